// Thread pools when the process cannot start all the threads they ask for (a
// container's pids limit or an address-space limit): TaskPool (the pack
// build's hashing beside its copy, the store's checksum checks beside
// io_uring's reads) and RunOnThreads (sweeps, the resume check).
// std::thread's exception used to leave with other
// threads still joinable, which aborts the process (std::terminate).
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <system_error>
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

}  // namespace
}  // namespace k3pack
