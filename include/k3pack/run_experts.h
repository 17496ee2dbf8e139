// Routed-expert blocks run twice for the same synthetic tokens: once with the
// expert bytes served by an ExpertStore from the pack, once with the bytes
// sliced straight out of the GGUF source tensors. Both runs use the same code
// and the same float operation order, so a pack that holds the right bytes for
// every (layer, expert, role) gives bit-identical outputs; any difference
// means the pack (or the store) served the wrong bytes. This is the end-to-end
// proof behind `k3pack run-experts`.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "k3pack/error.h"
#include "k3pack/progress.h"
#include "k3pack/store.h"
#include "k3pack/trace.h"

namespace k3pack::gguf {
class ShardSet;
}

namespace k3pack::store {

struct ExpertRunOptions {
  uint32_t layer = 0;
  uint32_t tokens = 1;
  uint64_t seed = 1;                  // hidden states are N(0, 1) from this seed
  bool quantize_activations = true;   // integer dots as ggml's CPU backend (false: float reference)
  int threads = 1;
  // > 1: also run the block as ep_size EP ranks, one thread each (fewer where
  // the process gives fewer) with its own rank store, and sum their partial
  // outputs (see RunRoutedExperts).
  uint32_t ep_size = 1;
  // The block's input hidden states, tokens x hidden (row-major); null: N(0, 1)
  // from `seed`.
  const std::vector<float>* hidden = nullptr;
  // Fill ExpertRunResult::hidden_out (the residual stream after the block).
  bool residual_out = false;
  // Router look-ahead: also route each token's input hidden state through
  // layer `predict_layer`'s router (ffn_gate_inp + exp_probs_b, the routing
  // rule itself) and keep its top `predict_k` experts (0: top_k).
  std::optional<uint32_t> predict_layer;
  uint32_t predict_k = 0;
  // RunLayerStack only: also record next-token predictions (trace flag bit
  // 3). A proxy: each layer's own router on the token's own MoE input (its
  // top predict_k), standing in for a predictor of the next token's route.
  bool predict_next_token = false;
  // RunLayerStack only: told after each layer (phase "run", unit "layers"),
  // for a caller that shows progress on a long stack.
  ProgressFn progress;
};

// The progress report of `done` of `total` layers run (phase "run", unit
// "layers"): what RunLayerStack and the command line's layer loop report.
Progress LayerProgress(size_t done, size_t total);

// One EP rank's share of an --ep-size run.
struct EpRankRun {
  uint32_t rank = 0;
  uint32_t first_expert = 0, end_expert = 0;   // owned experts [first, end)
  std::string pack_path;
  uint64_t routes = 0, acquire_calls = 0;      // routes it served, tokens it saw
  uint64_t hits = 0, misses = 0, bytes_read = 0;
  double seconds = 0;
};

struct ExpertRunResult {
  uint32_t layer = 0, tokens = 0, top_k = 0, num_experts = 0;
  int64_t hidden = 0, latent = 0, inter = 0;
  std::vector<std::vector<uint32_t>> routed;  // per token: chosen experts, best first
  std::vector<float> hidden_in;                // tokens x hidden: the block's input
  std::vector<float> hidden_out;               // residual_out: hidden_in + ffn_routed_up . from_store
  std::vector<std::vector<uint32_t>> predicted;  // predict_layer: per token, its predicted experts, best first
  std::vector<float> from_store, from_source;  // tokens x latent, row-major
  uint64_t mismatched_values = 0;              // bitwise differences
  double max_abs_diff = 0;
  std::string store_sha256, source_sha256;     // of the float32 outputs' bytes
  double acquire_seconds = 0, store_compute_seconds = 0, source_compute_seconds = 0;
  uint64_t hits = 0, misses = 0, bytes_read = 0;  // the store's counters for this run
  // ep_size > 1: the ranks' summed output and how it compares to from_store.
  uint32_t ep_size = 1;
  std::vector<EpRankRun> ranks;
  std::vector<float> from_ranks;
  uint64_t rank_mismatched_values = 0;         // bitwise differences from from_store
  std::string ranks_sha256;
  bool matches() const { return mismatched_values == 0 && rank_mismatched_values == 0; }
};

// Errors name the missing tensor, a dimension disagreement between the pack
// and the source, or the store's own error (SGLang's texts) for the layer.
//
// The reduction order is fixed, so outputs are bit-reproducible: per token,
// the routed experts are grouped by the EP rank that owns them (k3pack/ep.h,
// ep_size 1: one group); each group is summed from zero in router order
// (best first), and the group sums are added rank 0, 1, ..., N-1 to a zero
// vector. The single store, the GGUF source and the N rank stores all use
// this order, so with --ep-size N the ranks' sum equals the single store's
// output bit for bit when every rank store serves the right bytes.
// `rank_stores` (ep_size > 1): the stores of ranks 0..N-1, in order; each
// must serve its rank (info().ep). A rank acquires one call per token with
// that token's routes to it (none: no call).
Result<ExpertRunResult> RunRoutedExperts(ExpertStore& store, const gguf::ShardSet& source,
                                         const ExpertRunOptions& options,
                                         const std::vector<std::shared_ptr<ExpertStore>>& rank_stores = {});

nlohmann::json ExpertRunJson(const ExpertRunResult& r);

// Layer `layer`'s routing decision for hidden state `x`: its `k` experts with
// the highest selection score (sigmoid(ffn_gate_inp . x) + exp_probs_b), best
// first, exactly as the routed block chooses them (k = top_k gives its routes).
Result<std::vector<uint32_t>> RouteHidden(const gguf::ShardSet& source, uint32_t layer, std::span<const float> x,
                                          uint32_t k);

// `layers` (ascending routed layers) run as one stack for the same tokens:
// layer i's input is layer i-1's residual stream (its input plus its routed
// block's output through ffn_routed_up; attention, norms and shared experts
// are left out), the first layer's is N(0, 1) from options.seed. Each layer
// but the last also predicts the next one's routes by applying that layer's
// router to its own input (the MoE input: known when its acquire is made,
// one layer before the predicted acquire). The trace (format v2) holds the
// tokens decoded one after another: per token, one record per layer with
// its routes and predictions (predict_k ids per row).
struct LayerStackResult {
  std::vector<ExpertRunResult> layers;
  trace::Trace trace;
  uint32_t predict_k = 0;
  // Routes of every predicted layer (all but the first) and how many of them
  // were predicted; per predicted layer too (index i: layers[i + 1]).
  uint64_t predicted_routes = 0, predicted_right = 0;
  std::vector<uint64_t> layer_routes, layer_right;
  // predict_next_token: routes of every token but the first, and how many of
  // them the previous token's proxy prediction (same layer) held.
  uint64_t next_token_routes = 0, next_token_right = 0;
  double accuracy() const { return predicted_routes ? double(predicted_right) / double(predicted_routes) : 0.0; }
};
Result<LayerStackResult> RunLayerStack(ExpertStore& store, const gguf::ShardSet& source,
                                       const ExpertRunOptions& options, const std::vector<uint32_t>& layers,
                                       const std::vector<std::shared_ptr<ExpertStore>>& rank_stores = {});
nlohmann::json LayerStackJson(const LayerStackResult& r);

}  // namespace k3pack::store
