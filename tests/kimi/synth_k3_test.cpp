// The k3-structure preset (real Kimi-K3 dimensions, sparse data) and the CLI.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "kimi/tensors.h"
#include "synth_test_util.h"

namespace k3pack::synth {
namespace {

using testing::ReadAll;
using testing::TempDir;

TEST(SynthTable, K3HasTheInventoryCount) {
  auto table = kimi::ExpectedTensors(K3StructureDims());
  ASSERT_TRUE(table.ok()) << table.error().message();
  EXPECT_EQ(table->size(), 2573u);
  int mla = 0, kda = 0;
  for (uint32_t il = 0; il < 93; ++il) (IsMlaLayer(K3StructureDims(), il) ? mla : kda)++;
  EXPECT_EQ(mla, 24);
  EXPECT_EQ(kda, 69);
  EXPECT_TRUE(IsMlaLayer(K3StructureDims(), 3));
  EXPECT_TRUE(IsMlaLayer(K3StructureDims(), 91));
  EXPECT_TRUE(IsMlaLayer(K3StructureDims(), 92));
  EXPECT_FALSE(IsMlaLayer(K3StructureDims(), 0));
  EXPECT_FALSE(IsMlaLayer(K3StructureDims(), 90));
}

uint64_t DiskBytes(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0);
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

TEST(SynthK3, RealDimensionsSparse) {
  TempDir dir;
  auto o = PresetOptions("k3-structure");
  ASSERT_TRUE(o.ok());
  o->out_dir = dir.path();
  const auto t0 = std::chrono::steady_clock::now();
  auto res = WriteSynthModel(*o);
  ASSERT_TRUE(res.ok()) << res.error().message();
  std::printf("k3-structure written in %.2f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  ASSERT_EQ(res->shard_paths.size(), 19u);
  EXPECT_EQ(res->tensor_count, 2573u);
  EXPECT_EQ(res->mla_layers.size(), 24u);

  uint64_t disk = 0;
  for (const auto& p : res->shard_paths) disk += DiskBytes(p);
  EXPECT_LT(disk, 1ull << 30) << "real disk use";
  EXPECT_GT(res->total_bytes, 900ull * 1000 * 1000 * 1000);  // apparent size of a ~1 TB model

  auto set = gguf::ShardSet::Open(dir.path());
  ASSERT_TRUE(set.ok()) << set.error().message();
  EXPECT_EQ(set->tensor_count(), 2573u);
  EXPECT_EQ(set->shards().size(), 19u);
  auto table = kimi::ExpectedTensors(K3StructureDims());
  ASSERT_TRUE(table.ok());
  auto all = set->AllTensors();
  ASSERT_EQ(all.size(), table->size());
  for (size_t i = 0; i < all.size(); ++i) {
    ASSERT_EQ(all[i].info->name, (*table)[i].name);
    ASSERT_EQ(all[i].info->shape(), (*table)[i].ne);
    ASSERT_EQ(all[i].info->type, (*table)[i].type);
  }
  // SGLang's K3 numbers (spec §1.2).
  auto up = set->FindTensor("blk.1.ffn_up_exps.weight");
  ASSERT_TRUE(up);
  EXPECT_EQ(up->info->shape(), (std::vector<int64_t>{3584, 3072, 896}));
  EXPECT_EQ(up->info->nbytes / 896, 3612672u);
  auto down = set->FindTensor("blk.92.ffn_down_exps.weight");
  ASSERT_TRUE(down);
  EXPECT_EQ(down->info->nbytes / 896, 4730880u);
  EXPECT_EQ(set->FindTensor("blk.3.attn_k_b.weight")->info->shape(), (std::vector<int64_t>{128, 512, 96}));

  const auto& g = set->first();
  EXPECT_EQ(g.Find("tokenizer.ggml.tokens")->strings.size(), 163840u);
  EXPECT_EQ(*g.Find("tokenizer.ggml.eos_token_id")->AsInt(), 163586);
  EXPECT_EQ(g.Find("tokenizer.ggml.tokens")->strings[163586], "<|end_of_msg|>");
  const gguf::Value* kv = g.Find("kimi-k3.attention.head_count_kv");
  ASSERT_NE(kv, nullptr);
  int ones = 0;
  for (uint64_t i = 0; i < kv->array_count; ++i) ones += kv->ArrayInt(i) == 1;
  EXPECT_EQ(ones, 24);
  auto dims = kimi::DimsFromGguf(g);
  ASSERT_TRUE(dims.ok()) << dims.error().message();
  EXPECT_EQ(dims->num_layers, 93u);
  EXPECT_EQ(dims->latent, 3584u);
  EXPECT_EQ(dims->mla_layers->size(), 24u);

  // Small tensors carry real values; ssm_a stays strictly negative.
  for (uint32_t il : {0u, 1u, 90u}) {
    auto loc = set->FindTensor("blk." + std::to_string(il) + ".ssm_a");
    ASSERT_TRUE(loc);
    for (float x : testing::F32Values(*set->shards()[loc->shard_index], *loc->info)) {
      EXPECT_TRUE(std::isfinite(x) && x < 0.0f);
    }
  }
  auto norm = set->FindTensor("blk.50.attn_norm.weight");
  ASSERT_TRUE(norm);
  EXPECT_GT(testing::F32Values(*set->shards()[norm->shard_index], *norm->info)[0], 0.5f);

  auto cfg = nlohmann::json::parse(ReadAll(res->config_path));
  EXPECT_EQ(cfg["text_config"]["num_experts"], 896);
  EXPECT_EQ(cfg["text_config"]["linear_attn_config"]["full_attn_layers"].size(), 24u);
  EXPECT_EQ(cfg["text_config"]["linear_attn_config"]["full_attn_layers"].back(), 93);
  EXPECT_EQ(cfg["text_config"]["eos_token_id"], 163586);
}

std::string RunShell(const std::string& cmd, int* rc) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  *rc = ::pclose(p);
  return out;
}

TEST(SynthCli, TinyJsonMatchesTheApi) {
  TempDir dir;
  int rc = -1;
  const std::string out = RunShell(std::string(K3PACK_BIN) + " synth --out " + dir.sub("cli") + " --seed 5 --json", &rc);
  ASSERT_EQ(rc, 0) << out;
  auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["tensor_count"], 107);
  ASSERT_EQ(j["shards"].size(), 3u);

  SynthOptions o = testing::Tiny(dir.sub("api"), 5);
  auto res = WriteSynthModel(o);
  ASSERT_TRUE(res.ok());
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_EQ(ReadAll(j["shards"][s].get<std::string>()), ReadAll(res->shard_paths[s])) << s;
  }
}

TEST(SynthCli, OptionsAndErrors) {
  TempDir dir;
  int rc = -1;
  std::string out = RunShell(std::string(K3PACK_BIN) + " synth --out " + dir.path() +
                            " --layers 3 --experts 8 --top-k 2 --shards 2 --prefix M"
                            " --layer-expert-types 1:IQ2_XS,IQ2_XS,IQ3_XXS --layer-expert-types 2:Q4_K,Q4_K,Q5_K"
                            " --fault missing-expert,raw-ssm-a --json",
                        &rc);
  ASSERT_EQ(rc, 0) << out;
  auto j = nlohmann::json::parse(out);
  EXPECT_EQ(j["faults"].size(), 2u);
  auto set = gguf::ShardSet::Open(dir.path());
  ASSERT_TRUE(set.ok()) << set.error().message();
  EXPECT_EQ(set->prefix(), "M");
  EXPECT_EQ(set->shards().size(), 2u);
  EXPECT_EQ(set->FindTensor("blk.1.ffn_down_exps.weight")->info->type, GgmlType::IQ3_XXS);
  EXPECT_EQ(set->FindTensor("blk.2.ffn_up_exps.weight")->info->shape(), (std::vector<int64_t>{512, 1024, 8}));
  EXPECT_FALSE(set->FindTensor("blk.2.ffn_gate_exps.weight"));

  out = RunShell(std::string(K3PACK_BIN) + " synth --out " + dir.path() + " --fault no-such-fault", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("unknown fault 'no-such-fault'"), std::string::npos) << out;
  out = RunShell(std::string(K3PACK_BIN) + " synth --out " + dir.path() + " --expert-types Q2_K,Q2_K", &rc);
  EXPECT_NE(rc, 0);
  out = RunShell(std::string(K3PACK_BIN) + " synth --preset tiny", &rc);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("--out"), std::string::npos) << out;
}

}  // namespace
}  // namespace k3pack::synth
