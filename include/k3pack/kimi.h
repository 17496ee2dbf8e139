// The Kimi-K3 model spec the pack and the manifest are built against.
//
// Read from the HF config.json (its `text_config` when present), the same
// keys SGLang's KimiK3Spec.from_config reads. Under Profile::kKimiK3 the
// audited K3 values are enforced with SGLang's exact error texts; under
// Profile::kScaled any dimensions are accepted (synthetic and scaled-down
// models), so the whole pipeline can run on small files.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "k3pack/error.h"

namespace k3pack::gguf {
class ShardSet;
}

namespace k3pack::kimi {

enum class Profile {
  kKimiK3,  // SGLang's strict invariants: 93 layers / 896 experts / top-16, layers 1..92
  kScaled,  // any dimensions; manifests carry the "k3pack" extension key
};
const char* ProfileName(Profile p);                    // "kimi-k3" / "scaled"
Result<Profile> ParseProfile(std::string_view name);   // ValueError naming the allowed values

// The audited Kimi-K3 values (SGLang's KimiK3Spec requirements).
inline constexpr uint32_t kK3NumHiddenLayers = 93;
inline constexpr uint32_t kK3FirstKDenseReplace = 1;
inline constexpr uint32_t kK3NumExperts = 896;
inline constexpr uint32_t kK3TopK = 16;
inline constexpr uint32_t kK3NumSharedExperts = 2;
inline constexpr uint64_t kK3HiddenSize = 7168;
inline constexpr uint64_t kK3RoutedExpertHiddenSize = 3584;
inline constexpr uint64_t kK3MoeIntermediateSize = 3072;
inline constexpr std::string_view kK3HiddenAct = "situ";

// k3pack's bound on a model's layers (Kimi-K3 has 93): every reader
// materializes per-layer state, so a corrupt config or manifest must not ask
// for billions.
inline constexpr uint32_t kMaxLayers = 1u << 16;

struct ModelSpec {
  uint32_t num_hidden_layers = 0;
  uint32_t first_k_dense_replace = 0;
  uint32_t num_experts = 0;
  uint32_t top_k = 0;  // config key num_experts_per_token
  uint32_t num_shared_experts = 0;
  uint64_t hidden_size = 0;
  uint64_t routed_expert_hidden_size = 0;
  uint64_t moe_intermediate_size = 0;
  std::string hidden_act;
  // range(first_k_dense_replace, num_hidden_layers); moe_layer_freq is
  // ignored, as in SGLang.
  std::vector<uint32_t> active_moe_layer_ids;
  Profile profile = Profile::kKimiK3;
};

// Parses an already-loaded config (top level or with text_config).
// Missing key -> ErrorKind::kKey with message `'key'` (Python KeyError repr).
// A value of the wrong JSON type -> ValueError naming the key.
// kKimiK3: `Kimi K3 model invariants do not match the audited model:
// expected={...}, actual={...}` and `Kimi K3 active MoE layers must be
// exactly 1..92`. kScaled: only sanity (num_experts >= 1, 1 <= top_k <=
// num_experts, first_k_dense_replace < num_hidden_layers).
Result<ModelSpec> ModelSpecFromConfig(const nlohmann::json& config, Profile profile);
// Reads and parses `config_path` (errors name the file).
Result<ModelSpec> LoadModelSpec(const std::string& config_path, Profile profile);

// Cross-checks the spec against the GGUF metadata of shard 0:
// kimi-k3.block_count, expert_count, expert_used_count,
// leading_dense_block_count, expert_feed_forward_length, expert_shared_count,
// embedding_length and expert_latent_length (each only if present; 0 for
// expert_latent_length means "no latent" and is not compared). A
// disagreement is a ValueError naming the key and both values.
Status CrossCheckGguf(const ModelSpec& spec, const gguf::ShardSet& shards);

}  // namespace k3pack::kimi
