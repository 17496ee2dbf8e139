// Shared helpers for the libFuzzer targets: a per-process scratch directory
// for targets whose API reads files (shard discovery, traces).
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace k3fuzz {

inline const std::filesystem::path& ScratchDir() {
  static const std::filesystem::path dir = [] {
    auto p = std::filesystem::temp_directory_path() / ("k3pack-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(p);
    return p;
  }();
  return dir;
}

inline void WriteFile(const std::filesystem::path& p, const uint8_t* data, size_t size) {
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data),
                                                             static_cast<std::streamsize>(size));
}

}  // namespace k3fuzz
