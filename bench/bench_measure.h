// Measuring helpers shared by the benchmarks: the median of paired rounds,
// evicting a file from the page cache for a cold run, and the load average
// printed beside every figure (a ratio means little without it).
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

namespace k3pack::bench {

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// fdatasync first: dirty pages (a file just written) cannot be dropped.
inline void EvictFromPageCache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// The three averages of /proc/loadavg ("?" where it cannot be read).
inline std::string LoadAverage() {
  std::string a, b, c;
  std::ifstream in("/proc/loadavg");
  if (!(in >> a >> b >> c)) return "?";
  return a + " " + b + " " + c;
}

}  // namespace k3pack::bench
