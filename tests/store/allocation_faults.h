// Failing allocations on purpose, for the out-of-memory tests of test_store:
// store_out_of_memory_test.cpp replaces operator new for the whole binary
// (not under the sanitizers, whose runtimes own it); these switches decide
// which allocations it fails. Off, every allocation is served as usual.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

#include "../forked_child.h"  // K3_TEST_UNDER_SANITIZER

namespace k3pack::store::testing {

#ifndef K3_TEST_UNDER_SANITIZER
inline std::atomic<bool> g_starved{false};
inline std::atomic<std::thread::id> g_fed_thread{};
// Counts down the allocations of one thread; the one that reaches 0 fails.
inline thread_local int64_t t_fail_in = 0;

// Whether the replaced operator new fails this allocation.
inline bool AllocationFails() {
  if (t_fail_in > 0 && --t_fail_in == 0) return true;
  return g_starved.load(std::memory_order_relaxed) && std::this_thread::get_id() != g_fed_thread.load();
}

// While alive, every thread but the one that made it is out of memory.
class StarveOtherThreads {
 public:
  StarveOtherThreads() {
    g_fed_thread.store(std::this_thread::get_id());
    g_starved.store(true);
  }
  ~StarveOtherThreads() { g_starved.store(false); }
};

// While alive, the `n`th allocation of the thread that made it fails (and
// only that one): a sweep over n fails each allocation of a call in turn.
class FailNthAllocation {
 public:
  explicit FailNthAllocation(int64_t n) { t_fail_in = n; }
  ~FailNthAllocation() { t_fail_in = 0; }
  bool fired() const { return t_fail_in == 0; }
};
#endif

}  // namespace k3pack::store::testing

#ifdef K3_TEST_UNDER_SANITIZER
#define SKIP_UNDER_SANITIZER() GTEST_SKIP() << "replaces operator new, which the sanitizer runtimes own"
#else
#define SKIP_UNDER_SANITIZER()
#endif
