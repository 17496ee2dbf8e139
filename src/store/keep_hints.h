// Objects named for a request's next call of a layer, kept per layer and per
// request so that they outlive other requests' calls of that layer: the keep
// hints a policy reads through Policy::SetKeepHints, and the staged reads of
// the store's Prefetch() (the timed replay's --keep-predicted and --staged
// model both, with the same rule).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "store/policy.h"

namespace k3pack::store {

// A group given for a layer ends at that layer's next call by its request
// (with requests taking turns, it comes after the other requests' calls), at
// the layer's next call of any request when the group or the call carries no
// request id, or after kMaxCalls calls of the layer (a request that ended
// never comes back for it).
class NextCallGroups {
 public:
  static constexpr uint64_t kAnyRequest = UINT64_MAX;  // a group without a request id
  static constexpr uint64_t kMaxCalls = 16;

  explicit NextCallGroups(size_t layers) : by_layer_(layers), calls_(layers, 0) {}

  // A call of layer `li` starts; `requests`: its rows' (empty: not known).
  // `ended(objects)` runs for each group that ends here.
  template <class Ended>
  void CallStarts(size_t li, std::span<const uint64_t> requests, Ended&& ended) {
    const uint64_t now = ++calls_[li];
    std::erase_if(by_layer_[li], [&](const Group& g) {
      const bool ends = requests.empty() || g.request == kAnyRequest || g.given_at + kMaxCalls <= now ||
                        std::find(requests.begin(), requests.end(), g.request) != requests.end();
      if (ends) ended(std::span<const ObjectId>(g.objects));
      return ends;
    });
  }
  void Give(size_t li, uint64_t request, std::span<const ObjectId> objects) {
    if (!objects.empty()) by_layer_[li].push_back({request, calls_[li], {objects.begin(), objects.end()}});
  }
  size_t num_layers() const { return by_layer_.size(); }

 private:
  struct Group {
    uint64_t request, given_at;  // given_at: the layer's call count then
    std::vector<ObjectId> objects;
  };
  std::vector<std::vector<Group>> by_layer_;
  std::vector<uint64_t> calls_;
};

// Keep hints: a count per object of the groups naming it, which a policy
// reads (passing over objects with a count).
class KeepHints {
 public:
  static constexpr uint64_t kAnyRequest = NextCallGroups::kAnyRequest;
  static constexpr uint64_t kMaxCalls = NextCallGroups::kMaxCalls;

  KeepHints(uint64_t objects, size_t layers) : keep_(objects, 0), groups_(layers) {}
  const PinCounts* counts() const { return &keep_; }

  void CallStarts(size_t li, std::span<const uint64_t> requests) {
    groups_.CallStarts(li, requests, [&](std::span<const ObjectId> objects) {
      for (ObjectId k : objects) --keep_[k];
    });
  }
  void Give(size_t li, uint64_t request, std::span<const ObjectId> objects) {
    groups_.Give(li, request, objects);
    for (ObjectId k : objects) ++keep_[k];
  }

 private:
  PinCounts keep_;
  NextCallGroups groups_;
};

}  // namespace k3pack::store
