// Exclusive advisory locks (flock) on an output's lock file or directory,
// and who holds one: what tells two k3pack processes on the same outputs
// apart, and what a refused or waiting operator is told.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "k3pack/error.h"

namespace k3pack {

// An exclusive, non-blocking flock on `path` (created if missing; a directory
// is locked as it is), held while any copy of the object lives. The same
// thread may take it again (the CLI holds a pack's lock from its first check
// of the outputs to its last write, and the builder takes it once more);
// another process, or another thread of this one, is refused with
// `another process is <what>: pid N (cmd...) holds the lock`, saying when that
// process is stopped (LockHolderOf): at once, or after the calling thread's
// LockWait (the CLI's `--wait`) has run out. Test seam: K3PACK_TEST_STOP_HOLDING_LOCK=1 makes the
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

// How long a LockFile::Acquire on this thread waits for a lock another
// process holds. Per thread, because the lock is taken deep inside a build or
// a merge on the caller's thread, and two Python threads may want different
// waits; a thread that never sets one refuses at once.
struct LockWait {
  double seconds = 0;  // 0: refuse at once; infinity: until the holder lets go
  // Told when the wait starts and when the holder changes or stops or goes
  // on: a waiting command must not look hung.
  std::function<void(const std::string&)> notify;
  // How the caller spells the wait, for the refusal's hint ("--wait SECONDS").
  std::string option;
  // Polled while waiting: an error ends the wait with it (a Python caller's
  // Ctrl-C, which no signal delivers to a thread sleeping without the GIL).
  std::function<Status()> interrupted;
};
const LockWait& CurrentLockWait();
// Sets this thread's wait until the object goes (the previous one returns).
class ScopedLockWait {
 public:
  explicit ScopedLockWait(LockWait wait);
  ~ScopedLockWait();
  ScopedLockWait(const ScopedLockWait&) = delete;
  ScopedLockWait& operator=(const ScopedLockWait&) = delete;

 private:
  LockWait previous_;
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
