// The store's I/O threads when no allocation succeeds on them (any
// allocation may fail under `ulimit -v`). An exception leaving an engine or
// checksum thread ends the process, and one swallowed by a checksum job left
// its read unfinished and its waiter waiting forever. This binary's operator
// new fails, while "starved", on every thread but the test's: the engine,
// checksum and reaping threads get no memory at all, the test's own thread
// (the acquiring caller, which reports errors) gets what it asks for.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <memory>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "allocation_faults.h"
#include "host_slots.h"
#include "emulated_cuda.h"
#include "k3pack/device_tier.h"
#include "k3pack/pack.h"
#include "k3pack/slot_cache.h"
#include "k3pack/store.h"
#include "open_ok.h"
#include "store/synthetic_pack.h"

#ifndef K3_TEST_UNDER_SANITIZER
// The sanitizers bring their own allocator: there the tests are skipped and
// these replacements are not built. g++ takes free() in a replaced operator
// delete for a mismatch with the new-expression it was inlined into.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) {
  if (!k3pack::store::testing::AllocationFails())
    if (void* p = std::malloc(n != 0 ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return ::operator new(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  return k3pack::store::testing::AllocationFails() ? nullptr : std::malloc(n != 0 ? n : 1);
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept { return ::operator new(n, t); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop
#endif

namespace k3pack::store {
namespace {

using testing::Get;
using testing::PatternByte;
using testing::TinyPack;
using testing::TinySpec;

#ifndef K3_TEST_UNDER_SANITIZER
using testing::FailNthAllocation;
using testing::StarveOtherThreads;

StoreOptions Opts(const char* io) {
  StoreOptions o;
  o.cache_bytes = 16 * 12288;
  o.policy = "lru";
  o.queue_depth = 4;
  o.io_backend = io;
  return o;
}

void ExpectPattern(const Acquisition& a) {
  for (const ExpertView& v : a.routes)
    for (uint64_t i = 0; i < v.gate.size(); i += 509) ASSERT_EQ(v.gate[i], PatternByte(v.layer, v.expert, 1, i));
}

// `ids` as rows of two (top-2) at `layer`.
Result<Acquisition> AcquireRows(ExpertStore& s, uint32_t layer, const std::vector<int64_t>& ids) {
  const int64_t shape[2] = {static_cast<int64_t>(ids.size() / 2), 2};
  return s.Acquire(layer, ids, shape, std::nullopt);
}

// Acquires `ids`, checks the bytes of each, releases.
void ExpectServed(ExpertStore& s, uint32_t layer, const std::vector<int64_t>& ids) {
  auto a = AcquireRows(s, layer, ids);
  ASSERT_TRUE(a.ok()) << a.error().message();
  ExpectPattern(*a);
  ASSERT_TRUE(s.MarkUsed(*a).ok());
}

// Every read counted reached the pack in full, and none failed: a read
// never submitted (its request could not be allocated) is neither a pack
// read nor an I/O error. Every object of the tiny pack is 12288 bytes.
void ExpectOnlyRealReadsCounted(const nlohmann::json& snapshot) {
  EXPECT_EQ(snapshot["io_errors"].get<uint64_t>(), 0u);
  EXPECT_EQ(snapshot["pack_read_bytes"].get<uint64_t>(), snapshot["pack_reads"].get<uint64_t>() * 12288);
}


// Fails each allocation of `call(layer, ids)` in turn (the nth of the nth
// run, on this thread), for calls of two experts on alternating layers.
// After each, whatever the call answered (an error, or std::bad_alloc),
// `served(layer, ids)` must find the same call, and a call of every slot
// (experts 4-7 of layer 2), served with the right bytes.
void SweepEachAllocation(const std::function<void(uint32_t, const std::vector<int64_t>&)>& call,
                         const std::function<void(uint32_t, const std::vector<int64_t>&)>& served) {
  bool finished = false;
  int failures = 0;
  for (int64_t n = 1; n < 2000 && !finished; ++n) {
    SCOPED_TRACE("allocation " + std::to_string(n));
    const uint32_t layer = 1 + n % 2;
    const std::vector<int64_t> ids = {n % 8, (n + 3) % 8};
    bool fired = false;
    {
      FailNthAllocation fail(n);
      try {
        call(layer, ids);
      } catch (const std::bad_alloc&) {
      }
      fired = fail.fired();
    }
    finished = !fired;  // the call made fewer than n allocations: every one has failed once
    failures += fired;
    served(layer, ids);  // a slot or entry whose read never ran would be served as a hit
    served(2, {4, 5, 6, 7});  // no pin or hold left behind
    if (::testing::Test::HasFatalFailure()) return;
  }
  EXPECT_TRUE(finished) << "the sweep did not reach the end of the call's allocations";
  EXPECT_GT(failures, 10) << "too few of the call's allocations were failed to test anything";
}
#endif

// A read that fails (EIO) when its engine thread has no memory for the
// error's text: before, std::bad_alloc left the thread (std::terminate).
// Now the acquire fails with an out-of-memory error naming the object, and
// once memory is back the same acquire is served with the right bytes.
TEST(StoreOutOfMemory, AFailedReadOnAStarvedIoThreadIsAnErrorNamingTheObject) {
  SKIP_UNDER_SANITIZER();
#ifndef K3_TEST_UNDER_SANITIZER
  for (const char* io : {"pread", "uring"}) {
    SCOPED_TRACE(io);
    TinyPack p(TinySpec{}, "oom-eio");
    ASSERT_TRUE(p.WriteDigestSidecar(true).ok());
    auto s = testing::OpenOk(p, Opts(io));
    ASSERT_TRUE(s);
    const uint64_t target = p.layout.ObjectOffset(0, 2);  // layer 1, expert 2
    std::atomic<bool> failing{true};
    s->SetReadFaultHook([&](uint64_t off, uint64_t, int64_t* result) {
      if (off == target && failing.load()) *result = -EIO;
    });
    {
      StarveOtherThreads starved;
      auto a = Get(*s, 1, {2, 3});
      ASSERT_FALSE(a.ok()) << "a failed read was served";
      EXPECT_EQ(a.error().kind(), ErrorKind::kMemory);
      EXPECT_EQ(a.error().sys_errno(), ENOMEM);
      EXPECT_NE(a.error().message().find("expert-pack object (layer 1, expert 2, 12288 bytes) of "),
                std::string::npos)
          << a.error().message();
      EXPECT_NE(a.error().message().find(" could not be read or checked: out of memory"), std::string::npos)
          << a.error().message();
      EXPECT_NE(a.error().message().find("\nhint: "), std::string::npos) << a.error().message();
      // A read that succeeds needs no memory on its thread: served as usual.
      auto b = Get(*s, 2, {0, 1});
      ASSERT_TRUE(b.ok()) << b.error().message();
      ExpectPattern(*b);
      ASSERT_TRUE(s->MarkUsed(*b).ok());
    }
    failing = false;
    auto again = Get(*s, 1, {2, 3});
    ASSERT_TRUE(again.ok()) << again.error().message();
    ExpectPattern(*again);
    ASSERT_TRUE(s->MarkUsed(*again).ok());
    auto j = s->Snapshot();
    EXPECT_EQ(j["io_errors"], 1);
    EXPECT_EQ(j["k3pack"]["checksum_errors"], 0);
    ASSERT_TRUE(s->Close().ok());
  }
#endif
}

// A damaged object found by a starved checksum check: the text of the
// mismatch cannot be made, but the bytes are refused all the same, and with
// memory back the next acquire names the damage.
TEST(StoreOutOfMemory, ADamagedObjectCheckedOnAStarvedThreadIsNeverServed) {
  SKIP_UNDER_SANITIZER();
#ifndef K3_TEST_UNDER_SANITIZER
  for (const char* io : {"pread", "uring"}) {
    SCOPED_TRACE(io);
    TinyPack p(TinySpec{}, "oom-crc");
    ASSERT_TRUE(p.WriteDigestSidecar(true).ok());
    const uint64_t at = p.layout.Slot(1, 3, pack::Role::kGate).offset + 1000;  // layer 2, expert 3
    const std::string bytes = *ReadFileToString(p.pack);
    const char flipped = static_cast<char>(bytes[at] ^ 0x10);
    p.Patch(at, &flipped, 1);
    auto s = testing::OpenOk(p, Opts(io));
    ASSERT_TRUE(s);
    {
      StarveOtherThreads starved;
      auto a = Get(*s, 2, {3, 4});
      ASSERT_FALSE(a.ok()) << "a damaged object was served";
      EXPECT_EQ(a.error().kind(), ErrorKind::kMemory);
    }
    auto named = Get(*s, 2, {3, 4});
    ASSERT_FALSE(named.ok()) << "a damaged object was served";
    EXPECT_NE(named.error().message().find("expert-pack object (layer 2, expert 3) is damaged"), std::string::npos)
        << named.error().message();
    EXPECT_EQ(s->Snapshot()["k3pack"]["checksum_errors"], 2);
    ASSERT_TRUE(s->Close().ok());
  }
#endif
}

// Staged prefetch starts its queued reads from the I/O thread as earlier
// ones finish. Starved there, such a read fails before it is submitted; the
// acquire that wants the object then reads it on demand.
TEST(StoreOutOfMemory, PrefetchesStartedOnAStarvedIoThreadFallBackToDemandReads) {
  SKIP_UNDER_SANITIZER();
#ifndef K3_TEST_UNDER_SANITIZER
  for (const char* io : {"pread", "uring"}) {
    SCOPED_TRACE(io);
    TinyPack p(TinySpec{}, "oom-prefetch");
    StoreOptions o = Opts(io);
    o.prefetch_queue_depth = 1;  // one speculative read at a time: the rest start from the I/O thread
    auto s = testing::OpenOk(p, o);
    ASSERT_TRUE(s);
    {
      StarveOtherThreads starved;
      ASSERT_TRUE(s->Prefetch(1, std::vector<int64_t>{0, 1, 2, 3, 4, 5}).ok());
      auto a = Get(*s, 1, {4, 5});
      ASSERT_TRUE(a.ok()) << a.error().message();
      ExpectPattern(*a);
      ASSERT_TRUE(s->MarkUsed(*a).ok());
    }
    auto b = Get(*s, 1, {0, 1});
    ASSERT_TRUE(b.ok()) << b.error().message();
    ExpectPattern(*b);
    ASSERT_TRUE(s->MarkUsed(*b).ok());
    ASSERT_TRUE(s->Close().ok());
  }
#endif
}

// The SGLang drop-in's slot cache reads misses straight into the caller's
// slots through the same engines: a short read (the pack cut under a live
// cache) on a starved engine thread fails the call, naming the object.
TEST(StoreOutOfMemory, TheSlotCachesFailedReadOnAStarvedIoThreadIsAnError) {
  SKIP_UNDER_SANITIZER();
#ifndef K3_TEST_UNDER_SANITIZER
  TinyPack p(TinySpec{}, "oom-slots");
  for (const char* io : {"pread", "uring"}) {
    SCOPED_TRACE(io);
    p.WritePack();
    testing::FourHostSlots slots(p, io);
    ASSERT_TRUE(slots.base != nullptr);
    // The last object (layer 2, expert 7) ends 7288 bytes short.
    std::filesystem::resize_file(p.pack, p.layout.final_size() - 12288 + 5000);
    {
      StarveOtherThreads starved;
      auto r = slots.Acquire(2, {7, 6});
      ASSERT_FALSE(r.ok()) << "a short read was served";
      EXPECT_EQ(r.error().kind(), ErrorKind::kMemory);
      EXPECT_NE(r.error().message().find("expert-pack object (layer 2, expert 7, 12288 bytes) of "),
                std::string::npos)
          << r.error().message();
    }
    auto named = slots.Acquire(2, {7, 6});
    ASSERT_FALSE(named.ok());
    EXPECT_EQ(named.error().message(), "short expert-pack read for (2, 7, 0, 12288): 5000 != 12288");
    slots.ExpectServed(2, {6, 5});
    ASSERT_TRUE(slots.cache->Close().ok());
  }
#endif
}

// The caller's own allocations: each allocation of an acquire (its
// entries, the policy's bookkeeping, the views it returns) fails in turn.
// The store must stay usable: no pin or acquisition left held (a call that
// needs the whole cache is served), no entry served that was never read,
// every read finished (Close() does not hang).
TEST(StoreOutOfMemory, EveryAllocationOfAnAcquireMayFailAndTheStoreStaysUsable) {
  SKIP_UNDER_SANITIZER();
#ifndef K3_TEST_UNDER_SANITIZER
  for (const char* io : {"pread", "uring"}) {
    for (const char* policy : {"lru", "reuse-lfu-lru-v2", "adaptive"}) {
      SCOPED_TRACE(std::string(io) + " " + policy);
      TinyPack p(TinySpec{}, "oom-acquire");
      StoreOptions o = Opts(io);
      o.cache_bytes = 4 * 12288;  // 4 objects: a call of 4 distinct experts needs all of it
      o.policy = policy;
      auto s = testing::OpenOk(p, o);
      ASSERT_TRUE(s);
      SweepEachAllocation(
          [&](uint32_t layer, const std::vector<int64_t>& ids) {
            auto a = AcquireRows(*s, layer, ids);
            if (a.ok()) (void)s->MarkUsed(*a);
          },
          [&](uint32_t layer, const std::vector<int64_t>& ids) { ExpectServed(*s, layer, ids); });
      ExpectOnlyRealReadsCounted(s->Snapshot());
      ASSERT_TRUE(s->Close().ok());
    }
  }
#endif
}

// The sweep over a staged prefetch and the acquire it prefetches for: no
// object may stay staged, charged against the prefetch budget, once its
// layer has been acquired.
TEST(StoreOutOfMemory, EveryAllocationOfAPrefetchMayFailAndNothingStaysStaged) {
  SKIP_UNDER_SANITIZER();
#ifndef K3_TEST_UNDER_SANITIZER
  for (const char* io : {"pread", "uring"}) {
    SCOPED_TRACE(io);
    TinyPack p(TinySpec{}, "oom-stage");
    StoreOptions o = Opts(io);
    o.cache_bytes = 4 * 12288;
    auto s = testing::OpenOk(p, o);
    ASSERT_TRUE(s);
    auto staged_bytes = [&] { return s->Snapshot()["k3pack"]["prefetch"]["staged_bytes"].get<uint64_t>(); };
    SweepEachAllocation(
        [&](uint32_t layer, const std::vector<int64_t>& ids) {
          // A third expert the acquire does not route: staged, then dropped by it.
          const std::vector<int64_t> guessed = {ids[0], ids[1], (ids[0] + 5) % 8};
          (void)s->Prefetch(layer, guessed);
          auto a = AcquireRows(*s, layer, ids);
          if (a.ok()) (void)s->MarkUsed(*a);
        },
        [&](uint32_t layer, const std::vector<int64_t>& ids) {
          ExpectServed(*s, layer, ids);
          if (::testing::Test::HasFatalFailure()) return;
          // The layer's staging has ended: once the reads of dropped guesses
          // land (they keep their charge until then), nothing is charged.
          const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
          while (staged_bytes() != 0 && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          ASSERT_EQ(staged_bytes(), 0u) << "an object stayed staged, charged against the prefetch budget";
        });
    ASSERT_TRUE(s->Close().ok());
  }
#endif
}

// The same sweep over the GPU tier's acquire (the emulated CUDA runtime of
// the device-tier tests): no slot held by a call that failed, none served
// that was never copied.
TEST(StoreOutOfMemory, EveryAllocationOfADeviceTierAcquireMayFailAndTheTierStaysUsable) {
  SKIP_UNDER_SANITIZER();
#ifndef K3_TEST_UNDER_SANITIZER
  testing::ScopedEmulatedCuda emulation;
  TinyPack p(TinySpec{}, "oom-tier");
  StoreOptions o = Opts("pread");
  o.cache_bytes = 6 * 12288;
  auto host = testing::OpenOk(p, o);
  ASSERT_TRUE(host);
  DeviceTierOptions to;
  to.device_bytes = 4 * 12288;  // 4 slots: a call of 4 distinct experts needs all of them
  to.copy_workers = 2;
  auto opened = DeviceExpertTier::Open(host, to);
  ASSERT_TRUE(opened.ok()) << opened.error().message();
  auto tier = std::move(opened).value();
  auto acquire = [&](uint32_t layer, const std::vector<int64_t>& ids) {
    const int64_t shape[2] = {static_cast<int64_t>(ids.size() / 2), 2};
    return tier->Acquire(layer, ids, shape);
  };
  SweepEachAllocation(
      [&](uint32_t layer, const std::vector<int64_t>& ids) {
        auto a = acquire(layer, ids);
        if (a.ok()) (void)tier->Release(*a);
      },
      [&](uint32_t layer, const std::vector<int64_t>& ids) {
        auto a = acquire(layer, ids);
        ASSERT_TRUE(a.ok()) << a.error().message();
        for (const DeviceExpertView& v : a->routes) {
          std::vector<uint8_t> back(v.gate.size);
          ASSERT_TRUE(tier->CopyToHost(v.gate, back).ok());
          ASSERT_EQ(back[777], PatternByte(v.layer, v.expert, 1, 777)) << "expert " << v.expert;
        }
        ASSERT_TRUE(tier->Release(*a).ok());
      });
#endif
}

// The same sweep over the slot cache's acquire (SGLang's drop-in).
TEST(StoreOutOfMemory, EveryAllocationOfASlotCacheAcquireMayFailAndTheCacheStaysUsable) {
  SKIP_UNDER_SANITIZER();
#ifndef K3_TEST_UNDER_SANITIZER
  for (const char* io : {"pread", "uring"}) {
    SCOPED_TRACE(io);
    TinyPack p(TinySpec{}, "oom-slot-acquire");
    testing::FourHostSlots slots(p, io);
    ASSERT_TRUE(slots.base != nullptr);
    SweepEachAllocation(
        [&](uint32_t layer, const std::vector<int64_t>& ids) {
          auto a = slots.Acquire(layer, ids);
          if (a.ok()) (void)slots.cache->MarkUsed(*a);
        },
        [&](uint32_t layer, const std::vector<int64_t>& ids) { slots.ExpectServed(layer, ids); });
    ExpectOnlyRealReadsCounted(slots.cache->Snapshot());
    ASSERT_TRUE(slots.cache->Close().ok());
  }
#endif
}

}  // namespace
}  // namespace k3pack::store
