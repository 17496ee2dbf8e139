// Which device-memory slot holds which expert object, for the device tier.
// Replacement is least-recently-used among the slots no call holds: a
// device cache sits above the host store's policy (which already decides
// what is worth keeping near), and a call's own objects must stay put until
// it releases them. Kept free of CUDA so it is tested on every machine.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "k3pack/error.h"
#include "store/intrusive_list.h"
#include "store/object_space.h"

namespace k3pack::store {

class DeviceSlots {
 public:
  static constexpr uint32_t kNone = ListFamily::kNil;  // no object in a slot / no slot for an object

  DeviceSlots(uint32_t slot_count, uint64_t num_objects);

  struct Placement {
    uint32_t slot = 0;
    bool load = false;  // the object must be copied in (a miss)
  };
  // Places each distinct key and holds its slot until Release(). Hits keep
  // their slot; misses take the least recently used free slots. All or
  // nothing: when the free slots cannot take every miss, nothing changes.
  Result<std::vector<Placement>> Place(std::span<const ObjectId> distinct_keys);
  // Drops one hold per slot; a slot with no hold left becomes most recently used.
  void Release(std::span<const uint32_t> slots);
  // The copy into `slot` failed: it holds nothing now (its hold stays until Release).
  void Forget(uint32_t slot);

  uint32_t slot_count() const { return static_cast<uint32_t>(key_of_.size()); }
  uint32_t held() const { return held_; }
  uint64_t resident() const { return resident_; }
  uint64_t evictions() const { return evictions_; }
  ObjectId KeyOf(uint32_t slot) const { return key_of_[slot]; }

 private:
  std::vector<uint32_t> slot_of_;  // per ObjectId
  std::vector<ObjectId> key_of_;   // per slot
  std::vector<uint32_t> holds_;
  ListFamily lru_;  // one list: the slots with no hold, least recently used first
  uint32_t held_ = 0;
  uint64_t resident_ = 0, evictions_ = 0;
};

}  // namespace k3pack::store
