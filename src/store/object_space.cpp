#include "store/object_space.h"

#include <algorithm>

namespace k3pack::store {

int32_t ObjectSpace::LayerIndex(uint32_t layer) const {
  auto it = std::lower_bound(active_layer_ids.begin(), active_layer_ids.end(), layer);
  if (it == active_layer_ids.end() || *it != layer) return -1;
  return static_cast<int32_t>(it - active_layer_ids.begin());
}

uint64_t ObjectSpace::max_object_bytes() const {
  return object_bytes.empty() ? 0 : *std::max_element(object_bytes.begin(), object_bytes.end());
}

uint64_t ObjectSpace::min_object_bytes() const {
  return object_bytes.empty() ? 0 : *std::min_element(object_bytes.begin(), object_bytes.end());
}

ObjectSpace ObjectSpace::KimiK3() { return Uniform(92, 896, 16, 11956224, 1); }

ObjectSpace ObjectSpace::Uniform(uint32_t layers, uint32_t experts, uint32_t top_k, uint64_t object_bytes,
                                 uint32_t first_layer) {
  ObjectSpace s;
  for (uint32_t i = 0; i < layers; ++i) s.active_layer_ids.push_back(first_layer + i);
  s.num_experts = experts;
  s.top_k = top_k;
  s.object_bytes.assign(layers, object_bytes);
  s.num_layers_total = first_layer + layers;
  return s;
}

static std::string ShapeRepr(std::span<const int64_t> shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

Status ValidateRoute(const ObjectSpace& space, uint32_t layer, std::span<const int64_t> shape,
                     std::span<const int64_t> ids, bool rank_share) {
  if (space.LayerIndex(layer) < 0)
    return Error("layer " + std::to_string(layer) + " is not an active routed MoE layer");
  if (rank_share && (shape.size() != 2 || shape[1] < 1 || shape[1] > static_cast<int64_t>(space.top_k)))
    return Error("an EP rank's routes must be 1.." + std::to_string(space.top_k) + " per token; received shape " +
                 ShapeRepr(shape));
  if (!rank_share && (shape.size() != 2 || shape[1] != static_cast<int64_t>(space.top_k)))
    return Error("runtime top-k must be exactly " + std::to_string(space.top_k) + "; received shape " +
                 ShapeRepr(shape));
  // Compared by division (shape[1] is top_k >= 1 here): a product of a huge shape[0]
  // would overflow (UB), or wrap to ids.size() and let a call claim 2^62 rows.
  const auto width = static_cast<uint64_t>(shape[1]);
  if (shape[0] < 0 || width == 0 || ids.size() % width != 0 ||
      ids.size() / width != static_cast<uint64_t>(shape[0]))
    return Error("route id count " + std::to_string(ids.size()) + " does not match shape " + ShapeRepr(shape));
  for (int64_t e : ids) {
    if (e < 0 || e >= static_cast<int64_t>(space.num_experts))
      return Error("route contains an out-of-range expert id");
  }
  return Status::OK();
}

void DistinctSorted(const ObjectSpace& space, uint32_t layer_index, const int64_t* ids, size_t n,
                    std::vector<ObjectId>* out) {
  out->clear();
  for (size_t i = 0; i < n; ++i) out->push_back(space.Id(layer_index, static_cast<uint32_t>(ids[i])));
  std::sort(out->begin(), out->end());
  out->erase(std::unique(out->begin(), out->end()), out->end());
}

Result<RouteCall> PrepareRoute(const ObjectSpace& space, uint32_t layer, std::span<const int64_t> shape,
                               std::span<const int64_t> ids, std::optional<bool> is_prefill, bool rank_share) {
  K3_RETURN_IF_ERROR(ValidateRoute(space, layer, shape, ids, rank_share));
  RouteCall call;
  call.rows = shape[0];
  call.is_prefill = is_prefill.value_or(call.rows > 1);
  call.layer_index = static_cast<uint32_t>(space.LayerIndex(layer));
  DistinctSorted(space, call.layer_index, ids.data(), ids.size(), &call.keys);
  return call;
}

}  // namespace k3pack::store
