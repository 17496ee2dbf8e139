#include "store/latency_window.h"

#include <algorithm>
#include <new>

namespace k3pack::store {

void LatencyWindow::Add(uint64_t ns) {
  ++total_;
  if (ring_.size() < capacity_) {
    // Called as reads finish, on the I/O threads, which must not throw: a
    // sample that finds no memory is left out of the percentiles.
    try {
      ring_.push_back(ns);
    } catch (const std::bad_alloc&) {
    }
    return;
  }
  ring_[next_] = ns;
  next_ = (next_ + 1) % capacity_;
}

nlohmann::json LatencyWindow::PercentilesMs() const {
  nlohmann::json out = nlohmann::json::object();
  if (ring_.empty()) {
    for (const char* k : {"p50", "p90", "p99", "max"}) out[k] = 0.0;
    return out;
  }
  std::vector<uint64_t> v = ring_;
  size_t from = 0;  // everything before it is <= everything after it
  auto rank = [&](double q) {
    const size_t i = std::min(static_cast<size_t>(q * double(v.size() - 1) + 0.5), v.size() - 1);
    // Ranks come in increasing order, so each selection only reorders the
    // part above the previous one.
    std::nth_element(v.begin() + static_cast<std::ptrdiff_t>(from), v.begin() + static_cast<std::ptrdiff_t>(i),
                     v.end());
    from = i;
    return double(v[i]) / 1e6;
  };
  out["p50"] = rank(0.50);
  out["p90"] = rank(0.90);
  out["p99"] = rank(0.99);
  out["max"] = double(*std::max_element(v.begin(), v.end())) / 1e6;
  return out;
}

}  // namespace k3pack::store
