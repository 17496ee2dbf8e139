// Faults a run-time audit of the stores found (docs/RELIABILITY.md, "Faults
// from a store run-time audit (session 13)"): what happens to calls that are
// inside a store when it is closed, and what a closed store still holds.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

#include "../forked_child.h"
#include "k3pack/slot_cache.h"
#include "k3pack/store.h"
#include "open_ok.h"
#include "store/synthetic_pack.h"
#include "util/file.h"

namespace k3pack::store {
namespace {

using testing::kObject;
using testing::OpenOk;
using testing::TinyPack;
using testing::TinySpec;

// The result of a call made on another thread. A call that never returns
// (the fault these tests pin down was a hang) cannot be joined: the process
// ends with a failure instead of hanging the suite until ctest's timeout.
template <typename T>
T ResultOrDie(std::future<T>& f, const char* what) {
  if (f.wait_for(std::chrono::minutes(2)) != std::future_status::ready) {
    std::fprintf(stderr, "FATAL: %s never returned (hung)\n", what);
    std::fflush(stderr);
    std::_Exit(1);
  }
  return f.get();
}

// Polls until `done` (a state the other thread reaches under the store's
// lock); no timing is asserted, only order.
template <typename F>
void WaitUntil(F done) {
  while (!done()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// A call waiting for other threads' pins when the store was closed went on
// after the close once those pins were released: it submitted its reads to
// the I/O engine Close() had already shut down and waited for them forever
// (ExpertStore::Acquire and SlotCache::Acquire alike).
TEST(StoreRuntimeAudit, AcquireWaitingForRoomWhenClosedReturnsClosedError) {
  TinyPack p(TinySpec{}, "close-waiting");
  for (const char* io : {"pread", "uring"}) {
    SCOPED_TRACE(io);
    StoreOptions o;
    o.cache_bytes = 2 * kObject;  // one top-k working set
    o.io_backend = io;
    auto s = OpenOk(p, o);
    ASSERT_TRUE(s);
    const int64_t shape[2] = {1, 2};
    std::vector<int64_t> held_ids = {0, 1}, other_ids = {2, 3};
    auto held = s->Acquire(1, held_ids, shape);
    ASSERT_TRUE(held.ok()) << held.error().message();
    std::future<Result<Acquisition>> other = std::async(std::launch::async, [&] {
      return s->Acquire(1, other_ids, shape);
    });
    // The second call is counted before it waits for the first one's room.
    WaitUntil([&] { return s->Snapshot()["route_calls_by_layer"][1].get<uint64_t>() == 2; });
    ASSERT_TRUE(s->Close().ok());
    ASSERT_TRUE(s->MarkUsed(*held).ok());  // the room it waited for
    Result<Acquisition> r = ResultOrDie(other, "ExpertStore::Acquire after Close");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().message(), "expert store is closed");
    EXPECT_EQ(r.error().kind(), ErrorKind::kRuntime);
  }
}

TEST(StoreRuntimeAudit, SlotCacheAcquireWaitingForRoomWhenClosedReturnsClosedError) {
  TinyPack p(TinySpec{}, "slots-close-waiting");
  for (const char* io : {"pread", "uring"}) {
    SCOPED_TRACE(io);
    SlotCacheOptions o;
    o.store.io_backend = io;
    auto opened = SlotCache::Open(p.pack, p.manifest, o);
    ASSERT_TRUE(opened.ok()) << opened.error().message();
    std::unique_ptr<SlotCache> cache = std::move(opened).value();
    void* mem = std::aligned_alloc(4096, 2 * kObject);
    ASSERT_TRUE(cache->AttachHost(static_cast<uint8_t*>(mem), 2).ok());
    const int64_t shape[2] = {1, 2};
    std::vector<int64_t> held_ids = {0, 1}, other_ids = {2, 3};
    auto held = cache->Acquire(1, held_ids, shape, std::nullopt);
    ASSERT_TRUE(held.ok()) << held.error().message();
    std::future<Result<std::vector<int32_t>>> other = std::async(std::launch::async, [&] {
      return cache->Acquire(1, other_ids, shape, std::nullopt);
    });
    WaitUntil([&] { return cache->Snapshot()["k3pack"]["waits_for_other_threads"].get<uint64_t>() >= 1; });
    ASSERT_TRUE(cache->Close().ok());
    ASSERT_TRUE(cache->MarkUsed(*held).ok());
    auto r = ResultOrDie(other, "SlotCache::Acquire after Close");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().message(), "expert store is closed");
    cache.reset();
    std::free(mem);
  }
}

bool SaysForked(const Error& e) {
  return e.kind() == ErrorKind::kRuntime && e.message().find("cannot be used in process") != std::string::npos &&
         e.message().find("forked from it") != std::string::npos;
}

// fork() copies a store but not its I/O threads. In the child an acquire of
// an object not resident waited forever for a read no thread would do, and
// Close() / the destructor joined threads that do not exist there (hang).
// Now the child's copy refuses to read or release, naming both processes,
// and closing or destroying it returns at once; the parent is unaffected.
TEST(StoreRuntimeAudit, ForkedChildCanOnlyCloseItsCopyOfAStore) {
  TinyPack p(TinySpec{}, "fork-store");
  for (const char* io : {"pread", "uring"}) {
    SCOPED_TRACE(io);
    StoreOptions o;
    o.cache_bytes = 8 * kObject;
    o.io_backend = io;
    o.stats_path = p.dir + "/stats-" + io + ".json";
    auto s = OpenOk(p, o);
    ASSERT_TRUE(s);
    const int64_t shape[2] = {1, 2};
    std::vector<int64_t> first = {0, 1}, second = {2, 3};
    auto held = s->Acquire(1, first, shape);  // the engine's threads are running now
    ASSERT_TRUE(held.ok()) << held.error().message();
    int rc = k3test::InForkedChild([&] {
      auto r = s->Acquire(1, second, shape);
      if (r.ok() || !SaysForked(r.error())) ::_exit(2);
      if (s->Prefetch(1, second).ok()) ::_exit(3);
      Status released = s->MarkUsed(*held);
      if (released.ok() || !SaysForked(released.error())) ::_exit(4);
      if (s->WriteStats().ok()) ::_exit(5);  // the stats file is the parent's
      if (!s->Close().ok()) ::_exit(6);
      s.reset();  // the destructor must not join the parent's threads
      ::_exit(0);
    });
    EXPECT_EQ(rc, 0) << "child exit code (2-6: a check above; -1: hung)";
    // The parent's store carries on.
    ASSERT_TRUE(s->MarkUsed(*held).ok());
    auto next = s->Acquire(1, second, shape);
    ASSERT_TRUE(next.ok()) << next.error().message();
    EXPECT_EQ(next->routes[0].bytes[0], testing::PatternByte(1, 2, 0, 0));
    ASSERT_TRUE(s->MarkUsed(*next).ok());
    ASSERT_TRUE(s->Close().ok());
  }
}

TEST(StoreRuntimeAudit, ForkedChildCanOnlyCloseItsCopyOfASlotCache) {
  TinyPack p(TinySpec{}, "fork-slots");
  for (uint64_t host_tier : {uint64_t{0}, 4 * kObject}) {
    SCOPED_TRACE(host_tier);
    SlotCacheOptions o;
    o.host_cache_bytes = host_tier;
    auto opened = SlotCache::Open(p.pack, p.manifest, o);
    ASSERT_TRUE(opened.ok()) << opened.error().message();
    std::unique_ptr<SlotCache> cache = std::move(opened).value();
    void* mem = std::aligned_alloc(4096, 4 * kObject);
    ASSERT_TRUE(cache->AttachHost(static_cast<uint8_t*>(mem), 4).ok());
    const int64_t shape[2] = {1, 2};
    std::vector<int64_t> first = {0, 1}, second = {2, 3};
    auto slots = cache->Acquire(1, first, shape, std::nullopt);
    ASSERT_TRUE(slots.ok()) << slots.error().message();
    int rc = k3test::InForkedChild([&] {
      auto r = cache->Acquire(1, second, shape, std::nullopt);
      if (r.ok() || !SaysForked(r.error())) ::_exit(2);
      Status released = cache->MarkUsed(*slots);
      if (released.ok() || !SaysForked(released.error())) ::_exit(3);
      if (!cache->Close().ok()) ::_exit(4);
      cache.reset();
      ::_exit(0);
    });
    EXPECT_EQ(rc, 0) << "child exit code (2-4: a check above; -1: hung)";
    ASSERT_TRUE(cache->MarkUsed(*slots).ok());
    auto next = cache->Acquire(1, second, shape, std::nullopt);
    ASSERT_TRUE(next.ok()) << next.error().message();
    ASSERT_TRUE(cache->Close().ok());
    cache.reset();
    std::free(mem);
  }
}

// Close() kept the whole cache (resident objects and the pool's free
// buffers) until the store object itself was destroyed: a closed Python
// store that stays referenced held its cache_bytes for good. Now Close()
// frees it; a view handed out keeps only its own object, freed with it.
TEST(StoreRuntimeAudit, CloseFreesTheCacheButNotTheViewsHandedOut) {
  TinyPack p(TinySpec{}, "close-frees");
  auto live = std::make_shared<std::atomic<int64_t>>(0);  // bytes allocated and not freed
  StoreOptions o;
  o.cache_bytes = 6 * kObject;
  o.buffer_alloc = [live](uint64_t bytes) -> void* {
    *live += static_cast<int64_t>(bytes);
    return std::aligned_alloc(4096, bytes);
  };
  o.buffer_free = [live](void* q, uint64_t bytes) {
    *live -= static_cast<int64_t>(bytes);
    std::free(q);
  };
  auto s = OpenOk(p, o);
  ASSERT_TRUE(s);
  const int64_t shape[2] = {1, 2};
  std::vector<ExpertView> kept;
  for (int64_t e = 0; e < 8; e += 2) {  // 4 calls x 2 objects on a 6-object cache: some evicted (pooled)
    std::vector<int64_t> ids = {e, e + 1};
    auto a = s->Acquire(2, ids, shape);
    ASSERT_TRUE(a.ok()) << a.error().message();
    if (e == 0) kept.push_back(a->routes[1]);
    ASSERT_TRUE(s->MarkUsed(*a).ok());
  }
  ASSERT_GE(live->load(), int64_t{6 * kObject});
  ASSERT_TRUE(s->Close().ok());
  EXPECT_EQ(live->load(), int64_t{kObject}) << "only the kept view's object may stay allocated";
  EXPECT_EQ(kept[0].bytes[0], testing::PatternByte(2, 1, 0, 0));  // still valid after close
  kept.clear();
  EXPECT_EQ(live->load(), 0);
  s.reset();
  EXPECT_EQ(live->load(), 0);
}

// SGLang's _write_stats creates the stats file's parent directory;
// ExpertStore's did not, so a stats_path in a directory not made yet lost
// every counter at Close() ("No such file or directory"), after the run.
TEST(StoreRuntimeAudit, StatsFileParentDirectoryIsCreatedAsSglangDoes) {
  TinyPack p(TinySpec{}, "stats-dir");
  StoreOptions o;
  o.cache_bytes = 4 * kObject;
  o.stats_path = p.dir + "/not/yet/stats.json";
  auto s = OpenOk(p, o);
  ASSERT_TRUE(s);
  const int64_t shape[2] = {1, 2};
  std::vector<int64_t> ids = {0, 1};
  auto a = s->Acquire(1, ids, shape);
  ASSERT_TRUE(a.ok()) << a.error().message();
  ASSERT_TRUE(s->MarkUsed(*a).ok());
  Status closed = s->Close();
  ASSERT_TRUE(closed.ok()) << closed.error().message();
  auto text = ReadFileToString(o.stats_path);
  ASSERT_TRUE(text.ok()) << text.error().message();
  auto j = nlohmann::json::parse(*text);
  EXPECT_EQ(j["cache_misses"].get<uint64_t>(), 2u);
  EXPECT_EQ(j["route_calls_by_layer"][1].get<uint64_t>(), 1u);
}

// stats_path was written at close over whatever it named: a slip of the path
// replaced the pack being served (and could the manifest or a shard) with
// the counters, and a directory lost them only at close. Now open refuses
// such a path, and each write looks again; a stats file is replaced.
TEST(StoreRuntimeAudit, StatsPathNeverReplacesAnotherKindOfFile) {
  TinyPack p(TinySpec{}, "stats-guard");
  const auto pack_before = ReadFileToString(p.pack);
  ASSERT_TRUE(pack_before.ok());
  for (const std::string& target : {p.pack, p.manifest, p.dir}) {
    SCOPED_TRACE(target);
    StoreOptions o;
    o.cache_bytes = 4 * kObject;
    o.stats_path = target;
    auto s = ExpertStore::Open(p.pack, p.manifest, o);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.error().kind(), ErrorKind::kFileExists) << s.error().message();
    EXPECT_NE(s.error().message().find(target), std::string::npos) << s.error().message();
    EXPECT_NE(s.error().message().find("stats_path"), std::string::npos) << s.error().message();
  }
  EXPECT_EQ(*ReadFileToString(p.pack), *pack_before);

  // An earlier stats file is replaced; a file put in its place after open is not.
  StoreOptions o;
  o.cache_bytes = 4 * kObject;
  o.stats_path = p.dir + "/stats.json";
  for (int run = 0; run < 2; ++run) {
    auto s = OpenOk(p, o);
    ASSERT_TRUE(s);
    ASSERT_TRUE(s->Close().ok());
  }
  auto s = OpenOk(p, o);
  ASSERT_TRUE(s);
  {
    std::ofstream(o.stats_path, std::ios::trunc) << "GGUF and more";
  }
  Status closed = s->Close();
  ASSERT_FALSE(closed.ok());
  EXPECT_NE(closed.error().message().find("it is a GGUF file, not a stats file"), std::string::npos)
      << closed.error().message();
  EXPECT_EQ(*ReadFileToString(o.stats_path), "GGUF and more");
}

// A forked child's close() and snapshot() waited for the store's mutex,
// which a parent thread held at the fork (here: inside the buffer allocator
// of a read it was submitting). That thread does not exist in the child, so
// they hung. Now the child goes on without the mutex.
TEST(StoreRuntimeAudit, ForkedChildClosesAStoreAParentThreadWasInside) {
  TinyPack p(TinySpec{}, "fork-held");
  auto inside = std::make_shared<std::atomic<bool>>(false);
  auto release = std::make_shared<std::atomic<bool>>(false);
  StoreOptions o;
  o.cache_bytes = 4 * kObject;
  o.buffer_alloc = [inside, release](uint64_t bytes) -> void* {
    inside->store(true);
    while (!release->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return std::aligned_alloc(4096, bytes);
  };
  o.buffer_free = [](void* q, uint64_t) { std::free(q); };
  auto s = OpenOk(p, o);
  ASSERT_TRUE(s);
  std::thread user([&] {
    const int64_t shape[2] = {1, 2};
    std::vector<int64_t> ids = {0, 1};
    auto a = s->Acquire(1, ids, shape);
    if (a.ok()) (void)s->MarkUsed(*a);
  });
  while (!inside->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  int rc = k3test::InForkedChild([&] {
    ::alarm(10);  // a hang ends the child with SIGALRM (142)
    (void)s->Snapshot();
    if (!s->Close().ok()) ::_exit(2);
    ::_exit(0);
  });
  release->store(true);
  user.join();
  EXPECT_EQ(rc, 0) << "child exit status (142: it hung)";
  ASSERT_TRUE(s->Close().ok());
}

// A slot cache with a host tier read a call's misses through one host-tier
// acquire: a call missing more objects than the host tier holds (a prefill
// over many experts) failed with "expert cache cannot evict the active
// top-k working set" although the slots had room. They now go through the
// host tier in chunks that fit; every slot holds its object's bytes.
TEST(StoreRuntimeAudit, SlotCacheMissesBeyondTheHostTierGoThroughItInChunks) {
  TinyPack p(TinySpec{}, "host-chunks");
  SlotCacheOptions o;
  o.host_cache_bytes = 2 * kObject;  // the least a host tier may hold: top_k objects
  auto opened = SlotCache::Open(p.pack, p.manifest, o);
  ASSERT_TRUE(opened.ok()) << opened.error().message();
  std::unique_ptr<SlotCache> cache = std::move(opened).value();
  uint8_t* mem = static_cast<uint8_t*>(std::aligned_alloc(4096, 8 * kObject));
  ASSERT_TRUE(cache->AttachHost(mem, 8).ok());
  const int64_t shape[2] = {3, 2};  // a prefill of 3 tokens: 5 distinct experts, duplicates kept
  std::vector<int64_t> ids = {0, 1, 2, 3, 4, 1};
  auto slots = cache->Acquire(2, ids, shape, std::nullopt);
  ASSERT_TRUE(slots.ok()) << slots.error().message();
  ASSERT_EQ(slots->size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint8_t* slot = mem + uint64_t((*slots)[i]) * kObject;
    for (uint32_t role = 0; role < 3; ++role)
      EXPECT_EQ(slot[role * 4096 + 5], testing::PatternByte(2, uint32_t(ids[i]), role, 5)) << "route " << i;
  }
  EXPECT_EQ((*slots)[1], (*slots)[5]);
  auto j = cache->Snapshot();
  EXPECT_EQ(j["k3pack"]["host_tier_copies"].get<uint64_t>(), 5u);
  EXPECT_EQ(j["cache_misses"].get<uint64_t>(), 5u);
  ASSERT_TRUE(cache->MarkUsed(*slots).ok());
  ASSERT_TRUE(cache->Close().ok());
  cache.reset();
  std::free(mem);
}

// The pread engine starts one thread per read in flight (queue_depth). When
// the process could not make them all (a container's pids limit, the
// address-space limit), std::thread's exception unwound through the engine
// with running threads and aborted the process (SIGABRT from Open()). Now
// the threads started are stopped and Open() returns an error.
TEST(StoreRuntimeAudit, OpenThatCannotStartItsIoThreadsFailsWithoutAborting) {
#ifdef K3_TEST_UNDER_SANITIZER
  GTEST_SKIP() << "an address-space limit under a sanitizer runtime";
#endif
  TinyPack p(TinySpec{}, "thread-limit");
  int rc = k3test::InForkedChild([&] {
    // This child's address space may grow by 256 MiB: the 64 thread stacks started at open do not fit.
    if (!k3test::LimitAddressSpaceGrowth(uint64_t{256} << 20)) ::_exit(4);
    StoreOptions o;
    o.cache_bytes = 4 * kObject;
    o.queue_depth = 1024;
    auto s = ExpertStore::Open(p.pack, p.manifest, o);
    if (s.ok()) ::_exit(5);  // the limit did not bite: nothing shown
    if (s.error().message().find("cannot start the expert store's I/O threads") == std::string::npos) ::_exit(2);
    ::_exit(0);
  });
  if (rc == 5) GTEST_SKIP() << "1024 threads fit under the address-space limit here";
  EXPECT_EQ(rc, 0) << "child exit code (134: aborted; 2: another error)";
}

// Open hashes the pack index on a second thread beside its entry walk;
// when that thread could not start, std::thread's exception left
// ValidatePack (a Result function) and Open threw. Now the index is hashed
// on the opening thread, and Open answers with a Result.
TEST(StoreRuntimeAudit, OpenWithoutASpareThreadAnswersWithAResult) {
#ifdef K3_TEST_UNDER_SANITIZER
  GTEST_SKIP() << "an address-space limit under a sanitizer runtime";
#endif
  TinyPack p(TinySpec{}, "no-hasher");
  int rc = k3test::InForkedChild([&] {
    // 1 MiB more address space: no 8 MiB thread stack fits.
    if (!k3test::LimitAddressSpaceGrowth(uint64_t{1} << 20)) ::_exit(4);
    StoreOptions o;
    o.cache_bytes = 4 * kObject;
    o.queue_depth = 1;
    try {
      // Opened (the I/O thread got a stack glibc kept from an exited thread)
      // or refused: either way a Result.
      auto s = ExpertStore::Open(p.pack, p.manifest, o);
      ::_exit(s.ok() || !s.error().message().empty() ? 0 : 3);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "threw: %s\n", e.what());
      ::_exit(2);
    }
  });
  EXPECT_EQ(rc, 0) << "child exit code (2: Open threw)";
}

}  // namespace
}  // namespace k3pack::store
