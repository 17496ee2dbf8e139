// A store used in a process forked from the one that opened it. fork() copies
// the store's state but none of its threads: the I/O engine's workers (and
// io_uring's submitter and reaper, the checksum pool) exist only in the
// parent. In the child a read would never complete (an acquire hangs), and
// Close() or the destructor would join threads that are not there (a hang,
// or SIGSEGV in a Python child's exit). So the child may look at the store
// (snapshot, info) and close it, which then only gives up its descriptors
// and leaves the thread handles alone; anything that reads or releases is
// refused with an error that says what to do.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <mutex>

#include "k3pack/error.h"

namespace k3pack::store {

// True in a process forked from `opened_pid` (the pid that opened the store).
inline bool ForkedFrom(pid_t opened_pid) { return ::getpid() != opened_pid; }

// OK in the opening process; else a RuntimeError naming both processes.
Status CheckOpenedHere(pid_t opened_pid);

// The store's mutex for what a forked child may still do (snapshot, close).
// A parent thread that held the mutex at the fork does not exist in the
// child and never lets go: waiting for it hung the child's close(). No other
// thread of the child is inside the store (every reading call is refused
// there first), so the child goes on without the mutex when it is held.
class ForkSafeLock {
 public:
  ForkSafeLock(std::mutex& mu, pid_t opened_pid) : lock_(mu, std::defer_lock) {
    if (ForkedFrom(opened_pid)) {
      (void)lock_.try_lock();
    } else {
      lock_.lock();
    }
  }

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace k3pack::store
