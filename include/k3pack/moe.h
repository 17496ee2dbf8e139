// CPU forward of Kimi-K3's routed experts for one token (spec §4.5).
//
// The router scores every expert with sigmoid(logit), picks the top-k by
// score + exp_probs_b (the bias only chooses), weights the chosen experts by
// their unbiased scores (renormalized, then scaled), and runs each chosen
// expert on the latent vector: down(situ(gate . x, up . x)). Expert weights
// come through a callback so the same code runs from GGUF source tensors or
// from the expert store.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "k3pack/error.h"
#include "k3pack/ggml_types.h"

namespace k3pack::moe {

// One expert's three matrices in ggml layout: gate/up ne = (latent, inter)
// (inter rows of latent elements), down ne = (inter, latent).
struct ExpertWeights {
  std::span<const uint8_t> up, gate, down;
  GgmlType up_type = GgmlType::F32, gate_type = GgmlType::F32, down_type = GgmlType::F32;
};
using ExpertSource = std::function<Result<ExpertWeights>(uint32_t layer, uint32_t expert)>;

struct MoeConfig {
  uint32_t num_experts = 0;
  uint32_t top_k = 0;
  int64_t latent = 0;  // routed_expert_hidden_size
  int64_t inter = 0;   // moe_intermediate_size
  bool expert_weights_norm = true;    // divide by the sum of the chosen scores
  float expert_weights_scale = 1.0f;  // routed_scaling_factor; 0 or 1 = none
  float situ_beta = 4.0f;
  float situ_lambda = 25.0f;  // <= 0: u passes through unchanged
  // true: activations quantized to Q8_K/Q8_0 and integer dots, as ggml's CPU
  // backend does; false: float dots on decoded rows (reference).
  bool quantize_activations = true;
  int threads = 1;
};

struct Routing {
  std::vector<uint32_t> experts;  // chosen experts, best first
  std::vector<float> weights;     // final weight of each
};

// SiTU(g, u) = beta*tanh(g/beta)*sigmoid(g) * lambda*tanh(u/lambda).
float Situ(float g, float u, float beta, float lambda);

// Router decision from logits (W_router . x_full), one per expert.
// `exp_probs_b` may be empty (no selection bias).
Result<Routing> Route(std::span<const float> logits, std::span<const float> exp_probs_b, const MoeConfig& cfg);

// logits = W_router . x for a router tensor of `num_experts` rows of x.size().
Result<std::vector<float>> RouterLogits(GgmlType type, std::span<const uint8_t> bytes, std::span<const float> x,
                                        uint32_t num_experts);

// One expert on the latent vector: down(situ(gate . x, up . x)), `latent` values.
Result<std::vector<float>> ExpertForward(const ExpertWeights& w, std::span<const float> x_lat, const MoeConfig& cfg);

// Sum over the routed experts of weight * ExpertForward.
Result<std::vector<float>> RoutedForward(uint32_t layer, const Routing& routing, std::span<const float> x_lat,
                                         const ExpertSource& source, const MoeConfig& cfg);

// Route + RoutedForward.
Result<std::vector<float>> Forward(uint32_t layer, std::span<const float> logits, std::span<const float> exp_probs_b,
                                   std::span<const float> x_lat, const ExpertSource& source, const MoeConfig& cfg);

}  // namespace k3pack::moe
