#include "pack/source_hash.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "pack/copy.h"
#include "util/file.h"
#include "util/sha256.h"

namespace k3pack::pack {

SourceHasher::SourceHasher(std::vector<std::string> paths, int threads)
    : paths_(std::move(paths)), digests_(paths_.size()), errors_(paths_.size()) {
  for (const auto& p : paths_) {
    if (auto size = FileSize(p); size.ok()) total_bytes_ += *size;
  }
  const size_t n = std::min<size_t>(paths_.size(), static_cast<size_t>(std::max(1, threads)));
  working_threads_.store(n);
  for (size_t i = 0; i < n; ++i) {
    threads_.emplace_back([this] {
      Work();
      --working_threads_;
    });
  }
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
      hashed_bytes_ += *got;
      if (*got < buf.size()) {
        digests_[i] = h.HexDigest();
        ++shards_done_;
        break;
      }
    }
  }
}

Result<std::vector<std::string>> SourceHasher::Finish(const ProgressFn& progress) {
  const auto started = std::chrono::steady_clock::now();
  auto report = [&] {
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    Progress p("hash shards", hashed_bytes_.load(), total_bytes_, shards_done_.load(), paths_.size(), elapsed);
    p.unit = "shards";
    progress(p);
  };
  while (progress && working_threads_.load() > 0 && !cancel_.load()) {
    report();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  for (auto& t : threads_) t.join();
  if (progress && !cancel_.load()) report();
  threads_.clear();
  if (cancel_.load()) return Error("source hashing was cancelled", ErrorKind::kRuntime);
  for (auto& e : errors_) {
    if (e) return *e;
  }
  return digests_;
}

}  // namespace k3pack::pack
