// Faults of the timed replay found by an audit (session 36): Belady with
// perfect prefetch evicting what its own prefetch's call needs, the host MIN
// behind a device tier keeping stale next uses, the host-to-device link held
// by a copy whose source is not ready, a used prefetch counted as wasted
// behind a device tier, and a full prefetch budget stopping device copies
// that need no read. The setting is timed_tiny.h's: 1,000-byte objects, an
// SSD taking 1 ms per object (one read at a time, no latency); where there
// is a device tier, its link takes 0.25 ms per object. Times below are in
// ms, `cN` is the N-th call, and every count is worked out in the comments.
#include <gtest/gtest.h>

#include <vector>

#include "k3pack/trace.h"
#include "store/simulate.h"
#include "store/timed_sim.h"
#include "timed_tiny.h"

namespace k3pack::store {
namespace {

using timed_tiny::Device;
using timed_tiny::Opts;
using timed_tiny::Timed;

struct Call {
  uint32_t layer;
  std::vector<uint16_t> routes;      // one route per row (top_k = 1)
  std::vector<uint16_t> pred;        // the next layer's predictions, predict_k per row (empty: none)
  std::vector<uint16_t> token_pred;  // the next token's predictions, predict_k per row (empty: none)
};

// 4 experts per layer, top-1.
trace::Trace Make(std::vector<uint32_t> layers, const std::vector<Call>& calls, uint32_t predict_k = 1) {
  trace::Trace t;
  t.num_experts = 4;
  t.top_k = 1;
  t.layer_ids = std::move(layers);
  t.predict_k = predict_k;
  for (const Call& c : calls) {
    t.Append(c.layer, static_cast<uint32_t>(c.routes.size()), 0, false, c.routes);
    if (!c.pred.empty()) t.SetPredictions(c.pred);
    if (!c.token_pred.empty()) t.SetTokenPredictions(c.token_pred);
  }
  return t;
}

// F1. Perfect prefetch may evict only what demand MIN would evict for the
// prefetched object, and only if that is needed strictly later.
// Layers 1, 2; calls c0 L1{a}, c1 L2{b}, c2 L1{a}, c3 L2{b, c} (two rows);
// 2 slots, 0.5 ms of compute. Next uses: a at c2, b at c3, c at c3.
// Belady with one-layer perfect prefetch:
//   c0 t=0: a misses, read 0->1, stall 1. Prefetch c1's {b} (room): read 1->2; to 1.5.
//   c1 t=1.5: b resident, lands at 2: late, stall 0.5. c2's {a} is resident; to 2.5.
//   c2 t=2.5: a hits. c3's {b, c}: b resident; c would evict. The resident
//     needed farthest off is a (never again), but it is this call's own
//     (pinned), so the victim would be b, needed by c's own call: skipped.
//     (Admitting on the tie b = c = c3 evicted b, read c 2.5->3.5, and c3
//     then missed b, read 3.5->4.5: 4,000 bytes, 3.0 ms of stall, more
//     bytes than demand-only LRU.) To 3.0.
//   c3 t=3.0: b hits, c misses, read 3.0->4.0 evicting a, stall 1.
//   => 3,000 bytes, stall 1 + 0.5 + 0 + 1 = 2.5.
// LRU demand-only: a 0->1 (stall 1), b 1.5->2.5 (stall 1), a hits, b hits and
//   c 3.5->4.5 evicting a (stall 1): 3,000 bytes, stall 3.0.
TEST(TimedOptimum, PerfectPrefetchEvictsOnlyWhatDemandMinWould) {
  trace::Trace t = Make({1, 2}, {{1, {0}, {}, {}}, {2, {1}, {}, {}}, {1, {0}, {}, {}}, {2, {1, 2}, {}, {}}});
  TimedResult lru = Timed(t, "lru", Opts(0.5, false), 2);
  EXPECT_EQ(lru.bytes_read, 3000u);
  EXPECT_NEAR(lru.stall_s, 3.0e-3, 1e-12);
  TimedResult opt = Timed(t, "belady", Opts(0.5, true), 2);
  EXPECT_EQ(opt.bytes_read, 3000u);
  EXPECT_EQ(opt.prefetch_bytes, 1000u);  // b only
  EXPECT_NEAR(opt.stall_s, 2.5e-3, 1e-12);
}

// F2. Behind a device tier the host policy sees only device misses; its MIN
// must still re-key an object the device served, or that object keeps a
// next use in the past and looks needed soonest for good.
// One layer; calls a, a, b, c, b. Host 2 slots, device 1, 5 ms of compute.
// Next uses: a at c1, b at c2 and c4, c at c3.
//   c0: a read (host and device). c1: a is a device hit: no longer needed.
//   c2: b read (host has room). c3: c: the host holds a (never again) and
//   b (c4): MIN evicts a and reads c. c4: b is a host hit. 3,000 bytes, as an
//   LRU host reads. (With a's key left at c1 the host took b as the farthest,
//   evicted it and read it again at c4: 4,000 bytes.) With perfect prefetch
//   the same three reads are made ahead: b at c1 (room), c at c2 (a is the
//   farthest and unpinned); the device's MIN takes no prefetch, since its one
//   slot holds the call's own object.
TEST(TimedOptimum, HostMinBehindADeviceSeesTheDevicesHits) {
  trace::Trace t =
      Make({1}, {{1, {0}, {}, {}}, {1, {0}, {}, {}}, {1, {1}, {}, {}}, {1, {2}, {}, {}}, {1, {1}, {}, {}}});
  TimedResult lru = Timed(t, "lru", Device(Opts(5, false), 1), 2);
  EXPECT_EQ(lru.bytes_read, 3000u);
  TimedResult demand = Timed(t, "belady", Device(Opts(5, false), 1), 2);
  EXPECT_EQ(demand.bytes_read, 3000u);
  TimedResult opt = Timed(t, "belady", Device(Opts(5, true), 1), 2);  // the sweep's Belady row
  EXPECT_EQ(opt.bytes_read, 3000u);
  EXPECT_EQ(opt.prefetch_bytes, 2000u);
}

// F3. A prefetch copy is booked for when its SSD read lands; until then the
// link is idle, and a demand copy whose source is ready goes first.
// Layers 1, 2; token 0: c0 L1 e0 (predicts L2 e1, right), c1 L2 e1; token 1:
// c2 L1 e0 (predicts L2 e3, wrong), c3 L2 e1. LRU, host 4 slots, device 2,
// 0.5 ms of compute.
//   c0 t=0: device and host miss: read 0->1, copy 1->1.25, stall 1.25. Prefetch
//     L2 e1: read 1.25->2.25, device admit (room), copy 2.25->2.5; to 1.75.
//   c1 t=1.75: e1 is on the device but lands at 2.5: late, stall 0.75; to 3.0.
//   c2 t=3.0: e0 device hit. Prefetch L2 e3: read 3.0->4.0; the device evicts
//     e1 (e0 is the call's own); e3's copy is booked 4.0->4.25; to 3.5.
//   c3 t=3.5: e1 device miss, host hit (ready since 2.25): copy 3.5->3.75 in
//     the idle gap before e3's, stall 0.25. (With the link held from the
//     prefetch's issue it copied 4.25->4.5: stall 1.0, 3.0 in all.)
//   Stall 1.25 + 0.75 + 0 + 0.25 = 2.25; reads e0, e1, e3.
TEST(TimedOptimum, LinkIsNotHeldByACopyWhoseSourceIsNotReady) {
  trace::Trace t =
      Make({1, 2}, {{1, {0}, {1}, {}}, {2, {1}, {}, {}}, {1, {0}, {3}, {}}, {2, {1}, {}, {}}});
  TimedResult r = Timed(t, "lru", Device(Opts(0.5, true), 2), 4);
  EXPECT_EQ(r.bytes_read, 3000u);
  EXPECT_EQ(r.hits, 1u);       // c2
  EXPECT_EQ(r.host_hits, 1u);  // c3
  EXPECT_NEAR(r.stall_s, 2.25e-3, 1e-12);
}
// F1, ties for farthest (found by the review of the fix): residents needed
// farthest off are often several ("never again"), and the rule looked only
// at the one with the largest id: when that was pinned it refused, though an
// unpinned one was as far off. Two mirror-image traces, layers swapped, must
// give the same schedule. Trace A: c0 L1{e0}, c1 L2{e0}, c2 L1{e1}; 2 slots,
// 0.5 ms of compute; no object is used twice.
//   c0 t=0: L1e0 misses, read 0->1, stall 1. Prefetch L2e0 (room): read 1->2. To 1.5.
//   c1 t=1.5: L2e0 lands at 2, stall 0.5. Prefetch L1e1: both residents are
//     needed never again; L2e0 is pinned, L1e0 is not: evict it, read 2->3. To 2.5.
//   c2 t=2.5: L1e1 lands at 3, stall 0.5.
//   => 3,000 bytes (demand MIN's), 2,000 of them read ahead, stall 2.0.
// (Refusing at c1, c2 missed: read 2.5->3.5, stall 1, in all 2.5.) Trace B
// is the same with layers 2 and 1 swapped.
TEST(TimedOptimum, PerfectPrefetchAmongResidentsTiedForFarthestTakesAnUnpinnedOne) {
  for (const auto& order : {std::vector<uint32_t>{1, 2}, std::vector<uint32_t>{2, 1}}) {
    SCOPED_TRACE(order[0]);
    trace::Trace t = Make({1, 2}, {{order[0], {0}, {}, {}}, {order[1], {0}, {}, {}}, {order[0], {1}, {}, {}}});
    TimedResult opt = Timed(t, "belady", Opts(0.5, true), 2);
    EXPECT_EQ(opt.bytes_read, 3000u);
    EXPECT_EQ(opt.prefetch_bytes, 2000u);
    EXPECT_NEAR(opt.stall_s, 2.0e-3, 1e-12);
  }
}

// F4. Behind a device tier a prefetch is wasted only once it has left both
// tiers unused: a device hit on its copy is a use, whatever the host did.
// Layers 1, 2, 3, next-token look-ahead; token 0: c0 L1 x0 (predicts L1 x1
// for the next token), c1 L2 y0, c2 L3 z0; token 1: c3 L1 x1, c4 L2 y0, c5
// L3 z0. LRU, host 2 slots, device 4, 5 ms of compute (nothing is late).
//   c0: x0 read. Prefetch x1: host room, read; device room, copied.
//   c1: y0 misses both tiers; the host evicts x0 (LRU): host {x1, y0}.
//   c2: z0 misses both tiers; the host evicts x1, unused, but the device
//     holds it: not wasted (it was counted wasted here).
//   c3: x1 is a device hit on the prefetched copy: useful. c4, c5: device hits.
// Without a device tier (host 4 slots) the same prefetch is a host hit: useful.
TEST(TimedOptimum, PrefetchUsedFromTheDeviceIsUseful) {
  trace::Trace t = Make({1, 2, 3}, {{1, {0}, {}, {1}}, {2, {0}, {}, {}}, {3, {0}, {}, {}}, {1, {1}, {}, {}},
                                    {2, {0}, {}, {}}, {3, {0}, {}, {}}});
  TimingOptions o = Device(Opts(5, true), 4);
  o.lookahead = TimingOptions::Lookahead::kNextToken;
  TimedResult r = Timed(t, "lru", o, 2);
  EXPECT_EQ(r.prefetch_bytes, 1000u);
  EXPECT_EQ(r.hits, 3u);  // c3 (x1, prefetched), c4, c5
  EXPECT_EQ(r.prefetch_useful_bytes, 1000u);
  EXPECT_EQ(r.prefetch_wasted_bytes, 0u);
  TimingOptions h = Opts(5, true);
  h.lookahead = TimingOptions::Lookahead::kNextToken;
  TimedResult host_only = Timed(t, "lru", h, 4);
  EXPECT_EQ(host_only.prefetch_useful_bytes, 1000u);
  EXPECT_EQ(host_only.prefetch_wasted_bytes, 0u);
}

// F5. The prefetch budget caps speculative reads; a predicted object over the
// budget is skipped, and the ones after it still go to the device when they
// are in host memory (they need no read, only a copy).
// Layers 1, 2; one row, 3 predictions. LRU, host 8 slots, device 3, budget
// 1,000 bytes (one read), 5 ms of compute (nothing is late).
//   c0 L2 e3, c1 L2 e2, c2 L1 e1: read and copied; device {L2e3, L2e2, L1e1}.
//   c3 L1 e0: the device evicts L2e3 (least recently used), the host reads
//     e0. It predicts L2 {e0, e1, e3}: L2e0 is read (the budget is now full)
//     and copied, evicting L2e2 from the device; L2e1 would need a read: over
//     the budget, skipped; L2e3 is in host memory: copied (evicting L1e1), in
//     the link's idle time, long before c4.
//   c4 L2 e3: a device hit. Demand-only it is a device miss and a host hit
//     with a 0.25 ms copy, so prefetch saves exactly that. (Stopping at
//     L2e1, as the loop did, left c4 a device miss.)
TEST(TimedOptimum, FullBudgetStillCopiesWhatNeedsNoRead) {
  trace::Trace t = Make({1, 2},
                        {{2, {3}, {}, {}},
                         {2, {2}, {}, {}},
                         {1, {1}, {}, {}},
                         {1, {0}, {0, 1, 3}, {}},  // c3 predicts L2 e0, e1, e3
                         {2, {3}, {}, {}}},
                        /*predict_k=*/3);
  TimingOptions o = Device(Opts(5, true), 3);
  o.prefetch_budget_bytes = 1000;
  TimedResult with = Timed(t, "lru", o, 8);
  o.prefetch = false;
  TimedResult demand = Timed(t, "lru", o, 8);
  EXPECT_EQ(demand.hits, 0u);
  EXPECT_EQ(with.prefetch_bytes, 1000u);
  EXPECT_EQ(with.hits, 1u);  // c4
  EXPECT_NEAR(demand.stall_s - with.stall_s, 0.25e-3, 1e-12);
}

// F4, the device's side (found by the review of the fix): a prefetch the
// device evicts after the host already did is wasted then. Every prefetched
// byte ends either used or wasted, whichever tier lets it go last; checked
// on a generated trace of half-right predictions (many of both), for every
// policy and with and without a device tier.
TEST(TimedOptimum, EveryPrefetchedByteIsUsefulOrWastedWithADeviceTier) {
  trace::GenOptions g;
  g.num_experts = 16;
  g.top_k = 2;
  g.layer_ids = {1, 2, 3};
  g.requests = 2;
  g.prompt_tokens = 2;
  g.decode_tokens = 40;
  g.predict = true;
  g.predict_accuracy = 0.5;
  auto t = trace::Generate(g);
  ASSERT_TRUE(t.ok()) << t.error().message();
  for (const char* policy : {"lru", "quota-decay", "adaptive", "belady"}) {
    for (uint64_t device : {0u, 4u, 6u}) {
      SCOPED_TRACE(std::string(policy) + " device " + std::to_string(device));
      TimingOptions o = Opts(1, true);
      if (device) o = Device(o, device);
      TimedResult r = Timed(*t, policy, o, 12);
      EXPECT_GT(r.prefetch_bytes, 0u);
      if (std::string(policy) != "belady") {  // one layer ahead Belady reads the true next call: no waste
        EXPECT_GT(r.prefetch_wasted_bytes, 0u);
      }
      EXPECT_EQ(r.prefetch_useful_bytes + r.prefetch_wasted_bytes, r.prefetch_bytes);
    }
  }
}

}  // namespace
}  // namespace k3pack::store
