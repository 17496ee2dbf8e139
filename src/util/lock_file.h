// Exclusive advisory locks (flock) on an output's lock file or directory,
// and who holds one: what tells two k3pack processes on the same outputs
// apart, and what a refused or waiting operator is told.
#pragma once

#include <memory>
#include <string>

#include "k3pack/error.h"

namespace k3pack {

// An exclusive, non-blocking flock on `path` (created if missing; a directory
// is locked as it is), held while any copy of the object lives. The same
// thread may take it again (the CLI holds a pack's lock from its first check
// of the outputs to its last write, and the builder takes it once more);
// another process, or another thread of this one, is refused at once with
// `another process is <what>: pid N (cmd...) holds the lock`, saying when that
// process is stopped (LockHolderOf). Test seam: K3PACK_TEST_STOP_HOLDING_LOCK=1 makes the
// process stop itself (SIGSTOP) right after taking a lock it did not hold.
class LockFile {
 public:
  // `what`: the work the lock guards, for the refusal ("building or
  // repairing the Expert Pack P").
  static Result<LockFile> Acquire(const std::string& path, const std::string& what);

  struct Held;  // the locked descriptor and the thread that took it

 private:
  std::shared_ptr<Held> held_;
};

// The process holding a flock, as /proc/locks and /proc/PID tell it.
struct LockHolder {
  long pid = 0;  // 0: nobody holds it, or it cannot be told
  std::string command;
  bool stopped = false;  // by a signal (Ctrl-Z, SIGSTOP) or a tracer: it keeps the lock but makes no progress
  // "pid N (command)", with ", which is stopped," when it is.
  std::string Text() const;
  // What the refused operator can do.
  std::string Hint() const;
};

// Who holds a flock on `path` now. Reads only: it never takes the lock, so a
// probe never makes a starting build fail.
LockHolder LockHolderOf(const std::string& path);

}  // namespace k3pack
