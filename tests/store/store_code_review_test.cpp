// Faults from a code-reading audit of the store's run-time cache
// (docs/RELIABILITY.md, "session 44"), each proved by a program before its
// fix: the io_uring ring's size, a forked child's release, a prefetch
// counted twice.
#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "../forked_child.h"
#include "k3pack/slot_cache.h"
#include "k3pack/store.h"
#include "open_ok.h"
#include "store/synthetic_pack.h"

namespace k3pack::store {
namespace {

using testing::kObject;
using testing::OpenOk;
using testing::TinyPack;
using testing::TinySpec;

// A queue_depth past 2^31 made the ring's size double until it wrapped to 0,
// for ever: Open never returned. Past the kernel's 32768 entries the ring
// setup failed as "io_uring is unavailable", which it was not.
TEST(StoreCodeReview, AQueueDepthPastOneRingIsRefusedNotHung) {
  TinyPack p(TinySpec{}, "ring-depth");
  for (const int64_t depth : {int64_t{40000}, (int64_t{1} << 31) + 1, int64_t{UINT32_MAX}}) {
    SCOPED_TRACE(depth);
    const int rc = k3test::InForkedChild([&] {
      StoreOptions o;
      o.cache_bytes = 8 * kObject;
      o.io_backend = "uring";
      o.queue_depth = depth;
      auto s = ExpertStore::Open(p.pack, p.manifest, o);
      if (s.ok()) ::_exit(2);
      const std::string want = "queue_depth " + std::to_string(depth) +
                               " is more reads in flight than an io_uring ring holds (32768 entries)";
      ::_exit(s.error().headline() == want ? 0 : 3);
    });
    EXPECT_EQ(rc, 0) << "child exit code (2: opened; 3: another error; -1: hung)";
  }
  StoreOptions o;  // the most a ring takes still opens
  o.cache_bytes = 8 * kObject;
  o.io_backend = "uring";
  o.queue_depth = 32768;
  auto s = ExpertStore::Open(p.pack, p.manifest, o);
  if (!s.ok() && s.error().headline().find("io_uring is unavailable") != std::string::npos)
    GTEST_SKIP() << s.error().message();
  ASSERT_TRUE(s.ok()) << s.error().message();
  ASSERT_TRUE((*s)->Close().ok());
}

// MarkUsed took the store's mutex before its fork check: a child forked
// while a parent's thread held that mutex hung in it for good (in Python,
// the collection of an unreleased acquisition hung the child).
TEST(StoreCodeReview, AForkedChildsReleaseNeverWaitsForTheParentsMutex) {
  TinyPack p(TinySpec{}, "fork-release");
  static std::atomic<bool> slow{false}, inside{false};
  StoreOptions o;
  o.cache_bytes = 8 * kObject;
  o.buffer_alloc = [](uint64_t n) -> void* {
    if (slow.exchange(false)) {  // a read's buffer is allocated under the store's mutex
      inside = true;
      std::this_thread::sleep_for(std::chrono::seconds(2));
    }
    return std::aligned_alloc(4096, (n + 4095) / 4096 * 4096);
  };
  o.buffer_free = [](void* ptr, uint64_t) { std::free(ptr); };
  auto s = OpenOk(p, o);
  ASSERT_TRUE(s);
  const int64_t shape[2] = {1, 2};
  auto held = s->Acquire(1, std::vector<int64_t>{0, 1}, shape);
  ASSERT_TRUE(held.ok()) << held.error().message();
  slow = true;
  std::thread reader([&] {
    auto a = s->Acquire(2, std::vector<int64_t>{0, 1}, shape);
    if (a.ok()) (void)s->MarkUsed(*a);
  });
  while (!inside) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const int rc = k3test::InForkedChild([&] {
    Status released = s->MarkUsed(*held);
    ::_exit(!released.ok() && released.error().message().find("forked from it") != std::string::npos ? 0 : 2);
  });
  reader.join();
  EXPECT_EQ(rc, 0) << "child exit code (2: released or another error; -1: hung)";
  ASSERT_TRUE(s->MarkUsed(*held).ok());
  ASSERT_TRUE(s->Close().ok());
}

// prefetch_mode "cache": a prefetched object evicted while its read was in
// flight was counted wasted, and when that read then failed, failed too:
// issued = useful + wasted + cancelled + staged + failed no longer held.
TEST(StoreCodeReview, APrefetchEvictedInFlightThenFailedIsCountedOnce) {
  TinyPack p(TinySpec{}, "prefetch-counted-once");
  StoreOptions o;
  o.cache_bytes = 2 * kObject;  // one call's working set
  o.prefetch_mode = "cache";
  auto s = OpenOk(p, o);
  ASSERT_TRUE(s);
  static std::atomic<int> armed{0};
  static std::atomic<bool> prefetch_read_started{false};
  armed = 0;  // statics: a repeated run (--gtest_repeat) starts afresh
  prefetch_read_started = false;
  s->SetReadFaultHook([](uint64_t, uint64_t, int64_t* result) {
    if (armed.exchange(0) == 0) return;
    prefetch_read_started = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    *result = -EIO;
  });
  armed = 1;
  ASSERT_TRUE(s->Prefetch(1, std::vector<int64_t>{0}).ok());
  // The prefetch's read runs on the store's I/O thread; the acquire's reads
  // must not reach the armed hook before it does.
  for (int i = 0; i < 10000 && !prefetch_read_started; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(prefetch_read_started) << "the prefetch's read never started";
  const int64_t shape[2] = {1, 2};
  auto a = s->Acquire(1, std::vector<int64_t>{4, 5}, shape);  // evicts expert 0, its read still in flight
  ASSERT_TRUE(a.ok()) << a.error().message();
  ASSERT_TRUE(s->MarkUsed(*a).ok());
  for (int i = 0; i < 500 && s->Snapshot()["io_errors"].get<uint64_t>() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const auto snap = s->Snapshot();
  ASSERT_EQ(snap["io_errors"], 1) << snap.dump();
  const auto& pf = snap["k3pack"]["prefetch"];
  EXPECT_EQ(pf["issued"], 1) << pf.dump();
  EXPECT_EQ(pf["wasted"], 1) << pf.dump();
  EXPECT_EQ(pf["failed"], 0) << pf.dump();
  EXPECT_EQ(pf["useful"].get<uint64_t>() + pf["wasted"].get<uint64_t>() + pf["cancelled"].get<uint64_t>() +
                pf["staged"].get<uint64_t>() + pf["failed"].get<uint64_t>(),
            pf["issued"].get<uint64_t>())
      << pf.dump();
  ASSERT_TRUE(s->Close().ok());
}

// SlotCache's host tier heard every acquire as of no request: request B's
// call ended request A's staged prefetch at that layer, and A's acquire read
// the predicted experts again. As ExpertStore does, A's survive B's call.
TEST(StoreCodeReview, ASlotCachesHostTierKeepsAnotherRequestsStagedReads) {
  TinyPack p(TinySpec{}, "slots-host-requests");
  const uint64_t a = 1, b = 2;
  const int64_t shape[2] = {1, 2};
  const std::vector<int64_t> predicted = {4, 5}, b_routes = {0, 1};
  uint64_t store_reads = 0;
  {  // the same calls on the store itself: the reference
    StoreOptions o;
    o.cache_bytes = 8 * kObject;
    auto s = OpenOk(p, o);
    ASSERT_TRUE(s);
    ASSERT_TRUE(s->Prefetch(1, predicted, a).ok());
    auto got_b = s->Acquire(1, b_routes, shape, false, std::vector<uint64_t>{b});
    ASSERT_TRUE(got_b.ok()) << got_b.error().message();
    ASSERT_TRUE(s->MarkUsed(*got_b).ok());
    auto got_a = s->Acquire(1, predicted, shape, false, std::vector<uint64_t>{a});
    ASSERT_TRUE(got_a.ok()) << got_a.error().message();
    ASSERT_TRUE(s->MarkUsed(*got_a).ok());
    store_reads = s->Snapshot()["pack_reads"].get<uint64_t>();
    EXPECT_EQ(s->Snapshot()["k3pack"]["prefetch"]["useful"], 2);
    ASSERT_TRUE(s->Close().ok());
  }
  SlotCacheOptions o;
  o.host_cache_bytes = 8 * kObject;
  auto opened = SlotCache::Open(p.pack, p.manifest, o);
  ASSERT_TRUE(opened.ok()) << opened.error().message();
  std::unique_ptr<SlotCache> cache = std::move(opened).value();
  auto* mem = static_cast<uint8_t*>(std::aligned_alloc(4096, 8 * cache->slot_bytes()));
  ASSERT_TRUE(cache->AttachHost(mem, 8).ok());
  ASSERT_TRUE(cache->Prefetch(1, predicted, a).ok());
  auto got_b = cache->Acquire(1, b_routes, shape, false, nullptr, std::vector<uint64_t>{b});
  ASSERT_TRUE(got_b.ok()) << got_b.error().message();
  ASSERT_TRUE(cache->MarkUsed(*got_b).ok());
  auto got_a = cache->Acquire(1, predicted, shape, false, nullptr, std::vector<uint64_t>{a});
  ASSERT_TRUE(got_a.ok()) << got_a.error().message();
  ASSERT_TRUE(cache->MarkUsed(*got_a).ok());
  EXPECT_EQ(cache->Snapshot()["pack_reads"].get<uint64_t>(), store_reads) << "the predicted experts were read again";
  ASSERT_TRUE(cache->Close().ok());
  std::free(mem);
}

}  // namespace
}  // namespace k3pack::store
