// Whole-file SHA-256 of several files at once, with byte progress.
//
// Both the pack build (hashing the shards beside its copy) and `manifest`
// (hashing them on request) need every shard's digest. SHA-256 is sequential
// within a file, so the parallelism is per file: threads take the next file
// until none is left. Hashing starts in the constructor, so a caller can do
// other work (the copy) while it runs and collect the digests with Finish.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "k3pack/error.h"
#include "k3pack/progress.h"

namespace k3pack {

class ParallelSha256 {
 public:
  // Starts up to `background_threads` threads (as many as the system gives;
  // none at all is fine: Finish then hashes every file itself).
  ParallelSha256(std::vector<std::string> paths, int background_threads);
  ~ParallelSha256();  // cancels and joins
  ParallelSha256(const ParallelSha256&) = delete;
  ParallelSha256& operator=(const ParallelSha256&) = delete;

  struct Wait {
    // Byte progress, phase "hash shards", unit "shards".
    ProgressFn progress;
    // Polled between 8 MiB chunks; an error stops every thread and is
    // returned. Runs on the thread that called Finish only (Python runs
    // signal handlers on its main thread only).
    std::function<Status()> interrupt_check;
    // After each file's digest (its index in `paths`, files done so far).
    std::function<void(size_t index, size_t done)> file_done;
  };
  // Hashes files not yet taken on the calling thread too, then waits for the
  // others; returns every digest (lowercase hex, by index of `paths`) or the
  // first error by index. Every callback runs on the calling thread.
  Result<std::vector<std::string>> Finish(const Wait& wait);
  // Stops early: Finish returns an error.
  void Cancel() { cancel_.store(true); }

 private:
  void HashFiles(const std::function<Status()>& between_chunks);
  Status Poll(const Wait& wait);
  void Report(const Wait& wait);

  std::vector<std::string> paths_, digests_;
  std::vector<std::optional<Error>> errors_;
  std::atomic<size_t> next_{0}, done_{0};
  static constexpr size_t kNoFile = SIZE_MAX;
  std::atomic<size_t> out_of_memory_at_{kNoFile};  // the first file a thread could not hash for want of memory
  std::atomic<bool> cancel_{false};
  std::atomic<uint64_t> hashed_bytes_{0};
  uint64_t total_bytes_ = 0;
  std::mutex finished_mu_;
  std::vector<size_t> finished_;  // indexes whose file_done is still due
  size_t announced_ = 0;
  std::optional<Error> interrupted_;
  std::chrono::steady_clock::time_point started_;
  std::vector<std::thread> threads_;
};

}  // namespace k3pack
