// A check that the calling thread's bounded waits poll: a Python caller's
// Ctrl-C, which no signal delivers to a thread waiting without the GIL
// (the store's wait for room in its cache, up to 10 s, took the interrupt
// only once it was over). Native callers set none, and wait as before.
#pragma once

#include <chrono>
#include <functional>
#include <mutex>

#include "k3pack/error.h"

namespace k3pack {

// Sets this thread's check until the object goes (the previous one returns).
class ScopedInterruptCheck {
 public:
  explicit ScopedInterruptCheck(std::function<Status()> check);
  ~ScopedInterruptCheck();
  ScopedInterruptCheck(const ScopedInterruptCheck&) = delete;
  ScopedInterruptCheck& operator=(const ScopedInterruptCheck&) = delete;

 private:
  std::function<Status()> previous_;
};

// Whether this thread has a check set (a waiter then wakes often to poll it).
bool HasInterruptCheck();
// Runs this thread's check: OK when none is set. Call it holding no lock the
// check's own machinery may need (a Python check takes the GIL).
Status PollInterruptCheck();

// For a condition-variable wait until `deadline`: when this thread has a
// check, the wait wakes within 100 ms to poll it.
std::chrono::steady_clock::time_point WakeForInterrupt(std::chrono::steady_clock::time_point deadline);
// PollInterruptCheck with `lock` released around it (then taken again).
Status PollInterruptUnlocked(std::unique_lock<std::mutex>& lock);

}  // namespace k3pack
