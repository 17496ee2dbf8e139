// Model spec from config.json: SGLang's KimiK3Spec texts and the scaled profile.
#include <gtest/gtest.h>

#include "k3pack/gguf.h"
#include "k3pack/kimi.h"
#include "manifest/pyjson.h"
#include "test_util.h"

using k3pack::ErrorKind;
using k3pack::kimi::ModelSpecFromConfig;
using k3pack::kimi::Profile;
using nlohmann::json;

namespace {

json K3TextConfig() {
  return {{"num_hidden_layers", 93}, {"first_k_dense_replace", 1}, {"num_experts", 896},
          {"num_experts_per_token", 16}, {"num_shared_experts", 2}, {"hidden_size", 7168},
          {"routed_expert_hidden_size", 3584}, {"moe_intermediate_size", 3072}, {"hidden_act", "situ"},
          {"moe_layer_freq", 1}, {"model_type", "kimi_linear"}};
}

// The message Python would print, computed by python3 from the same dicts.
std::string PythonInvariantText(const json& text) {
  k3test::TempDir dir;
  k3test::WriteFile(dir / "c.json", text.dump());
  const std::string script =
      "import json,sys\n"
      "t=json.load(open(sys.argv[1]))\n"
      "s=dict(num_hidden_layers=int(t['num_hidden_layers']),first_k_dense_replace=int(t['first_k_dense_replace']),"
      "num_experts=int(t['num_experts']),top_k=int(t['num_experts_per_token']),"
      "num_shared_experts=int(t['num_shared_experts']),hidden_size=int(t['hidden_size']),"
      "routed_expert_hidden_size=int(t['routed_expert_hidden_size']),"
      "moe_intermediate_size=int(t['moe_intermediate_size']),hidden_act=str(t['hidden_act']))\n"
      "e=dict(num_hidden_layers=93,first_k_dense_replace=1,num_experts=896,top_k=16,num_shared_experts=2,"
      "hidden_size=7168,routed_expert_hidden_size=3584,moe_intermediate_size=3072,hidden_act='situ')\n"
      "sys.stdout.write(f'Kimi K3 model invariants do not match the audited model: expected={e}, actual={s}')\n";
  k3test::WriteFile(dir / "p.py", script);
  auto r = k3test::RunCmd(k3test::Python() + " " + (dir / "p.py") + " " + (dir / "c.json"), false);
  EXPECT_EQ(r.rc, 0);
  return r.out;
}

std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

}  // namespace

TEST(ModelSpec, K3ConfigPassesAndUsesTextConfig) {
  json cfg = {{"model_type", "kimi_k3"}, {"text_config", K3TextConfig()}, {"num_hidden_layers", 5}};
  auto spec = ModelSpecFromConfig(cfg, Profile::kKimiK3);
  ASSERT_TRUE(spec.ok()) << spec.error().message();
  EXPECT_EQ(spec->num_hidden_layers, 93u);
  EXPECT_EQ(spec->top_k, 16u);
  EXPECT_EQ(spec->hidden_act, "situ");
  ASSERT_EQ(spec->active_moe_layer_ids.size(), 92u);
  EXPECT_EQ(spec->active_moe_layer_ids.front(), 1u);
  EXPECT_EQ(spec->active_moe_layer_ids.back(), 92u);
}

TEST(ModelSpec, InvariantMismatchTextMatchesPython) {
  struct Case { const char* key; json value; };
  const Case cases[] = {{"num_experts", 8},          {"num_experts_per_token", 4}, {"hidden_act", "silu"},
                        {"first_k_dense_replace", 2}, {"hidden_size", 7168.0},     {"hidden_act", "it's"},
                        {"moe_intermediate_size", "3072"}};
  for (const auto& c : cases) {
    json text = K3TextConfig();
    text[c.key] = c.value;
    auto spec = ModelSpecFromConfig(text, Profile::kKimiK3);
    const std::string expect = PythonInvariantText(text);
    if (expect.find("actual={'num_hidden_layers': 93, 'first_k_dense_replace': 1, 'num_experts': 896, 'top_k': 16, "
                    "'num_shared_experts': 2, 'hidden_size': 7168, 'routed_expert_hidden_size': 3584, "
                    "'moe_intermediate_size': 3072, 'hidden_act': 'situ'}") != std::string::npos) {
      // int() made it equal (7168.0, "3072"): Python accepts it, so must we.
      EXPECT_TRUE(spec.ok()) << c.key;
      continue;
    }
    ASSERT_FALSE(spec.ok()) << c.key;
    EXPECT_EQ(spec.error().kind(), ErrorKind::kValue);
    EXPECT_EQ(FirstLine(spec.error().message()), expect) << c.key;
  }
}

TEST(ModelSpec, MissingKeyIsKeyErrorInSglangOrder) {
  json text = K3TextConfig();
  text.erase("num_experts");
  text.erase("hidden_act");
  auto spec = ModelSpecFromConfig({{"text_config", text}}, Profile::kKimiK3);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.error().kind(), ErrorKind::kKey);
  EXPECT_EQ(spec.error().message(), "'num_experts'");
  text = K3TextConfig();
  text.erase("hidden_act");
  spec = ModelSpecFromConfig(text, Profile::kScaled);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.error().message(), "'hidden_act'");
}

TEST(ModelSpec, ScaledAcceptsAnyDimsButChecksSanity) {
  json text = K3TextConfig();
  text["num_hidden_layers"] = 4;
  text["num_experts"] = 16;
  text["num_experts_per_token"] = 4;
  text["hidden_size"] = 512;
  auto spec = ModelSpecFromConfig(text, Profile::kScaled);
  ASSERT_TRUE(spec.ok()) << spec.error().message();
  EXPECT_EQ(spec->active_moe_layer_ids, (std::vector<uint32_t>{1, 2, 3}));
  EXPECT_EQ(spec->profile, Profile::kScaled);
  // The same config is rejected under the audited profile.
  EXPECT_FALSE(ModelSpecFromConfig(text, Profile::kKimiK3).ok());

  json bad = text;
  bad["num_experts_per_token"] = 17;
  EXPECT_FALSE(ModelSpecFromConfig(bad, Profile::kScaled).ok());
  bad = text;
  bad["first_k_dense_replace"] = 4;
  EXPECT_FALSE(ModelSpecFromConfig(bad, Profile::kScaled).ok());
  bad = text;
  bad["num_experts"] = -3;
  EXPECT_FALSE(ModelSpecFromConfig(bad, Profile::kScaled).ok());
  bad = text;
  bad["num_hidden_layers"] = 4000000000LL;
  EXPECT_FALSE(ModelSpecFromConfig(bad, Profile::kScaled).ok());
  bad = text;
  bad["num_experts"] = json::array();
  auto r = ModelSpecFromConfig(bad, Profile::kScaled);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("num_experts"), std::string::npos);
}

TEST(ModelSpec, LoadNamesTheFile) {
  k3test::TempDir dir;
  auto r = k3pack::kimi::LoadModelSpec(dir / "missing.json", Profile::kKimiK3);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().kind(), ErrorKind::kFileNotFound);
  EXPECT_NE(r.error().message().find("missing.json"), std::string::npos);
  k3test::WriteFile(dir / "bad.json", "{\"num_experts\": ");
  r = k3pack::kimi::LoadModelSpec(dir / "bad.json", Profile::kKimiK3);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("bad.json"), std::string::npos);
  k3test::WriteFile(dir / "ok.json", json{{"text_config", K3TextConfig()}}.dump());
  EXPECT_TRUE(k3pack::kimi::LoadModelSpec(dir / "ok.json", Profile::kKimiK3).ok());
}

TEST(ModelSpec, ProfileNames) {
  EXPECT_EQ(*k3pack::kimi::ParseProfile("kimi-k3"), Profile::kKimiK3);
  EXPECT_EQ(*k3pack::kimi::ParseProfile("scaled"), Profile::kScaled);
  EXPECT_FALSE(k3pack::kimi::ParseProfile("k3").ok());
  EXPECT_STREQ(k3pack::kimi::ProfileName(Profile::kScaled), "scaled");
}

namespace {

// A one-shard set whose kimi-k3.* keys come from `meta`.
k3pack::Result<k3pack::gguf::ShardSet> OneShard(const std::string& dir, k3pack::gguf::MetadataBuilder meta) {
  k3pack::gguf::MetadataBuilder per_shard;
  std::vector<k3pack::gguf::TensorSpec> tensors(1);
  tensors[0].name = "token_embd_norm.weight";
  tensors[0].type = k3pack::GgmlType::F32;
  tensors[0].ne = {8};
  auto paths = k3pack::gguf::WriteGgufSplit(dir, "X", meta, per_shard, tensors, {0});
  if (!paths.ok()) return paths.error();
  return k3pack::gguf::ShardSet::Open(dir);
}

k3pack::kimi::ModelSpec ScaledSpec() {
  json text = K3TextConfig();
  text["num_hidden_layers"] = 4;
  text["num_experts"] = 16;
  text["num_experts_per_token"] = 4;
  return *ModelSpecFromConfig(text, Profile::kScaled);
}

}  // namespace

TEST(CrossCheckGguf, AgreesDisagreesAndSkipsAbsentKeys) {
  const auto spec = ScaledSpec();
  {
    k3test::TempDir dir;
    k3pack::gguf::MetadataBuilder m;
    m.Str("general.architecture", "kimi-k3").U32("kimi-k3.block_count", 4).U32("kimi-k3.expert_count", 16)
        .U32("kimi-k3.expert_used_count", 4).U32("kimi-k3.leading_dense_block_count", 1)
        .U32("kimi-k3.expert_latent_length", 0)  // 0 = no latent: not compared
        .U32("kimi-k3.expert_feed_forward_length", 3072).U32("kimi-k3.embedding_length", 7168);
    auto set = OneShard(dir.path(), m);
    ASSERT_TRUE(set.ok()) << set.error().message();
    auto st = k3pack::kimi::CrossCheckGguf(spec, *set);
    EXPECT_TRUE(st.ok()) << st.message();
  }
  {
    k3test::TempDir dir;
    k3pack::gguf::MetadataBuilder m;
    m.Str("general.architecture", "kimi-k3").U32("kimi-k3.expert_latent_length", 2048);
    auto set = OneShard(dir.path(), m);
    ASSERT_TRUE(set.ok()) << set.error().message();
    auto st = k3pack::kimi::CrossCheckGguf(spec, *set);
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(FirstLine(st.error().message()).rfind(
                  "GGUF metadata kimi-k3.expert_latent_length=2048 disagrees with model config "
                  "routed_expert_hidden_size=3584 (", 0),
              0u)
        << st.error().message();
  }
  {
    k3test::TempDir dir;
    k3pack::gguf::MetadataBuilder m;
    m.Str("general.architecture", "kimi-k3").Str("kimi-k3.block_count", "4");
    auto set = OneShard(dir.path(), m);
    ASSERT_TRUE(set.ok()) << set.error().message();
    auto st = k3pack::kimi::CrossCheckGguf(spec, *set);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.error().message().find("kimi-k3.block_count must be an integer"), std::string::npos);
  }
}
