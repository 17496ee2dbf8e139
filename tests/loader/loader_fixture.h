// Test fixtures for the loader: small hand-made GGUF shard sets and the
// adapter-manifest fields the stream reads, built from the files themselves.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "k3pack/gguf.h"
#include "k3pack/loader.h"
#include "util/file.h"
#include "util/sha256.h"

namespace k3pack::loader::testing {

namespace fs = std::filesystem;
using nlohmann::json;

inline std::string MakeTempDir(const std::string& tag) {
  std::string tmpl = (fs::temp_directory_path() / ("k3loader-" + tag + "-XXXXXX")).string();
  char* p = ::mkdtemp(tmpl.data());
  EXPECT_NE(p, nullptr);
  return tmpl;
}

struct TempDir {
  explicit TempDir(const std::string& tag) : path(MakeTempDir(tag)) {}
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string path;
};

// Fill helpers for gguf::TensorSpec.
inline std::function<void(uint64_t, std::span<uint8_t>)> FloatFill(std::vector<float> values) {
  return [v = std::move(values)](uint64_t off, std::span<uint8_t> out) {
    std::memcpy(out.data(), reinterpret_cast<const uint8_t*>(v.data()) + off, out.size());
  };
}
inline std::function<void(uint64_t, std::span<uint8_t>)> U16Fill(std::vector<uint16_t> values) {
  return [v = std::move(values)](uint64_t off, std::span<uint8_t> out) {
    std::memcpy(out.data(), reinterpret_cast<const uint8_t*>(v.data()) + off, out.size());
  };
}
inline std::function<void(uint64_t, std::span<uint8_t>)> PatternFill(uint8_t seed) {
  return [seed](uint64_t off, std::span<uint8_t> out) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>((off + i) * 131 + seed);
  };
}

inline gguf::TensorSpec F32Tensor(std::string name, std::vector<int64_t> ne, std::vector<float> values) {
  return {std::move(name), GgmlType::F32, std::move(ne), FloatFill(std::move(values))};
}
inline gguf::TensorSpec Typed(std::string name, GgmlType type, std::vector<int64_t> ne, uint8_t seed = 7) {
  return {std::move(name), type, std::move(ne), PatternFill(seed)};
}

// The manifest fields kimi_k3_gguf.py reads, plus the ones verify_metadata
// compares, computed from the shard files.
inline json ManifestFor(const std::vector<std::string>& shard_paths) {
  json shards = json::array();
  json tensors = json::array();
  for (size_t i = 0; i < shard_paths.size(); ++i) {
    auto f = gguf::GgufFile::Open(shard_paths[i]);
    EXPECT_TRUE(f.ok()) << f.error().message();
    const auto& g = **f;
    shards.push_back({{"index", i},
                      {"path", fs::absolute(shard_paths[i]).string()},
                      {"size", g.file_size()},
                      {"metadata_nbytes", g.data_offset()},
                      {"metadata_sha256", Sha256Hex(g.mapping()->data(), g.data_offset())},
                      {"tensor_count", g.tensors().size()}});
    for (const auto& t : g.tensors()) {
      tensors.push_back({{"name", t.name},
                         {"shape", t.shape()},
                         {"dtype", std::string(GgmlTypeName(t.type))},
                         {"dtype_id", static_cast<uint32_t>(t.type)},
                         {"shard_index", i},
                         {"data_offset", t.data_offset},
                         {"nbytes", t.nbytes}});
    }
  }
  return {{"format", "SGLANG-KIMI-GGMLMOEPACK-ADAPTER-v1"},
          {"complete", true},
          {"source", {{"shards", shards}, {"tensors", tensors}}}};
}

inline std::string WriteJson(const std::string& path, const json& j) {
  std::ofstream(path) << j.dump(2) << "\n";
  return path;
}

// Writes `tensors` as a split set (shard_of per tensor) plus its manifest;
// returns the manifest path.
inline std::string WriteModel(const std::string& dir, const std::vector<gguf::TensorSpec>& tensors,
                              const std::vector<uint32_t>& shard_of, json* manifest_out = nullptr,
                              std::vector<std::string>* shard_paths = nullptr) {
  gguf::MetadataBuilder meta;
  meta.Str("general.architecture", "kimi-k3").U32("kimi-k3.attention.head_count", 4);
  gguf::MetadataBuilder per_shard;
  auto paths = gguf::WriteGgufSplit(dir, "T", meta, per_shard, tensors, shard_of);
  EXPECT_TRUE(paths.ok()) << paths.error().message();
  json m = ManifestFor(*paths);
  if (manifest_out) *manifest_out = m;
  if (shard_paths) *shard_paths = *paths;
  return WriteJson(dir + "/manifest.json", m);
}

// Drains a stream; on error returns it in `*error`.
inline std::vector<NamedTensor> Drain(NonExpertStream& s, std::optional<Error>* error = nullptr) {
  std::vector<NamedTensor> out;
  for (;;) {
    auto r = s.Next();
    if (!r.ok()) {
      if (error) *error = r.error();
      return out;
    }
    if (!*r) return out;
    out.push_back(std::move(**r));
  }
}

inline float F32At(const NamedTensor& t, size_t i) {
  float f;
  std::memcpy(&f, t.data.data() + 4 * i, 4);
  return f;
}

}  // namespace k3pack::loader::testing
