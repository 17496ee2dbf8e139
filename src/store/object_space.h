// The set of cacheable objects of one pack: (active layer, expert) pairs,
// numbered densely so policies can keep per-object state in flat arrays.
//
// ObjectId = active_layer_index * num_experts + expert. Every component of
// the store (policies, Belady, simulator, real store) speaks ObjectIds; only
// the front door converts SGLang's (layer id, expert id) routes into them.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "k3pack/error.h"

namespace k3pack::store {

using ObjectId = uint32_t;

struct ObjectSpace {
  std::vector<uint32_t> active_layer_ids;   // ascending layer ids (K3: 1..92)
  uint32_t num_experts = 0;                 // K3: 896
  uint32_t top_k = 0;                       // K3: 16
  std::vector<uint64_t> object_bytes;       // per active layer index
  uint32_t num_layers_total = 0;            // route counters are this long (K3: 93)

  uint32_t num_active_layers() const { return static_cast<uint32_t>(active_layer_ids.size()); }
  uint64_t num_objects() const { return uint64_t{num_active_layers()} * num_experts; }
  // -1 when `layer` is not an active routed layer.
  int32_t LayerIndex(uint32_t layer) const;
  ObjectId Id(uint32_t layer_index, uint32_t expert) const { return layer_index * num_experts + expert; }
  uint32_t LayerIndexOf(ObjectId id) const { return id / num_experts; }
  uint32_t ExpertOf(ObjectId id) const { return id % num_experts; }
  uint32_t LayerOf(ObjectId id) const { return active_layer_ids[LayerIndexOf(id)]; }
  uint64_t Cost(ObjectId id) const { return object_bytes[LayerIndexOf(id)]; }
  uint64_t max_object_bytes() const;
  uint64_t min_object_bytes() const;
  bool uniform() const { return max_object_bytes() == min_object_bytes(); }

  // The Kimi-K3 space: layers 1..92, 896 experts, top-16, 11,956,224-byte objects.
  static ObjectSpace KimiK3();
  // A synthetic space with `layers` routed layers numbered first_layer.. and one object size.
  static ObjectSpace Uniform(uint32_t layers, uint32_t experts, uint32_t top_k, uint64_t object_bytes,
                             uint32_t first_layer = 1);
};

// SGLang's route checks, in its order, with its texts:
//   `layer {layer} is not an active routed MoE layer`
//   `runtime top-k must be exactly {top_k}; received shape {shape}`
//   `route contains an out-of-range expert id`
// `shape` is the id array's shape (must be 2-D [tokens, top_k]); it is
// printed as a Python tuple, e.g. `(1, 8)`. `rank_share`: an EP rank
// store's call, whose rows hold 1..top_k routes (a token's routes to this
// rank); a wrong width is then `an EP rank's routes must be 1..{top_k} per
// token; received shape {shape}`.
Status ValidateRoute(const ObjectSpace& space, uint32_t layer, std::span<const int64_t> shape,
                     std::span<const int64_t> ids, bool rank_share = false);

// One acquire call after SGLang's route checks: its rows, whether it counts
// as prefill (SGLang's default: more than one row), its layer index and its
// distinct objects in ascending order.
struct RouteCall {
  int64_t rows = 0;
  bool is_prefill = false;
  uint32_t layer_index = 0;
  std::vector<ObjectId> keys;
};
Result<RouteCall> PrepareRoute(const ObjectSpace& space, uint32_t layer, std::span<const int64_t> shape,
                               std::span<const int64_t> ids, std::optional<bool> is_prefill,
                               bool rank_share = false);

// Distinct object ids of one route, ascending (SGLang processes keys in
// ascending (layer, expert) order, deduplicated).
void DistinctSorted(const ObjectSpace& space, uint32_t layer_index, const int64_t* ids, size_t n,
                    std::vector<ObjectId>* out);

}  // namespace k3pack::store
