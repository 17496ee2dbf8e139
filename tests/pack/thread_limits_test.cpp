// Thread pools when the process cannot start all the threads they ask for (a
// container's pids limit or an address-space limit): TaskPool (the pack
// build's hashing beside its copy, the store's checksum checks beside
// io_uring's reads) and RunOnThreads (sweeps, the resume check).
// std::thread's exception used to leave with other
// threads still joinable, which aborts the process (std::terminate).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <new>
#include <stdexcept>
#include <system_error>
#include <thread>
#include <vector>

#include "../forked_child.h"
#include "util/task_pool.h"
#include "util/threads.h"

namespace k3pack {
namespace {

TEST(TaskPoolLimits, FewerThreadsThanAskedStillRunEveryJob) {
#ifdef K3_TEST_UNDER_SANITIZER
  GTEST_SKIP() << "an address-space limit under a sanitizer runtime";
#endif
  int rc = k3test::InForkedChild([] {
    // 64 MiB more: a few 8 MiB thread stacks, not 1024.
    if (!k3test::LimitAddressSpaceGrowth(uint64_t{64} << 20)) ::_exit(4);
    std::atomic<int> ran{0};
    {
      TaskPool pool(1024);
      if (pool.threads() >= 1024) ::_exit(5);  // the limit did not bite
      if (pool.threads() < 1) ::_exit(2);
      std::vector<std::future<void>> done;
      for (int i = 0; i < 200; ++i) done.push_back(pool.Submit([&] { ran.fetch_add(1); }));
      for (auto& d : done) pool.Wait(d);
    }
    ::_exit(ran.load() == 200 ? 0 : 3);
  });
  if (rc == 5) GTEST_SKIP() << "1024 threads fit under the address-space limit here";
  EXPECT_EQ(rc, 0) << "child exit code (134: aborted; 2: no thread; 3: jobs lost)";
}

TEST(TaskPoolLimits, NoThreadAtAllIsAnExceptionNotAnAbort) {
#ifdef K3_TEST_UNDER_SANITIZER
  GTEST_SKIP() << "an address-space limit under a sanitizer runtime";
#endif
  int rc = k3test::InForkedChild([] {
    // Room for small allocations, not for one more 8 MiB stack.
    if (!k3test::LimitAddressSpaceGrowth(uint64_t{1} << 20)) ::_exit(4);
    try {
      TaskPool pool(4);
      // A pool without threads would never run a submitted job.
      ::_exit(pool.threads() == 0 ? 2 : 5);
    } catch (const std::system_error&) {
      ::_exit(0);
    }
  });
  if (rc == 5) GTEST_SKIP() << "a thread started under the address-space limit";
  EXPECT_EQ(rc, 0) << "child exit code (134: aborted; 2: a pool without threads)";
}

TEST(ThreadLimits, RunOnThreadsDoesEveryJobOnTheThreadsItGets) {
#ifdef K3_TEST_UNDER_SANITIZER
  GTEST_SKIP() << "an address-space limit under a sanitizer runtime";
#endif
  int rc = k3test::InForkedChild([] {
    if (!k3test::LimitAddressSpaceGrowth(uint64_t{64} << 20)) ::_exit(4);
    std::atomic<int> next{0}, done{0}, callers{0};
    RunOnThreads(1024, [&] {
      callers.fetch_add(1);
      while (next.fetch_add(1) < 5000) done.fetch_add(1);
    });
    if (callers.load() >= 1024) ::_exit(5);
    ::_exit(done.load() == 5000 ? 0 : 3);
  });
  if (rc == 5) GTEST_SKIP() << "1024 threads fit under the address-space limit here";
  EXPECT_EQ(rc, 0) << "child exit code (134: aborted; 3: jobs lost)";
}

// Under `ulimit -v` any allocation may throw std::bad_alloc, on any thread.
// Before, one thrown on a thread of RunOnThreads ended the process
// (std::terminate), and a job of a TaskPool that threw passed as done: the
// pack build's digests of that batch were never computed.
TEST(ThreadLimits, RunOnThreadsThrowsWhatAThreadThrewAfterJoiningAll) {
  for (unsigned thrower : {0u, 1u, 3u}) {  // the first, second and last call to arrive
    SCOPED_TRACE(thrower);
    std::atomic<unsigned> who{0};
    std::atomic<int> finished{0};
    bool caught = false;
    try {
      RunOnThreads(4, [&] {
        const unsigned me = who.fetch_add(1);
        if (me == thrower) throw std::bad_alloc();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // still running when the other throws
        finished.fetch_add(1);
      });
    } catch (const std::bad_alloc&) {
      caught = true;
    }
    EXPECT_TRUE(caught);
    EXPECT_EQ(who.load(), 4u);
    EXPECT_EQ(finished.load(), 3);  // every other call ran to its end before the throw reached here
  }
}

// A job that throws ends the other threads' loops: before, they ran every
// remaining job (for the digest-sidecar upgrade, read the rest of the pack)
// for a call that had already failed.
TEST(ThreadLimits, RunJobsOnThreadsStopsPullingJobsOnceOneThrew) {
  constexpr uint64_t kJobs = 40000;  // 100 us each: about 1 s on 4 threads if nothing stops them
  std::atomic<uint64_t> ran{0};
  EXPECT_THROW(RunJobsOnThreads(4, kJobs,
                                [&](uint64_t j) {
                                  if (j == 0) throw std::bad_alloc();
                                  std::this_thread::sleep_for(std::chrono::microseconds(100));
                                  ran.fetch_add(1);
                                }),
               std::bad_alloc);
  EXPECT_LT(ran.load(), kJobs / 10) << "the other threads kept pulling jobs";
}

TEST(ThreadLimits, RanOutOfMemorySaysWhetherTheBodyThrewBadAlloc) {
  int ran = 0;
  EXPECT_FALSE(RanOutOfMemory([&] { ++ran; }));
  EXPECT_TRUE(RanOutOfMemory([&] {
    ++ran;
    throw std::bad_alloc();
  }));
  EXPECT_EQ(ran, 2);
  // Other exceptions are not its business: they pass through.
  EXPECT_THROW(RanOutOfMemory([] { throw std::runtime_error("x"); }), std::runtime_error);
}

TEST(TaskPoolLimits, WaitThrowsWhatTheJobThrew) {
  TaskPool pool(2);
  std::future<void> ok = pool.Submit([] {});
  std::future<void> failed = pool.Submit([] { throw std::bad_alloc(); });
  EXPECT_NO_THROW(pool.Wait(ok));
  EXPECT_THROW(pool.Wait(failed), std::bad_alloc);
}

TEST(ThreadLimits, JoinedOnExitStopsAndJoinsWhenTheOwnerThrows) {
  std::atomic<bool> stop{false};
  std::atomic<int> left{0};
  try {
    std::vector<std::thread> threads;
    const JoinedOnExit joined(threads, [&] { stop.store(true); });
    for (int i = 0; i < 3; ++i) {
      threads.emplace_back([&] {
        while (!stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        left.fetch_add(1);
      });
    }
    throw std::bad_alloc();  // without the guard: std::terminate (a joinable std::thread destroyed)
  } catch (const std::bad_alloc&) {
  }
  EXPECT_TRUE(stop.load());
  EXPECT_EQ(left.load(), 3);
}

}  // namespace
}  // namespace k3pack
