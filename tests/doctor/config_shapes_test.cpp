// config.json against the GGUF beyond KimiK3Spec's MoE keys: the attention,
// dense, embedding and layer-kind keys SGLang builds its modules from. A
// config of another model that agreed on the MoE keys passed the doctor and
// `build`'s gate, and SGLang failed at load (or computed with the wrong
// sizes). SGLang's server reads the tokenizer directory's config.json,
// which is checked too.
#include <fstream>

#include "doctor_test_util.h"

namespace dtest {
namespace {

void EditConfig(const fs::path& file, const std::function<void(nlohmann::json&)>& edit) {
  auto j = nlohmann::json::parse(ReadAll(file));
  edit(j.contains("text_config") ? j["text_config"] : j);
  std::ofstream(file, std::ios::trunc) << j.dump(2);
}

// A tiny model whose config.json beside the shards has `edit` applied to
// its text_config (the tokenizer directory's stays the converted one).
fs::path WithConfigEdit(const std::string& tag, const std::function<void(nlohmann::json&)>& edit) {
  auto dir = TempDir(tag);
  Synth(dir);
  EditConfig(dir / "config.json", edit);
  return dir;
}

std::map<std::string, const doctor::Finding*> ByKey(const doctor::Report& r, const std::string& code) {
  std::map<std::string, const doctor::Finding*> by_key;
  for (const auto* f : r.With(code)) by_key[f->details.value("config_key", std::string())] = f;
  return by_key;
}

TEST(ConfigShapes, EachAttentionDenseAndVocabKeyIsComparedWithTheGguf) {
  const std::vector<std::pair<std::string, std::string>> keys = {
      {"num_attention_heads", "kimi-k3.attention.head_count"},
      {"q_lora_rank", "kimi-k3.attention.q_lora_rank"},
      {"kv_lora_rank", "kimi-k3.attention.kv_lora_rank"},
      {"qk_rope_head_dim", "kimi-k3.rope.dimension_count"},
      {"qk_nope_head_dim", "kimi-k3.attention.key_length_mla"},
      {"v_head_dim", "kimi-k3.attention.value_length_mla"},
      {"intermediate_size", "kimi-k3.feed_forward_length"},
      {"attn_res_block_size", "kimi-k3.attn_res.block_size"},
      {"vocab_size", "kimi-k3.vocab_size"},
      {"linear_attn_config.num_heads", "kimi-k3.attention.head_count"},
      {"linear_attn_config.head_dim", "kimi-k3.kda.head_dim"},
      {"linear_attn_config.short_conv_kernel_size", "kimi-k3.ssm.conv_kernel"},
  };
  for (const auto& key_and_object : keys) {
    const std::string& key = key_and_object.first;
    const std::string& object = key_and_object.second;
    SCOPED_TRACE(key);
    const auto dir = WithConfigEdit("cfg-shape", [&](nlohmann::json& t) {
      nlohmann::json& obj = key.rfind("linear_attn_config.", 0) == 0 ? t["linear_attn_config"] : t;
      const std::string leaf = key.substr(key.find('.') == std::string::npos ? 0 : key.find('.') + 1);
      obj[leaf] = obj[leaf].get<uint64_t>() * 2;
    });
    const doctor::Report r = Scaled({dir.string()});
    const auto found = ByKey(r, "config-gguf-mismatch");
    ASSERT_EQ(found.size(), 1u) << Dump(r);
    ASSERT_EQ(found.count(key), 1u) << Dump(r);
    const doctor::Finding& f = *found.at(key);
    EXPECT_EQ(f.object, object);
    EXPECT_EQ(f.severity, doctor::Severity::kError);
    EXPECT_EQ(f.details["config"].get<uint64_t>(), 2 * f.details["gguf"].get<uint64_t>()) << f.details.dump();
    EXPECT_EQ(f.message.rfind((dir / "config.json").string() + ": " + key + "=", 0), 0u) << f.message;
    EXPECT_EQ(f.file, (dir / "config.json").string());
  }
}

TEST(ConfigShapes, TheConfigThatWasConvertedAgreesAndANullQueryLoraDoesNot) {
  auto dir = TempDir("cfg-agrees");
  Synth(dir);
  const doctor::Report r = Scaled({dir.string()});
  EXPECT_FALSE(r.Has("config-gguf-mismatch")) << Dump(r);
  EXPECT_FALSE(r.Has("config-invalid")) << Dump(r);
  // null: no query LoRA, where the GGUF has one.
  const auto no_q_lora = WithConfigEdit("cfg-null", [](nlohmann::json& t) { t["q_lora_rank"] = nullptr; });
  const doctor::Report no_q = Scaled({no_q_lora.string()});
  const auto found = ByKey(no_q, "config-gguf-mismatch");
  ASSERT_EQ(found.count("q_lora_rank"), 1u) << Dump(no_q);
  EXPECT_EQ(found.at("q_lora_rank")->details["config"], nullptr);
  EXPECT_NE(found.at("q_lora_rank")->message.find("config.json: q_lora_rank=null, GGUF kimi-k3.attention.q_lora_rank=256"),
            std::string::npos)
      << Dump(no_q);
}

// SGLang's torch sizes modules with these: 256.0, "256", -1 or true fail
// there (TypeError, RuntimeError), and KimiK3Spec's int() took 512.0.
TEST(ConfigShapes, ASizeThatIsNoIntegerIsInvalid) {
  for (const nlohmann::json& bad : {nlohmann::json(256.0), nlohmann::json("256"), nlohmann::json(-1),
                                    nlohmann::json(true), nlohmann::json(nullptr)}) {
    SCOPED_TRACE(bad.dump());
    const auto dir = WithConfigEdit("cfg-type", [&](nlohmann::json& t) {
      t["kv_lora_rank"] = bad;
      t["linear_attn_config"]["head_dim"] = bad;
    });
    const doctor::Report r = Scaled({dir.string()});
    const auto found = ByKey(r, "config-invalid");
    ASSERT_EQ(found.size(), 2u) << Dump(r);
    EXPECT_NE(found.at("kv_lora_rank")->message.find("kv_lora_rank must be a non-negative integer (SGLang sizes "
                                                     "modules with it), got " + bad.dump()),
              std::string::npos)
        << Dump(r);
    EXPECT_EQ(found.count("linear_attn_config.head_dim"), 1u) << Dump(r);
    EXPECT_FALSE(r.Has("config-gguf-mismatch")) << Dump(r);
  }
  const auto spec_key = WithConfigEdit("cfg-spec-float", [](nlohmann::json& t) { t["hidden_size"] = 512.0; });
  const doctor::Report r = Scaled({spec_key.string()});
  EXPECT_EQ(ByKey(r, "config-invalid").count("hidden_size"), 1u) << Dump(r);
}

TEST(ConfigShapes, LayerKindsComeFromKdaLayersAsSglangReadsThem) {
  // The tiny model: layer 4 (1-based) is MLA, 1..3 KDA.
  const auto dir = WithConfigEdit("cfg-kinds", [](nlohmann::json& t) { t["linear_attn_config"]["kda_layers"] = {1, 2}; });
  const doctor::Report r = Scaled({dir.string()});
  const auto found = ByKey(r, "config-gguf-mismatch");
  ASSERT_EQ(found.size(), 1u) << Dump(r);
  const doctor::Finding& kda = *found.at("linear_attn_config.kda_layers");
  EXPECT_EQ(kda.object, "kimi-k3.attention.head_count_kv");
  EXPECT_NE(kda.message.find("disagree on 1 layer(s); first: layer 3 (1-based) is MLA in config.json, KDA in the GGUF"),
            std::string::npos)
      << kda.message;
  EXPECT_EQ(kda.details["gguf"], nlohmann::json({1, 2, 3}));
  // `(il + 1) in kda_layers`: 1.0 is 1, "1" is no layer, a layer past the
  // model is never asked about, and full_attn_layers is never read.
  const std::vector<std::pair<nlohmann::json, int>> lists = {
      {nlohmann::json::array({1.0, 2.0, 3.0}), 0},
      {nlohmann::json::array({"1", "2", "3"}), 3},
      {nlohmann::json::array({1, 2, 3, 9}), 0},
      {nlohmann::json::array({0, 1, 2, 3, 4}), 1},
  };
  for (const auto& list_and_differ : lists) {
    const nlohmann::json& list = list_and_differ.first;
    const int differ = list_and_differ.second;
    SCOPED_TRACE(list.dump());
    const auto d = WithConfigEdit("cfg-list", [&](nlohmann::json& t) {
      t["linear_attn_config"]["kda_layers"] = list;
      t["linear_attn_config"]["full_attn_layers"] = {1};
    });
    const doctor::Report lr = Scaled({d.string()});
    const auto lf = ByKey(lr, "config-gguf-mismatch");
    if (differ == 0) {
      EXPECT_TRUE(lf.empty()) << Dump(lr);
    } else {
      ASSERT_EQ(lf.count("linear_attn_config.kda_layers"), 1u) << Dump(lr);
      EXPECT_NE(lf.at("linear_attn_config.kda_layers")->message.find("disagree on " + std::to_string(differ)),
                std::string::npos)
          << Dump(lr);
    }
  }
  // Without kda_layers SGLang's config raises KeyError; without
  // linear_attn_config every layer is built as MLA.
  const auto none = WithConfigEdit("cfg-no-kda", [](nlohmann::json& t) { t["linear_attn_config"].erase("kda_layers"); });
  const doctor::Report nr = Scaled({none.string()});
  ASSERT_EQ(ByKey(nr, "config-invalid").count("linear_attn_config.kda_layers"), 1u) << Dump(nr);
  const auto no_linear = WithConfigEdit("cfg-no-linear", [](nlohmann::json& t) { t.erase("linear_attn_config"); });
  const doctor::Report nl = Scaled({no_linear.string()});
  const auto nlf = ByKey(nl, "config-gguf-mismatch");
  ASSERT_EQ(nlf.count("linear_attn_config"), 1u) << Dump(nl);
  EXPECT_NE(nlf.at("linear_attn_config")->message.find("SGLang builds every layer as MLA"), std::string::npos);
}

TEST(ConfigShapes, GatesTheGgufHoldsMustBeInTheConfig) {
  for (const std::string key : {"mla_use_output_gate", "linear_attn_config.use_full_rank_gate"}) {
    SCOPED_TRACE(key);
    const auto dir = WithConfigEdit("cfg-gate-flag", [&](nlohmann::json& t) {
      if (key == "mla_use_output_gate") t[key] = false;
      else t["linear_attn_config"]["use_full_rank_gate"] = false;
    });
    const doctor::Report r = Scaled({dir.string()});
    const auto found = ByKey(r, "config-gguf-mismatch");
    ASSERT_EQ(found.size(), 1u) << Dump(r);
    EXPECT_NE(found.at(key)->message.find("config.json: " + key + "=false, but the GGUF holds"), std::string::npos)
        << Dump(r);
  }
}

// SGLang's server builds its model from the tokenizer directory's
// config.json; the one beside the shards agreed and the build went ahead.
TEST(ConfigShapes, TheTokenizerDirectorysConfigIsCheckedAndGatesTheBuild) {
  auto dir = TempDir("cfg-tok");
  Synth(dir);
  EditConfig(dir / "tokenizer" / "config.json", [](nlohmann::json& t) { t["kv_lora_rank"] = 128; });
  const doctor::Report r = Scaled({dir.string()});
  const auto found = ByKey(r, "config-gguf-mismatch");
  ASSERT_EQ(found.size(), 1u) << Dump(r);
  EXPECT_EQ(found.at("kv_lora_rank")->file, (dir / "tokenizer" / "config.json").string());
  const std::string shard = (dir / "KIMI-K3-SYNTH-00001-of-00003.gguf").string();
  Status gate = doctor::CheckSglangCanLoad(shard, kimi::Profile::kScaled, (dir / "config.json").string(),
                                           (dir / "tokenizer").string(), false);
  ASSERT_FALSE(gate.ok());
  EXPECT_NE(gate.error().message().find("[config-gguf-mismatch] kimi-k3.attention.kv_lora_rank: " +
                                        (dir / "tokenizer" / "config.json").string() +
                                        ": kv_lora_rank=128, GGUF kimi-k3.attention.kv_lora_rank=256"),
            std::string::npos)
      << gate.error().message();
  // The same model keys written another way (the flattened model-meta SGLang
  // makes of it, another indent) are one config: checked once.
  auto flat = TempDir("cfg-tok-flat");
  Synth(flat);
  EditConfig(flat / "config.json", [](nlohmann::json& t) { t["kv_lora_rank"] = 128; });
  const auto wrapped = nlohmann::json::parse(ReadAll(flat / "config.json"));
  std::ofstream(flat / "tokenizer" / "config.json", std::ios::trunc) << wrapped.dump(3);
  std::ofstream(flat / "config.json", std::ios::trunc) << wrapped["text_config"].dump();
  const doctor::Report once = Scaled({flat.string()});
  EXPECT_EQ(once.With("config-gguf-mismatch").size(), 1u) << Dump(once);
  // A tokenizer config without text_config: SGLang's server refuses it.
  std::ofstream(flat / "tokenizer" / "config.json", std::ios::trunc) << wrapped["text_config"].dump();
  const doctor::Report no_wrapper = Scaled({flat.string()});
  bool said = false;
  for (const auto* f : no_wrapper.With("config-invalid"))
    said |= f->sglang_error == "Kimi tokenizer config does not contain text_config" &&
            f->file == (flat / "tokenizer" / "config.json").string();
  EXPECT_TRUE(said) << Dump(no_wrapper);
  // Given elsewhere, the tokenizer directory given is the one checked.
  auto other = TempDir("cfg-tok-other");
  fs::copy(dir / "tokenizer", other, fs::copy_options::recursive);
  EditConfig(other / "config.json", [](nlohmann::json& t) { t["kv_lora_rank"] = 256; });
  doctor::DiagnoseOptions o;
  o.profile = kimi::Profile::kScaled;
  o.tokenizer_dir = other.string();
  const doctor::Report given = doctor::Diagnose({dir.string()}, o);
  EXPECT_FALSE(given.Has("config-gguf-mismatch")) << Dump(given);
}

// `k3pack doctor --tokenizer-dir DIR`: the directory's config is checked;
// one SGLang would not take as a tokenizer directory is said at once. A
// manifest's recorded tokenizer is the default.
TEST(ConfigShapesCli, TheTokenizerDirectoryGivenOrRecordedIsChecked) {
  auto dir = TempDir("cfg-tok-cli");
  Synth(dir);
  auto tok = TempDir("cfg-tok-cli-other");
  fs::copy(dir / "tokenizer", tok, fs::copy_options::recursive);
  EditConfig(tok / "config.json", [](nlohmann::json& t) { t["linear_attn_config"]["head_dim"] = 32; });
  EXPECT_EQ(RunCli("doctor --profile scaled " + dir.string()).exit_code, 0);
  auto r = RunCli("doctor --json --profile scaled --tokenizer-dir " + tok.string() + " " + dir.string());
  EXPECT_EQ(r.exit_code, 1) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  bool named = false;
  for (const auto& f : j["findings"])
    named |= f["code"] == "config-gguf-mismatch" && f["file"] == (tok / "config.json").string() &&
             f["object"] == "kimi-k3.kda.head_dim";
  EXPECT_TRUE(named) << r.out;
  auto missing = RunCli("doctor --profile scaled --tokenizer-dir " + (dir / "nope").string() + " " + dir.string() +
                        " 2>&1");
  EXPECT_EQ(missing.exit_code, 1) << missing.out;
  EXPECT_NE(missing.out.find("--tokenizer-dir"), std::string::npos) << missing.out;
  // Built with that tokenizer directory, the manifest records it, and doctor
  // on the manifest checks its config.
  const std::string pack = (dir / "p.expert-major.pack").string(), manifest = (dir / "m.json").string();
  auto built = RunCli("build " + dir.string() + " --profile scaled --pack " + pack + " --manifest " + manifest +
                      " --tokenizer-dir " + tok.string() + " --allow-unsupported --payload-samples 0 "
                      "--no-full-source-hashes");
  ASSERT_EQ(built.exit_code, 0) << built.out;
  auto on_manifest = RunCli("doctor --json --profile scaled " + manifest);
  EXPECT_NE(on_manifest.out.find("kimi-k3.kda.head_dim"), std::string::npos) << on_manifest.out;
  auto gated = RunCli("build " + dir.string() + " --profile scaled --pack " + pack + ".2 --manifest " + manifest +
                      ".2 --tokenizer-dir " + tok.string() + " --payload-samples 0 --no-full-source-hashes 2>&1");
  EXPECT_EQ(gated.exit_code, 1) << gated.out;
  EXPECT_NE(gated.out.find("[config-gguf-mismatch] kimi-k3.kda.head_dim"), std::string::npos) << gated.out;
  // Its hint is a doctor run that sees what the gate saw.
  EXPECT_NE(gated.out.find("--profile scaled --model-config " + (dir / "config.json").string() + " --tokenizer-dir " +
                           tok.string() + "` for every problem"),
            std::string::npos)
      << gated.out;
}

}  // namespace
}  // namespace dtest
