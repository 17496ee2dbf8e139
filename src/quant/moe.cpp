// Routed-expert forward (router + SiTU experts) on top of the quant dots.
#include "k3pack/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "k3pack/quant.h"

namespace k3pack::moe {
namespace {

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// rows x n matrix of type t times x, through the quant dot path. `rows_from`
// names the setting the row count comes from, for the errors.
Result<std::vector<float>> MatVec(GgmlType t, std::span<const uint8_t> bytes, std::span<const float> x,
                                  uint64_t rows, const char* rows_from, bool quantize, int threads, const char* what) {
  uint64_t need = 0;
  // A byte count that wraps would pass the size check below with a few bytes
  // at hand, and y(rows) would then throw out of this Result function.
  if (__builtin_mul_overflow(GgmlRowBytes(t, x.size()), rows, &need)) {
    return Error(std::string(what) + ": " + rows_from + " " + std::to_string(rows) + " rows of " +
                 std::to_string(x.size()) + " " + std::string(GgmlTypeName(t)) +
                 " elements need more bytes than a 64-bit count holds");
  }
  if (bytes.size() < need) {
    return Error(std::string(what) + ": " + std::to_string(rows) + " rows of " + std::to_string(x.size()) + " " +
                 std::string(GgmlTypeName(t)) + " elements need " + std::to_string(need) + " bytes, got " +
                 std::to_string(bytes.size()));
  }
  K3_ASSIGN_OR_RETURN(auto act, quant::PrepareActivation(t, x, quantize));
  std::vector<float> y(rows);
  K3_RETURN_IF_ERROR(quant::MatVec(bytes, rows, act, y, threads));
  return y;
}

}  // namespace

float Situ(float g, float u, float beta, float lambda) {
  const float gp = beta * std::tanh(g / beta) * Sigmoid(g);
  const float up = lambda > 0 ? lambda * std::tanh(u / lambda) : u;
  return gp * up;
}

Result<Routing> Route(std::span<const float> logits, std::span<const float> exp_probs_b, const MoeConfig& cfg) {
  const size_t n = logits.size();
  if (n != cfg.num_experts) {
    return Error("moe: " + std::to_string(n) + " router logits for " + std::to_string(cfg.num_experts) + " experts");
  }
  if (!exp_probs_b.empty() && exp_probs_b.size() != n) {
    return Error("moe: exp_probs_b has " + std::to_string(exp_probs_b.size()) + " values for " + std::to_string(n) +
                 " experts");
  }
  if (cfg.top_k == 0 || cfg.top_k > n) {
    return Error("moe: top_k " + std::to_string(cfg.top_k) + " outside 1.." + std::to_string(n));
  }
  std::vector<float> p(n), sel(n);
  for (size_t e = 0; e < n; ++e) {
    p[e] = Sigmoid(logits[e]);
    sel[e] = exp_probs_b.empty() ? p[e] : p[e] + exp_probs_b[e];
    // A NaN is unordered: the top-k comparison below would no longer be a
    // strict weak ordering (undefined behaviour in partial_sort) and which
    // experts run would be arbitrary. A NaN logit or bias means a broken
    // router tensor or hidden state, so it is named instead.
    if (std::isnan(sel[e])) {
      return Error("moe: the selection score of expert " + std::to_string(e) + " is NaN (router logit " +
                   std::to_string(logits[e]) +
                   (exp_probs_b.empty() ? std::string() : ", exp_probs_b " + std::to_string(exp_probs_b[e])) + ")");
    }
  }
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  // Highest selection score first; ties go to the lower expert id.
  std::partial_sort(order.begin(), order.begin() + cfg.top_k, order.end(), [&](uint32_t a, uint32_t b) {
    return sel[a] != sel[b] ? sel[a] > sel[b] : a < b;
  });
  Routing r;
  r.experts.assign(order.begin(), order.begin() + cfg.top_k);
  for (uint32_t e : r.experts) r.weights.push_back(p[e]);
  if (cfg.expert_weights_norm) {
    float sum = 0;
    for (float w : r.weights) sum += w;
    sum = std::max(sum, 6.103515625e-5f);
    for (float& w : r.weights) w /= sum;
  }
  if (cfg.expert_weights_scale != 0.0f && cfg.expert_weights_scale != 1.0f) {
    for (float& w : r.weights) w *= cfg.expert_weights_scale;
  }
  return r;
}

Result<std::vector<float>> RouterLogits(GgmlType type, std::span<const uint8_t> bytes, std::span<const float> x,
                                        uint32_t num_experts) {
  return MatVec(type, bytes, x, num_experts, "num_experts", /*quantize=*/false, 1, "moe router");
}

Result<std::vector<float>> ExpertForward(const ExpertWeights& w, std::span<const float> x_lat, const MoeConfig& cfg) {
  if (static_cast<int64_t>(x_lat.size()) != cfg.latent) {
    return Error("moe: latent vector has " + std::to_string(x_lat.size()) + " values, expected " +
                 std::to_string(cfg.latent));
  }
  if (cfg.inter < 0) return Error("moe: MoeConfig::inter " + std::to_string(cfg.inter) + " is negative");
  const uint64_t inter = static_cast<uint64_t>(cfg.inter), latent = static_cast<uint64_t>(cfg.latent);
  constexpr const char* kInter = "MoeConfig::inter";
  K3_ASSIGN_OR_RETURN(auto g, MatVec(w.gate_type, w.gate, x_lat, inter, kInter, cfg.quantize_activations,
                                     cfg.threads, "moe expert gate"));
  K3_ASSIGN_OR_RETURN(auto u, MatVec(w.up_type, w.up, x_lat, inter, kInter, cfg.quantize_activations, cfg.threads,
                                     "moe expert up"));
  std::vector<float> act(inter);
  for (uint64_t i = 0; i < inter; ++i) act[i] = Situ(g[i], u[i], cfg.situ_beta, cfg.situ_lambda);
  return MatVec(w.down_type, w.down, act, latent, "MoeConfig::latent", cfg.quantize_activations, cfg.threads,
                "moe expert down");
}

Result<std::vector<float>> RoutedForward(uint32_t layer, const Routing& routing, std::span<const float> x_lat,
                                         const ExpertSource& source, const MoeConfig& cfg) {
  if (!source) return Error("moe: no expert weight source");
  if (routing.weights.size() != routing.experts.size()) {
    return Error("moe: routing has " + std::to_string(routing.experts.size()) + " experts and " +
                 std::to_string(routing.weights.size()) + " weights");
  }
  std::vector<float> out(static_cast<size_t>(cfg.latent), 0.0f);
  for (size_t k = 0; k < routing.experts.size(); ++k) {
    const uint32_t e = routing.experts[k];
    auto w = source(layer, e);
    if (!w.ok()) return w.error().WithContext("moe layer " + std::to_string(layer) + " expert " + std::to_string(e));
    auto y = ExpertForward(*w, x_lat, cfg);
    if (!y.ok()) return y.error().WithContext("moe layer " + std::to_string(layer) + " expert " + std::to_string(e));
    for (size_t i = 0; i < out.size(); ++i) out[i] += routing.weights[k] * (*y)[i];
  }
  return out;
}

Result<std::vector<float>> Forward(uint32_t layer, std::span<const float> logits, std::span<const float> exp_probs_b,
                                   std::span<const float> x_lat, const ExpertSource& source, const MoeConfig& cfg) {
  K3_ASSIGN_OR_RETURN(auto routing, Route(logits, exp_probs_b, cfg));
  return RoutedForward(layer, routing, x_lat, source, cfg);
}

}  // namespace k3pack::moe
