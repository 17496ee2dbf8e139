// The timed replay (`trace sweep --timing`) on hand-worked tiny traces, and
// its agreement with the untimed simulator.
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

TEST(TimedSim, DemandOnlyByHand) {
  // call0 (L1 e0) t=0: miss, read 0->1 ms, stall 1; compute to 1.5.
  // call1 (L2 e1) t=1.5: miss, read 1.5->2.5, stall 1; compute to 3.0.
  // call2, call3: hits (reads done long ago), no stall.
  TimedResult r = Timed(Tiny(1), "lru", Opts(0.5, false));
  EXPECT_EQ(r.tokens, 2u);
  EXPECT_EQ(r.accesses, 4u);
  EXPECT_EQ(r.hits, 2u);
  EXPECT_EQ(r.bytes_read, 2000u);
  EXPECT_EQ(r.prefetch_bytes, 0u);
  EXPECT_NEAR(r.stall_s, 2e-3, 1e-12);
  EXPECT_NEAR(r.stall_per_token_s(), 1e-3, 1e-12);
  EXPECT_NEAR(r.total_s, 4e-3, 1e-12);
  EXPECT_DOUBLE_EQ(r.stall_free_fraction(), 0.5);
}

TEST(TimedSim, PrefetchThatLandsAfterAcquireIsAMiss) {
  // call0 t=0: miss e0, read 0->1, stall 1; now 1 ms: prefetch L2 e1, read 1->2; compute to 1.5.
  // call1 t=1.5: e1 resident but its read ends at 2 > 1.5: a late prefetch (miss), stall 0.5; compute to 2.5.
  // call2 t=2.5: hit e0 (predicted e1 is resident: no read); call3 t=3: hit e1 (ready at 2).
  TimedResult r = Timed(Tiny(1), "lru", Opts(0.5, true));
  EXPECT_EQ(r.hits, 2u);
  EXPECT_EQ(r.late_prefetches, 1u);
  EXPECT_NEAR(r.stall_s, 1.5e-3, 1e-12);
  EXPECT_EQ(r.bytes_read, 2000u);
  EXPECT_EQ(r.prefetch_bytes, 1000u);
  EXPECT_EQ(r.prefetch_useful_bytes, 1000u);
  EXPECT_EQ(r.prefetch_wasted_bytes, 0u);
}

TEST(TimedSim, PrefetchThatLandsInTimeIsAHit) {
  // Compute 1.5 ms: prefetch of e1 issued at 1 ms ends at 2 ms, call1 starts at 2.5 ms: a hit.
  // Stall: only call0's 1 ms. Hits: calls 1, 2, 3.
  TimedResult r = Timed(Tiny(1), "lru", Opts(1.5, true));
  EXPECT_EQ(r.hits, 3u);
  EXPECT_EQ(r.late_prefetches, 0u);
  EXPECT_NEAR(r.stall_s, 1e-3, 1e-12);
  EXPECT_NEAR(r.total_s, 1e-3 + 4 * 1.5e-3, 1e-12);
}

TEST(TimedSim, WrongPredictionIsWastedAndDelaysTheDemandRead) {
  // call0: miss e0 (0->1), prefetch e2 (1->2); compute to 1.5.
  // call1 t=1.5: miss e1; the single queue slot is busy until 2: read 2->3, stall 1.5; compute to 3.5.
  // call2 t=3.5: hit e0, e2 resident already (no read); call3: hit e1.
  // e2 is never used: 1,000 wasted bytes.
  TimedResult r = Timed(Tiny(2), "lru", Opts(0.5, true));
  EXPECT_EQ(r.hits, 2u);
  EXPECT_NEAR(r.stall_s, 2.5e-3, 1e-12);
  EXPECT_EQ(r.bytes_read, 3000u);
  EXPECT_EQ(r.prefetch_useful_bytes, 0u);
  EXPECT_EQ(r.prefetch_wasted_bytes, 1000u);
}

TEST(TimedSim, BeladyPrefetchesTheTrueNextCall) {
  // A wrong prediction in the trace does not matter: Belady prefetches call c+1's objects.
  // Same timeline as PrefetchThatLandsAfterAcquireIsAMiss.
  TimedResult r = Timed(Tiny(2), "belady", Opts(0.5, true));
  EXPECT_EQ(r.hits, 2u);
  EXPECT_EQ(r.late_prefetches, 1u);
  EXPECT_NEAR(r.stall_s, 1.5e-3, 1e-12);
  EXPECT_EQ(r.prefetch_wasted_bytes, 0u);
}

TEST(TimedSim, PrefetchNeverEvictsTheCallsOwnObjects) {
  // One slot... two: call0 holds e0 (L1); the prefetch of L2's e1 needs a
  // slot: with 1 slot it must not evict e0 while call0 computes, so it is
  // skipped and call1 misses on demand.
  trace::Trace t = Tiny(1);
  TimedResult r = Timed(t, "lru", Opts(0.5, true), /*slots=*/1);
  EXPECT_EQ(r.prefetch_bytes, 0u);
  EXPECT_EQ(r.hits, 0u);
}

TEST(TimedSim, WithoutPrefetchHitsMatchTheUntimedSimulator) {
  trace::GenOptions g;
  g.layer_ids = {1, 2, 3, 4};
  g.num_experts = 32;
  g.top_k = 4;
  g.requests = 3;
  g.decode_tokens = 60;
  g.concurrent = 2;
  auto t = trace::Generate(g);
  ASSERT_TRUE(t.ok());
  ObjectSpace space = SpaceForTrace(*t, 4096);
  auto seq = BuildCallSeq(*t, space);
  ASSERT_TRUE(seq.ok());
  for (uint64_t slots : {8u, 20u, 50u}) {
    for (const char* p : {"lru", "reuse-lfu-lru-v2", "quota-decay", "adaptive"}) {
      auto a = Simulate(*seq, space, p, slots * 4096);
      auto b = SimulateTimed(*t, *seq, space, p, slots * 4096, TimingOptions{});
      ASSERT_TRUE(a.ok() && b.ok());
      EXPECT_EQ(a->hits, b->hits) << p << " " << slots;
      EXPECT_EQ(a->bytes_read, b->bytes_read) << p << " " << slots;
    }
    auto a = SimulateBelady(*seq, space, slots);
    auto b = SimulateTimed(*t, *seq, space, "belady", slots * 4096, TimingOptions{});
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->hits, b->hits) << slots;
  }
}

// A manifest's object space can hold layers the trace does not route (a
// trace of layers 3-5 replayed against a 1-6 model). The timed replay
// indexed its per-layer state and each record's prediction target by the
// trace's own layer list, so every prediction named objects of another
// layer: with exact next-layer predictions, all prefetch was wasted. Each
// row must match the replay over the trace's own space.
TEST(TimedSim, AWiderObjectSpaceThanTheTraceChangesNothing) {
  trace::GenOptions g;
  g.layer_ids = {3, 4, 5};
  g.num_experts = 16;
  g.top_k = 4;
  g.requests = 2;
  g.prompt_tokens = 4;
  g.decode_tokens = 60;
  g.predict = true;
  g.predict_accuracy = 1.0;
  g.predict_next_token = true;
  auto t = trace::Generate(g);
  ASSERT_TRUE(t.ok());
  const ObjectSpace own = SpaceForTrace(*t, 4096);
  const ObjectSpace wide = ObjectSpace::Uniform(6, 16, 4, 4096, 1);
  auto own_seq = BuildCallSeq(*t, own);
  auto wide_seq = BuildCallSeq(*t, wide);
  ASSERT_TRUE(own_seq.ok() && wide_seq.ok());
  using L = TimingOptions::Lookahead;
  for (const L lookahead : {L::kNextLayer, L::kNextToken, L::kBoth}) {
    for (const bool staged : {false, true}) {
      TimingOptions o;
      o.prefetch = true;
      o.prefetch_staged = staged;
      o.keep_predicted = true;
      o.lookahead = lookahead;
      auto a = SimulateTimed(*t, *own_seq, own, "lru", 12 * 4096, o);
      auto b = SimulateTimed(*t, *wide_seq, wide, "lru", 12 * 4096, o);
      ASSERT_TRUE(a.ok() && b.ok());
      const std::string at = "lookahead " + std::to_string(int(lookahead)) + (staged ? " staged" : "");
      EXPECT_GT(a->prefetch_useful_bytes, 0u) << at;
      EXPECT_EQ(a->hits, b->hits) << at;
      EXPECT_EQ(a->bytes_read, b->bytes_read) << at;
      EXPECT_EQ(a->prefetch_useful_bytes, b->prefetch_useful_bytes) << at;
      EXPECT_EQ(a->prefetch_wasted_bytes, b->prefetch_wasted_bytes) << at;
      EXPECT_DOUBLE_EQ(a->stall_s, b->stall_s) << at;
    }
  }
}

}  // namespace
}  // namespace k3pack::store
