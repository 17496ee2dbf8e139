#include "util/lock_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>

#include "util/file.h"

namespace k3pack {

struct LockFile::Held {
  UniqueFd fd;
  std::thread::id owner;
};

namespace {

using Key = std::pair<dev_t, ino_t>;

// The locks this process holds, by file: flock conflicts between two open
// file descriptions even within one process, so a second Acquire by the
// holding thread shares the first instead of refusing itself.
std::mutex& RegistryMutex() {
  static std::mutex m;
  return m;
}
std::map<Key, std::weak_ptr<LockFile::Held>>& Registry() {
  static auto* r = new std::map<Key, std::weak_ptr<LockFile::Held>>;
  return *r;
}

std::string CommandLineOf(long pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  while (!raw.empty() && raw.back() == '\0') raw.pop_back();
  for (char& c : raw) {
    if (c == '\0') c = ' ';
  }
  constexpr size_t kMax = 160;
  if (raw.size() > kMax) raw = raw.substr(0, kMax) + "...";
  return raw;
}

// 'T' (stopped by a signal) or 't' (by a tracer): it keeps its locks but
// makes no progress, which is what the refused operator needs to know.
bool IsStopped(long pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t close = s.rfind(')');
  if (close == std::string::npos || close + 2 >= s.size()) return false;
  return s[close + 2] == 'T' || s[close + 2] == 't';
}

}  // namespace

LockHolder LockHolderOf(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return {};
  char dev[64];
  std::snprintf(dev, sizeof dev, "%02x:%02x:%llu", major(st.st_dev), minor(st.st_dev),
                static_cast<unsigned long long>(st.st_ino));
  std::ifstream locks("/proc/locks");
  for (std::string line; std::getline(locks, line);) {
    // "1: FLOCK  ADVISORY  WRITE 1234 fe:00:5678 0 EOF"; waiters carry "->".
    std::istringstream in(line);
    std::string id, kind, mode, rw, file;
    long pid = 0;
    if (!(in >> id >> kind) || kind != "FLOCK") continue;
    if (!(in >> mode >> rw >> pid >> file) || file != dev || pid <= 0) continue;
    return {pid, CommandLineOf(pid), IsStopped(pid)};
  }
  return {};
}

std::string LockHolder::Text() const {
  std::string text = "pid " + std::to_string(pid);
  if (!command.empty()) text += " (" + command + ")";
  if (stopped) text += ", which is stopped,";
  return text;
}

std::string LockHolder::Hint() const {
  if (stopped) {
    return "that process is stopped (SIGSTOP or Ctrl-Z) and keeps the lock: `kill -CONT " + std::to_string(pid) +
           "` lets it finish; or end it, and the lock is released when it exits";
  }
  return "wait for it to finish; the lock is released automatically when that process exits";
}

namespace {

thread_local LockWait current_wait;

std::string Seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof text, s == std::floor(s) ? "%.0f s" : "%.1f s", s);
  return text;
}

// The refusal, after `waited` seconds of this thread's wait.
Error Refusal(const std::string& path, const std::string& what, const LockHolder& holder, double waited) {
  const LockWait& wait = CurrentLockWait();
  std::string message = "another process is " + what + (holder.pid == 0 ? "" : ": " + holder.Text() + " holds the lock");
  if (wait.seconds > 0) message += " (still after waiting " + Seconds(waited) + " for " + path + ")";
  std::string hint = holder.Hint();
  if (wait.seconds == 0 && !wait.option.empty() && !holder.stopped) {
    hint += "; or rerun with `" + wait.option + "` to wait for it";
  }
  return Error(message, ErrorKind::kOS, EWOULDBLOCK).WithHint(hint);
}

}  // namespace

const LockWait& CurrentLockWait() { return current_wait; }

ScopedLockWait::ScopedLockWait(LockWait wait) : previous_(std::move(current_wait)) { current_wait = std::move(wait); }

ScopedLockWait::~ScopedLockWait() { current_wait = std::move(previous_); }

Result<LockFile> LockFile::Acquire(const std::string& path, const std::string& what) {
  struct stat pst;
  const bool exists = ::stat(path.c_str(), &pst) == 0;
  const bool directory = exists && S_ISDIR(pst.st_mode);
  int fd = directory ? ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)
                     : ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, kNewFileMode);
  // The lock file is never written and flock needs no write access: one that
  // another user's run left (kept between runs) is locked read-only.
  if (fd < 0 && errno == EACCES && exists && !directory) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    Error e = Error::FromErrno("cannot open lock file " + path, err);
    if (err != EACCES || !exists) return e;
    return e.WithHint("it belongs to uid " + std::to_string(pst.st_uid) +
                      ", who ran k3pack here before; it must be readable for you to take the lock: ask its owner to "
                      "chmod a+r it, or pass another output path");
  }
  UniqueFd owned(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) return Error::FromErrno("cannot stat lock file " + path, errno);
  const Key key{st.st_dev, st.st_ino};
  const LockWait& wait = CurrentLockWait();
  const auto start = std::chrono::steady_clock::now();
  LockHolder told;
  bool waiting = false;
  for (;;) {
    {
      std::lock_guard<std::mutex> guard(RegistryMutex());
      if (auto held = Registry()[key].lock()) {
        if (held->owner != std::this_thread::get_id()) {
          return Error("another thread of this process is " + what + " (it holds " + path + ")", ErrorKind::kOS,
                       EWOULDBLOCK)
              .WithHint("wait for that call to return");
        }
        LockFile lock;
        lock.held_ = std::move(held);
        return lock;
      }
      if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
        LockFile lock;
        lock.held_ = std::make_shared<Held>(Held{std::move(owned), std::this_thread::get_id()});
        Registry()[key] = lock.held_;
        if (waiting && wait.notify) wait.notify("took the lock on " + path + " after " + Seconds(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()));
        // Test seam: stops at the first lock the process takes (its output's;
        // a later one, the manifest directory's at the end, goes on).
        static std::atomic<bool> seam_fired{false};
        const char* seam = std::getenv("K3PACK_TEST_STOP_HOLDING_LOCK");
        if (seam != nullptr && std::string(seam) == "1" && !seam_fired.exchange(true)) ::raise(SIGSTOP);
        return lock;
      }
      if (errno != EWOULDBLOCK) return Error::FromErrno("cannot lock " + path, errno);
    }
    // The registry is not held while waiting: other locks of this process go on.
    const LockHolder holder = LockHolderOf(path);
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // A wait asked for is said before it is refused: a process given no CPU
    // for the whole wait refused without a word of having waited.
    if (waited >= wait.seconds && (waiting || wait.seconds <= 0)) return Refusal(path, what, holder, waited);
    if (!waiting || (holder.pid != 0 && (holder.pid != told.pid || holder.stopped != told.stopped))) {
      if (wait.notify) {
        std::string line = "waiting for " + path + ": another process is " + what;
        if (holder.pid != 0) line += ": " + holder.Text() + " holds the lock";
        line += std::isinf(wait.seconds) ? " (until it lets go)" : " (for up to " + Seconds(wait.seconds) + ")";
        if (holder.stopped) line += "; " + holder.Hint();
        wait.notify(line);
      }
      waiting = true;
      told = holder;
    }
    if (wait.interrupted) K3_RETURN_IF_ERROR(wait.interrupted());
    // Short enough that a build queued behind another starts within a blink
    // of the lock's release; long enough to cost nothing.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace k3pack
