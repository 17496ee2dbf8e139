// Routed-expert blocks run twice for the same synthetic tokens: once with the
// expert bytes served by an ExpertStore from the pack, once with the bytes
// sliced straight out of the GGUF source tensors. Both runs use the same code
// and the same float operation order, so a pack that holds the right bytes for
// every (layer, expert, role) gives bit-identical outputs; any difference
// means the pack (or the store) served the wrong bytes. This is the end-to-end
// proof behind `k3pack run-experts`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "k3pack/error.h"
#include "k3pack/store.h"

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
  // > 1: also run the block as ep_size EP ranks, one thread each with its own
  // rank store, and sum their partial outputs (see RunRoutedExperts).
  uint32_t ep_size = 1;
};

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

}  // namespace k3pack::store
