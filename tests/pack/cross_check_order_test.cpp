// k3pack's config-vs-GGUF-metadata cross-check comes after SGLang's routed
// expert checks: a fault SGLang refuses gets SGLang's text first (the
// cross-check's finding as its hint), and only a checkpoint SGLang's checks
// pass is refused by the cross-check's own line.
#include <gtest/gtest.h>

#include <filesystem>

#include "k3pack/gguf.h"
#include "k3pack/kimi.h"
#include "k3pack/pack.h"
#include "../scratch_dir.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

k3pack::kimi::ModelSpec SmallSpec() {
  json text = {{"num_hidden_layers", 3},       {"first_k_dense_replace", 1}, {"num_experts", 16},
               {"num_experts_per_token", 4},   {"num_shared_experts", 2},    {"hidden_size", 64},
               {"routed_expert_hidden_size", 8}, {"moe_intermediate_size", 4}, {"hidden_act", "situ"}};
  return *k3pack::kimi::ModelSpecFromConfig(text, k3pack::kimi::Profile::kScaled);
}

// One shard: expert tensors of `experts` experts per layer, metadata saying
// `meta_experts`.
k3pack::Result<k3pack::gguf::ShardSet> Checkpoint(const std::string& dir, int64_t experts, uint32_t meta_experts) {
  k3pack::gguf::MetadataBuilder meta;
  meta.Str("general.architecture", "kimi-k3").U32("kimi-k3.expert_count", meta_experts);
  std::vector<k3pack::gguf::TensorSpec> tensors;
  for (int layer = 1; layer <= 2; ++layer) {
    for (const char* role : {"up", "gate", "down"}) {
      k3pack::gguf::TensorSpec t;
      t.name = "blk." + std::to_string(layer) + ".ffn_" + role + "_exps.weight";
      t.type = k3pack::GgmlType::F32;
      t.ne = std::string(role) == "down" ? std::vector<int64_t>{4, 8, experts} : std::vector<int64_t>{8, 4, experts};
      tensors.push_back(t);
    }
  }
  auto paths = k3pack::gguf::WriteGgufSplit(dir, "X", meta, k3pack::gguf::MetadataBuilder(), tensors, std::vector<uint32_t>(tensors.size(), 0));
  if (!paths.ok()) return paths.error();
  return k3pack::gguf::ShardSet::Open(dir);
}

std::string Dir(const std::string& tag) {
  fs::path p = fs::path(k3pack::testing_scratch::ProcessScratchDir("k3pack-test")) / (tag + std::to_string(rand()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

}  // namespace

TEST(CrossCheckOrder, SglangExpertShapeErrorComesFirstWithTheMetadataAsHint) {
  // A consistent 8-expert checkpoint given a 16-expert config: SGLang reads
  // no metadata and refuses the expert shape.
  auto set = Checkpoint(Dir("cc-shape"), 8, 8);
  ASSERT_TRUE(set.ok()) << set.error().message();
  auto r = k3pack::pack::CollectCheckedExperts(*set, SmallSpec());
  ASSERT_FALSE(r.ok());
  const std::string& m = r.error().message();
  EXPECT_EQ(m.substr(0, m.find('\n')), "unexpected expert shape for (1, 'up'): (8, 4, 8)") << m;
  EXPECT_NE(m.find("\nhint: GGUF metadata kimi-k3.expert_count=8 disagrees with model config num_experts=16"),
            std::string::npos)
      << m;
}

TEST(CrossCheckOrder, MetadataAloneStillRefused) {
  // Experts as the config says, metadata disagreeing: SGLang's checks pass,
  // k3pack's cross-check refuses (documented, FORMATS.md "Model spec").
  auto set = Checkpoint(Dir("cc-meta"), 16, 8);
  ASSERT_TRUE(set.ok()) << set.error().message();
  auto r = k3pack::pack::CollectCheckedExperts(*set, SmallSpec());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message().rfind("GGUF metadata kimi-k3.expert_count=8 disagrees with model config num_experts=16",
                                      0),
            0u)
      << r.error().message();
  auto good = Checkpoint(Dir("cc-good"), 16, 16);
  ASSERT_TRUE(good.ok()) << good.error().message();
  EXPECT_TRUE(k3pack::pack::CollectCheckedExperts(*good, SmallSpec()).ok());
}
