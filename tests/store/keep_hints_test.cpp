// Keep hints: predictions steering eviction (Policy::SetKeepHints, the timed
// replay's --keep-predicted, StoreOptions::keep_predicted). A hinted resident
// is evicted only when no other unprotected resident is left, and then in the
// policy's own order; hard protection (the call's keys, pins) still wins.
#include <gtest/gtest.h>

#include <algorithm>

#include "k3pack/store.h"
#include "k3pack/trace.h"
#include "open_ok.h"
#include "policy_driver.h"
#include "store/policy.h"
#include "store/synthetic_pack.h"
#include "store/timed_sim.h"
#include "timed_tiny.h"

namespace k3pack::store {
namespace {

TEST(KeepHints, AHintedResidentOutlivesUnhintedOnesInEveryPolicy) {
  // One layer of 8 experts, 3 slots. Residents used in the order 0, 1, 2,
  // each once; whatever a policy's first victim is, hinting it moves the
  // victim to another resident, never to the hinted object. `adaptive`
  // evicts with a follower's ranking: the follower must see the hints too.
  const ObjectSpace s = ObjectSpace::Uniform(1, 8, 2, kObj, 1);
  for (const std::string& name : PolicyNames()) {
    Driver plain(name, s, 3), hinted(name, s, 3);
    PinCounts keep(s.num_objects(), 0);
    hinted.p->SetKeepHints(&keep);
    for (ObjectId k : {0u, 1u, 2u}) {
      plain.Call({k});
      hinted.Call({k});
    }
    const std::vector<ObjectId> first = plain.Call({3});
    ASSERT_EQ(first.size(), 1u) << name;
    keep[first[0]] = 1;
    const std::vector<ObjectId> moved = hinted.Call({3});
    ASSERT_EQ(moved.size(), 1u) << name;
    EXPECT_NE(moved[0], first[0]) << name;
    EXPECT_TRUE(hinted.p->Resident(first[0])) << name;
  }
}

TEST(KeepHints, WhenOnlyHintedResidentsAreLeftTheyAreEvictedInPolicyOrder) {
  const ObjectSpace s = ObjectSpace::Uniform(1, 8, 2, kObj, 1);
  Driver c("lru", s, 2);
  PinCounts keep(s.num_objects(), 0);
  c.p->SetKeepHints(&keep);
  c.Call({0});
  c.Call({1});
  keep[0] = keep[1] = 1;
  EXPECT_EQ(c.Call({2}), std::vector<ObjectId>{0});  // both hinted: LRU's victim
  // A hint never overrides hard protection: the call's own keys stay.
  keep[2] = 1;
  EXPECT_EQ(c.Call({1, 3}), std::vector<ObjectId>{2});
  // Without hints the rule is plain LRU again.
  c.p->SetKeepHints(nullptr);
  c.Call({4});
  EXPECT_FALSE(c.p->Resident(1));
}

TEST(KeepHints, ASearchPassesOverABoundedNumberOfHints) {
  // LRU over kMaxKeptPassed + 2 residents, all but the newest hinted: the
  // search passes over kMaxKeptPassed hinted ones and takes the next hinted
  // one in LRU order instead of scanning on to the one unhinted resident.
  const uint32_t n = Policy::kMaxKeptPassed + 2;
  const ObjectSpace s = ObjectSpace::Uniform(1, n + 1, 1, kObj, 1);
  Driver c("lru", s, n);
  PinCounts keep(s.num_objects(), 0);
  c.p->SetKeepHints(&keep);
  for (ObjectId k = 0; k < n; ++k) c.Call({k});
  for (ObjectId k = 0; k + 1 < n; ++k) keep[k] = 1;
  EXPECT_EQ(c.Call({n}), std::vector<ObjectId>{Policy::kMaxKeptPassed});
}

// Timed replay (timed_tiny.h: 1,000-byte objects, 1 ms per read, one read
// at a time; here 0.5 ms of compute per call), LRU with two slots, three
// layers of top-1, three tokens: token t routes L1 e0, L2 e(1+t), L3 e(1+t).
// L1's expert recurs; the others never do. Tokens 0 and 1 predict each
// layer's next token right (L1 e0; L2 and L3 the next new expert).
trace::Trace Recurring(bool l1_prefill = false) {
  trace::Trace t;
  t.num_experts = 4;
  t.top_k = 1;
  t.layer_ids = {1, 2, 3};
  t.predict_k = 1;
  for (uint16_t token = 0; token < 3; ++token) {
    for (uint32_t layer = 1; layer <= 3; ++layer) {
      uint16_t e[1] = {layer == 1 ? uint16_t(0) : uint16_t(1 + token)};
      t.Append(layer, 1, 0, layer == 1 && l1_prefill, e);
      uint16_t next[1] = {layer == 1 ? uint16_t(0) : uint16_t(2 + token)};
      if (token < 2) t.SetTokenPredictions(next);
    }
  }
  return t;
}

TimingOptions KeepOpts(bool keep) {
  TimingOptions o = timed_tiny::Opts(0.5, /*prefetch=*/false);
  o.lookahead = TimingOptions::Lookahead::kNextToken;
  o.keep_predicted = keep;
  return o;
}

TEST(KeepHints, TimedReplayKeepsThePredictedObjectThroughOtherLayersMisses) {
  // Without hints every call misses: each token brings three objects into
  // two slots, and LRU's victim at L3 is always L1 e0 (its oldest use):
  // 9 misses, 9 reads of 1 ms each at their call's start, 9 x 0.5 ms of
  // compute: stall 9 ms, 13.5 ms in all.
  TimedResult a = timed_tiny::Timed(Recurring(), "lru", KeepOpts(false), 2);
  EXPECT_FALSE(a.keep_predicted);
  EXPECT_EQ(a.hits, 0u);
  EXPECT_EQ(a.bytes_read, 9000u);
  EXPECT_NEAR(a.stall_s, 9e-3, 1e-12);
  EXPECT_NEAR(a.total_s, 13.5e-3, 1e-12);
  // With hints (no read ahead): after token 0's L1 call, e0 is predicted for
  // L1's next call, so L3's miss evicts L2 e1 instead; token 1: L1 e0 hits
  // (hinted again), L2 e2 evicts L3 e1, L3 e2 evicts L2 e2; token 2: L1 e0
  // hits; with no predictions left, L2 e3 evicts L3 e2 and L3 e3 evicts
  // L1 e0 (LRU). 2 hits, 7 reads: stall 7 ms, 11.5 ms in all.
  TimedResult b = timed_tiny::Timed(Recurring(), "lru", KeepOpts(true), 2);
  EXPECT_TRUE(b.keep_predicted);
  EXPECT_EQ(b.hits, 2u);
  EXPECT_EQ(b.bytes_read, 7000u);
  EXPECT_EQ(b.prefetch_bytes, 0u);
  EXPECT_NEAR(b.stall_s, 7e-3, 1e-12);
  EXPECT_NEAR(b.total_s, 11.5e-3, 1e-12);
  // Belady needs no hint and takes none: the option leaves its row alone.
  TimingOptions belady = KeepOpts(true);
  belady.prefetch = true;
  EXPECT_FALSE(timed_tiny::Timed(Recurring(), "belady", belady, 2).keep_predicted);
}

TEST(KeepHints, APrefillCallGivesNoHints) {
  // The same trace with L1's calls as one-row prefill chunks: their
  // predictions are not hints, so L3's misses evict L1 e0 as without them
  // (a prefill hit does not refresh LRU, so nothing else changes either).
  TimedResult r = timed_tiny::Timed(Recurring(/*l1_prefill=*/true), "lru", KeepOpts(true), 2);
  EXPECT_EQ(r.hits, 0u);
  EXPECT_EQ(r.bytes_read, 9000u);
}

TEST(KeepHints, AHintHoldsUntilItsRequestsNextCallOfTheLayer) {
  // Two requests decoded one call per token, taking turns: A0, B0, A1.
  // A routes L1 e0 every token (and L2 e1, then e2); B routes L1 e1, L2 e3.
  // LRU, 2 slots. A0's L1 call predicts e0 for A's next L1 call, which comes
  // after B0's calls. Worked out:
  //   c0 A L1 e0 miss; c1 A L2 e1 miss (cache full);
  //   c2 B L1 e1 miss: A's hint on L1 e0 holds (B's call is not A's), so
  //      L2 e1 is evicted; c3 B L2 e3 miss evicts L1 e1 (L1 e0 still hinted);
  //   c4 A L1 e0 hit (its hint ends here); c5 A L2 e2 miss.
  // 1 hit, 5 reads. Were the hint to end at the layer's next call (c2, B's),
  // c2 would evict L1 e0 (LRU) and c4 would miss: 0 hits, as without hints.
  trace::Trace t;
  t.num_experts = 4;
  t.top_k = 1;
  t.layer_ids = {1, 2};
  t.predict_k = 1;
  struct Call {
    uint32_t layer, request;
    uint16_t expert;
    int next;  // predicted id for the request's next token, -1: none
  };
  const Call calls[] = {{1, 0, 0, 0}, {2, 0, 1, 2}, {1, 1, 1, 2}, {2, 1, 3, 0}, {1, 0, 0, -1}, {2, 0, 2, -1}};
  for (const Call& c : calls) {
    uint16_t e[1] = {c.expert};
    t.Append(c.layer, 1, c.request, false, e);
    if (c.next >= 0) {
      uint16_t n[1] = {static_cast<uint16_t>(c.next)};
      t.SetTokenPredictions(n);
    }
  }
  TimedResult off = timed_tiny::Timed(t, "lru", KeepOpts(false), 2);
  TimedResult on = timed_tiny::Timed(t, "lru", KeepOpts(true), 2);
  EXPECT_EQ(off.hits, 0u);
  EXPECT_EQ(off.bytes_read, 6000u);
  EXPECT_EQ(on.hits, 1u);
  EXPECT_EQ(on.bytes_read, 5000u);
  // --horizon both takes its hints from the same next-token predictions
  // (the trace has no next-layer ones: with layer hints nothing is kept).
  TimingOptions both = KeepOpts(true), layer = KeepOpts(true);
  both.lookahead = TimingOptions::Lookahead::kBoth;
  layer.lookahead = TimingOptions::Lookahead::kNextLayer;
  EXPECT_EQ(timed_tiny::Timed(t, "lru", both, 2).hits, 1u);
  EXPECT_EQ(timed_tiny::Timed(t, "lru", layer, 2).hits, 0u);
}

// request-aware ranks a previous-token expert by the chance its request
// routes it again (rho, the share of previous-token experts kept). With
// keep hints the look-ahead has already said which of them the next call
// routes: an unhinted one comes back far less often, and the policy learns
// that rate from the hints instead of keeping the old one.
//
// Three layers of top-1, 3 slots, 400 tokens, the hints the true next route
// of each layer: L0 routes a favourite F every 8th token and a new expert
// otherwise, L1 a new expert every token, L2 a new expert every 4th token,
// kept for the three tokens after (a keep no fresh draw explains: an expert
// arrives once, so rho is near 3/4 at L2 and 1/4 over the three layers).
// The slots hold L2's expert, the call's key and one more; at L0's and L1's
// misses the candidates are F (not a previous-token expert: a fresh chance
// of about 1/7, one arrival per seven rows that could have it arrive) and
// the other layer's previous-token expert, unhinted and never routed again.
// - Without hints that expert scores about rho = 1/4 > 1/7: F is evicted
//   at every miss between its routes and hits never.
// - With hints (before this rule, hints only protected): F is hinted only
//   at the token before its route, so it was still evicted at the two
//   misses after that, the same as without.
// - With the learned rate the unhinted expert scores a few percent: F stays
//   and hits at every route once the rate has been learned (its first ~64
//   observations start it at rho).
TEST(KeepHints, RequestAwareLearnsThatUnhintedPreviousTokenExpertsRarelyReturn) {
  constexpr uint32_t kTokens = 400, kF = 0;
  const ObjectSpace s = ObjectSpace::Uniform(3, kTokens + 2, 1, kObj, 1);
  auto route = [&](uint32_t layer, uint32_t t) -> ObjectId {
    const uint32_t e = layer == 2 ? t / 4 : layer == 0 && t % 8 == 0 ? kF : 1 + t;
    return s.Id(layer, e);
  };
  auto f_hits = [&](std::unique_ptr<Policy> p, bool hints, uint32_t from_token) {
    PinCounts keep(s.num_objects(), 0);
    if (hints) p->SetKeepHints(&keep);
    AccessResult r;
    ObjectId given[3] = {kNoObject, kNoObject, kNoObject};
    uint32_t hits = 0;
    const uint64_t request = 7;
    std::vector<uint64_t> gens = {1};
    for (uint32_t t = 0; t < kTokens; ++t)
      for (uint32_t l = 0; l < 3; ++l) {
        if (given[l] != kNoObject) --keep[given[l]];  // the layer's call ends its hint
        std::vector<ObjectId> keys = {route(l, t)};
        CallRows rows{keys, {&request, 1}, 1};  // one request: adaptive races request-aware
        EXPECT_TRUE(p->Access(keys, gens, false, nullptr, &r, &rows).ok());
        if (l == 0 && t % 8 == 0 && t >= from_token) hits += r.hit[0];
        ++keep[given[l] = route(l, t + 1)];
      }
    return hits;
  };
  const uint64_t cap = 3 * kObj;
  EXPECT_EQ(f_hits(MakePolicy("request-aware", s, cap).value(), false, 0), 0u);
  // F's routes from token 100 on: 37, all hits once the rate is learned.
  EXPECT_EQ(f_hits(MakePolicy("request-aware", s, cap).value(), true, 100), 37u);
  // adaptive racing LRU (its first candidate, so the leader on ties) and
  // request-aware: without hints both ghosts hit only L2's kept experts, so
  // LRU stays the leader and F never hits. The ghosts race with the hints of
  // their layers, so request-aware's ghost hits F too and takes over.
  const char* const race[] = {"lru", "request-aware"};
  EXPECT_EQ(f_hits(MakeAdaptivePolicy(s, cap, race), true, 100), 37u);
}

TEST(KeepHints, TheSweepAddsAKeepRowAndSteersThePrefetchRows) {
  trace::Trace t = Recurring();
  ObjectSpace space = SpaceForTrace(t, 1000);
  auto seq = BuildCallSeq(t, space);
  ASSERT_TRUE(seq.ok());
  TimingOptions o = KeepOpts(true);
  o.prefetch_staged = true;
  auto rows = TimedSweep(t, *seq, space, {"lru"}, {2}, o, 1);
  ASSERT_TRUE(rows.ok()) << rows.error().message();
  std::vector<std::string> labels;
  for (const auto& row : *rows) labels.push_back(row.result.policy + " " + PrefetchLabel(row.result));
  EXPECT_EQ(labels, (std::vector<std::string>{"lru no", "lru keep", "lru yes+keep", "lru staged+k", "belady yes"}));
  EXPECT_EQ((*rows)[0].result.hits, 0u);  // the demand-only baseline takes no hints
  EXPECT_EQ((*rows)[1].result.hits, 2u);
}

// The store: Prefetch() of objects already resident (staged mode) keeps
// them through other layers' misses until their layer's next acquire.
constexpr uint64_t kStoreObject = 12288;  // TinySpec's objects

void Token(ExpertStore& s, uint32_t layer, int64_t a, int64_t b) {
  std::vector<int64_t> ids = {a, b};
  auto acq = s.AcquireToken(layer, ids);
  ASSERT_TRUE(acq.ok()) << acq.error().message();
  ASSERT_TRUE(s.MarkUsed(*acq).ok());
}

// The store tests' cache: four objects, LRU.
auto OpenFourSlotLru(const testing::TinyPack& p, bool keep_predicted = true) {
  StoreOptions o;
  o.cache_bytes = 4 * kStoreObject;
  o.policy = "lru";
  o.queue_depth = 4;
  if (!keep_predicted) o.keep_predicted = false;  // on by default
  return testing::OpenOk(p, o);
}

uint64_t HitsOfTheLastToken(bool keep_predicted, nlohmann::json* prefetch_stats) {
  testing::TinyPack p(testing::TinySpec{});
  auto s = OpenFourSlotLru(p, keep_predicted);
  Token(*s, 1, 0, 1);
  Token(*s, 1, 4, 5);  // L1 e0, e1 are now LRU's first victims
  EXPECT_TRUE(s->Prefetch(1, std::vector<int64_t>{0, 1}).ok());  // both resident: nothing to read
  Token(*s, 2, 2, 3);  // two misses, two victims
  const uint64_t before = s->Snapshot()["cache_hits"];
  Token(*s, 1, 0, 1);
  auto j = s->Snapshot();
  *prefetch_stats = j["k3pack"]["prefetch"];
  EXPECT_TRUE(s->Close().ok());
  return j["cache_hits"].get<uint64_t>() - before;
}

TEST(KeepHints, StorePrefetchOfResidentsKeepsThemUntilTheirAcquire) {
  nlohmann::json on, off;
  EXPECT_EQ(HitsOfTheLastToken(true, &on), 2u);   // L2's misses took L1 e4, e5
  EXPECT_EQ(HitsOfTheLastToken(false, &off), 0u);  // demand-only: LRU took L1 e0, e1
  EXPECT_EQ(on["kept"], 2);
  EXPECT_EQ(on["keep_predicted"], true);
  EXPECT_EQ(on["issued"], 0);
  EXPECT_EQ(off["kept"], 0);
  EXPECT_EQ(off["keep_predicted"], false);
}

// Keep(): hints without reads. The same four-slot LRU as above: L1 e0, e1
// are kept through L2's misses, and e3, predicted but not resident, is not
// read (Prefetch() would have staged it).
TEST(KeepHints, StoreKeepHintsResidentsAndReadsNothing) {
  testing::TinyPack p(testing::TinySpec{});
  auto s = OpenFourSlotLru(p);
  Token(*s, 1, 0, 1);
  Token(*s, 1, 4, 5);
  const uint64_t reads = s->Snapshot()["pack_reads"];
  ASSERT_TRUE(s->Keep(1, std::vector<int64_t>{0, 1, 3}).ok());
  auto j = s->Snapshot();
  EXPECT_EQ(j["pack_reads"], reads);
  EXPECT_EQ(j["k3pack"]["prefetch"]["issued"], 0);
  EXPECT_EQ(j["k3pack"]["prefetch"]["kept"], 2);
  Token(*s, 2, 2, 3);
  const uint64_t before = s->Snapshot()["cache_hits"];
  Token(*s, 1, 0, 1);
  EXPECT_EQ(s->Snapshot()["cache_hits"].get<uint64_t>() - before, 2u);
  ASSERT_TRUE(s->Close().ok());
  // With keep hints off there is nothing Keep() could do: it says so.
  auto off = OpenFourSlotLru(p, false);
  Status st = off->Keep(1, std::vector<int64_t>{0});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message().find("keep hints are off in this store"), std::string::npos);
  ASSERT_TRUE(off->Close().ok());
}

TEST(KeepHints, StoreHintsEndAtTheLayersAcquire) {
  // The hint covers one acquire of its layer: after it, L1 e0 and e1 are
  // plain LRU residents again and L2's misses evict them first.
  testing::TinyPack p(testing::TinySpec{});
  auto s = OpenFourSlotLru(p);
  Token(*s, 1, 0, 1);
  Token(*s, 1, 4, 5);
  ASSERT_TRUE(s->Prefetch(1, std::vector<int64_t>{0, 1}).ok());
  Token(*s, 1, 4, 5);  // the acquire the hint was for (it routes elsewhere)
  Token(*s, 2, 2, 3);  // victims: L1 e0, e1 (least recent, no longer kept)
  const uint64_t before = s->Snapshot()["cache_hits"];
  Token(*s, 1, 4, 5);
  EXPECT_EQ(s->Snapshot()["cache_hits"].get<uint64_t>() - before, 2u);
  ASSERT_TRUE(s->Close().ok());
}

// Requests decoded side by side: A's prediction is given with A's request
// id, so B's acquire of the layer does not end it. Four slots, LRU: A routes
// L1 e0, e1, B routes e4, e5, A's look-ahead names e0, e1 again; B's next
// acquire of L1 (e4, e5 again) comes first, then L2's two misses. With A's
// id, e0 and e1 are still hinted there and L2 takes e4, e5: A's acquire hits
// twice. Without an id the hint ended at B's acquire, LRU took e0, e1 and A
// hits nothing.
uint64_t HitsOfRequestA(std::optional<uint64_t> prefetch_request) {
  testing::TinyPack p(testing::TinySpec{});
  auto s = OpenFourSlotLru(p);
  auto call = [&](uint32_t layer, int64_t a, int64_t b, uint64_t request) {
    const std::vector<int64_t> ids = {a, b}, shape = {1, 2};
    const std::vector<uint64_t> requests = {request};
    auto acq = s->Acquire(layer, ids, shape, std::nullopt, requests);
    EXPECT_TRUE(acq.ok()) << acq.error().message();
    if (acq.ok()) {
      EXPECT_TRUE(s->MarkUsed(*acq).ok());
    }
  };
  constexpr uint64_t kA = 1, kB = 2;
  call(1, 0, 1, kA);
  call(1, 4, 5, kB);
  EXPECT_TRUE(s->Prefetch(1, std::vector<int64_t>{0, 1}, prefetch_request).ok());
  call(1, 4, 5, kB);
  call(2, 2, 3, kB);
  const uint64_t before = s->Snapshot()["cache_hits"];
  call(1, 0, 1, kA);
  const uint64_t hits = s->Snapshot()["cache_hits"].get<uint64_t>() - before;
  EXPECT_TRUE(s->Close().ok());
  return hits;
}

TEST(KeepHints, StoreHintsOfARequestOutliveOtherRequestsAcquires) {
  EXPECT_EQ(HitsOfRequestA(1), 2u);
  EXPECT_EQ(HitsOfRequestA(std::nullopt), 0u);
  // B's own hint ends at B's acquire, as before.
  EXPECT_EQ(HitsOfRequestA(2), 0u);
}

}  // namespace
}  // namespace k3pack::store
