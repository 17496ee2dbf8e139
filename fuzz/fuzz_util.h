// Shared helpers for the libFuzzer targets whose API reads files (shard-set
// discovery): a per-process scratch directory, on tmpfs where there is one,
// because these targets are bound by file creation and the disk adds nothing
// the reader's checks could catch.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace k3fuzz {

inline std::filesystem::path ScratchRoot() {
  namespace fs = std::filesystem;
  if (const char* t = std::getenv("TMPDIR"); t && *t) return t;
  std::error_code ec;
  if (fs::is_directory("/dev/shm", ec) && ::access("/dev/shm", W_OK) == 0) return "/dev/shm";
  return fs::temp_directory_path();
}

// libFuzzer ends with _Exit, so no process removes its own directory; tmpfs
// is memory, so each new one sweeps away those of processes that are gone.
inline void RemoveDeadScratchDirs(const std::filesystem::path& root) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("k3pack-fuzz-", 0) != 0) continue;
    const long pid = std::strtol(name.c_str() + 12, nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) std::filesystem::remove_all(e.path(), ec);
  }
}

inline const std::filesystem::path& ScratchDir() {
  static const std::filesystem::path dir = [] {
    RemoveDeadScratchDirs(ScratchRoot());
    auto p = ScratchRoot() / ("k3pack-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(p);
    return p;
  }();
  return dir;
}

// Writes with plain syscalls: the per-input cost matters at millions of runs.
inline void WriteFile(const std::filesystem::path& p, const char* data, size_t size) {
  const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) __builtin_trap();  // scratch space is the harness's, not the input's, failure
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n <= 0) __builtin_trap();
    data += n;
    size -= static_cast<size_t>(n);
  }
  ::close(fd);
}

}  // namespace k3fuzz
