// Which device-memory slot holds which expert object, for the device tier.
// Replacement is least-recently-used among the slots no call holds: a
// device cache sits above the host store's policy (which already decides
// what is worth keeping near), and a call's own objects must stay put until
// it releases them. Kept free of CUDA so it is tested on every machine.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "k3pack/error.h"
#include "store/intrusive_list.h"

namespace k3pack::store {

class DeviceSlots {
 public:
  static constexpr uint64_t kEmpty = ~uint64_t{0};

  explicit DeviceSlots(uint32_t slot_count);

  struct Placement {
    uint32_t slot = 0;
    bool load = false;  // the object must be copied in (a miss)
  };
  // Places each distinct key and holds its slot until Release(). Hits keep
  // their slot; misses take the least recently used free slots. All or
  // nothing: when the free slots cannot take every miss, nothing changes.
  Result<std::vector<Placement>> Place(std::span<const uint64_t> distinct_keys);
  // Drops one hold per slot; a slot with no hold left becomes most recently used.
  void Release(std::span<const uint32_t> slots);
  // The copy into `slot` failed: it holds nothing now (its hold stays until Release).
  void Forget(uint32_t slot);

  uint32_t slot_count() const { return static_cast<uint32_t>(key_of_.size()); }
  uint32_t held() const { return held_; }
  uint64_t resident() const { return slot_of_.size(); }
  uint64_t evictions() const { return evictions_; }
  uint64_t KeyOf(uint32_t slot) const { return key_of_[slot]; }

 private:
  std::unordered_map<uint64_t, uint32_t> slot_of_;
  std::vector<uint64_t> key_of_;
  std::vector<uint32_t> holds_;
  ListFamily lru_;  // one list: the slots with no hold, least recently used first
  uint32_t held_ = 0;
  uint64_t evictions_ = 0;
};

}  // namespace k3pack::store
