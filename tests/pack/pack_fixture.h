// Shared fixture for the pack tests: one synthetic `tiny` model per test
// binary, helpers to build packs and to compute the expected pack bytes
// independently of src/pack (straight from spec §1.1).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "k3pack/gguf.h"
#include "k3pack/kimi.h"
#include "k3pack/pack.h"
#include "k3pack/synth.h"

namespace k3pack::pack::testing {

inline std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
inline void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

struct Model {
  std::string dir, config;
  kimi::ModelSpec spec;
  ExpertSet experts;
};

// Writes the tiny synthetic model into `dir` and collects its experts.
inline Model MakeModel(const std::string& dir, uint64_t seed = 7) {
  Model m;
  m.dir = dir;
  auto opts = synth::PresetOptions("tiny");
  EXPECT_TRUE(opts.ok());
  opts->out_dir = dir;
  opts->seed = seed;
  auto res = synth::WriteSynthModel(*opts);
  EXPECT_TRUE(res.ok()) << (res.ok() ? "" : res.error().message());
  m.config = res->config_path;
  auto spec = kimi::LoadModelSpec(m.config, kimi::Profile::kScaled);
  EXPECT_TRUE(spec.ok()) << (spec.ok() ? "" : spec.error().message());
  m.spec = *spec;
  auto shards = gguf::ShardSet::Open(dir);
  EXPECT_TRUE(shards.ok()) << (shards.ok() ? "" : shards.error().message());
  auto ex = CollectExperts(*shards, m.spec);
  EXPECT_TRUE(ex.ok()) << (ex.ok() ? "" : ex.error().message());
  m.experts = *ex;
  return m;
}

// The pack bytes per spec §1.1, computed without src/pack's layout code.
inline std::string ExpectedPack(const ExpertSet& ex) {
  const uint64_t n = ex.layers.size() * ex.num_experts * 3;
  auto align = [](uint64_t v) { return (v + 4095) / 4096 * 4096; };
  std::string out(align(40 + n * 152), '\0');
  auto le = [&](uint64_t at, uint64_t v, int k) {
    for (int i = 0; i < k; ++i) out[at + i] = static_cast<char>(v >> (8 * i));
  };
  std::memcpy(out.data(), "GGMLMOEPACKv1\0\0\0", 16);
  le(16, 1, 4);
  le(20, 40, 4);
  le(24, n, 8);
  le(32, out.size(), 8);
  std::vector<std::string> shards;
  for (const auto& p : ex.shard_paths) shards.push_back(ReadAll(p));
  uint64_t entry = 0;
  for (size_t li = 0; li < ex.layers.size(); ++li) {
    for (uint32_t e = 0; e < ex.num_experts; ++e) {
      for (int r = 0; r < 3; ++r, ++entry) {
        const ExpertTensor& t = ex.by_layer[li][r];
        const uint64_t cursor = align(out.size());
        out.resize(cursor, '\0');
        out += shards[t.tensor.shard_index].substr(t.tensor.data_offset + e * t.expert_bytes, t.expert_bytes);
        const uint64_t at = 40 + entry * 152;
        std::memcpy(out.data() + at, t.tensor.name.data(), t.tensor.name.size());
        le(at + 128, e, 4);
        le(at + 136, cursor, 8);
        le(at + 144, t.expert_bytes, 8);
      }
    }
  }
  return out;
}

inline std::string TempDir(const std::string& tag) {
  std::string base = std::filesystem::temp_directory_path() / ("k3pack-pack-" + tag + "-XXXXXX");
  std::vector<char> buf(base.begin(), base.end());
  buf.push_back('\0');
  EXPECT_NE(mkdtemp(buf.data()), nullptr);
  return buf.data();
}

// A test suite sharing one synthetic model (and the pack it must give) in a
// temp dir: `Tag` names the dir (Tag::kName) and the model's seed (Tag::kSeed).
template <typename Tag>
class SharedModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new std::string(TempDir(Tag::kName));
    model_ = new Model(MakeModel(*root_ + "/model", Tag::kSeed));
    expected_ = new std::string(ExpectedPack(model_->experts));
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*root_);
    delete model_;
    delete expected_;
    delete root_;
  }
  // `k3pack pack` of the model into `out` (scaled profile, no space margin).
  static std::vector<std::string> PackArgs(const std::string& out) {
    return {"pack", "--gguf-dir", model_->dir, "--model-config", model_->config, "--profile", "scaled",
            "--out", out, "--safety-margin-gib", "0", "--threads", "2"};
  }
  static inline std::string* root_ = nullptr;
  static inline Model* model_ = nullptr;
  static inline std::string* expected_ = nullptr;
};

}  // namespace k3pack::pack::testing
