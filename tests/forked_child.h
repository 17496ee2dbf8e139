// Tests of what happens when the process runs out of something (threads,
// address space) run in a forked child, so the limit and any abort stay
// there.
#pragma once

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

// Sanitizer runtimes reserve terabytes of shadow memory and allocate their
// own per-thread state: under an address-space limit they fail before
// pthread_create does, which is not what such tests are about.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define K3_TEST_UNDER_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define K3_TEST_UNDER_SANITIZER 1
#endif
#endif

namespace k3test {

// A process id that no process has now (a child that has exited and been
// reaped): what a writer killed long ago left in its temp files' names.
inline pid_t DeadPid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int st = 0;
  ::waitpid(pid, &st, 0);
  return pid;
}

// Runs `child` in a forked process and returns its exit status (-1: it did
// not end, the fault; it is killed). The child must end with _exit().
template <typename F>
int InForkedChild(F child) {
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    child();
    ::_exit(0);
  }
  for (int i = 0; i < 60 * 100; ++i) {  // a guard against the hang, not a timing check
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  return -1;
}

// In a child: lets this process's address space grow by `headroom` bytes
// only (a thread's stack is 8 MiB of it). False when it cannot be set.
inline bool LimitAddressSpaceGrowth(uint64_t headroom) {
  uint64_t vm_kib = 0;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmSize:", 0) == 0) vm_kib = std::stoull(line.substr(7));
  if (vm_kib == 0) return false;
  const rlim_t limit = (vm_kib << 10) + headroom;
  struct rlimit rl = {limit, limit};
  return ::setrlimit(RLIMIT_AS, &rl) == 0;
}

}  // namespace k3test
