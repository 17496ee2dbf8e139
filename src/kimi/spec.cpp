// Kimi-K3 model spec from config.json, with SGLang's KimiK3Spec checks, and
// the cross-check of that spec against the GGUF metadata.
#include <charconv>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "k3pack/gguf.h"
#include "k3pack/kimi.h"
#include "util/file.h"
#include "util/pyint.h"
#include "util/pyrepr.h"
#include "util/json_text.h"

namespace k3pack::kimi {
namespace {

template <typename T>
Result<T> InRange(int64_t v, const std::string& key) {
  if (v < 0 || static_cast<uint64_t>(v) > std::numeric_limits<T>::max()) {
    return Error("model config key '" + key + "' is out of range: " + std::to_string(v));
  }
  return static_cast<T>(v);
}

std::string SpecRepr(int64_t layers, int64_t first_dense, int64_t experts, int64_t top_k, int64_t shared,
                     int64_t hidden, int64_t routed_hidden, int64_t moe_inter, const std::string& act) {
  return "{'num_hidden_layers': " + std::to_string(layers) +
         ", 'first_k_dense_replace': " + std::to_string(first_dense) +
         ", 'num_experts': " + std::to_string(experts) + ", 'top_k': " + std::to_string(top_k) +
         ", 'num_shared_experts': " + std::to_string(shared) + ", 'hidden_size': " + std::to_string(hidden) +
         ", 'routed_expert_hidden_size': " + std::to_string(routed_hidden) +
         ", 'moe_intermediate_size': " + std::to_string(moe_inter) + ", 'hidden_act': " + PyRepr(act) + "}";
}

}  // namespace

const char* ProfileName(Profile p) { return p == Profile::kKimiK3 ? "kimi-k3" : "scaled"; }

Result<Profile> ParseProfile(std::string_view name) {
  if (name == "kimi-k3") return Profile::kKimiK3;
  if (name == "scaled") return Profile::kScaled;
  return Error("unknown profile " + PyRepr(name) + " (expected 'kimi-k3' or 'scaled')");
}

Result<ModelSpec> ModelSpecFromConfig(const nlohmann::json& config, Profile profile) {
  if (!config.is_object()) return Error("model config must be a JSON object");
  const nlohmann::json* text = &config;
  if (auto it = config.find("text_config"); it != config.end()) {
    if (!it->is_object()) return Error("model config 'text_config' must be a JSON object");
    text = &*it;
  }
  // Read in SGLang's order, so the first missing key is the one Python names.
  static const char* const kIntKeys[] = {"num_hidden_layers", "first_k_dense_replace", "num_experts",
                                         "num_experts_per_token", "num_shared_experts", "hidden_size",
                                         "routed_expert_hidden_size", "moe_intermediate_size"};
  int64_t v[8];
  for (int i = 0; i < 8; ++i) {
    auto it = text->find(kIntKeys[i]);
    if (it == text->end()) return Error(PyRepr(kIntKeys[i]), ErrorKind::kKey);
    // SGLang's from_config: int(text_config[key]), Python's own error text.
    auto value = k3pack::PyInt(*it);
    if (!value.ok()) return value.error().WithHint("model config key '" + std::string(kIntKeys[i]) + "'");
    v[i] = *value;
  }
  auto act_it = text->find("hidden_act");
  if (act_it == text->end()) return Error(PyRepr("hidden_act"), ErrorKind::kKey);
  std::string act = k3pack::PyStr(*act_it);  // str(x): None, True, 1

  if (profile == Profile::kKimiK3) {
    const bool match = v[0] == kK3NumHiddenLayers && v[1] == kK3FirstKDenseReplace && v[2] == kK3NumExperts &&
                       v[3] == kK3TopK && v[4] == kK3NumSharedExperts && v[5] == static_cast<int64_t>(kK3HiddenSize) &&
                       v[6] == static_cast<int64_t>(kK3RoutedExpertHiddenSize) &&
                       v[7] == static_cast<int64_t>(kK3MoeIntermediateSize) && act == kK3HiddenAct;
    if (!match) {
      const std::string expected =
          SpecRepr(kK3NumHiddenLayers, kK3FirstKDenseReplace, kK3NumExperts, kK3TopK, kK3NumSharedExperts,
                   kK3HiddenSize, kK3RoutedExpertHiddenSize, kK3MoeIntermediateSize, std::string(kK3HiddenAct));
      const std::string actual = SpecRepr(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], act);
      return Error("Kimi K3 model invariants do not match the audited model: expected=" + expected +
                   ", actual=" + actual)
          .WithHint("the config is not the audited Kimi-K3; use --profile scaled for scaled-down models");
    }
  }

  ModelSpec spec;
  spec.profile = profile;
  K3_ASSIGN_OR_RETURN(spec.num_hidden_layers, InRange<uint32_t>(v[0], kIntKeys[0]));
  K3_ASSIGN_OR_RETURN(spec.first_k_dense_replace, InRange<uint32_t>(v[1], kIntKeys[1]));
  K3_ASSIGN_OR_RETURN(spec.num_experts, InRange<uint32_t>(v[2], kIntKeys[2]));
  K3_ASSIGN_OR_RETURN(spec.top_k, InRange<uint32_t>(v[3], kIntKeys[3]));
  K3_ASSIGN_OR_RETURN(spec.num_shared_experts, InRange<uint32_t>(v[4], kIntKeys[4]));
  K3_ASSIGN_OR_RETURN(spec.hidden_size, InRange<uint64_t>(v[5], kIntKeys[5]));
  K3_ASSIGN_OR_RETURN(spec.routed_expert_hidden_size, InRange<uint64_t>(v[6], kIntKeys[6]));
  K3_ASSIGN_OR_RETURN(spec.moe_intermediate_size, InRange<uint64_t>(v[7], kIntKeys[7]));
  spec.hidden_act = act;
  // The layer list is materialized; keep a corrupt config from asking for billions.
  if (spec.num_hidden_layers > kMaxLayers) {
    return Error("model config num_hidden_layers=" + std::to_string(v[0]) + " is implausibly large (max " +
                 std::to_string(kMaxLayers) + ")");
  }
  for (uint32_t l = spec.first_k_dense_replace; l < spec.num_hidden_layers; ++l) spec.active_moe_layer_ids.push_back(l);

  if (profile == Profile::kKimiK3) {
    bool ok = spec.active_moe_layer_ids.size() == 92;
    for (size_t i = 0; ok && i < spec.active_moe_layer_ids.size(); ++i) ok = spec.active_moe_layer_ids[i] == i + 1;
    if (!ok) return Error("Kimi K3 active MoE layers must be exactly 1..92");
  } else {
    if (spec.active_moe_layer_ids.empty()) {
      return Error("model config has no MoE layers: first_k_dense_replace=" + std::to_string(v[1]) +
                   " >= num_hidden_layers=" + std::to_string(v[0]));
    }
    if (spec.num_experts == 0) return Error("model config num_experts must be >= 1, got 0");
    if (spec.top_k == 0 || spec.top_k > spec.num_experts) {
      return Error("model config num_experts_per_token must be in 1..num_experts=" + std::to_string(spec.num_experts) +
                   ", got " + std::to_string(spec.top_k));
    }
    if (spec.routed_expert_hidden_size == 0 || spec.moe_intermediate_size == 0) {
      return Error("model config routed_expert_hidden_size and moe_intermediate_size must be >= 1");
    }
  }
  return spec;
}

Result<ModelSpec> LoadModelSpec(const std::string& config_path, Profile profile) {
  K3_ASSIGN_OR_RETURN(std::string text, ReadFileToString(config_path));
  auto config = ParseJsonText(text);
  if (!config.ok()) return Error(config_path + ": model config is not valid JSON: " + config.error().message());
  auto spec = ModelSpecFromConfig(*config, profile);
  // k3pack's own texts ("model config ...") get the file's name; SGLang's
  // (KeyError, the invariant texts, int()'s) stay verbatim.
  if (!spec.ok() && spec.error().message().rfind("model config", 0) == 0) return spec.error().WithContext(config_path);
  return spec;
}

Status CrossCheckGguf(const ModelSpec& spec, const gguf::ShardSet& shards) {
  const gguf::GgufFile& first = shards.first();
  std::string arch = first.architecture();
  if (arch.empty()) arch = "kimi-k3";
  struct Check {
    const char* suffix;
    const char* config_key;
    uint64_t expected;
    bool zero_means_absent;
  };
  const Check checks[] = {
      {"block_count", "num_hidden_layers", spec.num_hidden_layers, false},
      {"leading_dense_block_count", "first_k_dense_replace", spec.first_k_dense_replace, false},
      {"expert_count", "num_experts", spec.num_experts, false},
      {"expert_used_count", "num_experts_per_token", spec.top_k, false},
      {"expert_shared_count", "num_shared_experts", spec.num_shared_experts, false},
      {"embedding_length", "hidden_size", spec.hidden_size, false},
      {"expert_latent_length", "routed_expert_hidden_size", spec.routed_expert_hidden_size, true},
      {"expert_feed_forward_length", "moe_intermediate_size", spec.moe_intermediate_size, false},
  };
  for (const Check& c : checks) {
    const std::string key = arch + "." + c.suffix;
    const gguf::Value* value = first.Find(key);
    if (value == nullptr) continue;
    auto got = value->AsInt();
    if (!got) {
      return Error(first.path() + ": GGUF metadata " + key + " must be an integer, got type " +
                   gguf::ValueTypeName(value->type));
    }
    if (*got == 0 && c.zero_means_absent) continue;
    if (*got < 0 || static_cast<uint64_t>(*got) != c.expected) {
      return Error("GGUF metadata " + key + "=" + std::to_string(*got) + " disagrees with model config " +
                   c.config_key + "=" + std::to_string(c.expected) + " (" + first.path() + ")")
          .WithHint("the config.json does not describe this GGUF; pass the config of the same checkpoint");
    }
  }
  return Status::OK();
}

}  // namespace k3pack::kimi
