// Objects held for a request's next call of a layer, per layer and per
// request so that they outlive other requests' calls of that layer. Two
// things are held so: the keep hints a policy reads through
// Policy::SetKeepHints, and the store's staged reads (Prefetch()); the timed
// replay's --keep-predicted and --staged model both with this one rule.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "store/policy.h"

namespace k3pack::store {

// What one Give() holds ends at the layer's next call by its request (with
// requests taking turns, it comes after the other requests' calls), at the
// layer's next call of any request when the hold or the call carries no
// request id, or after kMaxCalls calls of the layer (a request that ended
// never comes back for it). Per object, counts() says how many holds name
// it (a policy passes over objects with a count).
class NextCallHolds {
 public:
  static constexpr uint64_t kAnyRequest = kNoRequestId;  // a hold without a request id
  static constexpr uint64_t kMaxCalls = 16;

  NextCallHolds(uint64_t objects, size_t layers) : counts_(objects, 0), by_layer_(layers), calls_(layers, 0) {}
  const PinCounts* counts() const { return &counts_; }

  // A call of layer `li` starts; `requests`: its rows' (empty: not known).
  // `released(k)` runs for each object the last hold naming it ended here.
  template <class Released>
  void CallStarts(size_t li, std::span<const uint64_t> requests, Released&& released) {
    const uint64_t now = ++calls_[li];
    std::erase_if(by_layer_[li], [&](const Hold& h) {
      const bool ends = requests.empty() || h.request == kAnyRequest || h.given_at + kMaxCalls <= now ||
                        std::find(requests.begin(), requests.end(), h.request) != requests.end();
      if (ends)
        for (ObjectId k : h.objects)
          if (--counts_[k] == 0) released(k);
      return ends;
    });
  }
  void CallStarts(size_t li, std::span<const uint64_t> requests) {
    CallStarts(li, requests, [](ObjectId) {});
  }
  void Give(size_t li, uint64_t request, std::span<const ObjectId> objects) {
    if (objects.empty()) return;
    by_layer_[li].push_back({request, calls_[li], {objects.begin(), objects.end()}});
    for (ObjectId k : objects) ++counts_[k];
  }

 private:
  struct Hold {
    uint64_t request, given_at;  // given_at: the layer's call count then
    std::vector<ObjectId> objects;
  };
  PinCounts counts_;
  std::vector<std::vector<Hold>> by_layer_;
  std::vector<uint64_t> calls_;
};

}  // namespace k3pack::store
