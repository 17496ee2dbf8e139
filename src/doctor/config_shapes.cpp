// The config.json keys SGLang builds the attention and dense layers from,
// against the GGUF's kimi-k3.* metadata. KimiK3Spec checks only the MoE
// keys; a config.json from another model (or another revision) that agrees
// on those but not on these builds modules whose shapes the GGUF tensors do
// not fit, and SGLang fails at load, after the pack was built.
#include <optional>
#include <set>

#include "doctor/internal.h"
#include "k3pack/synth.h"
#include "util/json_text.h"

namespace k3pack::doctor::internal {
namespace {

// An integer the config holds at `key` (a JSON integer or an integral
// float); nullopt when absent or of another kind (SGLang's own parsing
// reports those). A null q_lora_rank means no query LoRA: rank 0.
std::optional<uint64_t> ConfigInt(const nlohmann::json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end()) return std::nullopt;
  if (it->is_null() && std::string_view(key) == "q_lora_rank") return 0;
  if (it->is_number_unsigned()) return it->get<uint64_t>();
  if (it->is_number_integer() && it->get<int64_t>() >= 0) return static_cast<uint64_t>(it->get<int64_t>());
  if (it->is_number_float()) {
    const double v = it->get<double>();
    if (v >= 0 && v < 1e15 && v == static_cast<double>(static_cast<uint64_t>(v))) return static_cast<uint64_t>(v);
  }
  return std::nullopt;
}

void Mismatch(const std::string& config_key, const std::string& gguf_key, const std::string& message,
              nlohmann::json config_value, nlohmann::json gguf_value, const std::string& config, Collector& out) {
  Finding& f = out.Add("config-gguf-mismatch", "kimi-k3." + gguf_key, message, {}, config);
  f.details = {{"config_key", config_key}, {"config", std::move(config_value)}, {"gguf", std::move(gguf_value)}};
}

// linear_attn_config.kda_layers / full_attn_layers (1-based) against the
// layers head_count_kv marks KDA (0) or MLA.
void CheckLayerList(const nlohmann::json& linear, const char* key, bool lists_kda, const kimi::SynthDims& d,
                    const std::string& config, Collector& out) {
  auto it = linear.find(key);
  if (it == linear.end() || !it->is_array()) return;
  std::set<uint64_t> listed;
  for (const auto& v : *it) {
    if (!v.is_number_integer() || v.get<int64_t>() < 1) return;  // not a layer list SGLang could use either
    listed.insert(v.get<uint64_t>());
  }
  std::vector<uint32_t> gguf_listed;
  uint32_t differ = 0, first = 0;
  for (uint32_t il = 0; il < d.num_layers; ++il) {
    const bool in_gguf = synth::IsMlaLayer(d, il) != lists_kda;
    if (in_gguf) gguf_listed.push_back(il + 1);
    if (in_gguf != (listed.count(il + 1) != 0) && differ++ == 0) first = il + 1;
  }
  for (uint64_t layer : listed) {
    if (layer > d.num_layers && differ++ == 0) first = static_cast<uint32_t>(layer);
  }
  if (differ == 0) return;
  const char* kind = lists_kda ? "KDA" : "MLA";
  const bool config_says = listed.count(first) != 0;
  Mismatch(std::string("linear_attn_config.") + key, "attention.head_count_kv",
           "config.json linear_attn_config." + std::string(key) + " and GGUF kimi-k3.attention.head_count_kv " +
               "disagree on " + std::to_string(differ) + " layer(s); first: layer " + std::to_string(first) +
               " (1-based) is " + (config_says ? "" : "not ") + kind + " in config.json, " +
               (config_says ? "not " : "") + kind + " in the GGUF",
           *it, gguf_listed, config, out);
}

}  // namespace

void CrossCheckLayerShapes(const std::string& config, const kimi::SynthDims& d, Collector& out) {
  auto text = ReadFileToString(config);
  if (!text.ok()) return;  // the spec was read from it a moment ago; a vanished file says nothing of the model
  auto parsed = ParseJsonText(*text);
  if (!parsed.ok() || !parsed->is_object()) return;
  const nlohmann::json& top = *parsed;
  auto tc = top.find("text_config");
  const nlohmann::json& c = tc != top.end() && tc->is_object() ? *tc : top;
  struct Pair { const char* cfg; const char* key; uint64_t gguf; bool applies; };
  const Pair pairs[] = {
      {"num_attention_heads", "attention.head_count", d.heads, true},
      {"q_lora_rank", "attention.q_lora_rank", d.q_lora_rank, true},
      {"kv_lora_rank", "attention.kv_lora_rank", d.kv_lora_rank, true},
      {"qk_rope_head_dim", "rope.dimension_count", d.qk_rope, true},
      {"qk_nope_head_dim", "attention.key_length_mla", synth::MlaQkNope(d), true},
      {"v_head_dim", "attention.value_length_mla", synth::MlaVHead(d), true},
      {"intermediate_size", "feed_forward_length", d.dense_intermediate, d.first_k_dense > 0},
      {"attn_res_block_size", "attn_res.block_size", d.attn_res_block_size, true},
  };
  auto check = [&](const nlohmann::json& obj, const std::string& prefix, const Pair& p) {
    if (!p.applies) return;
    const std::optional<uint64_t> v = ConfigInt(obj, p.cfg);
    if (!v || *v == p.gguf) return;
    std::string gguf_text = "GGUF kimi-k3." + std::string(p.key) + "=" + std::to_string(p.gguf);
    if (std::string_view(p.key) == "attention.key_length_mla") {
      gguf_text = "GGUF kimi-k3.attention.key_length_mla - rope.dimension_count = " + std::to_string(p.gguf);
    }
    Mismatch(prefix + p.cfg, p.key, "config.json " + prefix + p.cfg + "=" + obj.at(p.cfg).dump() + ", " + gguf_text,
             *v, p.gguf, config, out);
  };
  for (const Pair& p : pairs) check(c, "", p);
  auto linear = c.find("linear_attn_config");
  if (linear == c.end() || !linear->is_object()) return;
  const Pair linear_pairs[] = {
      {"num_heads", "attention.head_count", d.heads, true},
      {"head_dim", "kda.head_dim", d.head_dim, true},
      {"short_conv_kernel_size", "ssm.conv_kernel", d.conv_kernel, true},
  };
  for (const Pair& p : linear_pairs) check(*linear, "linear_attn_config.", p);
  // SGLang's model takes a layer's kind from kda_layers; the converter from
  // full_attn_layers, which counts when kda_layers is absent.
  if (linear->contains("kda_layers")) {
    CheckLayerList(*linear, "kda_layers", true, d, config, out);
  } else {
    CheckLayerList(*linear, "full_attn_layers", false, d, config, out);
  }
}

}  // namespace k3pack::doctor::internal
