// Synth options that express the variety of published checkpoints: per-tensor
// type overrides (dynamic "UD" mixes), general.alignment other than 32, and
// the model metadata repeated in every shard.
#include <gtest/gtest.h>

#include "k3pack/gguf.h"
#include "k3pack/names.h"
#include "synth_test_util.h"

namespace k3pack::synth {
namespace {

using testing::TempDir;
using testing::Tiny;

TEST(SynthVariety, ParseTensorTypes) {
  auto t = ParseTensorTypes({"attn_=BF16;ffn_down_exps=IQ3_XXS", "shexp=Q8_0"});
  ASSERT_TRUE(t.ok()) << t.error().message();
  ASSERT_EQ(t->size(), 3u);
  EXPECT_EQ((*t)[0].pattern, "attn_");
  EXPECT_EQ((*t)[0].type, GgmlType::BF16);
  EXPECT_EQ((*t)[1].type, GgmlType::IQ3_XXS);
  EXPECT_EQ((*t)[2].pattern, "shexp");
  EXPECT_FALSE(ParseTensorTypes({"attn_"}).ok());
  EXPECT_FALSE(ParseTensorTypes({"=Q8_0"}).ok());
  auto bad = ParseTensorTypes({"attn_=Q9_9"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("unknown ggml type 'Q9_9'"), std::string::npos);
}

TEST(SynthVariety, TensorTypeOverridesFirstMatchWinsAndFallBack) {
  TempDir dir;
  SynthOptions o = Tiny(dir.path());
  // ssm_f_b has ne[0] = head_dim (64): Q4_K does not fit and falls back to
  // Q5_0 as llama-quantize does; the expert override must fit exactly.
  auto types = ParseTensorTypes({"ffn_down_exps=IQ3_XXS;shexp=BF16;shexp=F16;ssm_f_b=Q4_K"});
  ASSERT_TRUE(types.ok()) << types.error().message();
  o.tensor_types = *types;
  auto res = WriteSynthModel(o);
  ASSERT_TRUE(res.ok()) << res.error().message();
  auto set = gguf::ShardSet::Open(dir.path());
  ASSERT_TRUE(set.ok()) << set.error().message();
  int down = 0, shexp = 0, fb = 0;
  for (const auto& loc : set->AllTensors()) {
    const std::string& n = loc.info->name;
    if (n.find("ffn_down_exps") != std::string::npos) {
      ++down;
      EXPECT_EQ(loc.info->type, GgmlType::IQ3_XXS) << n;
    }
    if (n.find("shexp") != std::string::npos) {
      ++shexp;
      EXPECT_EQ(loc.info->type, GgmlType::BF16) << n;
    }
    if (n.find("ssm_f_b") != std::string::npos) {
      ++fb;
      EXPECT_EQ(loc.info->type, GgmlType::Q5_0) << n;
    }
    if (n.find("ffn_up_exps") != std::string::npos) {
      EXPECT_EQ(loc.info->type, GgmlType::Q2_K) << n;
    }
  }
  EXPECT_EQ(down, 3);
  EXPECT_EQ(shexp, 9);
  EXPECT_EQ(fb, 3);

  TempDir dir2;
  SynthOptions bad = Tiny(dir2.path());
  bad.dims.moe_intermediate = 1056;  // down's ne[0]: not a multiple of 256
  bad.expert_types = {GgmlType::F16, GgmlType::F16, GgmlType::F16};
  bad.tensor_types = *ParseTensorTypes({"ffn_down_exps=IQ3_XXS"});
  auto refused = WriteSynthModel(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message().find("ffn_down_exps.weight has ne[0]=1056"), std::string::npos)
      << refused.error().message();
}

TEST(SynthVariety, AlignmentIsWrittenAndUsed) {
  TempDir dir;
  SynthOptions o = Tiny(dir.path());
  o.alignment = 4096;
  auto res = WriteSynthModel(o);
  ASSERT_TRUE(res.ok()) << res.error().message();
  for (const std::string& p : res->shard_paths) {
    auto f = gguf::GgufFile::Open(p);
    ASSERT_TRUE(f.ok()) << f.error().message();
    EXPECT_EQ((*f)->alignment(), 4096u) << p;
    EXPECT_EQ((*f)->data_offset() % 4096, 0u) << p;
    for (const auto& t : (*f)->tensors()) EXPECT_EQ((t.data_offset - (*f)->data_offset()) % 4096, 0u) << t.name;
  }
  o.alignment = 48;
  EXPECT_FALSE(WriteSynthModel(o).ok());
}

TEST(SynthVariety, MetadataInEveryShard) {
  TempDir dir;
  SynthOptions o = Tiny(dir.path());
  o.metadata_in_every_shard = true;
  auto res = WriteSynthModel(o);
  ASSERT_TRUE(res.ok()) << res.error().message();
  ASSERT_EQ(res->shard_paths.size(), 3u);
  size_t first_keys = 0;
  for (size_t i = 0; i < res->shard_paths.size(); ++i) {
    auto f = gguf::GgufFile::Open(res->shard_paths[i]);
    ASSERT_TRUE(f.ok()) << f.error().message();
    EXPECT_NE((*f)->Find("general.name"), nullptr);
    EXPECT_NE((*f)->Find("kimi-k3.block_count"), nullptr);
    EXPECT_NE((*f)->Find("tokenizer.ggml.tokens"), nullptr);
    if (i == 0) first_keys = (*f)->metadata().size();
    EXPECT_EQ((*f)->metadata().size(), first_keys) << res->shard_paths[i];
  }
  // The set still opens as one model.
  auto set = gguf::ShardSet::Open(dir.path());
  ASSERT_TRUE(set.ok()) << set.error().message();
  EXPECT_EQ(set->tensor_count(), res->tensor_count);
}

}  // namespace
}  // namespace k3pack::synth
