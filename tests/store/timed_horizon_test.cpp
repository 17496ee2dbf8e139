// `trace sweep --timing --horizon token`: prefetch of a layer's objects for
// the request's next token, issued when that layer's call starts (a whole
// token of look-ahead), on hand-worked tiny traces. Setting as in
// timed_tiny.h: 1,000-byte objects, 1 ms per read, no latency, one read at a
// time, 4 slots (nothing is ever evicted).
#include <gtest/gtest.h>

#include "k3pack/trace.h"
#include "store/timed_sim.h"
#include "timed_tiny.h"

namespace k3pack::store {
namespace {

using timed_tiny::Opts;
using timed_tiny::Timed;

// Two tokens: token 0 routes L1 e0, L2 e1; token 1 routes L1 e2, L2 e3.
// Next-layer predictions are right (token 0's L1 predicts e1, token 1's
// predicts e3). Token 0's records predict `l1_next` for L1 and `l2_next` for
// L2 at token 1 (right: 2 and 3); token 1 has no next token and no
// next-token predictions.
trace::Trace Horizon(uint16_t l1_next = 2, uint16_t l2_next = 3) {
  trace::Trace t;
  t.num_experts = 4;
  t.top_k = 1;
  t.layer_ids = {1, 2};
  t.predict_k = 1;
  uint16_t e0[1] = {0}, e1[1] = {1}, e2[1] = {2}, e3[1] = {3}, a[1] = {l1_next}, b[1] = {l2_next};
  t.Append(1, 1, 0, false, e0);
  t.SetPredictions(e1);
  t.SetTokenPredictions(a);
  t.Append(2, 1, 0, false, e1);
  t.SetTokenPredictions(b);
  t.Append(1, 1, 0, false, e2);
  t.SetPredictions(e3);
  t.Append(2, 1, 0, false, e3);
  return t;
}

TimingOptions TokenOpts(double compute_ms, bool staged = false) {
  TimingOptions o = Opts(compute_ms, true, staged);
  o.lookahead = TimingOptions::Lookahead::kNextToken;
  return o;
}

TEST(TimedHorizon, BothReadsOneLayerAhead) {
  // --horizon both reads the next layer's predictions, as LayerLookaheadLandsLate
  // below works out (0 hits, two late prefetches, 2.8 ms of stall), not the
  // next token's (TokenLookaheadTurnsTheLatePrefetchIntoAHit: 2 hits); its next-token
  // predictions only steer eviction (KeepHints.AHintHoldsUntilItsRequestsNextCallOfTheLayer).
  TimingOptions o = Opts(0.6, true);
  o.lookahead = TimingOptions::Lookahead::kBoth;
  o.keep_predicted = true;
  TimedResult r = Timed(Horizon(), "lru", o);
  EXPECT_EQ(r.hits, 0u);
  EXPECT_EQ(r.late_prefetches, 2u);
  EXPECT_NEAR(r.stall_s, 2.8e-3, 1e-12);
  EXPECT_EQ(r.bytes_read, 4000u);
}

TEST(TimedHorizon, LayerLookaheadLandsLate) {
  // Compute 0.6 ms, next-layer prefetch:
  // c0 (L1 e0) t=0: miss, read 0->1, stall 1; now 1: prefetch L2 e1, read 1->2; compute to 1.6.
  // c1 (L2 e1) t=1.6: resident, ready at 2 > 1.6: late (a miss), stall 0.4; now 2; compute to 2.6.
  // c2 (L1 e2) t=2.6: miss, read 2.6->3.6, stall 1; now 3.6: prefetch L2 e3, read 3.6->4.6; compute to 4.2.
  // c3 (L2 e3) t=4.2: ready at 4.6: late, stall 0.4; compute 4.6 -> 5.2.
  TimedResult r = Timed(Horizon(), "lru", Opts(0.6, true));
  EXPECT_EQ(r.hits, 0u);
  EXPECT_EQ(r.late_prefetches, 2u);
  EXPECT_NEAR(r.stall_s, 2.8e-3, 1e-12);
  EXPECT_NEAR(r.total_s, 5.2e-3, 1e-12);
  EXPECT_EQ(r.bytes_read, 4000u);
  EXPECT_EQ(r.prefetch_useful_bytes, 2000u);
}

TEST(TimedHorizon, TokenLookaheadTurnsTheLatePrefetchIntoAHit) {
  // The same trace and timing, next-token prefetch:
  // c0 (L1 e0) t=0: miss, read 0->1, stall 1; now 1: prefetch L1 e2 (token 1), read 1->2; compute to 1.6.
  // c1 (L2 e1) t=1.6: miss (nothing predicted it a token ahead); the one queue slot is busy until 2:
  //    read 2->3, stall 1.4; now 3: prefetch L2 e3, read 3->4; compute to 3.6.
  // c2 (L1 e2) t=3.6: ready since 2: hit; compute to 4.2.
  // c3 (L2 e3) t=4.2: ready since 4: hit (it was late one layer ahead); compute to 4.8.
  TimedResult r = Timed(Horizon(), "lru", TokenOpts(0.6));
  EXPECT_EQ(r.hits, 2u);
  EXPECT_EQ(r.late_prefetches, 0u);
  EXPECT_NEAR(r.stall_s, 2.4e-3, 1e-12);
  EXPECT_NEAR(r.total_s, 4.8e-3, 1e-12);
  EXPECT_EQ(r.bytes_read, 4000u);
  EXPECT_EQ(r.prefetch_bytes, 2000u);
  EXPECT_EQ(r.prefetch_useful_bytes, 2000u);
  EXPECT_EQ(r.prefetch_wasted_bytes, 0u);
}

TEST(TimedHorizon, TokenPrefetchThatLandsAfterAcquireIsAMiss) {
  // Compute 0.1 ms: bandwidth does not allow it.
  // c0 t=0: miss e0, read 0->1, stall 1; now 1: prefetch L1 e2, read 1->2; compute to 1.1.
  // c1 t=1.1: miss e1, read 2->3 (queue busy until 2), stall 1.9; now 3: prefetch L2 e3, read 3->4; compute to 3.1.
  // c2 t=3.1: e2 ready since 2: hit; compute to 3.2.
  // c3 t=3.2: e3 resident but its read ends at 4 > 3.2: a late prefetch (miss), stall 0.8; compute 4 -> 4.1.
  TimedResult r = Timed(Horizon(), "lru", TokenOpts(0.1));
  EXPECT_EQ(r.hits, 1u);
  EXPECT_EQ(r.late_prefetches, 1u);
  EXPECT_NEAR(r.stall_s, 3.7e-3, 1e-12);
  EXPECT_NEAR(r.total_s, 4.1e-3, 1e-12);
  EXPECT_EQ(r.prefetch_useful_bytes, 2000u);
}

TEST(TimedHorizon, StagedTokenPrefetchIsTakenByTheNextCallOfItsLayer) {
  // As TokenLookaheadTurnsTheLatePrefetchIntoAHit, with the staging rule:
  // e2 is staged for L1 at 1 ms (read 1->2); c1 (L2) drops only L2's staging
  // (empty) and stages e3 (read 3->4); c2 (L1) takes e2 (a policy miss, no
  // second read, ready: a hit), c3 (L2) takes e3 (ready at 4 <= 4.2: a hit).
  TimedResult r = Timed(Horizon(), "lru", TokenOpts(0.6, /*staged=*/true));
  EXPECT_TRUE(r.staged);
  EXPECT_EQ(r.hits, 2u);
  EXPECT_NEAR(r.stall_s, 2.4e-3, 1e-12);
  EXPECT_EQ(r.bytes_read, 4000u);
  EXPECT_EQ(r.prefetch_useful_bytes, 2000u);
  EXPECT_EQ(r.prefetch_wasted_bytes, 0u);
}

TEST(TimedHorizon, WrongTokenGuessIsWastedAndDelaysTheDemandRead) {
  // Token 0's L1 predicts e3 for token 1 (the object L1/e3, never used).
  // c0 t=0: miss e0, read 0->1, stall 1; now 1: prefetch L1 e3, read 1->2; compute to 1.6.
  // c1 t=1.6: miss e1, read 2->3, stall 1.4; now 3: prefetch L2 e3, read 3->4; compute to 3.6.
  // c2 t=3.6: miss e2, read 4->5 (queue busy until 4), stall 1.4; now 5; compute to 5.6.
  // c3 t=5.6: L2 e3 ready since 4: hit.
  TimedResult r = Timed(Horizon(/*l1_next=*/3), "lru", TokenOpts(0.6));
  EXPECT_EQ(r.hits, 1u);
  EXPECT_NEAR(r.stall_s, 3.8e-3, 1e-12);
  EXPECT_EQ(r.bytes_read, 5000u);
  EXPECT_EQ(r.prefetch_bytes, 2000u);
  EXPECT_EQ(r.prefetch_useful_bytes, 1000u);
  EXPECT_EQ(r.prefetch_wasted_bytes, 1000u);
}

TEST(TimedHorizon, BeladyPrefetchesTheTrueNextCallOfTheSameLayer) {
  // The trace's wrong guess does not matter to Belady: with the next-token
  // horizon it reads the next call of the same layer, so the timeline is
  // TokenLookaheadTurnsTheLatePrefetchIntoAHit's.
  TimedResult r = Timed(Horizon(/*l1_next=*/3, /*l2_next=*/0), "belady", TokenOpts(0.6));
  EXPECT_EQ(r.hits, 2u);
  EXPECT_NEAR(r.stall_s, 2.4e-3, 1e-12);
  EXPECT_EQ(r.prefetch_wasted_bytes, 0u);
}

TEST(TimedHorizon, BeladyNeverPrefetchesOverAnObjectNeededSooner) {
  // Token 0: L1 e0, L2 e1; token 1: L1 e0, L2 e3; two slots.
  // c0 t=0: miss L1 e0, read 0->1, stall 1; its next-layer-1 call needs e0 (resident): nothing; compute to 1.6.
  // c1 t=1.6: miss L2 e1, read 1.6->2.6, stall 1; now 2.6. Prefetching L2 e3 (needed at c3) would evict
  //    L1 e0 (needed at c2, sooner; L2 e1 is the call's own): not worth it, skipped. Compute to 3.2.
  // c2 t=3.2: hit L1 e0; compute to 3.8.
  // c3 t=3.8: miss L2 e3, read 3.8->4.8, stall 1.
  // (Admitting it would evict e0: c2 would miss, read 3.6->4.6, 3.4 ms of stall and 4,000 bytes.)
  trace::Trace t;
  t.num_experts = 4;
  t.top_k = 1;
  t.layer_ids = {1, 2};
  for (uint16_t second : {1, 3}) {
    uint16_t a[1] = {0}, b[1] = {second};
    t.Append(1, 1, 0, false, a);
    t.Append(2, 1, 0, false, b);
  }
  TimedResult r = Timed(t, "belady", TokenOpts(0.6), /*slots=*/2);
  EXPECT_EQ(r.hits, 1u);
  EXPECT_NEAR(r.stall_s, 3e-3, 1e-12);
  EXPECT_EQ(r.bytes_read, 3000u);
  EXPECT_EQ(r.prefetch_bytes, 0u);
}

TEST(TimedHorizon, NoNextTokenPredictionsMeansDemandOnly) {
  // A trace with next-layer predictions only: the token horizon issues
  // nothing, so the run equals the demand-only one (timed_sim_test's
  // DemandOnlyByHand: stall 2 ms, 2 hits).
  TimedResult r = Timed(timed_tiny::Tiny(1), "lru", TokenOpts(0.5));
  EXPECT_EQ(r.prefetch_bytes, 0u);
  EXPECT_EQ(r.hits, 2u);
  EXPECT_NEAR(r.stall_s, 2e-3, 1e-12);
}

}  // namespace
}  // namespace k3pack::store
