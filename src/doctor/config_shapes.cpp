// The config.json keys SGLang builds the attention, dense and embedding
// modules from, against the GGUF's kimi-k3.* metadata. KimiK3Spec checks
// only the MoE keys; a config.json of another model (or revision) that
// agrees on those builds modules the GGUF tensors do not fit: SGLang fails
// at load (a plain weight's shape, the coverage check) or, where only GGUF-
// quantized linears take the size, computes with the wrong dimensions.
#include "doctor/internal.h"
#include "k3pack/synth.h"
#include "util/json_text.h"

namespace k3pack::doctor::internal {
namespace {

// Python's view of a JSON value as a size: an int (bool is one to Python,
// but no config writes a size as true; SGLang's torch refuses floats).
bool IsSize(const nlohmann::json& v) {
  return v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
}

// Python's `n in list`: an entry equal to n as a number (1.0 and true
// equal 1; a string equals no int).
bool PythonListHas(const nlohmann::json& list, uint64_t n) {
  for (const auto& v : list) {
    if (v.is_boolean() ? (v.get<bool>() ? 1u : 0u) == n
                       : v.is_number() && v.get<double>() == static_cast<double>(n))
      return true;
  }
  return false;
}

struct Checker {
  const kimi::SynthDims& d;
  const std::string& config;
  Collector& out;

  void Mismatch(const std::string& config_key, const std::string& gguf_key, const std::string& message,
                nlohmann::json config_value, nlohmann::json gguf_value) {
    Finding& f = out.Add("config-gguf-mismatch", "kimi-k3." + gguf_key, message, {}, config);
    f.details = {{"config_key", config_key}, {"config", std::move(config_value)}, {"gguf", std::move(gguf_value)}};
  }

  void NotASize(const std::string& key, const nlohmann::json& v) {
    Finding& f = out.Add("config-invalid", key,
                         config + ": " + key + " must be a non-negative integer (SGLang sizes modules with it), got " +
                             v.dump(),
                         {}, config);
    f.details = {{"config_key", key}, {"config", v}};
  }

  // `obj[key]` against the GGUF's `gguf`; a key the config lacks is not
  // compared. `null_is_zero`: q_lora_rank null means no query LoRA.
  void Size(const nlohmann::json& obj, const std::string& prefix, const char* key, const char* gguf_key,
            uint64_t gguf, bool null_is_zero = false) {
    auto it = obj.find(key);
    if (it == obj.end()) return;
    uint64_t v = 0;
    if (IsSize(*it)) {
      v = it->get<uint64_t>();
    } else if (!(null_is_zero && it->is_null())) {
      NotASize(prefix + key, *it);
      return;
    }
    if (v == gguf) return;
    std::string gguf_text = "GGUF kimi-k3." + std::string(gguf_key) + "=" + std::to_string(gguf);
    // Without the MLA keys llama.cpp sizes the MLA heads with kda.head_dim.
    const std::string_view k(gguf_key);
    if (k == "attention.key_length_mla")
      gguf_text = d.mla_qk_nope != 0
                      ? "GGUF kimi-k3.attention.key_length_mla - rope.dimension_count = " + std::to_string(gguf)
                      : "GGUF kimi-k3.kda.head_dim=" + std::to_string(gguf) + " (no attention.key_length_mla)";
    if (k == "attention.value_length_mla" && d.mla_v_head == 0)
      gguf_text = "GGUF kimi-k3.kda.head_dim=" + std::to_string(gguf) + " (no attention.value_length_mla)";
    Mismatch(prefix + key, gguf_key, config + ": " + prefix + key + "=" + it->dump() + ", " + gguf_text, *it, gguf);
  }

  // A flag the GGUF's tensors imply (`tensor`, of the first layer that
  // holds one): present in the config and not true.
  void Flag(const nlohmann::json& obj, const std::string& prefix, const char* key, const std::string& tensor,
            const std::string& what_the_gguf_holds) {
    auto it = obj.find(key);
    if (tensor.empty() || it == obj.end() || (it->is_boolean() && it->get<bool>())) return;
    Finding& f = out.Add("config-gguf-mismatch", tensor,
                         config + ": " + prefix + key + "=" + it->dump() + ", but the GGUF holds " + what_the_gguf_holds,
                         {}, config);
    f.details = {{"config_key", prefix + key}, {"config", *it}, {"gguf", true}};
  }

  // SGLang's model takes a layer's kind from `(il + 1) in kda_layers` (the
  // converter wrote head_count_kv from full_attn_layers, which SGLang never
  // reads); layers past the model are never asked about.
  void LayerKinds(const nlohmann::json* linear) {
    std::vector<uint32_t> gguf_kda;
    for (uint32_t il = 0; il < d.num_layers; ++il)
      if (!synth::IsMlaLayer(d, il)) gguf_kda.push_back(il + 1);
    if (linear == nullptr) {
      if (!gguf_kda.empty())
        Mismatch("linear_attn_config", "attention.head_count_kv",
                 config + " has no linear_attn_config: SGLang builds every layer as MLA, the GGUF's "
                 "kimi-k3.attention.head_count_kv makes " + std::to_string(gguf_kda.size()) + " layer(s) KDA",
                 nullptr, gguf_kda);
      return;
    }
    auto it = linear->find("kda_layers");
    if (it == linear->end() || !it->is_array()) {
      Finding& f = out.Add("config-invalid", "linear_attn_config.kda_layers",
                           config + ": linear_attn_config.kda_layers must be a list of 1-based layer numbers (SGLang takes each "
                           "layer's kind from it), got " + (it == linear->end() ? std::string("no such key") : it->dump()),
                           {}, config);
      f.details = {{"config_key", "linear_attn_config.kda_layers"}};
      return;
    }
    uint32_t differ = 0, first = 0;
    for (uint32_t il = 0; il < d.num_layers; ++il) {
      const bool kda_in_gguf = !synth::IsMlaLayer(d, il);
      if (kda_in_gguf != PythonListHas(*it, il + 1) && differ++ == 0) first = il + 1;
    }
    if (differ == 0) return;
    const bool config_says_kda = PythonListHas(*it, first);
    Mismatch("linear_attn_config.kda_layers", "attention.head_count_kv",
             config + ": linear_attn_config.kda_layers and GGUF kimi-k3.attention.head_count_kv disagree on " +
                 std::to_string(differ) + " layer(s); first: layer " + std::to_string(first) + " (1-based) is " +
                 (config_says_kda ? "KDA" : "MLA") + " in config.json, " + (config_says_kda ? "MLA" : "KDA") +
                 " in the GGUF",
             *it, gguf_kda);
  }
};

}  // namespace

namespace {

// The config's top-level JSON object; nullopt when it cannot be read or is
// no JSON object (the spec's own finding says which).
std::optional<nlohmann::json> ConfigObject(const std::string& config) {
  auto text = ReadFileToString(config);
  if (!text.ok()) return std::nullopt;
  auto parsed = ParseJsonText(*text);
  if (!parsed.ok() || !parsed->is_object()) return std::nullopt;
  return std::move(*parsed);
}

const nlohmann::json* TextConfigOf(const nlohmann::json& top) {
  auto tc = top.find("text_config");
  return tc != top.end() && tc->is_object() ? &*tc : nullptr;
}

}  // namespace

std::optional<nlohmann::json> ModelKeysOf(const std::string& config) {
  std::optional<nlohmann::json> top = ConfigObject(config);
  if (!top) return std::nullopt;
  if (const nlohmann::json* tc = TextConfigOf(*top)) return *tc;
  return top;
}

bool HasTextConfig(const std::string& config) {
  const std::optional<nlohmann::json> top = ConfigObject(config);
  return !top || TextConfigOf(*top) != nullptr;
}

void CrossCheckConfig(const kimi::ModelSpec& spec, const std::string& config, const kimi::SynthDims& d,
                      Collector& out) {
  Checker check{d, config, out};
  struct Pair { const char* cfg; const char* key; uint64_t a, b; };
  const Pair spec_pairs[] = {
      {"num_hidden_layers", "block_count", spec.num_hidden_layers, d.num_layers},
      {"first_k_dense_replace", "leading_dense_block_count", spec.first_k_dense_replace, d.first_k_dense},
      {"num_experts", "expert_count", spec.num_experts, d.num_experts},
      {"num_experts_per_token", "expert_used_count", spec.top_k, d.top_k},
      {"num_shared_experts", "expert_shared_count", spec.num_shared_experts, d.num_shared_experts},
      {"hidden_size", "embedding_length", spec.hidden_size, d.hidden},
      {"routed_expert_hidden_size", "expert_latent_length", spec.routed_expert_hidden_size, d.latent},
      {"moe_intermediate_size", "expert_feed_forward_length", spec.moe_intermediate_size, d.moe_intermediate},
  };
  for (const Pair& p : spec_pairs) {
    if (p.a == p.b) continue;
    check.Mismatch(p.cfg, p.key,
                   config + ": " + p.cfg + "=" + std::to_string(p.a) + ", GGUF kimi-k3." + p.key + "=" +
                       std::to_string(p.b),
                   p.a, p.b);
  }
  // The spec was read from it a moment ago; a vanished file says nothing of the model.
  const std::optional<nlohmann::json> keys = ModelKeysOf(config);
  if (!keys) return;
  const nlohmann::json& c = *keys;
  // KimiK3Spec's keys, whose values are compared above: SGLang's manifest
  // tool takes int() of them, its model sizes modules and ranges with them.
  for (const char* key : {"num_hidden_layers", "first_k_dense_replace", "num_experts", "num_experts_per_token",
                          "num_shared_experts", "hidden_size", "routed_expert_hidden_size", "moe_intermediate_size"}) {
    if (auto it = c.find(key); it != c.end() && !IsSize(*it)) check.NotASize(key, *it);
  }
  check.Size(c, "", "num_attention_heads", "attention.head_count", d.heads);
  check.Size(c, "", "q_lora_rank", "attention.q_lora_rank", d.q_lora_rank, /*null_is_zero=*/true);
  check.Size(c, "", "kv_lora_rank", "attention.kv_lora_rank", d.kv_lora_rank);
  check.Size(c, "", "qk_rope_head_dim", "rope.dimension_count", d.qk_rope);
  check.Size(c, "", "qk_nope_head_dim", "attention.key_length_mla", synth::MlaQkNope(d));
  check.Size(c, "", "v_head_dim", "attention.value_length_mla", synth::MlaVHead(d));
  if (d.first_k_dense > 0) check.Size(c, "", "intermediate_size", "feed_forward_length", d.dense_intermediate);
  check.Size(c, "", "attn_res_block_size", "attn_res.block_size", d.attn_res_block_size);
  if (d.vocab != 0) check.Size(c, "", "vocab_size", "vocab_size", d.vocab);
  std::string first_mla_gate, first_kda_gate;
  for (uint32_t il = d.num_layers; il-- > 0;)
    (synth::IsMlaLayer(d, il) ? first_mla_gate : first_kda_gate) = "blk." + std::to_string(il) + ".";
  if (!first_mla_gate.empty()) first_mla_gate += "attn_gate.weight";
  if (!first_kda_gate.empty()) first_kda_gate += "ssm_g.weight";
  check.Flag(c, "", "mla_use_output_gate", first_mla_gate,
             "an output gate (attn_gate) in every MLA layer, which SGLang would skip");
  auto linear = c.find("linear_attn_config");
  const bool has_linear = linear != c.end() && linear->is_object();
  if (has_linear) {
    check.Size(*linear, "linear_attn_config.", "num_heads", "attention.head_count", d.heads);
    check.Size(*linear, "linear_attn_config.", "head_dim", "kda.head_dim", d.head_dim);
    check.Size(*linear, "linear_attn_config.", "short_conv_kernel_size", "ssm.conv_kernel", d.conv_kernel);
    check.Flag(*linear, "linear_attn_config.", "use_full_rank_gate", first_kda_gate,
               "a full-rank output gate (ssm_g) in every KDA layer, which SGLang's low-rank gate does not load");
  }
  check.LayerKinds(has_linear ? &*linear : nullptr);
}

}  // namespace k3pack::doctor::internal
