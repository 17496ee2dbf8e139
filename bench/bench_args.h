// Command-line conventions shared by the benchmarks: `-h`/`--help` prints the
// usage and exits 0; an argument a benchmark does not understand prints the
// usage to stderr and exits 2, rather than being taken for a count or a
// directory (a stray `--help` once became a work directory of that name).
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace k3pack::bench {

[[noreturn]] inline void ExitUsage(const char* usage) {
  std::fprintf(stderr, "usage: %s\n", usage);
  std::exit(2);
}

inline void ExitOnHelp(int argc, char** argv, const char* usage) {
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "-h") || !std::strcmp(argv[i], "--help")) {
      std::printf("usage: %s\n", usage);
      std::exit(0);
    }
  }
}

// A whole positive decimal number, or the usage.
inline uint64_t PositiveArg(const char* text, const char* usage) {
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (end == text || *end != '\0' || v == 0 || text[0] == '-') ExitUsage(usage);
  return static_cast<uint64_t>(v);
}

// A positional argument must not look like an option.
inline std::string PositionalArg(const char* text, const char* usage) {
  if (text[0] == '-') ExitUsage(usage);
  return text;
}

}  // namespace k3pack::bench
