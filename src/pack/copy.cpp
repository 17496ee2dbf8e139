#include "pack/copy.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "util/crc32c.h"
#include "util/process_limits.h"
#include "util/file.h"

namespace k3pack::pack {
namespace {

constexpr size_t kZeroChunk = 1 << 20;

const uint8_t* ZeroBlock() {
  static const auto* zeros = static_cast<const uint8_t*>(std::calloc(1, kZeroChunk));
  return zeros;
}

// Minimal raw-digest SHA-256 over OpenSSL's EVP interface.
class Hasher {
 public:
  Hasher() : ctx_(EVP_MD_CTX_new()) { EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr); }
  ~Hasher() { EVP_MD_CTX_free(ctx_); }
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;
  void Update(const void* p, size_t n) { EVP_DigestUpdate(ctx_, p, n); }
  std::array<uint8_t, 32> Final() {
    std::array<uint8_t, 32> out{};
    unsigned int len = 0;
    EVP_DigestFinal_ex(ctx_, out.data(), &len);
    return out;
  }

 private:
  EVP_MD_CTX* ctx_;
};

void UpdateZeros(Hasher* ctx, uint64_t n) {
  while (n > 0) {
    size_t k = n < kZeroChunk ? static_cast<size_t>(n) : kZeroChunk;
    ctx->Update(ZeroBlock(), k);
    n -= k;
  }
}

// Adds the seconds since it was made to *acc on destruction (phase timers).
class PhaseTimer {
 public:
  explicit PhaseTimer(double* acc) : acc_(acc), t0_(std::chrono::steady_clock::now()) {}
  ~PhaseTimer() {
    if (acc_) *acc_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

 private:
  double* acc_;
  std::chrono::steady_clock::time_point t0_;
};

// Reads src[off, +n) with O_DIRECT into dst (dst[x - base] = src[x]; the
// block-aligned range around it is read, so dst must have room for up to a
// block on either side and be aligned like the file offsets). False when the
// device refuses (EINVAL on odd alignment, ...) or the read comes up short:
// the caller then reads the range through the page cache, which also
// produces the exact short-read error.
bool ReadDirect(int fd, uint64_t off, uint64_t n, uint64_t base, uint8_t* dst) {
  const uint64_t a = off & ~(kDirectAlign - 1);
  const uint64_t z = (off + n + kDirectAlign - 1) & ~(kDirectAlign - 1);
  uint8_t* p = dst - static_cast<ptrdiff_t>(base - a);  // a >= base rounded down
  uint64_t done = 0;
  while (a + done < off + n) {
    const ssize_t r = ::pread(fd, p + done, z - a - done, static_cast<off_t>(a + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    done += static_cast<uint64_t>(r);
    if (done % kDirectAlign != 0 && a + done < off + n) return false;  // short mid-file: next offset unaligned
  }
  return true;
}

Error ShortRead(const char* what, uint64_t offset, uint64_t remaining) {
  return Error(std::string(what) + " at offset " + std::to_string(offset) + "; " + std::to_string(remaining) +
                   " bytes remain",
               ErrorKind::kEOF);
}

}  // namespace

std::optional<uint64_t> WriteBudget::FromEnv() {
  const char* v = std::getenv("K3PACK_TEST_ENOSPC_AFTER_BYTES");
  if (!v || !*v) return std::nullopt;
  char* end = nullptr;
  const unsigned long long x = std::strtoull(v, &end, 10);
  if (end == v || *end != '\0') return std::nullopt;
  return static_cast<uint64_t>(x);
}

Status OutputFile::Write(const void* data, size_t n, uint64_t offset, std::optional<uint64_t> counted) const {
  size_t allowed = n;
  if (budget_ && budget_->limit) {
    // Like a filling disk: the write that crosses the limit is partial.
    const uint64_t charge = counted.value_or(n);
    const uint64_t before = budget_->used.fetch_add(charge);
    const uint64_t limit = *budget_->limit;
    if (before + charge > limit) allowed = before >= limit ? 0 : static_cast<size_t>(std::min<uint64_t>(n, limit - before));
  }
  auto aligned = [](uint64_t x) { return x % kDirectAlign == 0; };
  size_t done = 0;
  if (allowed == n && direct_fd_ >= 0 && aligned(reinterpret_cast<uintptr_t>(data)) && aligned(offset)) {
    // The whole blocks go direct; a tail shorter than a block (the end of
    // the file) is written through the page cache. EINVAL: the device wants
    // another alignment (or the filesystem took O_DIRECT at open but refuses
    // it here); the buffered write below does it all.
    const size_t head = n - n % kDirectAlign;
    Status st = head ? PwriteFull(direct_fd_, data, head, offset) : Status::OK();
    if (!st.ok() && st.error().sys_errno() != EINVAL) {
      return Error::FromErrno("cannot write " + path_ + " at offset " + std::to_string(offset), st.error().sys_errno());
    }
    if (st.ok()) done = head;
  }
  if (done < allowed) {
    Status st = PwriteFull(fd_, static_cast<const uint8_t*>(data) + done, allowed - done, offset + done);
    if (!st.ok()) {
      return Error::FromErrno("cannot write " + path_ + " at offset " + std::to_string(offset + done),
                              st.error().sys_errno());
    }
  }
  if (allowed < n) {
    return Error::FromErrno("cannot write " + path_ + " at offset " + std::to_string(offset + allowed), ENOSPC);
  }
  return Status::OK();
}

Result<IoBuffer> IoBuffer::Allocate(size_t bytes) {
  // A buffer of several MiB is aligned to 2 MiB and asks for transparent
  // huge pages (the default policy here is madvise-only): the copy's
  // buffers take one fault per 2 MiB instead of 512, and every O_DIRECT
  // request pins and releases a few large folios instead of thousands of
  // 4 KiB pages (perf of a 1 GiB build: page faults, page pinning and bio
  // page release were ~8% of its CPU time).
  constexpr size_t kHuge = 2u << 20;
  const size_t align = bytes >= kHuge ? kHuge : 4096;
  void* p = nullptr;
  if (int rc = posix_memalign(&p, align, bytes ? bytes : 4096); rc != 0)
    return Error("cannot allocate an I/O buffer of " + std::to_string(bytes) + " bytes: " + std::strerror(rc),
                 ErrorKind::kMemory, rc)
        .WithHint(OutOfMemoryHint());
  if (align == kHuge) ::madvise(p, bytes / kHuge * kHuge, MADV_HUGEPAGE);  // a hint; failure is harmless
  return IoBuffer(static_cast<uint8_t*>(p), bytes);
}
IoBuffer::IoBuffer(IoBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
IoBuffer& IoBuffer::operator=(IoBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}
IoBuffer::~IoBuffer() { std::free(data_); }

std::array<uint8_t, 32> ZeroSha256(uint64_t n) {
  static std::mutex mu;
  static std::map<uint64_t, std::array<uint8_t, 32>> cache;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(n);
    if (it != cache.end()) return it->second;
  }
  Hasher ctx;
  UpdateZeros(&ctx, n);
  auto out = ctx.Final();
  std::lock_guard<std::mutex> lock(mu);
  if (cache.size() < 4096) cache[n] = out;
  return out;
}

namespace {

// CRC32C of `crc`'s bytes followed by n zero bytes.
uint32_t ExtendCrc32cWithZeros(uint32_t crc, uint64_t n) {
  for (uint64_t done = 0; done < n;) {
    const size_t k = static_cast<size_t>(std::min<uint64_t>(kZeroChunk, n - done));
    crc = Crc32c(ZeroBlock(), k, crc);
    done += k;
  }
  return crc;
}

}  // namespace

uint32_t ZeroCrc32c(uint64_t n) {
  static std::mutex mu;
  static std::map<uint64_t, uint32_t> cache;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(n);
    if (it != cache.end()) return it->second;
  }
  const uint32_t crc = ExtendCrc32cWithZeros(0, n);
  std::lock_guard<std::mutex> lock(mu);
  if (cache.size() < 4096) cache[n] = crc;
  return crc;
}

namespace {

// SHA-256 (and with `crc`, CRC32C) of fd[off, +n) read segment by segment
// (holes hashed as zeros, never read); with dst >= 0 the data segments are
// also written to dst at dst_off + their place in the range, so holes stay
// holes there. A range the file does not hold is `{what} at offset {o}; {r}
// bytes remain`.
Result<std::array<uint8_t, 32>> HashSegments(int fd, uint64_t off, uint64_t n, IoBuffer& buf, CopyStats* stats,
                                             const char* what, int dst, uint64_t dst_off, uint32_t* crc) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return Error::FromErrno("fstat failed", errno);
  if (static_cast<uint64_t>(st.st_size) < off + n) {
    const uint64_t have = static_cast<uint64_t>(st.st_size) > off ? st.st_size - off : 0;
    return ShortRead(what, off + have, n - have);
  }
  const auto segs = MapRange(fd, off, n);
  if (segs.size() == 1 && segs[0].hole) {
    if (stats) stats->hole_bytes += n;
    if (crc) *crc = ZeroCrc32c(n);
    return ZeroSha256(n);
  }
  if (crc) *crc = 0;
  Hasher ctx;
  for (const Segment& s : segs) {
    if (s.hole) {
      UpdateZeros(&ctx, s.length);
      if (crc) *crc = ExtendCrc32cWithZeros(*crc, s.length);
      if (stats) stats->hole_bytes += s.length;
      continue;
    }
    for (uint64_t done = 0; done < s.length;) {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(buf.size(), s.length - done));
      K3_ASSIGN_OR_RETURN(size_t got, PreadFull(fd, buf.data(), want, s.offset + done));
      if (got != want) {
        const uint64_t at = s.offset + done + got;
        return ShortRead(what, at, off + n - at);
      }
      ctx.Update(buf.data(), got);
      if (crc) *crc = Crc32c(buf.data(), got, *crc);
      if (dst >= 0) K3_RETURN_IF_ERROR(PwriteFull(dst, buf.data(), got, dst_off + (s.offset - off) + done));
      done += got;
    }
    if (stats) stats->data_bytes += s.length;
  }
  return ctx.Final();
}

}  // namespace

Result<std::array<uint8_t, 32>> CopyAndHash(int src, uint64_t src_off, int dst, uint64_t dst_off, uint64_t n,
                                            IoBuffer& buf, CopyStats* stats) {
  return HashSegments(src, src_off, n, buf, stats, "short GGUF read", dst, dst_off, nullptr);
}

Result<SourceRange> ReadSource(int src, uint64_t src_size, uint64_t src_off, uint64_t len, IoBuffer& buf,
                               CopyStats* stats, int direct_src) {
  if (src_off + len > src_size) {
    const uint64_t have = src_size > src_off ? src_size - src_off : 0;
    return ShortRead("short GGUF read", src_off + have, len - have);
  }
  SourceRange out;
  out.segs = MapRange(src, src_off, len);
  if (out.segs.size() == 1 && out.segs[0].hole) {
    if (stats) stats->hole_bytes += len;
    return out;  // nothing to read: bytes stays null
  }
  const bool direct = direct_src >= 0 && buf.size() >= len + kDirectSlack;
  if (!direct && buf.size() < len) return Error("ReadSource: buffer too small", ErrorKind::kRuntime);
  // With O_DIRECT, b is placed so that every block-aligned file offset maps
  // to a block-aligned address in buf (b[x] holds src[src_off + x]).
  uint8_t* b = direct ? buf.data() + kDirectAlign + src_off % kDirectAlign : buf.data();
  PhaseTimer timer(stats ? &stats->read_s : nullptr);
  for (const Segment& s : out.segs) {
    if (s.hole) continue;
    if (direct && ReadDirect(direct_src, s.offset, s.length, src_off, b)) {
      if (stats) stats->direct_bytes += s.length;
    } else {
      K3_ASSIGN_OR_RETURN(size_t got, PreadFull(src, b + (s.offset - src_off), s.length, s.offset));
      if (got != s.length) return ShortRead("short GGUF read", s.offset + got, src_off + len - s.offset - got);
    }
    if (stats) stats->data_bytes += s.length;
  }
  // After the data: an aligned direct read may spill past its segment.
  for (const Segment& s : out.segs) {
    if (!s.hole) continue;
    std::memset(b + (s.offset - src_off), 0, s.length);
    if (stats) stats->hole_bytes += s.length;
  }
  out.bytes = b;
  return out;
}

void HashSlice(const uint8_t* p, uint64_t n, std::array<uint8_t, 32>* sha, uint32_t* crc) {
  Hasher h;
  h.Update(p, n);
  *sha = h.Final();
  *crc = Crc32c(p, n);
}

Result<std::array<uint8_t, 32>> HashRange(int fd, uint64_t off, uint64_t n, IoBuffer& buf, CopyStats* stats,
                                          uint32_t* crc) {
  return HashSegments(fd, off, n, buf, stats, "short read", -1, 0, crc);
}

Result<bool> RangesEqual(const FileRange& a, const FileRange& b, uint64_t n, IoBuffer& buf_a, IoBuffer& buf_b) {
  const size_t chunk = std::min(buf_a.size(), buf_b.size());
  uint64_t done = 0;
  while (done < n) {
    size_t want = static_cast<size_t>(std::min<uint64_t>(chunk, n - done));
    for (auto [range, buf] : {std::pair{&a, &buf_a}, std::pair{&b, &buf_b}}) {
      K3_ASSIGN_OR_RETURN(size_t got, PreadFull(range->fd, buf->data(), want, range->offset + done));
      if (got != want)
        return ShortRead(("short read of " + std::string(range->path)).c_str(), range->offset + done + got,
                         n - done - got);
    }
    if (std::memcmp(buf_a.data(), buf_b.data(), want) != 0) return false;
    done += want;
  }
  return true;
}

Status ZeroRange(int fd, uint64_t off, uint64_t n) {
  if (n == 0) return Status::OK();
  if (::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(off), static_cast<off_t>(n)) ==
      0) {
    return Status::OK();
  }
  uint64_t done = 0;
  while (done < n) {
    size_t k = static_cast<size_t>(std::min<uint64_t>(kZeroChunk, n - done));
    K3_RETURN_IF_ERROR(PwriteFull(fd, ZeroBlock(), k, off + done));
    done += k;
  }
  return Status::OK();
}

}  // namespace k3pack::pack
