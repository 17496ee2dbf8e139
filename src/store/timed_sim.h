// Timed replay of a trace (`k3pack trace sweep --timing`): what a policy,
// with or without router look-ahead prefetch, costs in stall time and bytes.
//
// Model. One clock. Each acquire call waits until all its objects are
// readable, then computes for `layer_compute_s` (decode; a prefill call of n
// rows computes n times as long). The SSD serves reads first come first
// served at `ssd_bytes_per_s` with at most `queue_depth` in flight; a read
// completes `ssd_latency_s` after its last byte is transferred. A miss issues
// a demand read when its call starts. With prefetch, when a call starts
// computing, the predicted objects of the next layer (trace v2 predictions;
// Belady gets the true next call) that are not resident are admitted into
// the cache without evicting the call's own objects, and read; at most
// `prefetch_budget_bytes` of speculative reads are in flight (0 = no cap).
// With `lookahead` kNextToken the predictions issued when a call starts
// computing are instead its rows' predictions for the same layer at the
// request's next token (trace v2 next-token predictions; Belady gets the
// true next call of the same layer): a whole token of look-ahead instead of
// one layer. Their objects stay pinned against other prefetches until the
// next call of that layer starts (a demand miss can still evict them); the
// budget and staging rules are the same. A staged object is taken by any
// call of its layer that routes to it, and dropped by its request's next
// call of the layer if none did (the store's rule).
// An object counts as a hit only if its read had completed when the call
// started: a prefetch that lands later is a miss (the call stalls for it)
// and is counted in late_prefetches.
//
// `prefetch_staged` applies the store's staging rule (StoreOptions::
// prefetch_mode "staged") instead: predicted objects are read into a staging
// area, not admitted to the cache; the next call of that layer takes those it
// routes to (the policy sees a demand miss, no second read) and drops the
// rest (wasted). The cache then evolves exactly as without prefetch, so hits
// are never below demand-only. The budget caps staged bytes not yet taken
// or dropped (landed or not) plus dropped reads still in flight; a take
// frees its charge at once, as in the store; reads are issued at once
// (the store's speculative queue depth and cancellation are not modelled).
//
// Device tier (`device_bytes` > 0): the call is served from a device cache
// of that size run by `device_policy` (the DeviceExpertTier's slots are
// "lru"). Device hits cost nothing once their copy has landed; device misses
// are acquired from the host tier exactly as the device tier does (the
// host policy sees only the device misses: a host hit, a staged take, or an
// SSD read; in acquires of at most the objects the host always holds,
// capacity / largest object and at least top_k, each started when the
// previous one's copies have landed) and copied over one host-to-device
// link (`h2d_bytes_per_s`, `h2d_latency_s` per copy), each in the link's
// first idle time once its host copy is readable (a prefetch copy waiting
// for its read does not hold the link); the call waits for its last copy.
// So only a device hit whose
// copy landed before the acquire is stall-free (`hits`); `host_hits` counts
// device misses whose host copy was ready. With prefetch into the cache the
// predicted objects also go on to the device (admitted without evicting the
// call's own objects, copied once read); staged prefetch stops at the host
// tier, as the store's Prefetch() does behind a slot cache. Belady runs MIN
// at both tiers (next use in the whole trace).
#pragma once

#include <cstdint>
#include <string>

#include "k3pack/error.h"
#include "k3pack/progress.h"
#include "k3pack/trace.h"
#include "store/object_space.h"
#include "store/simulate.h"

namespace k3pack::store {

struct TimingOptions {
  double layer_compute_s = 350e-6;   // one routed layer of a single-GPU decode step
  double ssd_bytes_per_s = 7.0e9;    // one PCIe-4 NVMe
  double ssd_latency_s = 80e-6;
  uint32_t queue_depth = 16;
  bool prefetch = false;
  uint64_t prefetch_budget_bytes = 0;
  bool prefetch_staged = false;
  // What a call's predictions name: the next layer's objects, this layer's
  // at the request's next token, or kBoth: reads one layer ahead while the
  // keep hints come from the next-token predictions (a small read budget
  // then fills the SSD's idle time during compute, and the hints choose the
  // victims).
  enum class Lookahead { kNextLayer, kNextToken, kBoth };
  Lookahead lookahead = Lookahead::kNextLayer;
  // With prefetch: the predictions also steer eviction (Policy::
  // SetKeepHints): a predicted object already resident is passed over by
  // victim searches until the call it was predicted for starts. Belady
  // needs no hint (it knows every next use).
  bool keep_predicted = false;
  // Device tier (0: none; the host tier serves the calls).
  uint64_t device_bytes = 0;
  std::string device_policy = "lru";
  double h2d_bytes_per_s = 25e9;     // PCIe-4 x16
  double h2d_latency_s = 10e-6;      // per copy
};

struct TimedResult {
  std::string policy;
  bool prefetch = false;
  bool staged = false;
  bool keep_predicted = false;       // the predictions steered eviction (TimingOptions::keep_predicted)
  uint64_t tokens = 0;
  uint64_t accesses = 0;             // distinct objects per call, summed
  std::string device_policy;         // empty: no device tier
  uint64_t hits = 0;                 // resident and readable at acquire (stall-free; tiered: on the device)
  uint64_t late_prefetches = 0;      // prefetched but still in flight at acquire (misses)
  uint64_t bytes_read = 0;           // demand + prefetch
  // Wasted: prefetched, and evicted (behind a device tier: from both tiers),
  // dropped from staging or still held at the end without a use.
  uint64_t prefetch_bytes = 0, prefetch_useful_bytes = 0, prefetch_wasted_bytes = 0;
  uint64_t host_hits = 0;            // tiered: device misses whose host copy was readable at acquire
  uint64_t bytes_copied = 0;         // tiered: host to device, demand + prefetch
  uint64_t prefetch_copied_bytes = 0;
  double stall_s = 0;                // time calls waited for reads
  double total_s = 0;                // end of the last call
  double stall_free_fraction() const { return accesses ? double(hits) / double(accesses) : 0.0; }
  double stall_per_token_s() const { return tokens ? stall_s / double(tokens) : 0.0; }
  double bytes_per_token() const { return tokens ? double(bytes_read) / double(tokens) : 0.0; }
  double copied_per_token() const { return tokens ? double(bytes_copied) / double(tokens) : 0.0; }
};

// `policy` is a policy name or "belady" (MIN with the true future; its
// prefetch is perfect: the next call's objects).
Result<TimedResult> SimulateTimed(const trace::Trace& trace, const CallSeq& seq, const ObjectSpace& space,
                                  const std::string& policy, uint64_t capacity_bytes, const TimingOptions& options);

}  // namespace k3pack::store

namespace k3pack::store {

struct TimedRow {
  uint64_t capacity_objects = 0;
  TimedResult result;
};
// Every policy without and with prefetch (into the cache, and staged when
// `base.prefetch_staged`), and Belady with perfect prefetch, at every size;
// `threads` run jobs in parallel. Rows: size-major.
Result<std::vector<TimedRow>> TimedSweep(const trace::Trace& trace, const CallSeq& seq, const ObjectSpace& space,
                                         const std::vector<std::string>& policies,
                                         const std::vector<uint64_t>& capacity_objects, const TimingOptions& options,
                                         unsigned threads, const ProgressFn& progress = {});
std::string TimedText(const std::vector<TimedRow>& rows, uint64_t num_objects);
// The text table's prefetch column: no | yes | staged, or keep | yes+keep |
// staged+k when the predictions steered eviction.
const char* PrefetchLabel(const TimedResult& r);

}  // namespace k3pack::store
