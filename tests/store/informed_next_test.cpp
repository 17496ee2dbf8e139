// The informed bound told each request's next call (`trace sweep
// --informed-next`): hand-worked traces where knowing the next call changes
// the victim (its place between the informed bound and Belady on every
// family: InformedBound.BelowBeladyAndRejectsAForeignTrace).
#include <gtest/gtest.h>

#include <vector>

#include "k3pack/trace.h"
#include "store/simulate.h"

namespace k3pack::store {
namespace {

// One request, top-1, the given (layer, expert) calls; popularity `w` per
// layer (each layer's experts, summing to 1) and no reuse, so the informed
// bound ranks residents by w alone.
struct Tiny {
  trace::Trace t;
  trace::TrueDistribution truth;
};
Tiny Calls(uint32_t layers, uint32_t experts, const std::vector<float>& w,
           const std::vector<std::pair<uint32_t, uint16_t>>& calls) {
  Tiny x;
  x.t.num_experts = experts;
  x.t.top_k = 1;
  for (uint32_t l = 1; l <= layers; ++l) x.t.layer_ids.push_back(l);
  for (auto [layer, e] : calls) {
    uint16_t id[1] = {e};
    x.t.Append(layer, 1, 0, false, id);
  }
  x.truth.top_k = 1;
  x.truth.reuse = 0;
  x.truth.initial = {w};
  return x;
}

SimResult Bound(const Tiny& x, uint64_t slots, bool know_next) {
  ObjectSpace space = SpaceForTrace(x.t, 1000);
  auto seq = BuildCallSeq(x.t, space);
  EXPECT_TRUE(seq.ok());
  auto r = know_next ? SimulateInformedNext(x.t, *seq, space, slots, x.truth)
                     : SimulateInformed(x.t, *seq, space, slots, x.truth);
  EXPECT_TRUE(r.ok()) << r.error().message();
  return *r;
}

TEST(InformedNext, KeepsWhatTheNextCallRoutesOverAMorePopularExpert) {
  // One layer, 2 slots, popularity e0 0.4 > e1 0.3 > e2 0.2 > e3 0.1; calls
  // route e0, e1, e3, e1, e1.
  //   informed:      e0 miss, e1 miss, e3 miss evicts e1 (0.3 < 0.4),
  //                  e1 miss evicts e3 (0.1), e1 hit: 1 hit, 4 misses.
  //   informed+next: e3's miss sees the next call route e1, so e1 is certain
  //                  and e0 goes; e1 hits, and again (its next call routes
  //                  e1): 2 hits, 3 misses, as Belady.
  const Tiny x = Calls(1, 4, {0.4f, 0.3f, 0.2f, 0.1f}, {{1, 0}, {1, 1}, {1, 3}, {1, 1}, {1, 1}});
  const SimResult informed = Bound(x, 2, false), next = Bound(x, 2, true);
  EXPECT_EQ(informed.hits, 1u);
  EXPECT_EQ(informed.misses, 4u);
  EXPECT_EQ(next.hits, 2u);
  EXPECT_EQ(next.misses, 3u);
  EXPECT_EQ(next.policy, "informed+next");
}

TEST(InformedNext, ALayerTheRequestDoesNotCallAgainIsWorthNothing) {
  // Two layers of 2 experts, 2 slots. Layer 1 favours e0 (0.9), layer 2
  // favours e1 (0.9). Calls: L1 e0, L2 e0, L1 e1, L2 e0.
  //   informed: the third call's miss evicts L2 e0 (0.1 < L1 e0's 0.9), so
  //             the fourth call misses: 0 hits.
  //   informed+next: the request never calls layer 1 again after its
  //             third call, so L1 e0 is worth nothing, and L2 e0 is what the
  //             next call of layer 2 routes: L1 e0 goes, the fourth call
  //             hits. A 0.9 popularity did not keep an object that cannot
  //             be used again.
  const Tiny x = Calls(2, 2, {0.9f, 0.1f, 0.1f, 0.9f}, {{1, 0}, {2, 0}, {1, 1}, {2, 0}});
  EXPECT_EQ(Bound(x, 2, false).hits, 0u);
  EXPECT_EQ(Bound(x, 2, true).hits, 1u);
  // Without the next call of layer 2 routing e0 (it routes e1), the only
  // thing left to tell the two apart is that layer 1 is done: L1 e0 still
  // goes first, and a fifth call of layer 2 routing e0 then hits.
  const Tiny y = Calls(2, 2, {0.9f, 0.1f, 0.1f, 0.9f}, {{1, 0}, {2, 0}, {1, 1}, {2, 1}, {2, 0}});
  // informed+next: the third call evicts L1 e0 (ended); the fourth (L2 e1)
  // evicts L1 e1 (ended too) over L2 e0 (fresh 0.1); the fifth hits.
  // informed: the third evicts L2 e0 (0.1 against L1 e0's 0.9), the fourth
  // L1 e1 (0.1 against 0.9 again), and the fifth misses.
  EXPECT_EQ(Bound(y, 2, true).hits, 1u);
  EXPECT_EQ(Bound(y, 2, false).hits, 0u);
}

}  // namespace
}  // namespace k3pack::store
