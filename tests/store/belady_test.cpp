// Belady's MIN: hand-checked cases and an exhaustive-search cross-check on
// tiny traces (the optimum over every possible victim choice).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <set>

#include "store/simulate.h"

namespace k3pack::store {
namespace {

ObjectSpace Space(uint32_t experts = 8) { return ObjectSpace::Uniform(1, experts, 2, 4096, 1); }

CallSeq Seq(const std::vector<std::vector<ObjectId>>& calls) {
  CallSeq s;
  for (auto keys : calls) {
    std::sort(keys.begin(), keys.end());
    s.calls.push_back({0, false, 1, s.keys.size(), s.keys.size() + keys.size()});
    s.keys.insert(s.keys.end(), keys.begin(), keys.end());
  }
  return s;
}

TEST(Belady, TextbookSequence) {
  // a b c a b with 2 slots: at c evict b (next use 4) rather than a (next use 3).
  auto r = SimulateBelady(Seq({{0}, {1}, {2}, {0}, {1}}), Space(), 2);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->hits, 1u);
  EXPECT_EQ(r->misses, 4u);
  EXPECT_EQ(r->evictions, 2u);
}

TEST(Belady, ClassicThreeSlotExample) {
  // 7 0 1 2 0 3 0 4 2 3 0 3 2 with 3 frames: OPT has 7 faults (textbook).
  std::vector<std::vector<ObjectId>> calls;
  for (ObjectId k : {7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2}) calls.push_back({k});
  auto r = SimulateBelady(Seq(calls), Space(), 3);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->misses, 7u);
  EXPECT_EQ(r->hits, 6u);
}

TEST(Belady, CallKeysAreCoResident) {
  // {0,1} then {2,3} then {0,1} with 2 slots: nothing can be kept.
  auto r = SimulateBelady(Seq({{0, 1}, {2, 3}, {0, 1}}), Space(), 2);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->hits, 0u);
  // With 3 slots one of {0,1} survives the middle call.
  r = SimulateBelady(Seq({{0, 1}, {2, 3}, {0, 1}}), Space(), 3);
  EXPECT_EQ(r->hits, 1u);
}

TEST(Belady, CallLargerThanCacheIsAnError) {
  EXPECT_FALSE(SimulateBelady(Seq({{0, 1, 2}}), Space(), 2).ok());
}

// Minimum misses over all victim choices (keys of the current call protected).
uint64_t BruteForce(const CallSeq& seq, uint64_t slots) {
  uint64_t best = UINT64_MAX;
  std::function<void(size_t, size_t, std::set<ObjectId>, uint64_t)> go = [&](size_t c, size_t p,
                                                                              std::set<ObjectId> res, uint64_t miss) {
    if (miss >= best) return;
    if (c == seq.calls.size()) { best = miss; return; }
    const auto& call = seq.calls[c];
    if (p == call.end) return go(c + 1, seq.calls.size() > c + 1 ? seq.calls[c + 1].begin : p, res, miss);
    ObjectId k = seq.keys[p];
    if (res.count(k)) return go(c, p + 1, res, miss);
    if (res.size() < slots) {
      res.insert(k);
      return go(c, p + 1, res, miss + 1);
    }
    for (ObjectId v : std::vector<ObjectId>(res.begin(), res.end())) {
      bool in_call = std::find(seq.keys.begin() + call.begin, seq.keys.begin() + call.end, v) !=
                     seq.keys.begin() + call.end;
      if (in_call) continue;
      auto next = res;
      next.erase(v);
      next.insert(k);
      go(c, p + 1, next, miss + 1);
    }
  };
  go(0, seq.calls.empty() ? 0 : seq.calls[0].begin, {}, 0);
  return best;
}

TEST(Belady, OptimalAgainstExhaustiveSearch) {
  std::mt19937_64 rng(42);
  for (int trial = 0; trial < 60; ++trial) {
    std::vector<std::vector<ObjectId>> calls;
    int n = 5 + trial % 4;
    for (int i = 0; i < n; ++i) {
      std::set<ObjectId> ks;
      int width = 1 + rng() % 2;
      while (int(ks.size()) < width) ks.insert(rng() % 5);
      calls.emplace_back(ks.begin(), ks.end());
    }
    uint64_t slots = 2 + trial % 3;
    CallSeq seq = Seq(calls);
    auto r = SimulateBelady(seq, Space(), slots);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->misses, BruteForce(seq, slots)) << "trial " << trial;
  }
}

TEST(Belady, UpperBoundsEveryPolicyOnAGeneratedTrace) {
  trace::GenOptions o;
  o.layer_ids = {1, 2, 3, 4};
  o.num_experts = 64;
  o.top_k = 4;
  o.requests = 2;
  o.prompt_tokens = 8;
  o.decode_tokens = 100;
  auto t = trace::Generate(o);
  ASSERT_TRUE(t.ok());
  ObjectSpace space = SpaceForTrace(*t, 4096);
  auto seq = BuildCallSeq(*t, space);
  ASSERT_TRUE(seq.ok());
  for (uint64_t slots : {8, 20, 60}) {
    auto b = SimulateBelady(*seq, space, slots);
    ASSERT_TRUE(b.ok());
    for (const char* p : {"reuse-lfu-lru-v2", "lru", "decay-lfu", "quota-decay"}) {
      auto r = Simulate(*seq, space, p, slots * 4096);
      ASSERT_TRUE(r.ok());
      EXPECT_LE(r->hits, b->hits) << p << " slots " << slots;
      EXPECT_EQ(r->hits + r->misses, b->hits + b->misses);
    }
  }
}

}  // namespace
}  // namespace k3pack::store
