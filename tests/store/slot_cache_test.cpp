// SlotCache: SGLang's slot-level acquire (spec §7.6) checked against a
// reference model written here from the spec, slot bytes against the pack,
// the error texts, the CUDA path on the emulated runtime, and threads.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <list>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "emulated_cuda.h"
#include "k3pack/slot_cache.h"
#include "store/synthetic_pack.h"

namespace k3pack::store {
namespace {

using testing::PatternByte;
using testing::TinyPack;
using testing::TinySpec;

// SGLang's KimiGGMLExpertPackStore bookkeeping, from spec §7.6: persistent
// key frequencies capped at 255, slots with a key / frequency, an LRU of
// keys, victims = first empty slot in index order, else the strictly
// smallest slot frequency walking the LRU oldest->newest (decode) or
// newest->oldest (prefill), skipping the call's keys.
struct SglangReference {
  using Key = std::pair<uint32_t, uint32_t>;
  struct Slot {
    std::optional<Key> key;
    uint32_t frequency = 0;
  };
  std::vector<Slot> slots;
  std::map<Key, uint32_t> key_to_slot, key_frequency;
  std::list<Key> lru;  // oldest first
  uint64_t hits = 0, misses = 0, evictions = 0;

  explicit SglangReference(uint32_t n) : slots(n) {}

  void Touch(const Key& k) {
    lru.remove(k);
    lru.push_back(k);
  }
  int Victim(const std::set<Key>& protect, bool preserve_oldest) {
    for (size_t i = 0; i < slots.size(); ++i)
      if (!slots[i].key) return static_cast<int>(i);
    int best = -1;
    auto consider = [&](const Key& k) {
      if (protect.count(k)) return;
      int s = static_cast<int>(key_to_slot.at(k));
      if (best < 0 || slots[s].frequency < slots[best].frequency) best = s;
    };
    if (preserve_oldest) {
      for (auto it = lru.rbegin(); it != lru.rend(); ++it) consider(*it);
    } else {
      for (const Key& k : lru) consider(k);
    }
    return best;
  }
  // Returns the slots in route order, or nullopt when no victim exists.
  std::optional<std::vector<int32_t>> Acquire(uint32_t layer, const std::vector<int64_t>& ids, int64_t rows) {
    const bool prefill = rows > 1;
    std::set<Key> keys;
    for (int64_t e : ids) keys.insert({layer, static_cast<uint32_t>(e)});
    for (const Key& k : keys) key_frequency[k] = std::min<uint32_t>(key_frequency[k] + 1, 255);
    for (const Key& k : keys) {
      auto it = key_to_slot.find(k);
      if (it != key_to_slot.end()) {
        ++hits;
        Touch(k);
        slots[it->second].frequency = key_frequency[k];
        continue;
      }
      ++misses;
      int v = Victim(keys, prefill);
      if (v < 0) return std::nullopt;
      if (slots[v].key) {
        ++evictions;
        key_to_slot.erase(*slots[v].key);
        lru.remove(*slots[v].key);
      }
      slots[v].key = k;
      slots[v].frequency = key_frequency[k];
      key_to_slot[k] = static_cast<uint32_t>(v);
      Touch(k);
    }
    std::vector<int32_t> out;
    for (int64_t e : ids) out.push_back(static_cast<int32_t>(key_to_slot.at({layer, static_cast<uint32_t>(e)})));
    return out;
  }
};

struct AlignedSlots {
  uint8_t* base = nullptr;
  AlignedSlots(uint32_t slots, uint64_t bytes) {
    base = static_cast<uint8_t*>(std::aligned_alloc(4096, (uint64_t{slots} * bytes + 4095) / 4096 * 4096));
  }
  ~AlignedSlots() { std::free(base); }
};

// Every byte of `slot` is the pack's object (layer, expert): up | gate | down.
::testing::AssertionResult SlotHolds(const uint8_t* slot, const std::array<uint64_t, 3>& role_bytes, uint32_t layer,
                                     uint32_t expert) {
  uint64_t pos = 0;
  for (uint32_t r = 0; r < 3; ++r)
    for (uint64_t i = 0; i < role_bytes[r]; ++i, ++pos)
      if (slot[pos] != PatternByte(layer, expert, r, i))
        return ::testing::AssertionFailure() << "layer " << layer << " expert " << expert << " role " << r
                                             << " byte " << i << " differs";
  return ::testing::AssertionSuccess();
}

TinySpec Spec() {
  TinySpec spec;
  spec.layers = {1, 2, 3};
  spec.num_hidden_layers = 4;
  spec.experts = 12;
  spec.top_k = 3;
  return spec;
}

std::unique_ptr<SlotCache> OpenCache(const TinyPack& p, SlotCacheOptions o = {}) {
  auto r = SlotCache::Open(p.pack, p.manifest, o);
  EXPECT_TRUE(r.ok()) << r.error().message();
  return std::move(r).value();
}

TEST(SlotCache, SglangSequenceAndBytesOverRandomRoutes) {
  TinyPack p(Spec(), "slots-seq");
  for (const char* io : {"pread", "uring"}) {
    for (uint32_t slot_count : {3u, 5u, 9u}) {
      SlotCacheOptions o;
      o.store.io_backend = io;
      auto cache = OpenCache(p, o);
      ASSERT_EQ(cache->slot_bytes(), 3u * 4096);
      AlignedSlots mem(slot_count, cache->slot_bytes());
      ASSERT_TRUE(cache->AttachHost(mem.base, slot_count).ok());
      SglangReference ref(slot_count);
      uint64_t loaded = 0;  // misses of calls that succeeded (a failed call reads nothing)
      std::mt19937 rng(slot_count * 7 + (io[0] == 'u'));
      std::discrete_distribution<int> popular({8, 6, 5, 4, 3, 3, 2, 2, 1, 1, 1, 1});
      for (int call = 0; call < 300; ++call) {
        const uint32_t layer = 1 + call % 3;
        const int64_t rows = (call % 17 == 0) ? 2 : 1;  // some prefill-shaped calls
        std::vector<int64_t> ids;
        while (ids.size() < static_cast<size_t>(rows * 3)) ids.push_back(popular(rng));
        const int64_t shape[2] = {rows, 3};
        auto want = ref.Acquire(layer, ids, rows);
        auto got = cache->Acquire(layer, ids, shape, std::nullopt);
        if (!want) {
          ASSERT_FALSE(got.ok());
          // SGLang's text is the first line (a hint may follow it).
          const std::string text = got.error().message();
          EXPECT_EQ(text.substr(0, text.find('\n')), "expert cache cannot evict the active top-k working set");
          break;
        }
        ASSERT_TRUE(got.ok()) << got.error().message();
        ASSERT_EQ(*got, *want) << "call " << call;
        for (size_t i = 0; i < ids.size(); ++i)
          ASSERT_TRUE(SlotHolds(mem.base + uint64_t((*got)[i]) * cache->slot_bytes(), {4096, 4096, 4096}, layer,
                                static_cast<uint32_t>(ids[i])));
        ASSERT_TRUE(cache->MarkUsed(*got).ok());
        auto snap = cache->Snapshot();
        ASSERT_EQ(snap["cache_hits"], ref.hits);
        ASSERT_EQ(snap["cache_misses"], ref.misses);
        ASSERT_EQ(snap["cache_evictions"], ref.evictions);
        loaded = ref.misses;
      }
      auto snap = cache->Snapshot();
      EXPECT_EQ(snap["pack_reads"].get<uint64_t>(), loaded) << snap.dump();
      EXPECT_EQ(snap["h2d_bytes"].get<uint64_t>(), loaded * cache->slot_bytes());
      EXPECT_EQ(snap["cache_capacity_experts"], slot_count);
      EXPECT_EQ(snap["route_calls_by_layer"].size(), 4u);
      EXPECT_TRUE(cache->Close().ok());
    }
  }
}

TEST(SlotCache, SglangErrorTexts) {
  TinyPack p(Spec(), "slots-err");
  auto cache = OpenCache(p);
  const std::vector<int64_t> ids = {0, 1, 2};
  const int64_t shape[2] = {1, 3};
  auto r = cache->Acquire(1, ids, shape, std::nullopt);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message(), "expert device cache is not initialized");
  EXPECT_EQ(r.error().kind(), ErrorKind::kRuntime);
  AlignedSlots mem(2, cache->slot_bytes());
  auto few = cache->AttachHost(mem.base, 2);
  ASSERT_FALSE(few.ok());
  EXPECT_EQ(few.error().kind(), ErrorKind::kMemory);
  AlignedSlots mem4(4, cache->slot_bytes());
  ASSERT_TRUE(cache->AttachHost(mem4.base, 4).ok());
  r = cache->Acquire(0, ids, shape, std::nullopt);
  EXPECT_EQ(r.error().message(), "layer 0 is not an active routed MoE layer");
  const int64_t wide[2] = {1, 2};
  r = cache->Acquire(1, std::vector<int64_t>{0, 1}, wide, std::nullopt);
  EXPECT_EQ(r.error().message(), "runtime top-k must be exactly 3; received shape (1, 2)");
  r = cache->Acquire(1, std::vector<int64_t>{0, 1, 12}, shape, std::nullopt);
  EXPECT_EQ(r.error().message(), "route contains an out-of-range expert id");
  // A missing pack is SGLang's FileNotFoundError.
  auto missing = SlotCache::Open(p.dir + "/nope.pack", p.manifest, {});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().kind(), ErrorKind::kFileNotFound);
}

TEST(SlotCache, CudaPathOnEmulatedRuntime) {
  testing::ScopedEmulatedCuda emulated;
  TinyPack p(Spec(), "slots-cuda");
  for (uint64_t host_tier : {uint64_t{0}, uint64_t{64} << 10}) {
    SlotCacheOptions o;
    o.stage_slots = 2;  // several staging rounds per call
    o.host_cache_bytes = host_tier;
    auto cache = OpenCache(p, o);
    const uint32_t slots = 6;
    void* device = nullptr;
    ASSERT_EQ(testing::EmulatedCuda::Get().Malloc(&device, slots * cache->slot_bytes()), 0);
    ASSERT_TRUE(cache->AttachCuda(device, slots, 0).ok());
    SglangReference ref(slots);
    std::mt19937 rng(5);
    for (int call = 0; call < 60; ++call) {
      const uint32_t layer = 1 + call % 3;
      std::vector<int64_t> ids = {int64_t(rng() % 12), int64_t(rng() % 12), int64_t(rng() % 12)};
      const int64_t shape[2] = {1, 3};
      auto want = ref.Acquire(layer, ids, 1);
      auto got = cache->Acquire(layer, ids, shape, std::nullopt);
      ASSERT_TRUE(got.ok()) << got.error().message();
      ASSERT_EQ(*got, *want);
      for (size_t i = 0; i < ids.size(); ++i)
        ASSERT_TRUE(SlotHolds(static_cast<uint8_t*>(device) + uint64_t((*got)[i]) * cache->slot_bytes(),
                              {4096, 4096, 4096}, layer, static_cast<uint32_t>(ids[i])));
      ASSERT_TRUE(cache->MarkUsed(*got).ok());
    }
    auto snap = cache->Snapshot();
    EXPECT_EQ(snap["k3pack"]["slot_memory"], "cuda");
    EXPECT_EQ(snap["staged_bytes"], host_tier ? 0 : 2 * cache->slot_bytes());
    ASSERT_TRUE(cache->Close().ok());
    testing::EmulatedCuda::Get().Free(device);
  }
  EXPECT_EQ(testing::EmulatedCuda::live_events.load(), 0);
  EXPECT_EQ(testing::EmulatedCuda::live_pinned.load(), 0);
  EXPECT_EQ(testing::EmulatedCuda::live_streams.load(), 0);
}

// An attach after Close (the drop-in's initialize_device_cache racing its
// close) used to succeed: the cache took the slots of a closed store, and on
// CUDA created events, a stream and pinned staging that nothing released.
TEST(SlotCache, AttachAfterCloseIsRefusedAndTakesNothing) {
  testing::ScopedEmulatedCuda emulated;
  TinyPack p(Spec(), "slots-closed");
  auto host = OpenCache(p);
  ASSERT_TRUE(host->Close().ok());
  AlignedSlots mem(4, host->slot_bytes());
  Status st = host->AttachHost(mem.base, 4);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().message(), "expert store is closed");
  EXPECT_EQ(st.error().kind(), ErrorKind::kRuntime);
  EXPECT_FALSE(host->attached());
  auto cuda = OpenCache(p);
  ASSERT_TRUE(cuda->Close().ok());
  void* device = nullptr;
  ASSERT_EQ(testing::EmulatedCuda::Get().Malloc(&device, 4 * cuda->slot_bytes()), 0);
  st = cuda->AttachCuda(device, 4, 0);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().message(), "expert store is closed");
  EXPECT_FALSE(cuda->attached());
  cuda.reset();  // the destructor's Close is a no-op: nothing may be left
  testing::EmulatedCuda::Get().Free(device);
  EXPECT_EQ(testing::EmulatedCuda::live_events.load(), 0);
  EXPECT_EQ(testing::EmulatedCuda::live_pinned.load(), 0);
  EXPECT_EQ(testing::EmulatedCuda::live_streams.load(), 0);
}

TEST(SlotCache, FailedCopyIsNeverServed) {
  testing::ScopedEmulatedCuda emulated;
  TinyPack p(Spec(), "slots-fail");
  auto cache = OpenCache(p);
  void* device = nullptr;
  ASSERT_EQ(testing::EmulatedCuda::Get().Malloc(&device, 6 * cache->slot_bytes()), 0);
  ASSERT_TRUE(cache->AttachCuda(device, 6, 0).ok());
  testing::EmulatedCuda::fail_h2d_copy = testing::EmulatedCuda::h2d_copies.load() + 1;  // the call's 2nd copy
  const int64_t shape[2] = {1, 3};
  std::vector<int64_t> ids = {4, 5, 6};
  auto r = cache->Acquire(2, ids, shape, std::nullopt);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("illegal memory access"), std::string::npos) << r.error().message();
  testing::EmulatedCuda::fail_h2d_copy = -1;
  // Nothing of the failed call is resident: the retry reads all three again.
  auto again = cache->Acquire(2, ids, shape, std::nullopt);
  ASSERT_TRUE(again.ok()) << again.error().message();
  for (size_t i = 0; i < ids.size(); ++i)
    EXPECT_TRUE(SlotHolds(static_cast<uint8_t*>(device) + uint64_t((*again)[i]) * cache->slot_bytes(),
                          {4096, 4096, 4096}, 2, static_cast<uint32_t>(ids[i])));
  EXPECT_EQ(cache->Snapshot()["cache_hits"], 0);
  ASSERT_TRUE(cache->Close().ok());
  testing::EmulatedCuda::Get().Free(device);
}

// An AttachCuda that failed (a device the runtime does not have, too few
// slots, or a CUDA resource it could not create) kept what it had set up:
// the runtime, and past the slot check the slots and their policy. After a
// bad device the host attach that followed went down the CUDA path with no
// events or staging (out-of-bounds reads); after a failed resource the cache
// said it was attached, refused a retry, and read misses into slot memory
// at a null base.
TEST(SlotCache, FailedCudaAttachLeavesTheCacheUnattached) {
  testing::ScopedEmulatedCuda emulated;  // resets the runtime whatever happens
  TinyPack p(Spec(), "slots-attach-fail");
  const std::vector<int64_t> ids = {4, 5, 6};
  const int64_t shape[2] = {1, 3};
  {
    auto cache = OpenCache(p);
    void* device = nullptr;
    ASSERT_EQ(testing::EmulatedCuda::Get().Malloc(&device, 6 * cache->slot_bytes()), 0);
    ASSERT_FALSE(cache->AttachCuda(device, 6, /*device=*/1).ok());  // the emulation has device 0 only
    ASSERT_FALSE(cache->attached());
    AlignedSlots mem(6, cache->slot_bytes());
    ASSERT_TRUE(cache->AttachHost(mem.base, 6).ok());
    auto got = cache->Acquire(2, ids, shape, std::nullopt);
    ASSERT_TRUE(got.ok()) << got.error().message();
    for (size_t i = 0; i < ids.size(); ++i)
      EXPECT_TRUE(SlotHolds(mem.base + uint64_t((*got)[i]) * cache->slot_bytes(), {4096, 4096, 4096}, 2,
                            static_cast<uint32_t>(ids[i])));
    EXPECT_EQ(cache->Snapshot()["k3pack"]["slot_memory"], "host");
    ASSERT_TRUE(cache->Close().ok());
    testing::EmulatedCuda::Get().Free(device);
  }
  {
    cuda::Runtime no_pinned = testing::EmulatedCuda::Get();
    no_pinned.HostAlloc = [](void**, size_t, unsigned) { return 2; };  // cudaErrorMemoryAllocation
    cuda::SetRuntimeForTesting(&no_pinned);
    auto cache = OpenCache(p);
    void* device = nullptr;
    ASSERT_EQ(testing::EmulatedCuda::Get().Malloc(&device, 6 * cache->slot_bytes()), 0);
    Status st = cache->AttachCuda(device, 6, 0);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.error().message().find("cudaHostAlloc"), std::string::npos) << st.error().message();
    EXPECT_FALSE(cache->attached());
    auto r = cache->Acquire(2, ids, shape, std::nullopt);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().message(), "expert device cache is not initialized");
    // With a runtime that can, the same cache attaches and serves.
    cuda::SetRuntimeForTesting(&testing::EmulatedCuda::Get());
    ASSERT_TRUE(cache->AttachCuda(device, 6, 0).ok());
    auto got = cache->Acquire(2, ids, shape, std::nullopt);
    ASSERT_TRUE(got.ok()) << got.error().message();
    for (size_t i = 0; i < ids.size(); ++i)
      EXPECT_TRUE(SlotHolds(static_cast<uint8_t*>(device) + uint64_t((*got)[i]) * cache->slot_bytes(),
                            {4096, 4096, 4096}, 2, static_cast<uint32_t>(ids[i])));
    ASSERT_TRUE(cache->Close().ok());
    testing::EmulatedCuda::Get().Free(device);
  }
  EXPECT_EQ(testing::EmulatedCuda::live_events.load(), 0);
  EXPECT_EQ(testing::EmulatedCuda::live_pinned.load(), 0);
  EXPECT_EQ(testing::EmulatedCuda::live_streams.load(), 0);
}

// An acquire whose slots were placed and filled but whose caller's stream
// could not be made to wait on them (cudaStreamWaitEvent failed: a stream of
// another device, a sticky context error) returned the error and kept the
// call's holds: nobody could release them, and other threads' calls that
// needed those slots waited 10 s and failed.
// Three slots on the emulated CUDA runtime, and a stream that cannot be made
// to wait on their copies (cudaStreamWaitEvent fails on it).
struct ThreeCudaSlotsAndABadStream {
  explicit ThreeCudaSlotsAndABadStream(const std::string& tag) : p(Spec(), tag) {
    rt.StreamWaitEvent = [](cuda::Stream s, cuda::Event, unsigned) { return s == bad_stream ? 400 : 0; };
    cuda::SetRuntimeForTesting(&rt);
    cache = OpenCache(p);
    malloced = testing::EmulatedCuda::Get().Malloc(&device, 3 * cache->slot_bytes()) == 0;
    attached = malloced && cache->AttachCuda(device, 3, 0).ok();
  }
  ~ThreeCudaSlotsAndABadStream() {
    (void)cache->Close();
    if (malloced) testing::EmulatedCuda::Get().Free(device);
  }
  static inline int bad_stream_storage = 0;
  static inline void* const bad_stream = &bad_stream_storage;
  testing::ScopedEmulatedCuda emulated;
  cuda::Runtime rt = testing::EmulatedCuda::Get();
  TinyPack p;
  std::unique_ptr<SlotCache> cache;
  void* device = nullptr;
  bool malloced = false, attached = false;
};

TEST(StoreConcurrency, SlotCacheFailedStreamWaitReleasesTheCallsHolds) {
  ThreeCudaSlotsAndABadStream three("slots-wait-fail");
  ASSERT_TRUE(three.attached);
  auto& cache = three.cache;
  void* const device = three.device;
  void* const bad_stream = three.bad_stream;
  const int64_t shape[2] = {1, 3};
  const std::vector<int64_t> first = {0, 1, 2}, second = {3, 4, 5};
  std::thread([&] {
    // Misses, copied in; the caller's stream cannot wait for their copies.
    auto r = cache->Acquire(1, first, shape, std::nullopt, bad_stream);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message().find("cudaStreamWaitEvent"), std::string::npos) << r.error().message();
  }).join();
  // Every slot holds the failed call's objects: only a released call lets
  // them go. Holds that were kept make this call wait out its 10 s and fail
  // (no wall-clock bound is asserted: that flakes on a loaded machine).
  auto r = cache->Acquire(1, second, shape, std::nullopt);
  ASSERT_TRUE(r.ok()) << r.error().message();
  for (size_t i = 0; i < second.size(); ++i)
    EXPECT_TRUE(SlotHolds(static_cast<uint8_t*>(device) + uint64_t((*r)[i]) * cache->slot_bytes(),
                          {4096, 4096, 4096}, 1, static_cast<uint32_t>(second[i])));
  ASSERT_TRUE(cache->MarkUsed(*r).ok());
  ASSERT_TRUE(cache->Close().ok());
}

// MarkUsed checked each slot as it went: a list with a bad slot after a
// good one failed, yet had already released the good one. The caller, told
// nothing was done, still used that slot, which another thread's call could
// now overwrite (and the caller's later MarkUsed released another thread's
// hold on it instead).
// A host cache of 3 slots over the tiny pack: one top-3 call fills it.
struct ThreeSlots {
  explicit ThreeSlots(const std::string& tag) : p(Spec(), tag), cache(OpenCache(p)), mem(3, cache->slot_bytes()) {
    attached = cache->AttachHost(mem.base, 3).ok();
  }
  TinyPack p;
  std::unique_ptr<SlotCache> cache;
  AlignedSlots mem;
  bool attached = false;
};

TEST(StoreConcurrency, SlotCacheMarkUsedWithABadSlotReleasesNothing) {
  ThreeSlots three("slots-markused-bad");
  ASSERT_TRUE(three.attached);
  auto& cache = three.cache;
  AlignedSlots& mem = three.mem;
  const int64_t shape[2] = {1, 3};
  std::atomic<bool> refused{false}, released{false};
  std::thread holder([&] {
    auto r = cache->Acquire(1, std::vector<int64_t>{0, 1, 2}, shape, std::nullopt);
    ASSERT_TRUE(r.ok()) << r.error().message();
    const std::vector<int32_t> bad = {(*r)[0], 99};
    Status st = cache->MarkUsed(bad);
    EXPECT_FALSE(st.ok());
    refused = true;
    // Still this call's: expert 0's bytes must stay put until released.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_TRUE(SlotHolds(mem.base + uint64_t((*r)[0]) * cache->slot_bytes(), {4096, 4096, 4096}, 1, 0));
    released = true;
    EXPECT_TRUE(cache->MarkUsed(*r).ok());
  });
  while (!refused) std::this_thread::yield();
  // Needs a slot: the only candidate holds expert 0, which the holder holds.
  auto r = cache->Acquire(1, std::vector<int64_t>{1, 2, 3}, shape, std::nullopt);
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_TRUE(released) << "took the slot of a call that was never released";
  holder.join();
  ASSERT_TRUE(cache->MarkUsed(*r).ok());
  ASSERT_TRUE(cache->Close().ok());
}

// A thread releasing its call twice (a retry, a release in a finally block
// and again by hand) released another thread's call on the same slots the
// second time: that thread's slots were overwritten while it still used them.
TEST(StoreConcurrency, SlotCacheARepeatedMarkUsedNeverReleasesAnotherThreadsCall) {
  ThreeSlots three("slots-markused-twice");
  ASSERT_TRUE(three.attached);
  auto& cache = three.cache;
  AlignedSlots& mem = three.mem;
  const int64_t shape[2] = {1, 3};
  const std::vector<int64_t> ids = {0, 1, 2};
  std::atomic<bool> held{false}, repeated{false}, released{false};
  std::thread holder([&] {
    auto r = cache->Acquire(1, ids, shape, std::nullopt);
    ASSERT_TRUE(r.ok()) << r.error().message();
    held = true;
    while (!repeated) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    for (size_t i = 0; i < ids.size(); ++i)
      EXPECT_TRUE(SlotHolds(mem.base + uint64_t((*r)[i]) * cache->slot_bytes(), {4096, 4096, 4096}, 1,
                            static_cast<uint32_t>(ids[i])));
    released = true;
    EXPECT_TRUE(cache->MarkUsed(*r).ok());
  });
  while (!held) std::this_thread::yield();
  auto mine = cache->Acquire(1, ids, shape, std::nullopt);  // the same slots, hits
  ASSERT_TRUE(mine.ok()) << mine.error().message();
  ASSERT_TRUE(cache->MarkUsed(*mine).ok());
  ASSERT_TRUE(cache->MarkUsed(*mine).ok());  // a repeat: releases nothing
  repeated = true;
  // Needs every slot: it waits for the holder's release.
  auto r = cache->Acquire(2, std::vector<int64_t>{3, 4, 5}, shape, std::nullopt);
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_TRUE(released) << "took the slots of a call that was never released";
  holder.join();
  // 1, or 0 where a loaded machine let the holder release before the call.
  const auto waits_so_far = cache->Snapshot()["k3pack"]["waits_for_other_threads"];
  ASSERT_TRUE(cache->MarkUsed(*r).ok());
  // Released by another thread than the one that made it, a call is released.
  std::thread([&] {
    auto again = cache->Acquire(1, ids, shape, std::nullopt);
    ASSERT_TRUE(again.ok()) << again.error().message();
    mine = again;
  }).join();
  ASSERT_TRUE(cache->MarkUsed(*mine).ok());
  r = cache->Acquire(2, std::vector<int64_t>{3, 4, 5}, shape, std::nullopt);
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ(cache->Snapshot()["k3pack"]["waits_for_other_threads"], waits_so_far) << "the released call was still held";
  ASSERT_TRUE(cache->MarkUsed(*r).ok());
  ASSERT_TRUE(cache->Close().ok());
}

// A thread's next call may evict its own unreleased call's objects (SGLang);
// their holds stayed on the evicted objects while the releases, by slot,
// took the new objects' holds: after both releases the evicted objects were
// pinned for good (another thread waited 10 s and failed), and after the
// first the second call's slots were unprotected (overwritten while used).
TEST(StoreConcurrency, SlotCacheHoldsFollowASlotTheSameThreadsNextCallTakes) {
  ThreeSlots three("slots-own-eviction");
  ASSERT_TRUE(three.attached);
  auto& cache = three.cache;
  AlignedSlots& mem = three.mem;
  const int64_t shape[2] = {1, 3};
  const std::vector<int64_t> first = {0, 1, 2}, second = {3, 4, 5};
  auto a = cache->Acquire(1, first, shape, std::nullopt);
  ASSERT_TRUE(a.ok()) << a.error().message();
  auto b = cache->Acquire(1, second, shape, std::nullopt);  // evicts every object of `a`
  ASSERT_TRUE(b.ok()) << b.error().message();
  ASSERT_TRUE(cache->MarkUsed(*a).ok());

  // `b` is still held: another thread's call waits for its release.
  std::atomic<bool> released{false};
  std::thread other([&] {
    auto r = cache->Acquire(1, first, shape, std::nullopt);
    ASSERT_TRUE(r.ok()) << r.error().message();
    EXPECT_TRUE(released) << "took the slots of a call that was never released";
    EXPECT_TRUE(cache->MarkUsed(*r).ok());
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (size_t i = 0; i < second.size(); ++i)
    EXPECT_TRUE(SlotHolds(mem.base + uint64_t((*b)[i]) * cache->slot_bytes(), {4096, 4096, 4096}, 1,
                          static_cast<uint32_t>(second[i])))
        << "slot of expert " << second[i] << " overwritten while held";
  released = true;
  ASSERT_TRUE(cache->MarkUsed(*b).ok());
  other.join();

  // Both released (in the other order too): nothing stays held.
  a = cache->Acquire(1, first, shape, std::nullopt);
  ASSERT_TRUE(a.ok()) << a.error().message();
  b = cache->Acquire(1, second, shape, std::nullopt);
  ASSERT_TRUE(b.ok()) << b.error().message();
  ASSERT_TRUE(cache->MarkUsed(*b).ok());
  ASSERT_TRUE(cache->MarkUsed(*a).ok());
  const uint64_t waits_before = cache->Snapshot()["k3pack"]["waits_for_other_threads"].get<uint64_t>();
  std::thread([&] {
    for (const auto* ids : {&first, &second}) {
      auto r = cache->Acquire(1, *ids, shape, std::nullopt);
      ASSERT_TRUE(r.ok()) << r.error().message();
      EXPECT_TRUE(cache->MarkUsed(*r).ok());
    }
  }).join();
  EXPECT_EQ(cache->Snapshot()["k3pack"]["waits_for_other_threads"].get<uint64_t>(), waits_before)
      << "a released call's objects were still held";
  ASSERT_TRUE(cache->Close().ok());
}

// A call released by a thread holding none (a completion thread) ended the
// hold of whichever thread came first in thread-id order: with two threads'
// calls on the same objects, the later call's hold went, and the earlier
// call's thread, then the objects' only holder, overwrote the slots the
// later one still read. It ends the hold of the thread that took them first.
TEST(StoreConcurrency, SlotCacheAReleaseFromAThirdThreadEndsTheOldestCall) {
  ThreeSlots three("slots-third-thread");
  ASSERT_TRUE(three.attached);
  auto& cache = three.cache;
  AlignedSlots& mem = three.mem;
  const int64_t shape[2] = {1, 3};
  const std::vector<int64_t> ids = {0, 1, 2}, next = {3, 4, 5};
  std::vector<int32_t> first_call;
  std::atomic<int> step{0};
  std::atomic<bool> released{false};
  std::thread earlier([&] {
    auto a = cache->Acquire(1, ids, shape, std::nullopt);
    ASSERT_TRUE(a.ok()) << a.error().message();
    first_call = *a;
    step = 1;
    while (step < 3) std::this_thread::yield();  // released by the third thread
    // Needs every slot: waits for the later call's release.
    auto b = cache->Acquire(1, next, shape, std::nullopt);
    ASSERT_TRUE(b.ok()) << b.error().message();
    EXPECT_TRUE(released) << "took the slots of a call that was never released";
    EXPECT_TRUE(cache->MarkUsed(*b).ok());
  });
  std::thread later([&] {
    while (step < 1) std::this_thread::yield();
    auto a = cache->Acquire(1, ids, shape, std::nullopt);  // the same slots, hits
    ASSERT_TRUE(a.ok()) << a.error().message();
    step = 2;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    for (size_t i = 0; i < ids.size(); ++i)
      EXPECT_TRUE(SlotHolds(mem.base + uint64_t((*a)[i]) * cache->slot_bytes(), {4096, 4096, 4096}, 1,
                            static_cast<uint32_t>(ids[i])))
          << "slot of expert " << ids[i] << " overwritten while held";
    released = true;
    EXPECT_TRUE(cache->MarkUsed(*a).ok());
  });
  while (step < 2) std::this_thread::yield();
  ASSERT_TRUE(cache->MarkUsed(first_call).ok());  // this thread holds no call
  step = 3;
  earlier.join();
  later.join();
  ASSERT_TRUE(cache->Close().ok());
}

// The release of a thread's first call left its hold looking as old as that
// call: a completion thread releasing A's call 1, then B's call 2, ended A's
// call 3 the second time, and B's next call overwrote the slots A still read.
TEST(StoreConcurrency, SlotCacheAReleaseEndsTheOldestCallNotTheOldestThread) {
  ThreeSlots three("slots-oldest-call");
  ASSERT_TRUE(three.attached);
  auto& cache = three.cache;
  AlignedSlots& mem = three.mem;
  const int64_t shape[2] = {1, 3};
  const std::vector<int64_t> ids = {0, 1, 2}, other = {3, 4, 5};
  std::vector<int32_t> call1, call2, call3;
  std::atomic<int> step{0};
  std::atomic<bool> released{false};
  std::thread a([&] {
    auto r = cache->Acquire(1, ids, shape, std::nullopt);
    ASSERT_TRUE(r.ok()) << r.error().message();
    call1 = *r;
    step = 1;
    while (step < 2) std::this_thread::yield();
    r = cache->Acquire(1, ids, shape, std::nullopt);  // call 3, the same slots
    ASSERT_TRUE(r.ok()) << r.error().message();
    call3 = *r;
    step = 3;
    while (step < 4) std::this_thread::yield();  // calls 1 and 2 released
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    for (size_t i = 0; i < ids.size(); ++i)
      EXPECT_TRUE(SlotHolds(mem.base + uint64_t(call3[i]) * cache->slot_bytes(), {4096, 4096, 4096}, 1,
                            static_cast<uint32_t>(ids[i])))
          << "slot of expert " << ids[i] << " overwritten while call 3 held it";
    released = true;
    EXPECT_TRUE(cache->MarkUsed(call3).ok());
  });
  std::thread b([&] {
    while (step < 1) std::this_thread::yield();
    auto r = cache->Acquire(1, ids, shape, std::nullopt);  // call 2
    ASSERT_TRUE(r.ok()) << r.error().message();
    call2 = *r;
    step = 2;
    while (step < 4) std::this_thread::yield();
    // Needs every slot: waits for call 3's release.
    auto next = cache->Acquire(1, other, shape, std::nullopt);
    ASSERT_TRUE(next.ok()) << next.error().message();
    EXPECT_TRUE(released) << "took the slots of a call that was never released";
    EXPECT_TRUE(cache->MarkUsed(*next).ok());
  });
  while (step < 3) std::this_thread::yield();
  ASSERT_TRUE(cache->MarkUsed(call1).ok());  // this thread holds no call: in the order made
  ASSERT_TRUE(cache->MarkUsed(call2).ok());
  step = 4;
  a.join();
  b.join();
  ASSERT_TRUE(cache->Close().ok());
}

// A thread's call evicted the objects of its own earlier, unreleased call
// and then failed (its caller's stream could not wait for the copies). The
// earlier call's holds went with the failed call; its release, naming the
// slots, ended another thread's hold on the objects there by then, and a
// third thread's call overwrote the slots that thread still read.
TEST(StoreConcurrency, SlotCacheAReleaseAfterItsOwnLaterCallFailedEndsNoOtherThreadsHold) {
  ThreeCudaSlotsAndABadStream three("slots-orphaned-holds");
  ASSERT_TRUE(three.attached);
  auto& cache = three.cache;
  void* const device = three.device;
  void* const bad_stream = three.bad_stream;
  const int64_t shape[2] = {1, 3};
  const std::vector<int64_t> first = {0, 1, 2}, second = {3, 4, 5}, third = {6, 7, 8};
  auto earlier = cache->Acquire(1, first, shape, std::nullopt);
  ASSERT_TRUE(earlier.ok()) << earlier.error().message();
  // Evicts every object of `earlier` (a thread's own calls do not protect
  // their slots), copies its own in, then fails.
  auto failed = cache->Acquire(1, second, shape, std::nullopt, bad_stream);
  ASSERT_FALSE(failed.ok());
  std::atomic<int> step{0};
  std::atomic<bool> released{false};
  std::thread reader([&] {
    auto r = cache->Acquire(1, second, shape, std::nullopt);  // hits the failed call's copies
    ASSERT_TRUE(r.ok()) << r.error().message();
    step = 1;
    while (step < 2) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    for (size_t i = 0; i < second.size(); ++i)
      EXPECT_TRUE(SlotHolds(static_cast<uint8_t*>(device) + uint64_t((*r)[i]) * cache->slot_bytes(),
                            {4096, 4096, 4096}, 1, static_cast<uint32_t>(second[i])))
          << "slot of expert " << second[i] << " overwritten while held";
    released = true;
    EXPECT_TRUE(cache->MarkUsed(*r).ok());
  });
  while (step < 1) std::this_thread::yield();
  ASSERT_TRUE(cache->MarkUsed(*earlier).ok());  // ends this thread's own call, nothing of the reader's
  ASSERT_TRUE(cache->MarkUsed(*earlier).ok());  // a repeat releases nothing (it ended the reader's at first)
  step = 2;
  std::thread writer([&] {
    // Needs every slot: waits for the reader's release.
    auto r = cache->Acquire(1, third, shape, std::nullopt);
    ASSERT_TRUE(r.ok()) << r.error().message();
    EXPECT_TRUE(released) << "took the slots of a call that was never released";
    EXPECT_TRUE(cache->MarkUsed(*r).ok());
  });
  reader.join();
  writer.join();
  // Every call released: nothing stays held.
  const uint64_t waits_before = cache->Snapshot()["k3pack"]["waits_for_other_threads"].get<uint64_t>();
  std::thread([&] {
    auto r = cache->Acquire(1, first, shape, std::nullopt);
    ASSERT_TRUE(r.ok()) << r.error().message();
    EXPECT_TRUE(cache->MarkUsed(*r).ok());
  }).join();
  EXPECT_EQ(cache->Snapshot()["k3pack"]["waits_for_other_threads"].get<uint64_t>(), waits_before);
  ASSERT_TRUE(cache->Close().ok());
}

// Two threads, each its own layer, check their slots before mark_used while
// the other keeps evicting: another thread's unreleased call is protected.
TEST(StoreConcurrency, SlotCacheTwoThreadsDifferentLayers) {
  TinyPack p(Spec(), "slots-threads");
  auto cache = OpenCache(p);
  const uint32_t slots = 7;
  AlignedSlots mem(slots, cache->slot_bytes());
  ASSERT_TRUE(cache->AttachHost(mem.base, slots).ok());
  std::atomic<int> bad{0};
  auto worker = [&](uint32_t layer, unsigned seed) {
    std::mt19937 rng(seed);
    for (int call = 0; call < 200; ++call) {
      std::vector<int64_t> ids = {int64_t(rng() % 12), int64_t(rng() % 12), int64_t(rng() % 12)};
      const int64_t shape[2] = {1, 3};
      auto got = cache->Acquire(layer, ids, shape, std::nullopt);
      if (!got.ok()) {
        ++bad;
        continue;
      }
      std::this_thread::yield();
      for (size_t i = 0; i < ids.size(); ++i)
        if (!SlotHolds(mem.base + uint64_t((*got)[i]) * cache->slot_bytes(), {4096, 4096, 4096}, layer,
                       static_cast<uint32_t>(ids[i])))
          ++bad;
      if (!cache->MarkUsed(*got).ok()) ++bad;
    }
  };
  std::thread a(worker, 1, 11), b(worker, 3, 12);
  a.join();
  b.join();
  EXPECT_EQ(bad.load(), 0);
  auto snap = cache->Snapshot();
  EXPECT_EQ(snap["route_calls_by_layer"][1], 200);
  EXPECT_EQ(snap["route_calls_by_layer"][3], 200);
  EXPECT_TRUE(cache->Close().ok());
}

}  // namespace
}  // namespace k3pack::store
