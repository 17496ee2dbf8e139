// SHA-256 (OpenSSL) with lowercase-hex output, as SGLang's manifests record digests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "k3pack/error.h"

namespace k3pack {

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(Sha256&&) noexcept;
  Sha256& operator=(Sha256&&) noexcept;

  void Update(const void* data, size_t n);
  void Update(std::string_view s) { Update(s.data(), s.size()); }
  std::string HexDigest();  // finalizes; the object must not be updated after

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

std::string Sha256Hex(const void* data, size_t n);
inline std::string Sha256Hex(std::string_view s) { return Sha256Hex(s.data(), s.size()); }

// Digest of bytes [offset, offset+length) of a file, read with pread.
// A short read reports SGLang's text `short read at offset {o}; {r} bytes remain`.
// `between_chunks`, when set, runs before each 8 MiB chunk: a whole shard
// takes minutes, and a caller that must answer Ctrl-C or a close() stops the
// hashing by returning an error, which is returned as it is. `hashed`, when
// set, is told the bytes of each chunk once they are hashed (progress).
// "cannot allocate N bytes to hash PATH" (bytes 0: the size is not known),
// with the address-space hint: what a hash that ran out of memory returns.
Error HashOutOfMemory(const std::string& path, uint64_t bytes);
Result<std::string> Sha256FileRange(const std::string& path, uint64_t offset, uint64_t length,
                                    const std::function<Status()>& between_chunks = nullptr,
                                    const std::function<void(uint64_t)>& hashed = nullptr);
Result<std::string> Sha256File(const std::string& path, const std::function<Status()>& between_chunks = nullptr,
                               const std::function<void(uint64_t)>& hashed = nullptr);

}  // namespace k3pack
