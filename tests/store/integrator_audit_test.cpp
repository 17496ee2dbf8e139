// Faults an SGLang integrator's audit found in the stores' C++ side
// (docs/RELIABILITY.md, "Faults from an integrator's audit"): an
// Acquisition released through a store that did not hand it out, and
// SlotCache options refused only later or with a misleading text.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "k3pack/slot_cache.h"
#include "k3pack/store.h"
#include "open_ok.h"
#include "store/synthetic_pack.h"

namespace k3pack::store {
namespace {

using testing::Get;
using testing::OpenOk;
using testing::TinyPack;
using testing::TinySpec;

StoreOptions Objects(uint64_t n) {
  StoreOptions o;
  o.cache_bytes = n * 3 * 4096;  // TinySpec's objects: 3 roles of 4096 bytes
  return o;
}

// Store B's MarkUsed of store A's acquisition used to unpin, in B, objects
// B never pinned and mark the call released, so A's objects stayed pinned
// and A's next call that needed their room failed.
TEST(IntegratorAudit, MarkUsedRefusesAnotherStoresAcquisition) {
  TinyPack p(TinySpec{});
  auto a = OpenOk(p, Objects(3));
  auto b = OpenOk(p, Objects(3));
  auto held = Get(*a, 1, {0, 1});
  ASSERT_TRUE(held.ok()) << held.error().message();
  Status wrong = b->MarkUsed(*held);
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.error().kind(), ErrorKind::kValue);
  EXPECT_NE(wrong.error().message().find("belongs to another ExpertStore"), std::string::npos);
  EXPECT_NE(held->ticket, 0u);  // still held: its owner can release it
  ASSERT_TRUE(a->MarkUsed(*held).ok());
  auto next = Get(*a, 1, {2, 3});  // needs the released room
  EXPECT_TRUE(next.ok()) << next.error().message();
  // B's state is untouched: a full working set fits there too.
  auto other = Get(*b, 1, {4, 5});
  EXPECT_TRUE(other.ok()) << other.error().message();
  // A released acquisition stays a no-op anywhere (idempotent).
  EXPECT_TRUE(b->MarkUsed(*held).ok());
}

// An unknown policy name used to pass SlotCache::Open and fail only when
// the slots were attached (Python: at initialize_device_cache, after the
// constructor had returned); stage_slots above k3pack's limit was reported
// as "must be positive".
TEST(IntegratorAudit, SlotCacheOpenRefusesUnknownPolicyAndNamesTheStageLimit) {
  TinyPack p(TinySpec{});
  SlotCacheOptions o;
  o.store.policy = "bogus";
  auto r = SlotCache::Open(p.pack, p.manifest, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().kind(), ErrorKind::kValue);
  EXPECT_EQ(r.error().message().rfind("unknown cache policy 'bogus' (known: reuse-lfu-lru-v2", 0), 0u)
      << r.error().message();
  SlotCacheOptions big;
  big.stage_slots = 5000;
  r = SlotCache::Open(p.pack, p.manifest, big);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message(), "stage_slots must be at most 1024 (k3pack's limit), got 5000");
  SlotCacheOptions zero;
  zero.stage_slots = 0;
  r = SlotCache::Open(p.pack, p.manifest, zero);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message(),
            "expert cache and staging budgets, and read splits, must be positive\nhint: stage_slots must be at least 1, "
            "got 0");
  for (const char* policy : {"reuse-lfu-lru-v2", "lru", "quota-decay"}) {
    SlotCacheOptions ok;
    ok.store.policy = policy;
    auto c = SlotCache::Open(p.pack, p.manifest, ok);
    EXPECT_TRUE(c.ok()) << policy << ": " << c.error().message();
  }
}

// Several threads' MarkUsed flushing the stats file at once
// (stats_flush_interval = 1) shared one temporary file: a rename failed
// ("cannot move it into place") in about a third of the calls, and a
// file could hold two snapshots mixed.
TEST(IntegratorAudit, ConcurrentStatsFlushesNeverFail) {
  TinyPack p(TinySpec{});
  StoreOptions o = Objects(8);
  o.stats_path = p.dir + "/stats.json";
  o.stats_flush_interval = 1;
  auto s = OpenOk(p, o);
  std::mutex error_mu;
  std::vector<std::string> errors;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < 100; ++i) {
        const int64_t e = rng() % 7;
        auto a = Get(*s, 1 + t % 2, {e, e + 1});
        Status st = a.ok() ? s->MarkUsed(*a) : Status(a.error());
        if (!st.ok()) {
          std::lock_guard<std::mutex> lock(error_mu);
          errors.push_back(st.error().message());
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_TRUE(errors.empty()) << errors.size() << " failed calls, the first: " << errors.front();
  ASSERT_TRUE(s->Close().ok());
  std::ifstream in(o.stats_path);
  std::stringstream text;
  text << in.rdbuf();
  auto stats = nlohmann::json::parse(text.str(), nullptr, false);
  ASSERT_FALSE(stats.is_discarded()) << text.str();
  EXPECT_EQ(stats["route_calls_by_layer"][1].get<int>() + stats["route_calls_by_layer"][2].get<int>(), 400);
}

}  // namespace
}  // namespace k3pack::store
