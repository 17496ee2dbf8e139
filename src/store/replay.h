// Trace replay against the real store, and policy sweeps with an SVG plot:
// the engines behind `k3pack trace replay/sweep` and bench_store.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "k3pack/error.h"
#include "k3pack/progress.h"
#include "k3pack/store.h"
#include "k3pack/trace.h"
#include "store/simulate.h"

namespace k3pack::store {

struct ReplayOptions {
  std::string pack_path, manifest_path;
  std::string trace_path;  // names the trace in errors
  StoreOptions store;
  std::string prefetch = "none";  // "none" | "oracle-lookahead"
  uint32_t lookahead = 1;         // records ahead prefetched by the oracle
  std::function<void(uint64_t done, uint64_t total)> progress;
};

// Opens the store, replays every record (acquire, mark_used), closes it.
// Returns {hits, misses, hit_rate, tokens, bytes_read, bytes_per_token,
// seconds, gb_per_s, read_latency_ms{...}, open_seconds, stats{...}}.
Result<nlohmann::json> ReplayOnStore(const trace::Trace& trace, const ReplayOptions& options);

// A trace whose experts or top_k differ from the manifest's: "T: trace
// dimensions (experts 8, top_k 2) do not match manifest M (16, 2)" (no "T: "
// when `trace_path` is empty).
Error TraceDimensionMismatch(const std::string& trace_path, const trace::Trace& trace,
                             const std::string& manifest_path, uint32_t num_experts, uint32_t top_k);

struct SweepTable {
  std::vector<std::string> series;        // policy names (+ "belady")
  std::vector<uint64_t> capacity_objects; // x values
  std::vector<std::vector<double>> hit_rate;  // [series][size]
  // The counts behind each rate (a script needs them for bytes per token
  // and to add runs up): hits + misses is every call's distinct objects.
  std::vector<std::vector<uint64_t>> hits, misses, bytes_read;  // [series][size]
  uint64_t num_objects = 0;
};

// Every policy (and with `belady`, Belady when the object size is uniform)
// at every capacity; with `truth` (the generator's distribution for `trace`)
// and `belady` also the distribution-informed bound ("informed"), and with
// `references` the slower references it names. Runs on `threads` threads;
// `progress` (may be empty) counts finished simulations.
struct SweepReferences {
  bool learner = false;        // "learner": the learning reference
  bool informed_next = false;  // "informed+next": informed, told each request's next call
};
Result<SweepTable> Sweep(const CallSeq& seq, const ObjectSpace& space, const std::vector<std::string>& policies,
                         const std::vector<uint64_t>& capacity_objects, bool belady,
                         const trace::Trace* trace = nullptr, const trace::TrueDistribution* truth = nullptr,
                         unsigned threads = 1, const ProgressFn& progress = {}, SweepReferences references = {});
// The cache sizes `trace sweep` uses without --sizes: 0.54, 1, 2, 3.5, 5, 8,
// 12 and 20% of all objects (the Kimi-K3 range). A model too small for them
// (sizes below top_k, which all behave alike, or repeats) gets distinct sizes
// from top_k up instead, and `note` says so; otherwise it is cleared.
// `owner` names whose objects `space` holds in the note ("the model", or
// "each EP rank" when the sizes are a rank's). No size is below
// `min_objects` (LargestCall of the trace: a batched call or a prefill chunk
// needs up to rows x top_k objects co-resident) nor below top_k.
std::vector<uint64_t> DefaultSweepSizes(const ObjectSpace& space, std::string* note,
                                        const std::string& owner = "the model", uint64_t min_objects = 0);
std::string SweepText(const SweepTable& t);
nlohmann::json SweepJson(const SweepTable& t);
// Hit rate vs cache size, one polyline per series.
std::string SweepSvg(const SweepTable& t, const std::string& title);

}  // namespace k3pack::store
