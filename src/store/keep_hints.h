// Keep hints by request: the counts a policy reads through
// Policy::SetKeepHints, kept per layer and per request so that a hint
// outlives other requests' calls of its layer (the timed replay's
// --keep-predicted and the store's keep_predicted share it).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "store/policy.h"

namespace k3pack::store {

// A hint for a layer ends at that layer's next call by its request (with
// requests taking turns, it comes after the other requests' calls), at the
// layer's next call of any request when the hint or the call carries no
// request id, or after kMaxCalls calls of the layer (a request that ended
// never comes back for it).
class KeepHints {
 public:
  static constexpr uint64_t kAnyRequest = UINT64_MAX;  // a hint without a request id
  static constexpr uint64_t kMaxCalls = 16;

  KeepHints(uint64_t objects, size_t layers) : keep_(objects, 0), by_layer_(layers), calls_(layers, 0) {}
  const PinCounts* counts() const { return &keep_; }

  // A call of layer `li` starts; `requests`: its rows' (empty: not known).
  void CallStarts(size_t li, std::span<const uint64_t> requests) {
    const uint64_t now = ++calls_[li];
    std::erase_if(by_layer_[li], [&](const Hint& h) {
      const bool ends = requests.empty() || h.request == kAnyRequest || h.given_at + kMaxCalls <= now ||
                        std::find(requests.begin(), requests.end(), h.request) != requests.end();
      if (ends)
        for (ObjectId k : h.objects) --keep_[k];
      return ends;
    });
  }
  void Give(size_t li, uint64_t request, std::span<const ObjectId> objects) {
    if (objects.empty()) return;
    by_layer_[li].push_back({request, calls_[li], {objects.begin(), objects.end()}});
    for (ObjectId k : objects) ++keep_[k];
  }

 private:
  struct Hint {
    uint64_t request, given_at;  // given_at: the layer's call count then
    std::vector<ObjectId> objects;
  };
  PinCounts keep_;
  std::vector<std::vector<Hint>> by_layer_;
  std::vector<uint64_t> calls_;
};

}  // namespace k3pack::store
