// Doubly linked lists threaded through flat per-object arrays. A family of
// lists shares one node array; every object is in at most one list of the
// family. O(1) push/unlink without allocation, which keeps the policies fast
// enough to replay millions of routes.
#pragma once

#include <cstdint>
#include <vector>

#include "store/object_space.h"

namespace k3pack::store {

class ListFamily {
 public:
  static constexpr uint32_t kNil = 0xffffffffu;
  ListFamily(uint64_t objects, uint32_t lists)
      : prev_(objects, kNil), next_(objects, kNil), owner_(objects, kNil), head_(lists, kNil), tail_(lists, kNil) {}

  void PushBack(uint32_t list, ObjectId id) { Link(list, id, tail_[list], kNil); }
  void PushFront(uint32_t list, ObjectId id) { Link(list, id, kNil, head_[list]); }
  void Unlink(ObjectId id) {
    uint32_t list = owner_[id];
    if (list == kNil) return;
    if (prev_[id] != kNil) next_[prev_[id]] = next_[id]; else head_[list] = next_[id];
    if (next_[id] != kNil) prev_[next_[id]] = prev_[id]; else tail_[list] = prev_[id];
    prev_[id] = next_[id] = owner_[id] = kNil;
  }
  bool Linked(ObjectId id) const { return owner_[id] != kNil; }
  uint32_t head(uint32_t list) const { return head_[list]; }
  uint32_t tail(uint32_t list) const { return tail_[list]; }
  uint32_t next(ObjectId id) const { return next_[id]; }
  uint32_t prev(ObjectId id) const { return prev_[id]; }

 private:
  // Links `id` between neighbours `before` and `after` of `list` (kNil at an end).
  void Link(uint32_t list, ObjectId id, uint32_t before, uint32_t after) {
    prev_[id] = before;
    next_[id] = after;
    if (before != kNil) next_[before] = id; else head_[list] = id;
    if (after != kNil) prev_[after] = id; else tail_[list] = id;
    owner_[id] = list;
  }

  std::vector<uint32_t> prev_, next_, owner_, head_, tail_;
};

}  // namespace k3pack::store
