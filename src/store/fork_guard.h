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

#include "k3pack/error.h"

namespace k3pack::store {

// True in a process forked from `opened_pid` (the pid that opened the store).
inline bool ForkedFrom(pid_t opened_pid) { return ::getpid() != opened_pid; }

// OK in the opening process; else a RuntimeError naming both processes.
Status CheckOpenedHere(pid_t opened_pid);

}  // namespace k3pack::store
