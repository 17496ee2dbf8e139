// A replacement policy's own allocations under `ulimit -v`. A policy
// allocates only while its containers grow: a fresh cache's first calls, the
// first big call, a new request. Before, a std::bad_alloc there left the
// policy half updated and the caller's map apart from it: the process
// aborted (a throw from a call's end, in a destructor), objects were served
// from slot -1 or another expert's slot, a list got a cycle, or the cache
// stayed full of objects nothing could evict. So each sweep here opens a
// fresh cache for every allocation it fails (the nth of the nth run), and
// then checks the cache serves the right bytes and can still use all of
// itself. store_out_of_memory_test.cpp replaces operator new.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "allocation_faults.h"
#include "host_slots.h"
#include "k3pack/slot_cache.h"
#include "k3pack/store.h"
#include "open_ok.h"
#include "store/policy.h"
#include "store/synthetic_pack.h"

namespace k3pack::store {
namespace {

using testing::PatternByte;
using testing::TinyPack;
using testing::TinySpec;

#ifndef K3_TEST_UNDER_SANITIZER
using testing::FailNthAllocation;

// The steps of one sweep run, in order, on a fresh cache: each may fail
// (an error or std::bad_alloc); the nth allocation of the whole run fails.
using Steps = std::vector<std::function<void()>>;

// Runs `fresh_run(n, &fired)` for n = 1, 2, ... until a run makes fewer
// than n allocations (fired stays false). `fresh_run` opens its own cache,
// runs its steps with RunFailingNth(n, ...), then checks the cache with
// memory back.
void SweepFreshCaches(const std::function<void(int64_t, bool*)>& fresh_run, int64_t min_allocations = 50) {
  for (int64_t n = 1; n < 20000; ++n) {
    SCOPED_TRACE("allocation " + std::to_string(n));
    bool fired = false;
    fresh_run(n, &fired);
    if (::testing::Test::HasFatalFailure()) return;
    if (!fired) {
      EXPECT_GT(n, min_allocations) << "too few allocations were failed to test anything";
      return;
    }
  }
  ADD_FAILURE() << "the sweep did not reach the end of the run's allocations";
}

// Runs the steps with the nth allocation of this thread failing; whether
// it did (false: the steps made fewer allocations).
bool RunFailingNth(int64_t n, const Steps& steps) {
  FailNthAllocation fail(n);
  for (const auto& step : steps) {
    try {
      step();
    } catch (const std::bad_alloc&) {
    }
  }
  return fail.fired();
}

// Rows of two (top-2), one request per row.
Result<Acquisition> AcquireRequests(ExpertStore& s, uint32_t layer, const std::vector<int64_t>& ids) {
  const int64_t shape[2] = {static_cast<int64_t>(ids.size() / 2), 2};
  std::vector<uint64_t> requests;
  for (size_t r = 0; r < ids.size() / 2; ++r) requests.push_back(100 + r);
  return s.Acquire(layer, ids, shape, std::nullopt, requests);
}

void AcquireAndRelease(ExpertStore& s, uint32_t layer, const std::vector<int64_t>& ids) {
  auto a = AcquireRequests(s, layer, ids);
  if (a.ok()) (void)s.MarkUsed(*a);
}

void ExpectStoreServes(ExpertStore& s, uint32_t layer, const std::vector<int64_t>& ids) {
  auto a = AcquireRequests(s, layer, ids);
  ASSERT_TRUE(a.ok()) << a.error().message();
  for (const ExpertView& v : a->routes)
    ASSERT_EQ(v.gate[777], PatternByte(v.layer, v.expert, 1, 777)) << "layer " << v.layer << " expert " << v.expert;
  ASSERT_TRUE(s.MarkUsed(*a).ok());
}

#endif

using testing::FourHostSlots;


// The store with every policy, both prefetch modes: a prefetch (admitted
// through the policy in "cache" mode), two calls that fill the 4-object
// cache with one layer and then the other, and a mixed call. Afterwards
// both full calls are served (nothing left pinned, held or unevictable),
// with the right bytes, within the budget, and Close() returns.
TEST(PolicyOutOfMemory, AFreshStoresFirstCallsMayFailAtEveryAllocationForEveryPolicy) {
  SKIP_UNDER_SANITIZER();
#ifndef K3_TEST_UNDER_SANITIZER
  TinyPack p(TinySpec{}, "oom-policy");
  for (const std::string& policy : PolicyNames()) {
    for (const char* mode : {"staged", "cache"}) {
      SCOPED_TRACE(policy + " " + mode);
      StoreOptions o;
      o.cache_bytes = 4 * testing::kObject;
      o.queue_depth = 2;
      o.io_backend = "pread";
      o.policy = policy;
      o.prefetch_mode = mode;
      SweepFreshCaches([&](int64_t n, bool* fired) {
        auto s = testing::OpenOk(p, o);
        ASSERT_TRUE(s);
        *fired = RunFailingNth(n, {
                             [&] { (void)s->Prefetch(1, std::vector<int64_t>{6, 7}, 100); },
                             [&] { AcquireAndRelease(*s, 1, {0, 1, 2, 3}); },
                             // Between calls: a call left open made a later
                             // admission and hit link an object twice.
                             [&] { (void)s->Prefetch(2, std::vector<int64_t>{4, 5}, 100); },
                             [&] { AcquireAndRelease(*s, 2, {4, 5, 6, 7}); },
                             [&] { AcquireAndRelease(*s, 1, {0, 6, 4, 5}); },
                         });
        ExpectStoreServes(*s, 1, {0, 1, 2, 3});
        ExpectStoreServes(*s, 2, {4, 5, 6, 7});
        const nlohmann::json j = s->Snapshot();
        EXPECT_LE(j["resident_bytes"].get<uint64_t>(), o.cache_bytes);
        // The store's entries against the policy's residents: an eviction
        // the store was never told of kept its buffer (over the budget).
        EXPECT_EQ(j["k3pack"]["cache_entry_bytes"].get<uint64_t>(), j["resident_bytes"].get<uint64_t>());
        EXPECT_EQ(j["io_errors"].get<uint64_t>(), 0u);
        ASSERT_TRUE(s->Close().ok());
      });
    }
  }
#endif
}

// The slot cache (SGLang's drop-in) with every policy: the same calls, and
// the slots must match what the policy holds.
TEST(PolicyOutOfMemory, AFreshSlotCachesFirstCallsMayFailAtEveryAllocationForEveryPolicy) {
  SKIP_UNDER_SANITIZER();
#ifndef K3_TEST_UNDER_SANITIZER
  TinyPack p(TinySpec{}, "oom-policy-slots");
  for (const std::string& policy : PolicyNames()) {
    SCOPED_TRACE(policy);
    SweepFreshCaches([&](int64_t n, bool* fired) {
      FourHostSlots slots(p, "pread", policy);
      ASSERT_TRUE(slots.base != nullptr);
      *fired = RunFailingNth(n, {
                           [&] { slots.AcquireAndRelease(1, {0, 1, 2, 3}); },
                           [&] { slots.AcquireAndRelease(2, {4, 5, 6, 7}); },
                           [&] { slots.AcquireAndRelease(1, {0, 6, 4, 5}); },
                       });
      slots.ExpectServed(1, {0, 1, 2, 3});
      slots.ExpectServed(1, {0, 1, 2, 3});  // all hits now: a slot-less "resident" would show here
      slots.ExpectServed(2, {4, 5, 6, 7});
      ASSERT_TRUE(slots.cache->Close().ok());
    });
  }
#endif
}

// A call that fails while the same thread still holds an earlier one: the
// earlier call's slots stay protected from other threads (before, a failed
// allocation skipped giving back the pins the call had lowered, another
// thread's call was then given those slots, and the later release wrapped
// the pin counts, so a call needing the whole cache waited 10 s and failed).
TEST(PolicyOutOfMemory, AFailedCallNeverUnprotectsTheSameThreadsHeldSlots) {
  SKIP_UNDER_SANITIZER();
#ifndef K3_TEST_UNDER_SANITIZER
  TinyPack p(TinySpec{}, "oom-policy-held");
  for (const char* policy : {"lru", "reuse-lfu-lru-v2", "adaptive"}) {
    SCOPED_TRACE(policy);
    SweepFreshCaches([&](int64_t n, bool* fired) {
      FourHostSlots slots(p, "pread", policy);
      ASSERT_TRUE(slots.base != nullptr);
      auto held = slots.Acquire(1, {0, 1});
      ASSERT_TRUE(held.ok()) << held.error().message();
      // Two free slots: whether it fails or not, this call never needs the held ones.
      *fired = RunFailingNth(n, {[&] { slots.AcquireAndRelease(2, {4, 5}); }});
      // Another thread's call needs two slots: the released ones, never the held.
      std::thread other([&] { slots.AcquireAndRelease(2, {6, 7}); });
      other.join();
      ASSERT_TRUE(slots.Holds((*held)[0], 1, 0)) << "a held slot was given to another call";
      ASSERT_TRUE(slots.Holds((*held)[1], 1, 1)) << "a held slot was given to another call";
      ASSERT_TRUE(slots.cache->MarkUsed(*held).ok());
      slots.ExpectServed(1, {0, 1, 2, 3});  // every slot: no pin left or wrapped
      slots.ExpectServed(2, {4, 5, 6, 7});  // every slot again, none of them named by the held call
      ASSERT_TRUE(slots.cache->Close().ok());
    }, /*min_allocations=*/20);
  }
#endif
}

// Each allocation of an attach fails in turn: the cache is then attached
// whole or not at all (before, a failure half way left it "attached" with
// empty tables: a retry was refused and the next acquire crashed).
TEST(PolicyOutOfMemory, AnAttachThatFailsAttachesNothing) {
  SKIP_UNDER_SANITIZER();
#ifndef K3_TEST_UNDER_SANITIZER
  TinyPack p(TinySpec{}, "oom-attach");
  for (const std::string& policy : PolicyNames()) {
    SCOPED_TRACE(policy);
    SweepFreshCaches([&](int64_t n, bool* fired) {
      SlotCacheOptions o;
      o.store.io_backend = "pread";
      o.store.policy = policy;
      auto opened = SlotCache::Open(p.pack, p.manifest, o);
      ASSERT_TRUE(opened.ok()) << opened.error().message();
      std::unique_ptr<SlotCache> cache = std::move(opened).value();
      std::vector<uint8_t> memory(4 * cache->slot_bytes() + 4096);
      uint8_t* base = memory.data() + (4096 - reinterpret_cast<uintptr_t>(memory.data()) % 4096) % 4096;
      Status attached = Status::OK();
      *fired = RunFailingNth(n, {[&] { attached = cache->AttachHost(base, 4); }});
      if (!attached.ok()) {
        EXPECT_EQ(attached.error().kind(), ErrorKind::kMemory) << attached.error().message();
      }
      if (!cache->attached()) {
        ASSERT_TRUE(cache->AttachHost(base, 4).ok());
      }
      const int64_t shape[2] = {2, 2};
      const std::vector<int64_t> ids = {0, 1, 2, 3};
      auto got = cache->Acquire(1, ids, shape, std::nullopt);
      ASSERT_TRUE(got.ok()) << got.error().message();
      ASSERT_TRUE(cache->MarkUsed(*got).ok());
      ASSERT_TRUE(cache->Close().ok());
    }, /*min_allocations=*/10);
  }
#endif
}

// A release names each slot once however many rows routed to it: a call
// whose rows repeat experts gives back one hold per slot, never another
// call's (here the held call's, whose slots another thread then took).
TEST(SlotCacheRelease, ASlotNamedByManyRowsIsReleasedOnce) {
  TinyPack p(TinySpec{}, "release-repeats");
  FourHostSlots slots(p, "pread", "lru");
  ASSERT_TRUE(slots.base != nullptr);
  auto held = slots.Acquire(1, {0, 1});  // this thread's, unreleased
  ASSERT_TRUE(held.ok()) << held.error().message();
  std::thread([&] {
    auto twice = slots.Acquire(1, {0, 1, 0, 1});
    ASSERT_TRUE(twice.ok()) << twice.error().message();
    ASSERT_TRUE(slots.cache->MarkUsed(*twice).ok());
  }).join();
  std::thread([&] {
    slots.AcquireAndRelease(2, {4, 5});
    slots.AcquireAndRelease(2, {6, 7});  // evicts 4 and 5, never the held 0 and 1
  }).join();
  EXPECT_TRUE(slots.Holds((*held)[0], 1, 0)) << "a held slot was given to another call";
  EXPECT_TRUE(slots.Holds((*held)[1], 1, 1)) << "a held slot was given to another call";
  ASSERT_TRUE(slots.cache->MarkUsed(*held).ok());
  ASSERT_TRUE(slots.cache->Close().ok());
}

}  // namespace
}  // namespace k3pack::store
