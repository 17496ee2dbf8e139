// Helpers for the doctor tests: synthetic models (with faults), a GGUF
// rewriter that renames / retypes / replaces / drops tensors, and a CLI runner.
#pragma once

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "k3pack/doctor.h"
#include "k3pack/gguf.h"
#include "k3pack/synth.h"
#include "util/file.h"

namespace dtest {

namespace fs = std::filesystem;
using namespace k3pack;

// Directories made by TempDir, removed when the test binary exits (set
// K3PACK_KEEP_TEST_DIRS=1 to keep them for inspection).
struct TempDirs {
  std::vector<fs::path> dirs;
  ~TempDirs() {
    if (std::getenv("K3PACK_KEEP_TEST_DIRS") != nullptr) return;
    for (const auto& d : dirs) {
      std::error_code ec;
      fs::remove_all(d, ec);
    }
  }
};
// Overwrites n bytes of a file in place (a fault injected into a header).
inline void WriteAt(const fs::path& path, uint64_t offset, const void* data, size_t n) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY));
  ASSERT_TRUE(fd.valid()) << path;
  ASSERT_TRUE(PwriteFull(fd.get(), data, n, offset).ok());
}

inline TempDirs& AllTempDirs() {
  static TempDirs dirs;
  return dirs;
}

inline fs::path TempDir(const std::string& tag) {
  static int counter = 0;
  fs::path p = fs::temp_directory_path() /
               ("k3pack-doctor-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  fs::remove_all(p);
  fs::create_directories(p);
  AllTempDirs().dirs.push_back(p);
  return p;
}

// A tiny synthetic model with the given faults.
inline synth::SynthResult Synth(const fs::path& dir, const std::vector<synth::Fault>& faults = {}, uint32_t shards = 3) {
  auto o = synth::PresetOptions("tiny");
  EXPECT_TRUE(o.ok());
  o->out_dir = dir.string();
  o->faults = faults;
  o->shards = shards;
  auto r = synth::WriteSynthModel(*o);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message());
  return r.ok() ? *r : synth::SynthResult{};
}

struct TensorEdit {
  std::optional<std::string> rename;
  std::optional<GgmlType> type;
  std::optional<std::vector<int64_t>> ne;
  std::optional<std::vector<uint8_t>> bytes;  // new data (needed when type/shape change)
  bool drop = false;
};

inline TensorEdit WithBytes(std::vector<uint8_t> b) {
  TensorEdit e;
  e.bytes = std::move(b);
  return e;
}
inline TensorEdit WithType(GgmlType t, std::vector<uint8_t> b, std::optional<std::vector<int64_t>> ne = std::nullopt) {
  TensorEdit e = WithBytes(std::move(b));
  e.type = t;
  e.ne = std::move(ne);
  return e;
}
inline TensorEdit WithShape(std::vector<int64_t> ne, std::vector<uint8_t> b) {
  TensorEdit e = WithBytes(std::move(b));
  e.ne = std::move(ne);
  return e;
}
inline TensorEdit Renamed(std::string name) {
  TensorEdit e;
  e.rename = std::move(name);
  return e;
}
inline TensorEdit Dropped() {
  TensorEdit e;
  e.drop = true;
  return e;
}

inline std::vector<uint8_t> F32Bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Every metadata key of shard 0 except split.* (raw value bytes), and
// general.architecture for each shard: what a rewritten set starts from.
inline void CopyShard0Metadata(const gguf::GgufFile& f0, gguf::MetadataBuilder* meta,
                               gguf::MetadataBuilder* per_shard) {
  const uint8_t* base = f0.mapping()->data();
  const auto& kvs = f0.metadata();
  for (size_t i = 0; i < kvs.size(); ++i) {
    const auto& kv = kvs[i];
    const uint64_t start = kv.offset + 8 + kv.key.size() + 4;
    const uint64_t end = i + 1 < kvs.size() ? kvs[i + 1].offset : f0.tensors().front().info_offset;
    if (kv.key.rfind("split.", 0) == 0) continue;
    meta->Raw(kv.key, kv.value.type, std::string(reinterpret_cast<const char*>(base + start), end - start));
  }
  per_shard->Str("general.architecture", f0.architecture());
}

// Rewrites the (clean) shard set of `src` into `dst` with the edits applied,
// keeping every metadata key of shard 0 and the shard assignment.
inline std::vector<std::string> Rewrite(const fs::path& src, const fs::path& dst,
                                        const std::map<std::string, TensorEdit>& edits,
                                        const std::string& prefix = "KIMI-K3-SYNTH") {
  auto set = gguf::ShardSet::Open(src.string());
  EXPECT_TRUE(set.ok()) << (set.ok() ? "" : set.error().message());
  if (!set.ok()) return {};
  const gguf::GgufFile& f0 = set->first();
  gguf::MetadataBuilder meta, per_shard;
  CopyShard0Metadata(f0, &meta, &per_shard);
  std::vector<gguf::TensorSpec> specs;
  std::vector<uint32_t> shard_of;
  for (const auto& loc : set->AllTensors()) {
    const gguf::TensorInfo& t = *loc.info;
    gguf::TensorSpec s;
    s.name = t.name;
    s.type = t.type;
    s.ne = t.shape();
    auto data = set->shards()[loc.shard_index]->TensorData(t);
    auto keep = set->shards()[loc.shard_index];
    s.fill = [data, keep](uint64_t off, std::span<uint8_t> out) { std::memcpy(out.data(), data.data() + off, out.size()); };
    auto it = edits.find(t.name);
    if (it != edits.end()) {
      const TensorEdit& e = it->second;
      if (e.drop) continue;
      if (e.rename) s.name = *e.rename;
      if (e.type) s.type = *e.type;
      if (e.ne) s.ne = *e.ne;
      if (e.bytes) {
        auto b = std::make_shared<std::vector<uint8_t>>(*e.bytes);
        s.fill = [b](uint64_t off, std::span<uint8_t> out) { std::memcpy(out.data(), b->data() + off, out.size()); };
      }
    }
    specs.push_back(std::move(s));
    shard_of.push_back(loc.shard_index);
  }
  fs::create_directories(dst);
  auto paths = gguf::WriteGgufSplit(dst.string(), prefix, meta, per_shard, specs, shard_of);
  EXPECT_TRUE(paths.ok()) << (paths.ok() ? "" : paths.error().message());
  if (fs::exists(src / "config.json")) fs::copy_file(src / "config.json", dst / "config.json");
  return paths.ok() ? *paths : std::vector<std::string>{};
}

struct CliResult {
  int exit_code = -1;
  std::string out;
};

// Runs `k3pack <args>` capturing stdout (stderr goes to the test log).
inline CliResult RunCli(const std::string& args) {
  CliResult r;
  const std::string cmd = std::string(K3PACK_BIN) + " " + args;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = ::pclose(p);
  r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

inline std::set<std::string> ErrorCodes(const doctor::Report& r) {
  std::set<std::string> s;
  for (const auto& f : r.findings) {
    if (f.severity == doctor::Severity::kError) s.insert(f.code);
  }
  return s;
}

inline std::string Dump(const doctor::Report& r) { return r.ToText(); }

inline doctor::Report Scaled(const std::vector<std::string>& paths) {
  doctor::DiagnoseOptions o;
  o.profile = kimi::Profile::kScaled;
  return doctor::Diagnose(paths, o);
}

inline std::string ReadAll(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace dtest
