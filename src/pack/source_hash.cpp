#include "pack/source_hash.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>

#include "pack/copy.h"
#include "util/file.h"
#include "util/sha256.h"

namespace k3pack::pack {

SourceHasher::SourceHasher(std::vector<std::string> paths, int threads)
    : paths_(std::move(paths)), digests_(paths_.size()), errors_(paths_.size()) {
  const size_t n = std::min<size_t>(paths_.size(), static_cast<size_t>(std::max(1, threads)));
  for (size_t i = 0; i < n; ++i) threads_.emplace_back([this] { Work(); });
}

SourceHasher::~SourceHasher() {
  Cancel();
  for (auto& t : threads_) t.join();
}

void SourceHasher::Cancel() { cancel_.store(true); }

void SourceHasher::Work() {
  IoBuffer buf(8u << 20);
  for (size_t i; !cancel_.load() && (i = next_.fetch_add(1)) < paths_.size();) {
    auto fd = OpenReadOnly(paths_[i]);
    if (!fd.ok()) {
      errors_[i] = fd.error();
      continue;
    }
    ::posix_fadvise(fd->get(), 0, 0, POSIX_FADV_SEQUENTIAL);
    Sha256 h;
    uint64_t at = 0;
    while (!cancel_.load()) {
      auto got = PreadFull(fd->get(), buf.data(), buf.size(), at);
      if (!got.ok()) {
        errors_[i] = got.error().WithContext(paths_[i]);
        break;
      }
      h.Update(buf.data(), *got);
      at += *got;
      if (*got < buf.size()) {
        digests_[i] = h.HexDigest();
        break;
      }
    }
  }
}

Result<std::vector<std::string>> SourceHasher::Finish() {
  for (auto& t : threads_) t.join();
  threads_.clear();
  if (cancel_.load()) return Error("source hashing was cancelled", ErrorKind::kRuntime);
  for (auto& e : errors_) {
    if (e) return *e;
  }
  return digests_;
}

}  // namespace k3pack::pack
