#include "util/sha256.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <memory>
#include <new>
#include <vector>

#include "util/file.h"
#include "util/process_limits.h"

namespace k3pack {

struct Sha256::Impl {
  EVP_MD_CTX* ctx = nullptr;
};

Sha256::Sha256() : impl_(std::make_unique<Impl>()) {
  impl_->ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(impl_->ctx, EVP_sha256(), nullptr);
}

Sha256::~Sha256() {
  if (impl_ && impl_->ctx) EVP_MD_CTX_free(impl_->ctx);
}

Sha256::Sha256(Sha256&&) noexcept = default;
Sha256& Sha256::operator=(Sha256&&) noexcept = default;

void Sha256::Update(const void* data, size_t n) { EVP_DigestUpdate(impl_->ctx, data, n); }

std::string Sha256::HexDigest() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(impl_->ctx, md, &len);
  static const char* kHex = "0123456789abcdef";
  std::string out(len * 2, '0');
  for (unsigned i = 0; i < len; ++i) {
    out[2 * i] = kHex[md[i] >> 4];
    out[2 * i + 1] = kHex[md[i] & 15];
  }
  return out;
}

std::string Sha256Hex(const void* data, size_t n) {
  Sha256 h;
  h.Update(data, n);
  return h.HexDigest();
}

Error HashOutOfMemory(const std::string& path, uint64_t bytes) {
  return Error("cannot allocate " + (bytes ? std::to_string(bytes) + " bytes" : std::string("memory")) + " to hash " +
                   path,
               ErrorKind::kMemory, ENOMEM)
      .WithHint(OutOfMemoryHint());
}

Result<std::string> Sha256FileRange(const std::string& path, uint64_t offset, uint64_t length,
                                    const std::function<Status()>& between_chunks,
                                    const std::function<void(uint64_t)>& hashed) {
  K3_ASSIGN_OR_RETURN(UniqueFd fd, OpenReadOnly(path));
  ::posix_fadvise(fd.get(), static_cast<off_t>(offset), static_cast<off_t>(length), POSIX_FADV_SEQUENTIAL);
  Sha256 h;
  // Allocated without throwing: this runs on the build's hashing threads,
  // where std::bad_alloc under `ulimit -v` ended the process (std::terminate).
  const size_t buf_size = static_cast<size_t>(std::min<uint64_t>(length, 8u << 20));
  std::unique_ptr<uint8_t[]> buf(new (std::nothrow) uint8_t[buf_size]);
  if (!buf) return HashOutOfMemory(path, buf_size);
  uint64_t done = 0;
  while (done < length) {
    if (between_chunks) K3_RETURN_IF_ERROR(between_chunks());
    size_t want = static_cast<size_t>(std::min<uint64_t>(buf_size, length - done));
    K3_ASSIGN_OR_RETURN(size_t got, PreadFull(fd.get(), buf.get(), want, offset + done));
    if (got != want) {
      return Error("short read at offset " + std::to_string(offset + done + got) + "; " +
                       std::to_string(length - done - got) + " bytes remain",
                   ErrorKind::kEOF);
    }
    h.Update(buf.get(), got);
    done += got;
    if (hashed) hashed(got);
  }
  return h.HexDigest();
}

Result<std::string> Sha256File(const std::string& path, const std::function<Status()>& between_chunks,
                               const std::function<void(uint64_t)>& hashed) {
  K3_ASSIGN_OR_RETURN(uint64_t size, FileSize(path));
  return Sha256FileRange(path, 0, size, between_chunks, hashed);
}

}  // namespace k3pack
