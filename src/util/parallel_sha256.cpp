#include "util/parallel_sha256.h"

#include <algorithm>
#include <new>
#include <system_error>

#include "util/file.h"
#include "util/sha256.h"
#include "util/threads.h"

namespace k3pack {

ParallelSha256::ParallelSha256(std::vector<std::string> paths, int background_threads)
    : paths_(std::move(paths)),
      digests_(paths_.size()),
      errors_(paths_.size()),
      started_(std::chrono::steady_clock::now()) {
  for (const auto& p : paths_) {
    if (auto size = FileSize(p); size.ok()) total_bytes_ += *size;
  }
  const size_t n = std::min<size_t>(paths_.size(), static_cast<size_t>(std::max(0, background_threads)));
  for (size_t i = 0; i < n; ++i) {
    // Out of threads (a pids or address-space limit): Finish's thread does the rest.
    if (TryStartThread([&] { threads_.emplace_back([this] { HashFiles(nullptr); }); })) break;
  }
}

ParallelSha256::~ParallelSha256() {
  Cancel();
  for (auto& t : threads_) t.join();
}

void ParallelSha256::HashFiles(const std::function<Status()>& between_chunks) {
  auto poll = [&]() -> Status {
    if (between_chunks) K3_RETURN_IF_ERROR(between_chunks());
    return cancel_.load() ? Status(Error("stopped")) : Status::OK();
  };
  auto hashed = [this](uint64_t n) { hashed_bytes_ += n; };
  for (size_t i; !cancel_.load() && (i = next_.fetch_add(1)) < paths_.size();) {
    try {
      auto digest = Sha256File(paths_[i], poll, hashed);
      if (cancel_.load()) break;
      std::lock_guard<std::mutex> lock(finished_mu_);
      if (digest.ok()) digests_[i] = *digest;
      else errors_[i] = digest.error().WithContext(paths_[i]);
      finished_.push_back(i);
      ++done_;
    } catch (const std::bad_alloc&) {
      // Under `ulimit -v` any allocation of a background thread may fail
      // (a thread's malloc arena is address space too), and std::bad_alloc
      // leaving a thread ends the process. The file counts as done, so
      // Finish stops waiting, and Finish names it; nothing is allocated here.
      size_t none = kNoFile;
      out_of_memory_at_.compare_exchange_strong(none, i);
      ++done_;
    }
  }
}

void ParallelSha256::Report(const Wait& wait) {
  std::vector<size_t> finished;
  {
    std::lock_guard<std::mutex> lock(finished_mu_);
    finished.swap(finished_);
  }
  for (size_t i : finished) {
    ++announced_;
    if (wait.file_done) wait.file_done(i, announced_);
  }
  if (!wait.progress) return;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  Progress p("hash shards", hashed_bytes_.load(), total_bytes_, announced_, paths_.size(), elapsed);
  p.unit = "shards";
  wait.progress(p);
}

Status ParallelSha256::Poll(const Wait& wait) {
  if (wait.interrupt_check && !cancel_.load()) {
    if (Status s = wait.interrupt_check(); !s.ok()) {
      interrupted_ = s.error();
      Cancel();
      return s;
    }
  }
  Report(wait);
  return Status::OK();
}

Result<std::vector<std::string>> ParallelSha256::Finish(const Wait& wait) {
  HashFiles([&] { return Poll(wait); });
  while (!cancel_.load() && done_.load() < paths_.size()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    (void)Poll(wait);
  }
  for (auto& t : threads_) t.join();
  threads_.clear();
  if (interrupted_) return *interrupted_;
  if (cancel_.load()) return Error("hashing was cancelled", ErrorKind::kRuntime);
  if (const size_t i = out_of_memory_at_.load(); i != kNoFile) return HashOutOfMemory(paths_[i], 0);
  Report(wait);
  for (auto& e : errors_) {
    if (e) return *e;
  }
  return digests_;
}

}  // namespace k3pack
