// The store's read-latency percentiles (stats "k3pack.read_latency_ms") over
// the most recent reads. A store serves for days: keeping only the first
// million samples froze the percentiles after a few minutes of decode, and
// sorting a copy of all of them under the store's lock on every stats flush
// stalled every acquire. A fixed ring of recent samples and a selection
// (not a sort) keep both bounded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

namespace k3pack::store {

class LatencyWindow {
 public:
  static constexpr size_t kDefaultSamples = 1 << 16;
  explicit LatencyWindow(size_t samples = kDefaultSamples) : capacity_(samples == 0 ? 1 : samples) {}

  void Add(uint64_t ns);
  size_t size() const { return ring_.size(); }
  uint64_t total() const { return total_; }  // samples ever added

  // {"p50", "p90", "p99", "max"} in milliseconds over the samples held
  // (nearest rank; all 0.0 when there are none).
  nlohmann::json PercentilesMs() const;

 private:
  size_t capacity_;
  std::vector<uint64_t> ring_;
  size_t next_ = 0;  // where the next sample goes once the ring is full
  uint64_t total_ = 0;
};

}  // namespace k3pack::store
