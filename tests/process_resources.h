// What a process holds, read from /proc/self: open descriptors, threads,
// mappings and resident memory. The soak tests take it before and after
// running a long-lived object many times in one process: an object that
// keeps a descriptor, a thread or a mapping per use shows as growth that a
// leak check at exit (ASan) never sees while the object is alive.
#pragma once

#include <dirent.h>
#include <malloc.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <ostream>
#include <string>

namespace k3pack::testing_resources {

inline int CountDirEntries(const char* dir) {
  int n = 0;
  if (DIR* d = ::opendir(dir)) {
    while (dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') ++n;
    ::closedir(d);
  }
  return n;
}

// Call before the process starts any thread. glibc gives threads malloc
// arenas of their own (up to 8 per core), each a mapping that stays, and keeps
// freed memory in them: growth that depends on the core count and on which
// thread ran first, not on what an object keeps. One arena, trimmed before
// each count (Now()), leaves only what is really held.
inline void UseOneMallocArena() { ::mallopt(M_ARENA_MAX, 1); }

struct ProcessResources {
  int fds = 0, threads = 0, maps = 0;
  int64_t rss_kib = 0;

  static ProcessResources Now() {
    ::malloc_trim(0);
    ProcessResources r;
    // The directory stream of /proc/self/fd is itself one entry: not counted.
    r.fds = CountDirEntries("/proc/self/fd") - 1;
    r.threads = CountDirEntries("/proc/self/task");
    std::ifstream maps("/proc/self/maps");
    for (std::string line; std::getline(maps, line);) ++r.maps;
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);)
      if (line.rfind("VmRSS:", 0) == 0) r.rss_kib = std::stoll(line.substr(6));
    return r;
  }
};

inline std::ostream& operator<<(std::ostream& os, const ProcessResources& r) {
  return os << "{fds " << r.fds << ", threads " << r.threads << ", maps " << r.maps << ", rss " << r.rss_kib
            << " KiB}";
}

// Whether `after` came back to `before`: descriptors and threads exactly,
// mappings and resident memory within a fixed slack (malloc keeps freed arenas
// and pages for reuse; a leak per use of hundreds of uses exceeds it).
// Under AddressSanitizer freed memory waits in its quarantine (256 MiB by
// default) in mappings of its own, so only descriptors and threads count.
inline bool CameBack(const ProcessResources& before, const ProcessResources& after, int map_slack = 4,
                     int64_t rss_slack_kib = 8 << 10) {
  const bool held = after.fds <= before.fds && after.threads <= before.threads;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  (void)map_slack, (void)rss_slack_kib;
  return held;
#else
  return held && after.maps <= before.maps + map_slack && after.rss_kib <= before.rss_kib + rss_slack_kib;
#endif
}

// What the process holds once it has settled back to `before`, or after 5 s
// of trying. A joined thread's /proc/self/task entry can outlive the join by
// a moment (the kernel wakes the joiner before it reaps the thread), and a
// loaded machine stretches that moment: one count right after the join read
// a thread that was gone.
inline ProcessResources SettledAfter(const ProcessResources& before, int map_slack = 4,
                                     int64_t rss_slack_kib = 8 << 10) {
  ProcessResources r = ProcessResources::Now();
  for (int i = 0; i < 50 && !CameBack(before, r, map_slack, rss_slack_kib); ++i) {
    ::usleep(100 * 1000);
    r = ProcessResources::Now();
  }
  return r;
}

}  // namespace k3pack::testing_resources
