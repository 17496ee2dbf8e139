// ExpertStore acquire / mark_used / prefetch / stats on real files: route
// errors, views and role offsets, eviction, injected and real short reads,
// O_DIRECT and io_uring, concurrency.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
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

StoreOptions Opts(uint64_t objects, const std::string& policy = "reuse-lfu-lru-v2") {
  StoreOptions o;
  o.cache_bytes = objects * 12288;
  o.policy = policy;
  o.queue_depth = 4;
  return o;
}

// Every byte of every role view equals the pack's pattern.
void ExpectBytes(const ExpertView& v) {
  const std::span<const uint8_t> roles[3] = {v.up, v.gate, v.down};
  for (uint32_t r = 0; r < 3; ++r) {
    ASSERT_EQ(roles[r].size(), 4096u);
    for (uint64_t i = 0; i < roles[r].size(); i += 97)
      ASSERT_EQ(roles[r][i], PatternByte(v.layer, v.expert, r, i)) << v.layer << "/" << v.expert << " role " << r;
  }
  EXPECT_EQ(v.bytes.data(), v.up.data());
  EXPECT_EQ(v.bytes.size(), 12288u);
}

// Rows of two routes each (shape ids.size()/2 x 2).
Result<Acquisition> GetRowsOfTwo(ExpertStore& s, uint32_t layer, std::vector<int64_t> ids,
                                 std::optional<bool> prefill = {}) {
  int64_t shape[2] = {static_cast<int64_t>(ids.size() / 2), 2};
  return s.Acquire(layer, ids, shape, prefill);
}

TEST(StoreAcquire, ViewsInRouteOrderWithDuplicates) {
  TinyPack p(TinySpec{});
  auto s = OpenOk(p, Opts(8));
  auto a = GetRowsOfTwo(*s, 2, {5, 1, 1, 5});  // two tokens, duplicates kept
  ASSERT_TRUE(a.ok()) << a.error().message();
  ASSERT_EQ(a->routes.size(), 4u);
  EXPECT_EQ(a->routes[0].expert, 5u);
  EXPECT_EQ(a->routes[1].expert, 1u);
  EXPECT_EQ(a->routes[2].expert, 1u);
  EXPECT_EQ(a->routes[1].bytes.data(), a->routes[2].bytes.data());
  for (const auto& v : a->routes) ExpectBytes(v);
  ASSERT_TRUE(s->MarkUsed(*a).ok());
  ASSERT_TRUE(s->MarkUsed(*a).ok());  // idempotent
  auto j = s->Snapshot();
  EXPECT_EQ(j["cache_misses"], 2);
  EXPECT_EQ(j["pack_reads"], 2);
  EXPECT_EQ(j["route_calls_by_layer"], (std::vector<int>{0, 0, 1}));
  EXPECT_EQ(j["route_tokens_by_layer"], (std::vector<int>{0, 0, 2}));
  auto b = GetRowsOfTwo(*s, 2, {1, 5});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(s->Snapshot()["cache_hits"], 2);
  EXPECT_EQ(s->Snapshot()["pack_reads"], 2);
}

TEST(StoreAcquire, RouteErrors) {
  TinyPack p(TinySpec{});
  auto s = OpenOk(p, Opts(8));
  std::vector<int64_t> ids = {1, 2, 3};
  int64_t shape[2] = {1, 3};
  auto r = s->Acquire(1, ids, shape);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message(), "runtime top-k must be exactly 2; received shape (1, 3)");
  int64_t flat[1] = {2};
  r = s->Acquire(1, std::span<const int64_t>(ids.data(), 2), flat);
  EXPECT_EQ(r.error().message(), "runtime top-k must be exactly 2; received shape (2,)");
  r = GetRowsOfTwo(*s, 0, {1, 2});
  EXPECT_EQ(r.error().message(), "layer 0 is not an active routed MoE layer");
  r = GetRowsOfTwo(*s, 1, {1, 8});
  EXPECT_EQ(r.error().message(), "route contains an out-of-range expert id");
  r = GetRowsOfTwo(*s, 1, {-1, 2});
  EXPECT_EQ(r.error().message(), "route contains an out-of-range expert id");
  EXPECT_EQ(s->Prefetch(3, std::vector<int64_t>{1}).message(), "layer 3 is not an active routed MoE layer");
}

TEST(StoreAcquire, CannotEvictTheActiveWorkingSet) {
  TinyPack p(TinySpec{});
  auto s = OpenOk(p, Opts(3));
  auto a = GetRowsOfTwo(*s, 1, {0, 1});
  ASSERT_TRUE(a.ok());
  // Held (no mark_used): 2 of 3 slots pinned, the next call needs 2 new ones.
  auto b = GetRowsOfTwo(*s, 1, {2, 3});
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.error().message(), "expert cache cannot evict the active top-k working set");
  EXPECT_EQ(b.error().kind(), ErrorKind::kRuntime);
  ASSERT_TRUE(s->MarkUsed(*a).ok());
  auto c = GetRowsOfTwo(*s, 1, {2, 3});
  ASSERT_TRUE(c.ok()) << c.error().message();
  for (const auto& v : c->routes) ExpectBytes(v);
  // The earlier views stay valid after eviction (shared ownership).
  for (const auto& v : a->routes) ExpectBytes(v);
  ASSERT_TRUE(s->MarkUsed(*c).ok());
  // A call whose own distinct experts outnumber the cache: SGLang's text,
  // then a hint that says so (the text alone left users guessing).
  auto d = GetRowsOfTwo(*s, 1, {0, 1, 2, 3});
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().message(),
            "expert cache cannot evict the active top-k working set\nhint: this call routes 4 distinct experts of one "
            "layer and the cache holds 3 objects: give it room for a call's distinct experts, or route fewer tokens "
            "per call");
}

TEST(StoreAcquire, InjectedShortReadIsReportedNeverServed) {
  TinyPack p(TinySpec{});
  auto s = OpenOk(p, Opts(8));
  const uint64_t target = p.layout.ObjectOffset(0, 2);  // layer 1, expert 2
  std::atomic<int> armed{1};
  s->SetReadFaultHook([&](uint64_t off, uint64_t len, int64_t* result) {
    if (off == target && armed.exchange(0)) *result = static_cast<int64_t>(len) - 100;
  });
  auto r = GetRowsOfTwo(*s, 1, {2, 3});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message(), "short expert-pack read for (1, 2, 0, 12288): 12188 != 12288");
  EXPECT_EQ(r.error().kind(), ErrorKind::kOS);
  EXPECT_EQ(s->Snapshot()["io_errors"], 1);
  // Not kept: the next acquire reads it again and gets the real bytes.
  auto ok = GetRowsOfTwo(*s, 1, {2, 3});
  ASSERT_TRUE(ok.ok()) << ok.error().message();
  for (const auto& v : ok->routes) ExpectBytes(v);
  EXPECT_EQ(s->Snapshot()["pack_reads"], 3);  // 2 twice, 3 once (then a hit)
}

TEST(StoreAcquire, InjectedEioWithSplits) {
  TinyPack p(TinySpec{});
  StoreOptions o = Opts(8);
  o.read_splits = 3;  // 12288 >= 3*4096: page-aligned ranges of 4096
  auto s = OpenOk(p, o);
  const uint64_t target = p.layout.ObjectOffset(1, 7) + 4096;  // second range of layer 2, expert 7
  s->SetReadFaultHook([&](uint64_t off, uint64_t, int64_t* result) {
    if (off == target) *result = -EIO;
  });
  auto r = GetRowsOfTwo(*s, 2, {7, 0});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message(), "expert-pack read failed for (2, 7, 4096, 4096): Input/output error");
  EXPECT_EQ(r.error().sys_errno(), EIO);
}

TEST(StoreAcquire, FileTruncatedUnderALiveStore) {
  TinyPack p(TinySpec{});
  for (const char* io : {"pread", "uring"}) {
    p.WritePack();
    StoreOptions o = Opts(8);
    o.io_backend = io;
    auto s = OpenOk(p, o);
    // Cut the last object (layer 2, expert 7) in the middle of its gate role.
    std::filesystem::resize_file(p.pack, p.layout.final_size() - 12288 + 5000);
    auto r = GetRowsOfTwo(*s, 2, {7, 6});
    ASSERT_FALSE(r.ok()) << io;
    EXPECT_EQ(r.error().message(), "short expert-pack read for (2, 7, 0, 12288): 5000 != 12288") << io;
    auto fine = GetRowsOfTwo(*s, 2, {6, 5});
    ASSERT_TRUE(fine.ok());
    for (const auto& v : fine->routes) ExpectBytes(v);
  }
}

TEST(StoreAcquire, DirectIoAndUring) {
  TinyPack p(TinySpec{});
  for (const char* io : {"pread", "uring"}) {
    for (bool direct : {false, true}) {
      StoreOptions o = Opts(4, "lru");
      o.io_backend = io;
      o.direct_io = direct;
      o.read_splits = 3;
      auto opened = ExpertStore::Open(p.pack, p.manifest, o);
      if (!opened.ok() && direct && opened.error().sys_errno() == EINVAL) {
        GTEST_SKIP() << "O_DIRECT unsupported on this filesystem";
      }
      ASSERT_TRUE(opened.ok()) << opened.error().message();
      auto s = *opened;
      for (uint32_t layer : {1u, 2u})
        for (int64_t e = 0; e < 8; e += 2) {
          auto a = GetRowsOfTwo(*s, layer, {e, e + 1});
          ASSERT_TRUE(a.ok()) << io << " direct=" << direct << ": " << a.error().message();
          for (const auto& v : a->routes) ExpectBytes(v);
          ASSERT_TRUE(s->MarkUsed(*a).ok());
        }
      auto j = s->Snapshot();
      EXPECT_EQ(j["k3pack"]["io_backend"], io);
      EXPECT_EQ(j["direct_io"], direct);
      EXPECT_EQ(j["pack_reads"], 16);
      EXPECT_EQ(j["cache_evictions"], 12);
      EXPECT_EQ(j["pack_read_bytes"], 16 * 12288);
    }
  }
}

// prefetch_mode "cache" (the older rule; staged prefetch: store_prefetch_test.cpp).
TEST(StoreAcquire, PrefetchUsefulAndWasted) {
  TinyPack p(TinySpec{});
  for (const char* io : {"pread", "uring"}) {
    StoreOptions o = Opts(8);
    o.io_backend = io;
    o.prefetch_mode = "cache";
    auto s = OpenOk(p, o);
    ASSERT_TRUE(s->Prefetch(1, std::vector<int64_t>{3, 4, 4}).ok());
    auto a = GetRowsOfTwo(*s, 1, {3, 5});  // 3 was prefetched (hit, useful); 5 is a miss
    ASSERT_TRUE(a.ok());
    for (const auto& v : a->routes) ExpectBytes(v);
    ASSERT_TRUE(s->MarkUsed(*a).ok());
    auto j = s->Snapshot();
    EXPECT_EQ(j["cache_hits"], 1);
    EXPECT_EQ(j["cache_misses"], 1);
    EXPECT_EQ(j["k3pack"]["prefetch_issued"], 2);
    EXPECT_EQ(j["k3pack"]["prefetch_useful"], 1);
    ASSERT_TRUE(s->Close().ok());
    EXPECT_EQ(s->Snapshot()["k3pack"]["prefetch_wasted"], 1);  // 4 was never used
    EXPECT_FALSE(GetRowsOfTwo(*s, 1, {3, 5}).ok());  // closed
  }
}

TEST(StoreAcquire, StatsFileWrittenAtomically) {
  TinyPack p(TinySpec{});
  StoreOptions o = Opts(8);
  o.stats_path = p.dir + "/stats/stats.json";
  o.stats_flush_interval = 2;
  std::filesystem::create_directories(p.dir + "/stats");
  auto s = OpenOk(p, o);
  auto a = GetRowsOfTwo(*s, 1, {0, 1});
  ASSERT_TRUE(s->MarkUsed(*a).ok());
  EXPECT_FALSE(std::filesystem::exists(o.stats_path));
  a = GetRowsOfTwo(*s, 2, {0, 1});
  ASSERT_TRUE(s->MarkUsed(*a).ok());
  ASSERT_TRUE(std::filesystem::exists(o.stats_path));
  auto j = nlohmann::json::parse(*ReadFileToString(o.stats_path));
  EXPECT_EQ(j["route_calls_by_layer"], (std::vector<int>{0, 1, 1}));
  ASSERT_TRUE(s->Close().ok());
  std::string text = *ReadFileToString(o.stats_path);
  EXPECT_EQ(text.back(), '\n');
  j = nlohmann::json::parse(text);
  for (const char* key : {"pack_path", "pack_entries", "pack_reads", "pack_read_bytes", "pack_read_ns", "read_splits",
                          "direct_io", "cache_hits", "cache_misses", "cache_evictions", "cache_policy",
                          "kernel_backend", "resident_experts", "resident_bytes", "h2d_bytes",
                          "cache_vram_reserve_mib", "fallback_count", "io_errors", "pack_format", "active_moe_layers",
                          "cache_capacity_experts", "cache_capacity_bytes", "staged_bytes", "mean_read_ms",
                          "route_calls_by_layer", "route_tokens_by_layer"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j["cache_policy"], "reuse-lfu-lru-v2");
  EXPECT_EQ(j["pack_entries"], 48);
  EXPECT_EQ(j["k3pack"]["layer_misses"], (std::vector<int>{2, 2}));
  for (const auto& f : std::filesystem::directory_iterator(p.dir + "/stats"))
    EXPECT_EQ(f.path().filename(), "stats.json") << "temp file left: " << f.path();
}

// 8 threads acquire / prefetch / mark_used on one store. Every view must hold
// the right bytes; with room for every object the totals equal those of a
// single-threaded replay of the same calls (each object read exactly once,
// same number of lookups and route calls).
void Hammer(const TinyPack& p, const StoreOptions& o, bool all_fit) {
  constexpr int kThreads = 8, kCalls = 300;
  std::vector<std::vector<std::pair<uint32_t, std::vector<int64_t>>>> plans(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    std::mt19937 rng(1000 + t);
    for (int c = 0; c < kCalls; ++c)
      plans[t].push_back({uint32_t(1 + rng() % 2), {int64_t(rng() % 8), int64_t(rng() % 8)}});
  }
  auto run = [&](ExpertStore& s, int t, std::atomic<int>* failures) {
    for (int c = 0; c < kCalls; ++c) {
      const auto& [layer, ids] = plans[t][c];
      if (c + 1 < kCalls && c % 3 == 0) (void)s.Prefetch(plans[t][c + 1].first, plans[t][c + 1].second);
      int64_t shape[2] = {1, 2};
      auto a = s.Acquire(layer, ids, shape);
      if (!a.ok()) {
        ++*failures;
        continue;
      }
      for (const auto& v : a->routes) {
        for (uint32_t r = 0; r < 3; ++r) {
          auto role = r == 0 ? v.up : r == 1 ? v.gate : v.down;
          for (uint64_t i = 0; i < role.size(); i += 511)
            if (role[i] != PatternByte(v.layer, v.expert, r, i)) ++*failures;
        }
      }
      if (!s.MarkUsed(*a).ok()) ++*failures;
    }
  };
  auto multi = OpenOk(p, o);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(run, std::ref(*multi), t, &failures);
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  ASSERT_TRUE(multi->Close().ok());
  auto single = OpenOk(p, o);
  std::atomic<int> single_failures{0};
  for (int t = 0; t < kThreads; ++t) run(*single, t, &single_failures);
  EXPECT_EQ(single_failures.load(), 0);
  ASSERT_TRUE(single->Close().ok());
  auto m = multi->Snapshot(), s1 = single->Snapshot();
  for (const auto* j : {&m, &s1}) {
    if ((*j)["k3pack"]["checksums"].get<std::string>().rfind("crc32c", 0) != 0) continue;
    EXPECT_EQ((*j)["k3pack"]["checksum_verified_objects"], (*j)["pack_reads"]) << "every read checked";
    EXPECT_EQ((*j)["k3pack"]["checksum_errors"], 0);
  }
  EXPECT_EQ(m["route_calls_by_layer"], s1["route_calls_by_layer"]);
  EXPECT_EQ(m["cache_hits"].get<uint64_t>() + m["cache_misses"].get<uint64_t>(),
            s1["cache_hits"].get<uint64_t>() + s1["cache_misses"].get<uint64_t>());
  if (all_fit) {
    // Each object enters the cache exactly once. Staged prefetch reads that
    // the next acquire of their layer did not take are extra reads (wasted).
    const bool staged = o.prefetch_mode == "staged";
    for (const auto* j : {&m, &s1}) {
      uint64_t wasted = staged ? (*j)["k3pack"]["prefetch"]["wasted"].get<uint64_t>() : 0;
      EXPECT_EQ((*j)["pack_reads"].get<uint64_t>() - wasted, 16u) << o.prefetch_mode;
    }
    // (hits alone may differ: another thread's prefetch can turn a miss into a hit)
    EXPECT_EQ(m["cache_evictions"], 0);
  }
}

TEST(StoreConcurrency, EightThreadsAllResident) {
  TinyPack p(TinySpec{});
  for (const char* io : {"pread", "uring"}) {
    for (const char* mode : {"staged", "cache"}) {
      StoreOptions o = Opts(16);
      o.io_backend = io;
      o.prefetch_mode = mode;
      Hammer(p, o, true);
    }
  }
}

TEST(StoreConcurrency, EightThreadsWithEviction) {
  TinyPack p(TinySpec{});
  for (const char* policy : {"reuse-lfu-lru-v2", "quota-decay"}) {
    StoreOptions o = Opts(6, policy);  // < 8 threads x 2: callers must wait for each other
    o.io_backend = "uring";
    o.read_splits = 2;
    Hammer(p, o, false);
  }
}

// With the digest sidecar every io_uring read is checked on the store's
// verify pool before its waiters wake (TSan stage: the hand-off between the
// reaping thread, the pool and the callers).
TEST(StoreConcurrency, EightThreadsChecksummedOnTheVerifyPool) {
  TinyPack p(TinySpec{});
  ASSERT_TRUE(p.WriteDigestSidecar(true).ok());
  for (const char* mode : {"staged", "cache"}) {
    StoreOptions o = Opts(6, "lru");
    o.io_backend = "uring";
    o.prefetch_mode = mode;
    Hammer(p, o, false);
  }
}

}  // namespace
}  // namespace k3pack::store
