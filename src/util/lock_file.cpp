#include "util/lock_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

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

Result<LockFile> LockFile::Acquire(const std::string& path, const std::string& what) {
  struct stat pst;
  const bool directory = ::stat(path.c_str(), &pst) == 0 && S_ISDIR(pst.st_mode);
  const int fd = directory ? ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)
                           : ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, kNewFileMode);
  if (fd < 0) return Error::FromErrno("cannot open lock file " + path, errno);
  UniqueFd owned(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) return Error::FromErrno("cannot stat lock file " + path, errno);
  const Key key{st.st_dev, st.st_ino};
  std::lock_guard<std::mutex> guard(RegistryMutex());
  LockFile lock;
  if (auto held = Registry()[key].lock()) {
    if (held->owner == std::this_thread::get_id()) {
      lock.held_ = std::move(held);
      return lock;
    }
    return Error("another thread of this process is " + what + " (it holds " + path + ")", ErrorKind::kOS,
                 EWOULDBLOCK)
        .WithHint("wait for that call to return");
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) return Error::FromErrno("cannot lock " + path, errno);
    const LockHolder holder = LockHolderOf(path);
    return Error("another process is " + what + (holder.pid == 0 ? "" : ": " + holder.Text() + " holds the lock"),
                 ErrorKind::kOS, EWOULDBLOCK)
        .WithHint(holder.Hint());
  }
  lock.held_ = std::make_shared<Held>(Held{std::move(owned), std::this_thread::get_id()});
  Registry()[key] = lock.held_;
  const char* seam = std::getenv("K3PACK_TEST_STOP_HOLDING_LOCK");
  if (seam != nullptr && std::string(seam) == "1") ::raise(SIGSTOP);
  return lock;
}

}  // namespace k3pack
