// Soak tests of the expert stores (session 32 resource-leak audit): each
// store is opened, used and closed hundreds of times in one process, on both
// I/O backends, buffered and O_DIRECT, and the process's descriptors,
// threads, mappings and resident memory must come back to where they were
// (tests/process_resources.h). A long random workload from several threads
// must keep the cache within its capacity with counters that add up.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <thread>

#include "../process_resources.h"
#include "k3pack/slot_cache.h"
#include "k3pack/store.h"
#include "open_ok.h"
#include "store/synthetic_pack.h"

namespace k3pack::store {
namespace {

using testing::kObject;
using testing::PatternByte;
using testing::TinyPack;
using testing::TinySpec;
using testing_resources::CameBack;
using testing_resources::ProcessResources;

class StoreSoak : public ::testing::Test {
 protected:
  // Before the suite's first thread (tests/process_resources.h).
  static void SetUpTestSuite() { testing_resources::UseOneMallocArena(); }
};

struct Backend {
  const char* io;
  bool direct;
};
constexpr Backend kBackends[] = {{"pread", false}, {"pread", true}, {"uring", false}, {"uring", true}};

std::string Name(const Backend& b) { return std::string(b.io) + (b.direct ? " + O_DIRECT" : ""); }

TinySpec SoakSpec() {
  TinySpec spec;
  spec.layers = {1, 2};
  spec.num_hidden_layers = 3;
  spec.experts = 16;
  spec.top_k = 2;
  return spec;
}

StoreOptions SoakOptions(const Backend& b, uint64_t objects) {
  StoreOptions o;
  o.io_backend = b.io;
  o.direct_io = b.direct;
  o.cache_bytes = objects * kObject;
  o.queue_depth = 4;
  return o;
}

// One short session: acquires, a prefetch taken by the next acquire, a keep
// hint, releases; every view's first byte checked against the pack.
void UseStore(ExpertStore& s, int round) {
  for (int call = 0; call < 4; ++call) {
    const uint32_t layer = 1 + (call & 1);
    const int64_t a = (round + call) % 16, b = (round * 3 + call + 1) % 16;
    ASSERT_TRUE(s.Prefetch(layer, std::vector<int64_t>{a, (a + 5) % 16}).ok());
    auto acq = testing::Get(s, layer, {a, b});
    ASSERT_TRUE(acq.ok()) << acq.error().message();
    for (const ExpertView& v : acq->routes) ASSERT_EQ(v.bytes[0], PatternByte(layer, v.expert, 0, 0));
    ASSERT_TRUE(s.MarkUsed(*acq).ok());
    ASSERT_TRUE(s.Keep(layer, std::vector<int64_t>{b}).ok());
  }
}

TEST_F(StoreSoak, OpenUseCloseHundredsOfTimesLeavesNothingBehind) {
  TinyPack p(SoakSpec(), "soak-open");
  for (const Backend& b : kBackends) {
    SCOPED_TRACE(Name(b));
    {  // the first open loads what stays for the process (io_uring's, libc's)
      auto s = testing::OpenOk(p, SoakOptions(b, 6));
      ASSERT_TRUE(s);
      UseStore(*s, 0);
    }
    const ProcessResources before = ProcessResources::Now();
    for (int round = 0; round < 150; ++round) {
      auto s = testing::OpenOk(p, SoakOptions(b, 6));
      ASSERT_TRUE(s);
      UseStore(*s, round);
      // Half are closed, half just dropped: the destructor must free as much.
      if (round % 2 == 0) {
        ASSERT_TRUE(s->Close().ok());
      }
    }
    const ProcessResources after = testing_resources::SettledAfter(before);
    EXPECT_TRUE(CameBack(before, after)) << "before " << before << ", after " << after;
  }
}

struct SoakSlotMemory {
  uint8_t* base;
  SoakSlotMemory(uint32_t slots, uint64_t bytes)
      : base(static_cast<uint8_t*>(std::aligned_alloc(4096, uint64_t{slots} * bytes))) {}
  ~SoakSlotMemory() { std::free(base); }
};

void UseSlotCache(SlotCache& c, int round, bool host_tier) {
  for (int call = 0; call < 4; ++call) {
    const uint32_t layer = 1 + (call & 1);
    const std::vector<int64_t> ids = {(round + call) % 16, (round * 5 + call + 1) % 16};
    const int64_t shape[2] = {1, 2};
    if (host_tier) {
      ASSERT_TRUE(c.Prefetch(layer, ids).ok());
    }
    auto slots = c.Acquire(layer, ids, shape, std::nullopt);
    ASSERT_TRUE(slots.ok()) << slots.error().message();
    ASSERT_TRUE(c.MarkUsed(*slots).ok());
  }
}

TEST_F(StoreSoak, SlotCacheOpenUseCloseHundredsOfTimesLeavesNothingBehind) {
  TinyPack p(SoakSpec(), "soak-slots");
  for (const Backend& b : kBackends) {
    for (const uint64_t host_objects : {uint64_t{0}, uint64_t{6}}) {
      SCOPED_TRACE(Name(b) + (host_objects ? ", host tier" : ", no host tier"));
      auto once = [&](int round) {
        SlotCacheOptions o;
        o.store = SoakOptions(b, 0);
        o.host_cache_bytes = host_objects * kObject;
        auto c = SlotCache::Open(p.pack, p.manifest, o);
        ASSERT_TRUE(c.ok()) << c.error().message();
        SoakSlotMemory mem(4, (*c)->slot_bytes());
        ASSERT_TRUE((*c)->AttachHost(mem.base, 4).ok());
        UseSlotCache(**c, round, host_objects != 0);
        if (round % 2 == 0) {
          ASSERT_TRUE((*c)->Close().ok());
        }
      };
      once(0);
      const ProcessResources before = ProcessResources::Now();
      for (int round = 0; round < 100; ++round) once(round);
      const ProcessResources after = testing_resources::SettledAfter(before);
      EXPECT_TRUE(CameBack(before, after)) << "before " << before << ", after " << after;
    }
  }
}

// A closed store gives back its descriptors, threads and mappings at Close(),
// not when the object is destroyed: a Python store is often closed and kept
// (an attribute of a model). Before, an io_uring store kept its ring (the
// descriptor and its mappings) and, with checksums on, the checksum pool's
// threads while it lived; 20 closed stores held 20 rings and 40 threads.
TEST_F(StoreSoak, ClosedStoresStillAliveHoldNothing) {
  TinyPack p(SoakSpec(), "soak-closed");
  ASSERT_TRUE(p.WriteDigestSidecar().ok());  // checksums on: the uring store's checksum pool
  for (const Backend& b : kBackends) {
    SCOPED_TRACE(Name(b));
    auto open_use_close = [&](std::vector<std::shared_ptr<ExpertStore>>& stores,
                              std::vector<std::unique_ptr<SlotCache>>& caches,
                              std::vector<std::unique_ptr<SoakSlotMemory>>& memory) {
      auto s = testing::OpenOk(p, SoakOptions(b, 6));
      ASSERT_TRUE(s);
      UseStore(*s, static_cast<int>(stores.size()));
      ASSERT_TRUE(s->Close().ok());
      stores.push_back(std::move(s));
      SlotCacheOptions o;
      o.store = SoakOptions(b, 0);
      o.host_cache_bytes = 6 * kObject;
      auto c = SlotCache::Open(p.pack, p.manifest, o);
      ASSERT_TRUE(c.ok()) << c.error().message();
      memory.push_back(std::make_unique<SoakSlotMemory>(4, (*c)->slot_bytes()));
      ASSERT_TRUE((*c)->AttachHost(memory.back()->base, 4).ok());
      UseSlotCache(**c, static_cast<int>(caches.size()), true);
      ASSERT_TRUE((*c)->Close().ok());
      caches.push_back(std::move(*c));
    };
    {
      std::vector<std::shared_ptr<ExpertStore>> stores;
      std::vector<std::unique_ptr<SlotCache>> caches;
      std::vector<std::unique_ptr<SoakSlotMemory>> memory;
      open_use_close(stores, caches, memory);  // what stays for the process
    }
    std::vector<std::shared_ptr<ExpertStore>> stores;
    std::vector<std::unique_ptr<SlotCache>> caches;
    std::vector<std::unique_ptr<SoakSlotMemory>> memory;
    const ProcessResources before = ProcessResources::Now();
    for (int i = 0; i < 20 && !HasFatalFailure(); ++i) open_use_close(stores, caches, memory);
    const ProcessResources after = testing_resources::SettledAfter(before);
    EXPECT_TRUE(CameBack(before, after)) << "before " << before << ", after " << after << " with " << stores.size()
                                         << " closed stores and slot caches alive";
    // Closed, they still answer what does not need the pack.
    EXPECT_EQ(stores.back()->Snapshot()["k3pack"]["io_backend"], b.io);
    EXPECT_FALSE(testing::Get(*stores.back(), 1, {0, 1}).ok());
  }
}

// Opens that fail (no pack, a truncated pack, a manifest that is not JSON)
// must give back all they took on the way.
TEST_F(StoreSoak, FailedOpensLeaveNothingBehind) {
  TinyPack missing(SoakSpec(), "soak-missing");
  std::filesystem::remove(missing.pack);
  TinyPack truncated(SoakSpec(), "soak-truncated");
  std::filesystem::resize_file(truncated.pack, std::filesystem::file_size(truncated.pack) / 2);
  TinyPack damaged(SoakSpec(), "soak-damaged");
  std::ofstream(damaged.manifest, std::ios::trunc) << "{\"complete\": tr";
  for (const Backend& b : kBackends) {
    SCOPED_TRACE(Name(b));
    auto fail_all = [&] {
      for (const TinyPack* p : {&missing, &truncated, &damaged}) {
        ASSERT_FALSE(ExpertStore::Open(p->pack, p->manifest, SoakOptions(b, 6)).ok());
        SlotCacheOptions o;
        o.store = SoakOptions(b, 0);
        o.host_cache_bytes = 4 * kObject;
        ASSERT_FALSE(SlotCache::Open(p->pack, p->manifest, o).ok());
      }
    };
    fail_all();
    const ProcessResources before = ProcessResources::Now();
    for (int round = 0; round < 100; ++round) fail_all();
    const ProcessResources after = testing_resources::SettledAfter(before);
    EXPECT_TRUE(CameBack(before, after)) << "before " << before << ", after " << after;
  }
}

// Reads that fail (an injected short read) many times: the failed calls
// release what they took, the store keeps serving, and closes clean.
TEST_F(StoreSoak, FailedReadsLeaveTheCacheAndCountersConsistent) {
  TinyPack p(SoakSpec(), "soak-faults");
  for (const Backend& b : kBackends) {
    SCOPED_TRACE(Name(b));
    auto s = testing::OpenOk(p, SoakOptions(b, 6));
    ASSERT_TRUE(s);
    std::atomic<bool> fail{false};
    s->SetReadFaultHook([&](uint64_t, uint64_t, int64_t* result) {
      if (fail.load()) *result = -5;  // EIO
    });
    uint64_t failed = 0;
    for (int call = 0; call < 200; ++call) {
      fail = call % 3 == 0;
      auto acq = testing::Get(*s, 1 + (call & 1), {call % 16, (call * 7 + 3) % 16});
      if (!acq.ok()) {
        ++failed;
        continue;
      }
      ASSERT_TRUE(s->MarkUsed(*acq).ok());
    }
    EXPECT_GT(failed, 0u);
    fail = false;
    const nlohmann::json st = s->Snapshot();
    EXPECT_LE(st["resident_bytes"].get<uint64_t>(), 6 * kObject) << st.dump();
    // Every failed object is dropped, never kept resident without bytes: all
    // of the cache is still usable.
    for (int64_t e = 0; e < 16; e += 2) {
      auto acq = testing::Get(*s, 1, {e, e + 1});
      ASSERT_TRUE(acq.ok()) << acq.error().message();
      for (const ExpertView& v : acq->routes) ASSERT_EQ(v.bytes[5], PatternByte(1, v.expert, 0, 5));
      ASSERT_TRUE(s->MarkUsed(*acq).ok());
    }
    EXPECT_TRUE(s->Close().ok());
  }
}

// Several threads, thousands of random acquires with prefetches: the cache
// never holds more than its budget, and hits + misses = the distinct objects
// of every call that succeeded (none may fail: the budget fits every
// thread's working set at once).
TEST_F(StoreSoak, ManyThreadsRandomWorkloadStaysWithinCapacityAndCountersAddUp) {
  TinyPack p(SoakSpec(), "soak-random");
  constexpr int kThreads = 4, kCalls = 1500;
  constexpr uint64_t kCapacity = 12;  // objects: 4 threads x 2 tokens x top-2 = 16 routes, fewer distinct
  for (const Backend& b : {kBackends[0], kBackends[3]}) {
    SCOPED_TRACE(Name(b));
    StoreOptions o = SoakOptions(b, kCapacity + 8);
    auto s = testing::OpenOk(p, o);
    ASSERT_TRUE(s);
    std::atomic<uint64_t> distinct{0}, failures{0}, over_budget{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937 rng(1234 + t);
        std::discrete_distribution<int> popular({9, 7, 6, 5, 4, 3, 3, 2, 2, 2, 1, 1, 1, 1, 1, 1});
        for (int call = 0; call < kCalls; ++call) {
          const uint32_t layer = 1 + rng() % 2;
          const int64_t rows = 1 + rng() % 2;
          std::vector<int64_t> ids;
          std::set<int64_t> uniq;
          while (ids.size() < static_cast<size_t>(rows * 2)) {
            ids.push_back(popular(rng));
            uniq.insert(ids.back());
          }
          if (call % 5 == 0) (void)s->Prefetch(layer, std::vector<int64_t>{popular(rng), popular(rng)});
          const int64_t shape[2] = {rows, 2};
          auto acq = s->Acquire(layer, ids, shape);
          if (!acq.ok()) {
            ++failures;
            continue;
          }
          distinct += uniq.size();
          for (const ExpertView& v : acq->routes)
            if (v.bytes[100] != PatternByte(layer, v.expert, 0, 100)) ++failures;
          if (call % 50 == 0 && s->Snapshot()["resident_bytes"].get<uint64_t>() > o.cache_bytes) ++over_budget;
          if (!s->MarkUsed(*acq).ok()) ++failures;
        }
      });
    }
    for (auto& t : threads) t.join();
    const nlohmann::json st = s->Snapshot();
    EXPECT_EQ(failures.load(), 0u) << st.dump();
    EXPECT_EQ(over_budget.load(), 0u);
    EXPECT_LE(st["resident_bytes"].get<uint64_t>(), o.cache_bytes);
    EXPECT_EQ(st["resident_bytes"].get<uint64_t>(), st["resident_experts"].get<uint64_t>() * kObject);
    const uint64_t hits = st["cache_hits"], misses = st["cache_misses"];
    EXPECT_EQ(hits + misses, distinct.load()) << st.dump();
    uint64_t layer_sum = 0;
    for (const auto& v : st["k3pack"]["layer_hits"]) layer_sum += v.get<uint64_t>();
    for (const auto& v : st["k3pack"]["layer_misses"]) layer_sum += v.get<uint64_t>();
    EXPECT_EQ(layer_sum, hits + misses);
    // Every miss is one object read (demand) or one staged read taken.
    const nlohmann::json& pf = st["k3pack"]["prefetch"];
    EXPECT_LE(st["pack_reads"].get<uint64_t>(), misses + pf["issued"].get<uint64_t>());
    // Not `inflight` for the last term: a read taken or dropped may still be
    // in flight (1 in ~60 runs counted one object twice that way).
    EXPECT_EQ(pf["issued"].get<uint64_t>(),
              pf["useful"].get<uint64_t>() + pf["wasted"].get<uint64_t>() + pf["cancelled"].get<uint64_t>() +
                  pf["staged"].get<uint64_t>() + pf["failed"].get<uint64_t>())
        << pf.dump();
    EXPECT_EQ(pf["staged_bytes"].get<uint64_t>() <= pf["budget_bytes"].get<uint64_t>(), true) << pf.dump();
    EXPECT_EQ(st["io_errors"].get<uint64_t>(), 0u);
    ASSERT_TRUE(s->Close().ok());
  }
}

TEST_F(StoreSoak, SlotCacheManyThreadsRandomWorkloadCountersAddUp) {
  TinyPack p(SoakSpec(), "soak-slot-random");
  constexpr int kThreads = 3, kCalls = 1500;
  constexpr uint32_t kSlots = 16;
  for (const Backend& b : {kBackends[1], kBackends[2]}) {
    for (const uint64_t host_objects : {uint64_t{0}, uint64_t{8}}) {
      SCOPED_TRACE(Name(b) + (host_objects ? ", host tier" : ", no host tier"));
      SlotCacheOptions o;
      o.store = SoakOptions(b, 0);
      o.host_cache_bytes = host_objects * kObject;
      auto c = SlotCache::Open(p.pack, p.manifest, o);
      ASSERT_TRUE(c.ok()) << c.error().message();
      SoakSlotMemory mem(kSlots, (*c)->slot_bytes());
      ASSERT_TRUE((*c)->AttachHost(mem.base, kSlots).ok());
      std::atomic<uint64_t> distinct{0}, failures{0};
      std::vector<std::thread> threads;
      for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
          std::mt19937 rng(99 + t);
          for (int call = 0; call < kCalls; ++call) {
            const uint32_t layer = 1 + rng() % 2;
            std::vector<int64_t> ids = {int64_t(rng() % 16), int64_t(rng() % 16)};
            const int64_t shape[2] = {1, 2};
            if (host_objects && call % 7 == 0) (void)(*c)->Prefetch(layer, std::vector<int64_t>{int64_t(rng() % 16)});
            auto slots = (*c)->Acquire(layer, ids, shape, std::nullopt);
            if (!slots.ok()) {
              ++failures;
              continue;
            }
            distinct += ids[0] == ids[1] ? 1 : 2;
            if (!(*c)->MarkUsed(*slots).ok()) ++failures;
          }
        });
      }
      for (auto& t : threads) t.join();
      const nlohmann::json st = (*c)->Snapshot();
      EXPECT_EQ(failures.load(), 0u) << st.dump();
      EXPECT_LE(st["resident_experts"].get<uint64_t>(), kSlots);
      EXPECT_EQ(st["cache_hits"].get<uint64_t>() + st["cache_misses"].get<uint64_t>(), distinct.load()) << st.dump();
      if (host_objects) {
        const nlohmann::json& h = st["k3pack"]["host_tier"];
        EXPECT_LE(h["resident_experts"].get<uint64_t>(), host_objects) << h.dump();
        // Each slot miss goes through the host tier once.
        EXPECT_EQ(h["cache_hits"].get<uint64_t>() + h["cache_misses"].get<uint64_t>(),
                  st["cache_misses"].get<uint64_t>())
            << st.dump();
      }
      ASSERT_TRUE((*c)->Close().ok());
    }
  }
}

}  // namespace
}  // namespace k3pack::store
