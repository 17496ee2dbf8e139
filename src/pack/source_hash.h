// Whole-shard SHA-256 digests computed beside the pack copy.
//
// The manifest records each shard's SHA-256 so `verify --full` and the loader
// notice same-size edits anywhere in a shard (metadata padding, non-routed
// tensors, ...). The build reads the shards anyway, so these threads hash
// them while the copy runs: each reads one shard front to back in large
// sequential reads, overlapping the copy's reads of the same files (the page
// cache serves whichever comes second while both move through the same
// region). SHA-256 is sequential per file, so parallelism is per shard.
#pragma once

#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "k3pack/error.h"
#include "k3pack/progress.h"

namespace k3pack::pack {

class SourceHasher {
 public:
  // Starts hashing `paths` on up to `threads` threads.
  SourceHasher(std::vector<std::string> paths, int threads);
  ~SourceHasher();  // cancels and joins
  SourceHasher(const SourceHasher&) = delete;
  SourceHasher& operator=(const SourceHasher&) = delete;

  // Waits for every digest (hex, by index of `paths`), showing the bytes
  // hashed so far through `progress` (phase "hash shards") while it waits:
  // after a resume most of each shard is still to be read.
  Result<std::vector<std::string>> Finish(const ProgressFn& progress = nullptr);
  // Stops early (the result is discarded).
  void Cancel();

 private:
  void Work();
  std::vector<std::string> paths_, digests_;
  std::vector<std::optional<Error>> errors_;
  std::atomic<size_t> next_{0};
  std::atomic<bool> cancel_{false};
  std::atomic<uint64_t> hashed_bytes_{0};
  std::atomic<size_t> shards_done_{0}, working_threads_{0};
  uint64_t total_bytes_ = 0;
  std::vector<std::thread> threads_;
};

}  // namespace k3pack::pack
