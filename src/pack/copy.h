// Hole-aware copying and hashing of byte ranges (one payload at a time).
//
// Synthetic and partially-downloaded checkpoints are often sparse. Reading a
// hole costs page-cache work and writing it back costs disk, so ranges are
// split with SEEK_DATA/SEEK_HOLE: data is read, hashed and written; holes are
// left unwritten in the destination (which is created sparse) and hashed as
// zeros without reading. A payload that is entirely a hole takes its digest
// from a per-length cache, so a ~1 TB all-hole pack hashes in seconds.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "k3pack/error.h"
#include "util/file.h"  // Segment, MapRange

namespace k3pack::pack {

// SHA-256 of `n` zero bytes (memoized by n).
std::array<uint8_t, 32> ZeroSha256(uint64_t n);
// CRC32C of `n` zero bytes (memoized by n).
uint32_t ZeroCrc32c(uint64_t n);

// A reusable, page-aligned I/O buffer.
class IoBuffer {
 public:
  // An out-of-memory error naming the size when the memory cannot be had: a
  // null buffer would surface later, far from here, as EFAULT from a read.
  static Result<IoBuffer> Allocate(size_t bytes);
  ~IoBuffer();
  IoBuffer(IoBuffer&& other) noexcept;
  IoBuffer& operator=(IoBuffer&& other) noexcept;
  IoBuffer(const IoBuffer&) = delete;
  IoBuffer& operator=(const IoBuffer&) = delete;
  uint8_t* data() { return data_; }
  size_t size() const { return size_; }

 private:
  IoBuffer(uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Bytes the builder may still write before its writes fail with ENOSPC, as if
// the filesystem had filled up. Test seam: K3PACK_TEST_ENOSPC_AFTER_BYTES=N
// (read once per build by FromEnv) limits the copy phase's writes to the
// partial pack and the digest journal to N bytes in all; unset = no limit.
struct WriteBudget {
  std::optional<uint64_t> limit;
  std::atomic<uint64_t> used{0};
  static std::optional<uint64_t> FromEnv();
};

// One output file of the builder (the partial pack or the digest journal).
// Write errors name the file, so a full disk reads
// `cannot write <pack>.partial at offset N: No space left on device`.
class OutputFile {
 public:
  // direct_fd: the same file opened with O_DIRECT, or -1. Writes whose
  // address, length and offset are all kDirectAlign-aligned go through it
  // (no copy into the page cache, no writeback to wait for); any other
  // write, and any the device refuses, goes through `fd`.
  OutputFile(int fd, std::string path, WriteBudget* budget = nullptr, int direct_fd = -1)
      : fd_(fd), direct_fd_(direct_fd), path_(std::move(path)), budget_(budget) {}
  // `counted`: the bytes of the write the budget charges (the payload bytes
  // of a staged run that also carries zero fill); n when unset.
  Status Write(const void* data, size_t n, uint64_t offset, std::optional<uint64_t> counted = std::nullopt) const;
  int fd() const { return fd_; }
  bool direct() const { return direct_fd_ >= 0; }
  const std::string& path() const { return path_; }

 private:
  int fd_, direct_fd_;
  std::string path_;
  WriteBudget* budget_;
};

struct CopyStats {
  uint64_t data_bytes = 0;
  uint64_t hole_bytes = 0;
  uint64_t direct_bytes = 0;  // data bytes read with O_DIRECT (ReadSource's direct_src)
  // Thread-time per phase of the builder's copy (seconds), so a build can say where
  // its time went (BuildResult::phases).
  double read_s = 0, write_s = 0, hash_s = 0;
};

// Copies src[src_off, +n) to dst[dst_off, +n), keeping source holes as holes
// in dst (dst must read as zeros there already), and returns the SHA-256 of
// the bytes. A short source read fails with SGLang's EOFError text
// `short GGUF read at offset {o}; {r} bytes remain`.
Result<std::array<uint8_t, 32>> CopyAndHash(int src, uint64_t src_off, int dst, uint64_t dst_off, uint64_t n,
                                            IoBuffer& buf, CopyStats* stats);

// O_DIRECT alignment ReadSource assumes (the logical block size of every
// common device divides it), and the extra buffer it needs for direct reads.
inline constexpr uint64_t kDirectAlign = 4096;
inline constexpr uint64_t kDirectSlack = 3 * kDirectAlign;

// The bytes of src[src_off, +len) as ReadSource leaves them in a buffer:
// bytes[x] = src[src_off + x], holes zeroed; null when the whole range is a
// hole (nothing read). segs: the range's data/hole segments.
struct SourceRange {
  const uint8_t* bytes = nullptr;
  std::vector<Segment> segs;
};

// Reads src[src_off, +len) into buf (one read per data segment, holes zeroed,
// through `direct_src` with O_DIRECT when buf has kDirectSlack to spare: the
// bytes go from the disk straight into buf, with no page-cache pages to
// allocate and evict, which is CPU the hashing needs on a small machine; any
// range O_DIRECT cannot read is read through `src`). A range past `src_size`
// is SGLang's short-GGUF-read EOFError.
Result<SourceRange> ReadSource(int src, uint64_t src_size, uint64_t src_off, uint64_t len, IoBuffer& buf,
                               CopyStats* stats, int direct_src = -1);

// SHA-256 and CRC32C of one payload.
void HashSlice(const uint8_t* p, uint64_t n, std::array<uint8_t, 32>* sha, uint32_t* crc);

// SHA-256 of fd[off, +n), hole-aware, and with `crc` its CRC32C too. Short
// read: `short read at offset {o}; {r} bytes remain`.
Result<std::array<uint8_t, 32>> HashRange(int fd, uint64_t off, uint64_t n, IoBuffer& buf, CopyStats* stats,
                                          uint32_t* crc = nullptr);

// Bytes of an open file from `offset`, named for errors.
struct FileRange {
  int fd = -1;
  uint64_t offset = 0;
  std::string_view path;
};
// Byte compare a with b over n bytes; false on a mismatch. A file that ends
// first is not a mismatch but an error (kEOF) naming it: `short read of
// {path} at offset {o}; {r} bytes remain`.
Result<bool> RangesEqual(const FileRange& a, const FileRange& b, uint64_t n, IoBuffer& buf_a, IoBuffer& buf_b);

// Writes zeros over (or punches a hole into) [off, +n) of fd.
Status ZeroRange(int fd, uint64_t off, uint64_t n);

}  // namespace k3pack::pack
