// Byte-level builder for crafting GGUF images (valid and deliberately broken).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "../scratch_dir.h"
#include "k3pack/gguf.h"
#include "util/file.h"

namespace k3test {

// Parses a crafted image in memory, as the reader parses a mapped file.
inline k3pack::Result<std::shared_ptr<const k3pack::gguf::GgufFile>> ParseBytes(const std::string& b) {
  return k3pack::gguf::GgufFile::Parse(k3pack::MappedFile::FromBytes("crafted.gguf", b));
}

struct Bytes {
  std::string b;
  template <typename T>
  Bytes& put(T v) {
    b.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  Bytes& str(const std::string& s) {
    put<uint64_t>(s.size());
    b += s;
    return *this;
  }
  Bytes& raw(const std::string& s) {
    b += s;
    return *this;
  }
  Bytes& pad(size_t align) {
    while (b.size() % align) b.push_back('\0');
    return *this;
  }
};

// Header with version, n_tensors, n_kv.
inline Bytes Header(uint32_t version, int64_t n_tensors, int64_t n_kv) {
  Bytes x;
  x.raw("GGUF").put<uint32_t>(version).put<int64_t>(n_tensors).put<int64_t>(n_kv);
  return x;
}

inline std::filesystem::path TempDir(const std::string& tag) {
  auto p = std::filesystem::path(k3pack::testing_scratch::ProcessScratchDir("k3pack-test")) /
           (tag + "-" + std::to_string(rand()));
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p;
}

}  // namespace k3test
