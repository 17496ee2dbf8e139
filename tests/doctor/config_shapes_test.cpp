// config.json against the GGUF beyond KimiK3Spec's MoE keys: the attention,
// dense-FFN and layer-kind keys SGLang builds its modules from. A config of
// another model that agreed on the MoE keys passed the doctor and `build`'s
// gate, and SGLang failed at load on the first tensor that did not fit.
#include <fstream>

#include "doctor_test_util.h"

namespace dtest {
namespace {

// A tiny model whose config.json has `edit` applied to its text_config.
fs::path WithConfigEdit(const std::string& tag, const std::function<void(nlohmann::json&)>& edit) {
  auto dir = TempDir(tag);
  Synth(dir);
  auto j = nlohmann::json::parse(ReadAll(dir / "config.json"));
  edit(j.contains("text_config") ? j["text_config"] : j);
  std::ofstream(dir / "config.json", std::ios::trunc) << j.dump(2);
  return dir;
}

std::map<std::string, const doctor::Finding*> MismatchesByKey(const doctor::Report& r) {
  std::map<std::string, const doctor::Finding*> by_key;
  for (const auto* f : r.With("config-gguf-mismatch")) by_key[f->details["config_key"].get<std::string>()] = f;
  return by_key;
}

TEST(ConfigShapes, EachAttentionAndDenseKeyIsComparedWithTheGguf) {
  const std::vector<std::pair<std::string, std::string>> keys = {
      {"num_attention_heads", "kimi-k3.attention.head_count"},
      {"q_lora_rank", "kimi-k3.attention.q_lora_rank"},
      {"kv_lora_rank", "kimi-k3.attention.kv_lora_rank"},
      {"qk_rope_head_dim", "kimi-k3.rope.dimension_count"},
      {"qk_nope_head_dim", "kimi-k3.attention.key_length_mla"},
      {"v_head_dim", "kimi-k3.attention.value_length_mla"},
      {"intermediate_size", "kimi-k3.feed_forward_length"},
      {"attn_res_block_size", "kimi-k3.attn_res.block_size"},
      {"linear_attn_config.num_heads", "kimi-k3.attention.head_count"},
      {"linear_attn_config.head_dim", "kimi-k3.kda.head_dim"},
      {"linear_attn_config.short_conv_kernel_size", "kimi-k3.ssm.conv_kernel"},
  };
  for (const auto& [key, object] : keys) {
    SCOPED_TRACE(key);
    const auto dir = WithConfigEdit("cfg-shape", [&](nlohmann::json& t) {
      nlohmann::json& obj = key.rfind("linear_attn_config.", 0) == 0 ? t["linear_attn_config"] : t;
      const std::string leaf = key.substr(key.find('.') == std::string::npos ? 0 : key.find('.') + 1);
      obj[leaf] = obj[leaf].get<uint64_t>() * 2;
    });
    const doctor::Report r = Scaled({dir.string()});
    const auto found = MismatchesByKey(r);
    ASSERT_EQ(found.size(), 1u) << Dump(r);
    ASSERT_EQ(found.count(key), 1u) << Dump(r);
    const doctor::Finding& f = *found.at(key);
    EXPECT_EQ(f.object, object);
    EXPECT_EQ(f.severity, doctor::Severity::kError);
    EXPECT_EQ(f.details["config"].get<uint64_t>(), 2 * f.details["gguf"].get<uint64_t>()) << f.details.dump();
    EXPECT_NE(f.message.find("config.json " + key + "="), std::string::npos) << f.message;
    EXPECT_EQ(f.file, (dir / "config.json").string());
  }
}

TEST(ConfigShapes, TheConfigThatWasConvertedAgrees) {
  auto dir = TempDir("cfg-agrees");
  Synth(dir);
  const doctor::Report r = Scaled({dir.string()});
  EXPECT_FALSE(r.Has("config-gguf-mismatch")) << Dump(r);
  // An integral float and a null q_lora_rank where the GGUF has none are
  // what they say.
  const auto floats = WithConfigEdit("cfg-float", [](nlohmann::json& t) { t["kv_lora_rank"] = 256.0; });
  EXPECT_FALSE(Scaled({floats.string()}).Has("config-gguf-mismatch"));
  const auto no_q_lora = WithConfigEdit("cfg-null", [](nlohmann::json& t) { t["q_lora_rank"] = nullptr; });
  const doctor::Report no_q = Scaled({no_q_lora.string()});
  const auto found = MismatchesByKey(no_q);
  ASSERT_EQ(found.count("q_lora_rank"), 1u) << Dump(no_q);
  EXPECT_EQ(found.at("q_lora_rank")->details["config"], 0);
  EXPECT_NE(found.at("q_lora_rank")->message.find("config.json q_lora_rank=null, GGUF kimi-k3.attention.q_lora_rank=256"),
            std::string::npos)
      << Dump(no_q);
}

TEST(ConfigShapes, LayerKindsAreComparedWithHeadCountKv) {
  // The tiny model: layer 4 (1-based) is MLA, 1..3 KDA. A config that makes
  // layer 3 MLA builds attention modules the GGUF's ssm_* tensors do not fill.
  const auto dir = WithConfigEdit("cfg-kinds", [](nlohmann::json& t) {
    t["linear_attn_config"]["kda_layers"] = {1, 2};
    t["linear_attn_config"]["full_attn_layers"] = {3, 4};
  });
  const doctor::Report r = Scaled({dir.string()});
  const auto found = MismatchesByKey(r);
  ASSERT_EQ(found.size(), 1u) << Dump(r);  // SGLang's model reads kda_layers
  const doctor::Finding& kda = *found.at("linear_attn_config.kda_layers");
  EXPECT_EQ(kda.object, "kimi-k3.attention.head_count_kv");
  EXPECT_NE(kda.message.find("disagree on 1 layer(s); first: layer 3 (1-based) is not KDA in config.json, KDA in the GGUF"),
            std::string::npos)
      << kda.message;
  EXPECT_EQ(kda.details["gguf"], nlohmann::json({1, 2, 3}));
  // Without kda_layers, full_attn_layers decides; a layer past the model is
  // a disagreement too.
  const auto past = WithConfigEdit("cfg-past", [](nlohmann::json& t) {
    t["linear_attn_config"].erase("kda_layers");
    t["linear_attn_config"]["full_attn_layers"] = {3, 4, 9};
  });
  const doctor::Report past_report = Scaled({past.string()});
  const auto past_found = MismatchesByKey(past_report);
  ASSERT_EQ(past_found.count("linear_attn_config.full_attn_layers"), 1u) << Dump(past_report);
  EXPECT_NE(past_found.at("linear_attn_config.full_attn_layers")
                ->message.find("disagree on 2 layer(s); first: layer 3 (1-based) is MLA in config.json, not MLA in the GGUF"),
            std::string::npos)
      << Dump(past_report);
}

TEST(ConfigShapes, TheBuildGateRefusesAConfigOfAnotherModel) {
  const auto dir = WithConfigEdit("cfg-gate", [](nlohmann::json& t) { t["kv_lora_rank"] = 128; });
  Status gate = doctor::CheckSglangCanLoad((dir / "KIMI-K3-SYNTH-00001-of-00003.gguf").string(), kimi::Profile::kScaled,
                                           "", false);
  ASSERT_FALSE(gate.ok());
  EXPECT_NE(gate.error().message().find("[config-gguf-mismatch] kimi-k3.attention.kv_lora_rank: config.json "
                                        "kv_lora_rank=128, GGUF kimi-k3.attention.kv_lora_rank=256"),
            std::string::npos)
      << gate.error().message();
}

}  // namespace
}  // namespace dtest
