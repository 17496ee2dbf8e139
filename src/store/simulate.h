// Policy-only replay of a trace (no I/O), and Belady's MIN optimum.
//
// Hit accounting follows SGLang: one hit or miss per distinct object per
// acquire call (duplicates inside a call count once).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "k3pack/error.h"
#include "k3pack/progress.h"
#include "k3pack/trace.h"
#include "store/object_space.h"
#include "store/policy.h"

namespace k3pack::store {

// A trace reduced to what policies see: per call, the layer index, the
// prefill flag and the distinct object ids in ascending order.
struct CallSeq {
  struct Call {
    uint32_t layer_index;
    bool is_prefill;
    uint32_t rows;
    uint64_t begin, end;  // into keys
    uint64_t route_begin = 0;  // into row_keys (rows x route_width)
    uint64_t row_begin = 0;    // into row_requests (one per row)
  };
  std::vector<Call> calls;
  std::vector<ObjectId> keys;
  // Every row's routes as ObjectIds and the request of each row, for
  // request-aware policies (CallRows); empty when not recorded (EP ranks).
  std::vector<ObjectId> row_keys;
  std::vector<uint64_t> row_requests;
  uint32_t route_width = 0;
  bool has_rows() const { return route_width != 0; }
  uint64_t routes = 0;    // token x top_k entries, duplicates included
  uint64_t tokens = 0;    // decode/prefill tokens (rows of the first layer's calls)
};

// Checks each record with SGLang's route rules and reduces it.
Result<CallSeq> BuildCallSeq(const trace::Trace& trace, const ObjectSpace& space);
// The distinct objects of the largest call: the least cache, in objects, that
// can serve every call (a call's objects stay co-resident while it runs; a
// batched decode call or a prefill chunk holds up to rows x top_k of them).
uint64_t LargestCall(const CallSeq& seq);
// The bytes of the largest call's objects: the least device tier that can
// hold every call's working set.
uint64_t LargestCallBytes(const CallSeq& seq, const ObjectSpace& space);
// The CallRows of call `i` (null when `seq` has no rows); `storage` backs it.
const CallRows* RowsOf(const CallSeq& seq, size_t i, CallRows* storage);
// The object space a trace implies when no manifest is given (K3 object size).
ObjectSpace SpaceForTrace(const trace::Trace& trace, uint64_t object_bytes = 11956224);

struct SimResult {
  std::string policy;
  uint64_t capacity_bytes = 0;
  uint64_t capacity_objects = 0;   // capacity / largest object
  uint64_t hits = 0, misses = 0, evictions = 0;
  uint64_t bytes_read = 0;         // sum of missed objects' sizes
  std::vector<uint64_t> layer_hits, layer_misses;  // per active layer index
  double hit_rate() const { return hits + misses ? double(hits) / double(hits + misses) : 0.0; }
};

// `calls_done` (may be empty) is told how many of seq.calls were simulated,
// every few thousand calls and at the end: progress for long traces.
// The progress of a sweep: `total` independent simulations, reported as
// each one ends (JobDone() is called under the sweep's lock).
class SweepProgress {
 public:
  SweepProgress(const ProgressFn& fn, uint64_t total) : fn_(fn) {
    p_.phase = "sweep";
    p_.unit = "simulations";
    p_.total_objects = total;
  }
  void JobDone() {
    ++p_.done_objects;
    if (fn_) fn_(p_);
  }

 private:
  const ProgressFn& fn_;
  Progress p_;
};

using CallsDoneFn = std::function<void(uint64_t calls_done)>;

Result<SimResult> Simulate(const CallSeq& seq, const ObjectSpace& space, const std::string& policy,
                           uint64_t capacity_bytes, const CallsDoneFn& calls_done = {});

// Belady's MIN for slot capacity `slots`: on a miss with a full cache, evict
// the resident object (outside the current call) whose next use is farthest
// away. Optimal for one object size; requires slots >= the largest call.
Result<SimResult> SimulateBelady(const CallSeq& seq, const ObjectSpace& space, uint64_t slots,
                                 const CallsDoneFn& calls_done = {});

}  // namespace k3pack::store

namespace k3pack::store {

// The distribution-informed bound: the demand-only policy told the
// generator's true distribution. On a miss with a full cache it evicts the
// resident object least likely to be routed at the next token of any active
// request (P = 1 - prod over active requests of (1 - p_r), p_r from the
// request's true popularity, its previous token's experts and the reuse
// probability). It loads only what a call asks for, like every policy in
// the store, so the gap between it and Belady is what only prefetching can
// win; the gap between a policy and it is what eviction still can. `trace`
// must be the trace `truth` was generated with (seq built from it).
Result<SimResult> SimulateInformed(const trace::Trace& trace, const CallSeq& seq, const ObjectSpace& space,
                                   uint64_t slots, const trace::TrueDistribution& truth);

// The informed bound told, besides the distribution, each request's true
// next call of every layer: what a policy with the distribution and
// 100%-accurate next-token predictions as keep hints could reach. Objects the
// next call routes are kept over all others (demand_bound.h has the rule).
// The gap between it and Belady is what knowing only one token ahead leaves;
// it is a greedy rule, so an indication, not a floor.
Result<SimResult> SimulateInformedNext(const trace::Trace& trace, const CallSeq& seq, const ObjectSpace& space,
                                       uint64_t slots, const trace::TrueDistribution& truth);

// The learning reference: the informed bound's rule when each request is
// told only its popularity values (and its drift rate), not which expert
// holds which, and learns that per expert from its own routes with a close
// approximation of the Bayes estimate (LevelPosterior). The gap between the
// informed bound and it is what learning costs that rule; it is a
// reference, not a bound: other rules (recency, pooling requests of one
// kind, which it does not) can beat it.
Result<SimResult> SimulateLearner(const trace::Trace& trace, const CallSeq& seq, const ObjectSpace& space,
                                  uint64_t slots, const trace::TrueDistribution& truth);

}  // namespace k3pack::store
