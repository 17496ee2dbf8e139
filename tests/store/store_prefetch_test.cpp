// The store's prefetch policy (prefetch_mode "staged", the default):
// speculative reads land outside the cache, the next acquire of their layer
// takes what it routes to and drops the rest, a byte budget refuses excess,
// queued reads an acquire no longer needs are never issued, and the cache
// holds exactly what it would hold without prefetch.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <random>
#include <thread>

#include "k3pack/store.h"
#include "open_ok.h"
#include "store/synthetic_pack.h"

namespace k3pack::store {
namespace {

using testing::PatternByte;
using testing::OpenOk;
using testing::TinyPack;
using testing::TinySpec;
using testing::kObject;

StoreOptions PrefetchOpts(uint64_t objects, const std::string& policy = "lru") {
  StoreOptions o;
  o.cache_bytes = objects * kObject;
  o.policy = policy;
  o.queue_depth = 4;
  return o;
}

// One decode token (top-2) at `layer`, released at once; checks the bytes.
void Token(ExpertStore& s, uint32_t layer, int64_t a, int64_t b) {
  std::vector<int64_t> ids = {a, b};
  auto acq = s.AcquireToken(layer, ids);
  ASSERT_TRUE(acq.ok()) << acq.error().message();
  for (const auto& v : acq->routes)
    for (uint64_t i = 0; i < v.gate.size(); i += 331) ASSERT_EQ(v.gate[i], PatternByte(v.layer, v.expert, 1, i));
  ASSERT_TRUE(s.MarkUsed(*acq).ok());
}

uint64_t Pf(const nlohmann::json& j, const char* key) { return j["k3pack"]["prefetch"][key].get<uint64_t>(); }

TEST(PrefetchStaged, UsedByTheNextAcquireIsUsefulWithNoSecondRead) {
  TinyPack p(TinySpec{});
  for (const char* io : {"pread", "uring"}) {
    StoreOptions o = PrefetchOpts(8);
    o.io_backend = io;
    auto s = OpenOk(p, o);
    ASSERT_TRUE(s->Prefetch(1, std::vector<int64_t>{3, 3}).ok());
    EXPECT_EQ(Pf(s->Snapshot(), "issued"), 1u);
    Token(*s, 1, 3, 5);  // 3 comes from staging, 5 is read on demand
    auto j = s->Snapshot();
    EXPECT_EQ(j["pack_reads"], 2);
    EXPECT_EQ(j["cache_misses"], 2);  // the policy saw two misses, as without prefetch
    EXPECT_EQ(j["cache_hits"], 0);
    EXPECT_EQ(j["resident_experts"], 2);
    EXPECT_EQ(Pf(j, "useful"), 1u);
    EXPECT_EQ(Pf(j, "useful_bytes"), kObject);
    EXPECT_EQ(Pf(j, "wasted"), 0u);
    EXPECT_EQ(Pf(j, "staged_bytes"), 0u);
    EXPECT_EQ(j["k3pack"]["prefetch"]["mode"], "staged");
    // Now resident: prefetching it again reads nothing.
    ASSERT_TRUE(s->Prefetch(1, std::vector<int64_t>{3}).ok());
    EXPECT_EQ(Pf(s->Snapshot(), "issued"), 1u);
    Token(*s, 1, 3, 5);
    EXPECT_EQ(s->Snapshot()["cache_hits"], 2);
    ASSERT_TRUE(s->Close().ok());
    EXPECT_EQ(s->Snapshot()["pack_reads"], 2);
  }
}

TEST(PrefetchStaged, UnusedIsWastedAndDroppedAtTheNextAcquireOfItsLayer) {
  TinyPack p(TinySpec{});
  auto s = OpenOk(p, PrefetchOpts(8));
  ASSERT_TRUE(s->Prefetch(1, std::vector<int64_t>{4}).ok());
  Token(*s, 2, 0, 1);  // another layer: layer 1's staging is untouched
  auto j = s->Snapshot();
  EXPECT_EQ(Pf(j, "wasted"), 0u);
  EXPECT_EQ(Pf(j, "staged"), 1u);
  EXPECT_EQ(Pf(j, "staged_bytes"), kObject);
  Token(*s, 1, 3, 5);  // does not route to 4: dropped, its read wasted
  j = s->Snapshot();
  EXPECT_EQ(Pf(j, "staged"), 0u);
  EXPECT_EQ(Pf(j, "wasted"), 1u);
  EXPECT_EQ(Pf(j, "wasted_bytes"), kObject);
  EXPECT_EQ(Pf(j, "useful"), 0u);
  EXPECT_EQ(j["resident_experts"], 4);  // 4 never entered the cache
  // Later demand for 4 reads it again: it was not kept anywhere.
  Token(*s, 1, 4, 5);
  j = s->Snapshot();
  EXPECT_EQ(j["cache_misses"], 5);
  EXPECT_EQ(Pf(j, "useful"), 0u);
  ASSERT_TRUE(s->Close().ok());
  j = s->Snapshot();
  EXPECT_EQ(j["pack_reads"], 6);  // 0, 1, 3, 5, the wasted 4, and 4 on demand
  EXPECT_EQ(Pf(j, "staged_bytes"), 0u);  // the discarded read gave its charge back
}

// One decode token (top-2) of `request` at layer 1, released at once.
void TokenOf(ExpertStore& s, uint64_t request, int64_t a, int64_t b) {
  const std::vector<int64_t> ids = {a, b}, shape = {1, 2};
  const std::vector<uint64_t> requests = {request};
  auto acq = s.Acquire(1, ids, shape, std::nullopt, requests);
  ASSERT_TRUE(acq.ok()) << acq.error().message();
  ASSERT_TRUE(s.MarkUsed(*acq).ok());
}

// Requests decoded side by side: A's read is staged with A's request id, so
// B's acquire of the layer, which does not route to it, leaves it staged;
// A's next acquire takes it with no second read. Without an id B's acquire
// drops it (wasted) and A reads it again.
nlohmann::json StagedForAThenBThenA(std::optional<uint64_t> prefetch_request) {
  TinyPack p(TinySpec{});
  auto s = OpenOk(p, PrefetchOpts(8));
  constexpr uint64_t kA = 1, kB = 2;
  EXPECT_TRUE(s->Prefetch(1, std::vector<int64_t>{4}, prefetch_request).ok());
  TokenOf(*s, kB, 0, 1);
  EXPECT_EQ(Pf(s->Snapshot(), "wasted"), prefetch_request == kA ? 0u : 1u);  // dropped by B's acquire, or not
  TokenOf(*s, kA, 4, 5);
  EXPECT_TRUE(s->Close().ok());
  return s->Snapshot();
}

TEST(PrefetchStaged, AReadStagedForARequestWaitsThroughOtherRequestsAcquires) {
  nlohmann::json j = StagedForAThenBThenA(1);
  EXPECT_EQ(Pf(j, "useful"), 1u);
  EXPECT_EQ(Pf(j, "wasted"), 0u);
  EXPECT_EQ(j["pack_reads"], 4);  // 0, 1, 5 on demand and 4 once, staged
  EXPECT_EQ(j["cache_misses"], 4);  // the policy's view is demand-only's
  j = StagedForAThenBThenA(std::nullopt);
  EXPECT_EQ(Pf(j, "useful"), 0u);
  EXPECT_EQ(Pf(j, "wasted"), 1u);  // dropped at B's acquire
  EXPECT_EQ(j["pack_reads"], 5);   // and 4 read again for A
  // B's own read ends at B's acquire, as before.
  j = StagedForAThenBThenA(2);
  EXPECT_EQ(Pf(j, "wasted"), 1u);
  EXPECT_EQ(j["pack_reads"], 5);
}

// A guess staged for two requests waits for both: A's acquire (not routing
// to it) leaves it for B, whose acquire takes it.
TEST(PrefetchStaged, AReadTwoRequestsGuessedWaitsForTheSecond) {
  TinyPack p(TinySpec{});
  auto s = OpenOk(p, PrefetchOpts(8));
  ASSERT_TRUE(s->Prefetch(1, std::vector<int64_t>{4}, uint64_t{1}).ok());
  ASSERT_TRUE(s->Prefetch(1, std::vector<int64_t>{4}, uint64_t{2}).ok());
  EXPECT_EQ(Pf(s->Snapshot(), "issued"), 1u);  // one read for both
  TokenOf(*s, 1, 0, 1);
  EXPECT_EQ(Pf(s->Snapshot(), "wasted"), 0u);  // still staged for B
  TokenOf(*s, 2, 4, 5);
  ASSERT_TRUE(s->Close().ok());
  auto j = s->Snapshot();
  EXPECT_EQ(Pf(j, "useful"), 1u);
  EXPECT_EQ(Pf(j, "wasted"), 0u);
  EXPECT_EQ(j["pack_reads"], 4);
}

TEST(PrefetchStaged, BudgetFullRefusesNewPrefetches) {
  TinyPack p(TinySpec{});
  StoreOptions o = PrefetchOpts(8);
  o.prefetch_budget_bytes = 2 * kObject;
  auto s = OpenOk(p, o);
  ASSERT_TRUE(s->Prefetch(1, std::vector<int64_t>{0, 1, 2, 3}).ok());
  auto j = s->Snapshot();
  EXPECT_EQ(j["k3pack"]["prefetch"]["budget_bytes"], 2 * kObject);
  EXPECT_EQ(Pf(j, "issued"), 2u);
  EXPECT_EQ(Pf(j, "refused"), 2u);
  EXPECT_EQ(Pf(j, "refused_bytes"), 2 * kObject);
  EXPECT_EQ(Pf(j, "staged_bytes"), 2 * kObject);
  ASSERT_TRUE(s->Prefetch(2, std::vector<int64_t>{0}).ok());  // still full
  EXPECT_EQ(Pf(s->Snapshot(), "refused"), 3u);
  Token(*s, 1, 0, 1);  // takes both: the budget is free again
  j = s->Snapshot();
  EXPECT_EQ(Pf(j, "useful"), 2u);
  EXPECT_EQ(Pf(j, "staged_bytes"), 0u);
  EXPECT_EQ(Pf(j, "staged_bytes_max"), 2 * kObject);
  ASSERT_TRUE(s->Prefetch(2, std::vector<int64_t>{0}).ok());
  EXPECT_EQ(Pf(s->Snapshot(), "issued"), 3u);
  ASSERT_TRUE(s->Close().ok());
}

// File offset of an object's first byte (its up payload).
uint64_t ObjectOffset(const TinyPack& p, uint32_t layer, uint32_t expert) {
  uint64_t best = UINT64_MAX;
  for (uint64_t i = 0; i < p.layout.index_count(); ++i) {
    pack::EntrySlot e = p.layout.Entry(i);
    if (e.layer == layer && e.expert == expert) best = std::min(best, e.offset);
  }
  return best;
}

// One speculative read at a time, held in flight by the fault hook (pread
// engine: the hook runs on the reading thread, so only that read waits): the
// acquire takes a queued object (its read is submitted at once), and the
// queued object it does not route to is cancelled: never read.
TEST(PrefetchStaged, QueuedReadsTheAcquireNoLongerNeedsAreCancelled) {
  TinyPack p(TinySpec{});
  StoreOptions o = PrefetchOpts(8);
  o.prefetch_queue_depth = 1;
  auto s = OpenOk(p, o);
  std::atomic<bool> hold{true};
  const uint64_t held = ObjectOffset(p, 1, 0);
  s->SetReadFaultHook([&](uint64_t offset, uint64_t, int64_t*) {
    while (offset == held && hold.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  ASSERT_TRUE(s->Prefetch(1, std::vector<int64_t>{0, 1, 2}).ok());
  auto j = s->Snapshot();
  EXPECT_EQ(Pf(j, "issued"), 3u);
  EXPECT_EQ(Pf(j, "inflight"), 1u);  // 1 and 2 wait in the store
  EXPECT_EQ(Pf(j, "staged"), 3u);
  Token(*s, 1, 1, 5);  // takes 1 (queued: read now), drops 0 (in flight) and 2 (queued)
  j = s->Snapshot();
  // 0 is wasted and still in flight: issued = useful + wasted + cancelled + staged.
  EXPECT_EQ(Pf(j, "inflight"), 1u);
  EXPECT_EQ(Pf(j, "staged"), 0u);
  EXPECT_EQ(Pf(j, "useful"), 1u);
  EXPECT_EQ(Pf(j, "cancelled"), 1u);
  EXPECT_EQ(Pf(j, "cancelled_bytes"), kObject);
  EXPECT_EQ(Pf(j, "wasted"), 1u);
  EXPECT_EQ(Pf(j, "staged_bytes"), kObject);  // 0's read still holds its charge
  EXPECT_EQ(j["pack_reads"], 2);             // 1 and 5; 0 has not landed
  hold = false;
  ASSERT_TRUE(s->Close().ok());
  j = s->Snapshot();
  EXPECT_EQ(j["pack_reads"], 3);  // 2 was never read
  EXPECT_EQ(Pf(j, "staged_bytes"), 0u);
  EXPECT_EQ(Pf(j, "inflight"), 0u);
}

TEST(PrefetchStaged, FailedSpeculativeReadFallsBackToDemand) {
  TinyPack p(TinySpec{});
  auto s = OpenOk(p, PrefetchOpts(8));
  std::atomic<int> calls{0};
  s->SetReadFaultHook([&](uint64_t, uint64_t, int64_t* r) {
    if (calls.fetch_add(1) == 0) *r = -5;  // EIO on the prefetch
  });
  ASSERT_TRUE(s->Prefetch(1, std::vector<int64_t>{2}).ok());
  // Wait until the failed read has landed, so the acquire finds nothing staged.
  for (int i = 0; i < 20000 && s->Snapshot()["io_errors"] == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(s->Snapshot()["io_errors"], 1);
  Token(*s, 1, 2, 3);  // read on demand, succeeds
  auto j = s->Snapshot();
  EXPECT_EQ(Pf(j, "useful"), 0u);
  EXPECT_EQ(Pf(j, "staged"), 0u);
  EXPECT_EQ(Pf(j, "failed"), 1u);  // issued = useful + wasted + cancelled + staged + failed
  EXPECT_EQ(Pf(j, "issued"), 1u);
  EXPECT_EQ(Pf(j, "staged_bytes"), 0u);
  EXPECT_EQ(j["pack_reads"], 3);
  ASSERT_TRUE(s->Close().ok());
}

// A demand-only store and a prefetching one see the same acquires; the
// prefetches guess the next call's layer with 60% of routes right. With
// staging, the cache must evolve identically (same hits, misses, evictions
// and residents after every acquire) and the only extra reads are wasted
// guesses (keep hints off). The older "cache" mode must diverge on the same calls (else this
// test could not tell the two apart).
struct Counters {
  uint64_t hits, misses, evictions, resident;
  bool operator==(const Counters&) const = default;
};
Counters Read(const ExpertStore& s) {
  auto j = s.Snapshot();
  return {j["cache_hits"], j["cache_misses"], j["cache_evictions"], j["resident_experts"]};
}

bool SameCacheAsDemandOnly(const TinyPack& p, const std::string& policy, const std::string& mode) {
  StoreOptions o = PrefetchOpts(3, policy);  // room for one token's pair and one more
  o.prefetch_mode = mode;
  o.prefetch_budget_bytes = 4 * kObject;
  // Keep hints (on by default) are the one way a staged prefetch may change
  // the victims; keep_hints_test.cpp tests them.
  o.keep_predicted = false;
  auto demand = OpenOk(p, PrefetchOpts(3, policy));
  auto pre = OpenOk(p, o);
  std::mt19937 rng(7);
  std::vector<std::pair<uint32_t, std::array<int64_t, 2>>> calls;
  for (int c = 0; c < 400; ++c) {
    int64_t a = rng() % 4, b = 4 + rng() % 4;  // skewed toward a few experts per layer
    calls.push_back({uint32_t(1 + c % 2), {a, b}});
  }
  bool same = true;
  for (size_t c = 0; c < calls.size(); ++c) {
    if (c + 1 < calls.size()) {
      std::vector<int64_t> guess;
      for (int64_t e : calls[c + 1].second) guess.push_back(rng() % 10 < 6 ? e : int64_t(rng() % 8));
      EXPECT_TRUE(pre->Prefetch(calls[c + 1].first, guess).ok());
    }
    Token(*demand, calls[c].first, calls[c].second[0], calls[c].second[1]);
    Token(*pre, calls[c].first, calls[c].second[0], calls[c].second[1]);
    if (!(Read(*demand) == Read(*pre))) same = false;
  }
  EXPECT_TRUE(demand->Close().ok());
  EXPECT_TRUE(pre->Close().ok());
  auto d = demand->Snapshot(), q = pre->Snapshot();
  if (mode == "staged") {
    // Reads: the demand misses not served from staging, plus every staged read issued.
    EXPECT_GT(Pf(q, "useful"), 50u) << policy;
    EXPECT_EQ(q["pack_reads"].get<uint64_t>(), d["pack_reads"].get<uint64_t>() + Pf(q, "wasted")) << policy;
    EXPECT_EQ(Pf(q, "issued"), Pf(q, "useful") + Pf(q, "wasted") + Pf(q, "cancelled")) << policy;
  }
  return same;
}

TEST(PrefetchStaged, NeverChangesWhatTheCacheHolds) {
  TinyPack p(TinySpec{});
  for (const char* policy : {"lru", "reuse-lfu-lru-v2", "quota-decay", "adaptive"}) {
    EXPECT_TRUE(SameCacheAsDemandOnly(p, policy, "staged")) << policy;
    EXPECT_FALSE(SameCacheAsDemandOnly(p, policy, "cache")) << policy;
  }
}

// issued = useful + wasted + cancelled + staged + failed, at every moment.
void ExpectPrefetchIdentity(const nlohmann::json& j) {
  EXPECT_EQ(Pf(j, "issued"), Pf(j, "useful") + Pf(j, "wasted") + Pf(j, "cancelled") + Pf(j, "staged") + Pf(j, "failed"))
      << j["k3pack"]["prefetch"].dump();
}

// The cache mode's accounting: a read ahead into the cache that no acquire
// used yet is its `staged` term, a failed one is `failed` (it was in no term
// at all), and a closed store holds nothing, by the policy's count too (it
// said so of buffers it had freed).
TEST(PrefetchCache, EveryIssuedReadIsInOneTermAndAClosedStoreHoldsNothing) {
  TinyPack p(TinySpec{});
  StoreOptions o = PrefetchOpts(8);
  o.prefetch_mode = "cache";
  auto s = OpenOk(p, o);
  std::atomic<int> calls{0};
  s->SetReadFaultHook([&](uint64_t, uint64_t, int64_t* r) {
    if (calls.fetch_add(1) == 0) *r = -5;  // EIO on the first prefetch
  });
  ASSERT_TRUE(s->Prefetch(1, std::vector<int64_t>{2}).ok());
  for (int i = 0; i < 20000 && s->Snapshot()["io_errors"] == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto j = s->Snapshot();
  ASSERT_EQ(j["io_errors"], 1);
  EXPECT_EQ(Pf(j, "failed"), 1u);
  ExpectPrefetchIdentity(j);
  ASSERT_TRUE(s->Prefetch(1, std::vector<int64_t>{4, 5}).ok());
  j = s->Snapshot();
  EXPECT_EQ(Pf(j, "issued"), 3u);
  EXPECT_EQ(Pf(j, "staged"), 2u);
  EXPECT_EQ(Pf(j, "staged_bytes"), 2 * kObject);
  ExpectPrefetchIdentity(j);
  Token(*s, 1, 4, 6);  // 4 is used; 5 stays read ahead
  j = s->Snapshot();
  EXPECT_EQ(Pf(j, "useful"), 1u);
  EXPECT_EQ(Pf(j, "staged"), 1u);
  ExpectPrefetchIdentity(j);
  ASSERT_TRUE(s->Close().ok());
  j = s->Snapshot();
  EXPECT_EQ(Pf(j, "wasted"), 1u);
  EXPECT_EQ(Pf(j, "staged"), 0u);
  ExpectPrefetchIdentity(j);
  EXPECT_EQ(j["resident_experts"], 0);
  EXPECT_EQ(j["resident_bytes"], 0);
  EXPECT_EQ(j["k3pack"]["cache_entry_bytes"], 0);
}

// In the cache mode, prefetched objects stay pinned until their layer's next
// acquire. An acquire that needed their room waited for another thread's
// call first, and dropped them only when its 10 s wait ran out.
TEST(PrefetchCache, PrefetchPinsGoBeforeAWaitForAnotherThread) {
  TinyPack p(TinySpec{});
  StoreOptions o = PrefetchOpts(4);
  o.prefetch_mode = "cache";
  auto s = OpenOk(p, o);
  std::atomic<bool> held{false}, done{false}, released_first{false};
  std::thread other([&] {
    auto acq = s->AcquireToken(2, std::vector<int64_t>{0, 1});
    ASSERT_TRUE(acq.ok()) << acq.error().message();
    held = true;
    // Holds its call until the acquire below returns (at most 30 s: a loaded
    // machine under a sanitizer is slow, and the wait ends when it returns).
    for (int i = 0; i < 30000 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    released_first = !done;
    ASSERT_TRUE(s->MarkUsed(*acq).ok());
  });
  while (!held) std::this_thread::yield();
  ASSERT_TRUE(s->Prefetch(1, std::vector<int64_t>{2, 3}).ok());  // fills the cache, pinned
  auto acq = s->AcquireToken(2, std::vector<int64_t>{4, 5});
  done = true;
  other.join();
  ASSERT_TRUE(acq.ok()) << acq.error().message();
  EXPECT_FALSE(released_first) << "the acquire waited for the other thread with its own prefetch pins to drop";
  ASSERT_TRUE(s->MarkUsed(*acq).ok());
  ASSERT_TRUE(s->Close().ok());
}

// `queue_depth_max` is the most reads at the device at once: it counted the
// objects handed to the engine, queued ones too (4 with a queue depth of 1).
TEST(PrefetchStaged, TheQueueDepthSeenNeverPassesTheQueueDepth) {
  TinyPack p(TinySpec{});
  for (const char* io : {"pread", "uring"}) {
    StoreOptions o = PrefetchOpts(8);
    o.io_backend = io;
    o.queue_depth = 1;
    auto s = OpenOk(p, o);
    ASSERT_TRUE(s->Prefetch(1, std::vector<int64_t>{0, 1, 2, 3}).ok());
    Token(*s, 2, 4, 5);
    Token(*s, 1, 6, 7);
    auto j = s->Snapshot();
    EXPECT_EQ(j["k3pack"]["queue_depth_max"], 1) << io;
    ASSERT_TRUE(s->Close().ok());
  }
}

TEST(PrefetchStaged, OptionsAreChecked) {
  TinyPack p(TinySpec{});
  StoreOptions o = PrefetchOpts(8);
  o.prefetch_mode = "eager";
  auto s = ExpertStore::Open(p.pack, p.manifest, o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().message(), "unknown prefetch mode 'eager' (known: staged, cache)");
  o = PrefetchOpts(8);
  o.prefetch_queue_depth = -1;
  EXPECT_FALSE(ExpertStore::Open(p.pack, p.manifest, o).ok());
  // Defaults: two top-2 working sets of staging, half the queue depth.
  auto d = OpenOk(p, PrefetchOpts(8));
  auto j = d->Snapshot()["k3pack"]["prefetch"];
  EXPECT_EQ(j["budget_bytes"], 4 * kObject);
  EXPECT_EQ(j["queue_depth"], 2);
}

}  // namespace
}  // namespace k3pack::store
