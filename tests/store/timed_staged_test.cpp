// The timed replay's staging rule (TimingOptions::prefetch_staged, the
// store's prefetch_mode "staged"): hand-worked tiny traces, and the
// invariant that staged prefetch never costs a hit against demand-only, and
// a request's staged reads waiting through other requests' calls.
#include <gtest/gtest.h>

#include "k3pack/trace.h"
#include "store/simulate.h"
#include "store/timed_sim.h"
#include "timed_tiny.h"

namespace k3pack::store {
namespace {

using timed_tiny::Opts;
using timed_tiny::Tiny;
using timed_tiny::Timed;

TEST(TimedStaged, TakenFromStagingWithoutASecondRead) {
  // call0 t=0: miss e0, read 0->1, stall 1; stage e1, read 1->2; compute to 1.5.
  // call1 t=1.5: e1 is a policy miss, taken from staging (no read), but it
  // lands at 2: late, stall 0.5; compute to 2.5.
  // call2 t=2.5: hit e0 (e1 resident: nothing staged); call3 t=3: hit e1.
  TimedResult r = Timed(Tiny(1), "lru", Opts(0.5, true, true), 2);
  EXPECT_TRUE(r.staged);
  EXPECT_EQ(r.hits, 2u);
  EXPECT_EQ(r.late_prefetches, 1u);
  EXPECT_NEAR(r.stall_s, 1.5e-3, 1e-12);
  EXPECT_EQ(r.bytes_read, 2000u);
  EXPECT_EQ(r.prefetch_bytes, 1000u);
  EXPECT_EQ(r.prefetch_useful_bytes, 1000u);
  EXPECT_EQ(r.prefetch_wasted_bytes, 0u);
  // Compute 1.5 ms: call1 starts at 2.5, after e1 landed at 2: a hit.
  r = Timed(Tiny(1), "lru", Opts(1.5, true, true), 2);
  EXPECT_EQ(r.hits, 3u);
  EXPECT_EQ(r.late_prefetches, 0u);
  EXPECT_NEAR(r.stall_s, 1e-3, 1e-12);
}

TEST(TimedStaged, WrongGuessIsDroppedAndNeverEvicts) {
  // Two slots, LRU, every L2 prediction wrong (e2).
  // Demand-only: misses at calls 0 and 1, hits at 2 and 3.
  TimedResult demand = Timed(Tiny(2), "lru", Opts(0.5, false, false), 2);
  EXPECT_EQ(demand.hits, 2u);
  // Into the cache: call0 admits e2 beside e0; call1's miss evicts e0 (LRU),
  // call2's miss evicts e2, and its prefetch of e2 evicts e1: no hits at all.
  TimedResult cache = Timed(Tiny(2), "lru", Opts(0.5, true, false), 2);
  EXPECT_EQ(cache.hits, 0u);
  // Staged: call0 miss e0 (0->1, stall 1), stage e2 (1->2), compute to 1.5.
  // call1 t=1.5: miss e1, queued behind e2: read 2->3, stall 1.5; e2 dropped
  // (wasted); compute to 3.5. call2: hit e0, stage e2 (3.5->4.5); call3: hit
  // e1, e2 dropped (wasted). Same hits as demand-only.
  TimedResult staged = Timed(Tiny(2), "lru", Opts(0.5, true, true), 2);
  EXPECT_EQ(staged.hits, 2u);
  EXPECT_NEAR(staged.stall_s, 2.5e-3, 1e-12);
  EXPECT_EQ(staged.bytes_read, 4000u);
  EXPECT_EQ(staged.prefetch_bytes, 2000u);
  EXPECT_EQ(staged.prefetch_useful_bytes, 0u);
  EXPECT_EQ(staged.prefetch_wasted_bytes, 2000u);
}

TEST(TimedStaged, BudgetCapsStagedBytes) {
  // Budget of one object: call0 stages e1 (ready at 2); with a 0-byte
  // budget headroom for a second guess nothing more is staged. Top-2 trace:
  // L1 routes {0, 1}, predicts L2 {2, 3}; L2 routes {2, 3}.
  trace::Trace t;
  t.num_experts = 4;
  t.top_k = 2;
  t.layer_ids = {1, 2};
  t.predict_k = 2;
  uint16_t a[2] = {0, 1}, b[2] = {2, 3};
  t.Append(1, 1, 0, false, a);
  t.SetPredictions(b);
  t.Append(2, 1, 0, false, b);
  TimingOptions o = Opts(0.5, true, true);
  o.prefetch_budget_bytes = 1000;
  TimedResult r = Timed(t, "lru", o, 4);
  EXPECT_EQ(r.prefetch_bytes, 1000u);        // only e2 fitted the budget
  EXPECT_EQ(r.prefetch_useful_bytes, 1000u);
  EXPECT_EQ(r.bytes_read, 4000u);            // e0, e1, staged e2, demand e3
}

// On a generated Kimi-like trace with 80%-accurate predictions, staged
// prefetch never has fewer stall-free hits than demand-only (same cache
// contents; staged takes only add hits), for every policy and size.
TEST(TimedStaged, NeverFewerHitsThanDemandOnly) {
  trace::GenOptions g;
  g.layer_ids = {1, 2, 3, 4, 5, 6};
  g.num_experts = 64;
  g.top_k = 4;
  g.requests = 3;
  g.decode_tokens = 80;
  g.concurrent = 2;
  g.predict = true;
  g.predict_accuracy = 0.8;
  auto t = trace::Generate(g);
  ASSERT_TRUE(t.ok());
  ObjectSpace space = SpaceForTrace(*t, 4096);
  auto seq = BuildCallSeq(*t, space);
  ASSERT_TRUE(seq.ok());
  bool cache_lost_somewhere = false;
  for (uint64_t slots : {8u, 24u, 60u}) {
    for (const char* p : {"lru", "reuse-lfu-lru-v2", "quota-decay", "adaptive"}) {
      TimingOptions o;
      o.layer_compute_s = 50e-6;
      auto demand = SimulateTimed(*t, *seq, space, p, slots * 4096, o);
      o.prefetch = true;
      auto cache = SimulateTimed(*t, *seq, space, p, slots * 4096, o);
      o.prefetch_staged = true;
      auto staged = SimulateTimed(*t, *seq, space, p, slots * 4096, o);
      ASSERT_TRUE(demand.ok() && cache.ok() && staged.ok());
      EXPECT_GE(staged->hits, demand->hits) << p << " " << slots;
      EXPECT_GT(staged->prefetch_useful_bytes, 0u) << p << " " << slots;
      // Bytes: demand misses less those served from staging, plus every staged read.
      EXPECT_EQ(staged->bytes_read, demand->bytes_read + staged->prefetch_wasted_bytes) << p << " " << slots;
      cache_lost_somewhere |= cache->hits < demand->hits;
    }
  }
  // The rule matters: prefetching into the cache does lose hits here.
  EXPECT_TRUE(cache_lost_somewhere);
}

// Two requests taking turns at one layer, one call per token, a token of
// look-ahead, staged: A routes e0 then e1, B routes e2 then e3, and each
// first call predicts its request's next expert rightly. 2 ms of compute.
//   c0 A e0 t=0: miss, read 0->1, stall 1; stages e1 for A (1->2); to 3.
//   c1 B e2 t=3: miss, read 3->4, stall 1; A's e1 stays staged (B's acquire
//      is not A's); stages e3 for B (4->5); to 6.
//   c2 A e1 t=6: taken from staging, landed at 2: a hit; to 8.
//   c3 B e3 t=8: taken, landed at 5: a hit; to 10.
// 2 hits, 2 ms of stall, 4 reads. Were the staged reads dropped at the
// layer's next call (B's for A's guess), both guesses would be wasted and
// read again: 0 hits, 4 ms, 6 reads; that is the rule when every call is one
// request's.
trace::Trace TakingTurns(uint32_t request_a, uint32_t request_b) {
  trace::Trace t;
  t.num_experts = 4;
  t.top_k = 1;
  t.layer_ids = {1};
  t.predict_k = 1;
  struct Call {
    uint32_t request;
    uint16_t expert;
    int next;
  };
  const Call calls[] = {{request_a, 0, 1}, {request_b, 2, 3}, {request_a, 1, -1}, {request_b, 3, -1}};
  for (const Call& c : calls) {
    uint16_t e[1] = {c.expert};
    t.Append(1, 1, c.request, false, e);
    if (c.next >= 0) {
      uint16_t n[1] = {static_cast<uint16_t>(c.next)};
      t.SetTokenPredictions(n);
    }
  }
  return t;
}

TEST(TimedStaged, AReadStagedForARequestWaitsForThatRequestsNextCall) {
  TimingOptions o = Opts(2, true, true);
  o.lookahead = TimingOptions::Lookahead::kNextToken;
  TimedResult r = Timed(TakingTurns(0, 1), "lru", o, 4);
  EXPECT_EQ(r.hits, 2u);
  EXPECT_NEAR(r.stall_s, 2e-3, 1e-12);
  EXPECT_EQ(r.bytes_read, 4000u);
  EXPECT_EQ(r.prefetch_useful_bytes, 2000u);
  EXPECT_EQ(r.prefetch_wasted_bytes, 0u);
  // One request making all four calls: each guess ends at the next call.
  r = Timed(TakingTurns(0, 0), "lru", o, 4);
  EXPECT_EQ(r.hits, 0u);
  EXPECT_NEAR(r.stall_s, 4e-3, 1e-12);
  EXPECT_EQ(r.bytes_read, 6000u);
  EXPECT_EQ(r.prefetch_wasted_bytes, 2000u);
}

}  // namespace
}  // namespace k3pack::store
