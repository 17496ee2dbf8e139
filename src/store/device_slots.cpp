#include "store/device_slots.h"

#include <string>

namespace k3pack::store {

DeviceSlots::DeviceSlots(uint32_t slot_count, uint64_t num_objects)
    : slot_of_(num_objects, kNone), key_of_(slot_count, kNone), holds_(slot_count, 0), lru_(slot_count, 1) {
  for (uint32_t s = 0; s < slot_count; ++s) lru_.PushBack(0, s);
}

Result<std::vector<DeviceSlots::Placement>> DeviceSlots::Place(std::span<const ObjectId> keys) {
  // Count first so a refusal leaves every slot as it was.
  uint64_t misses = 0, free_hits = 0;
  for (ObjectId k : keys) {
    if (slot_of_[k] == kNone) ++misses;
    else if (holds_[slot_of_[k]] == 0) ++free_hits;
  }
  const uint64_t free_slots = slot_count() - held_;
  if (misses > free_slots - free_hits) {
    return Error("device expert cache cannot hold this call's working set: " + std::to_string(keys.size()) +
                     " distinct objects, " + std::to_string(misses) + " not resident, " +
                     std::to_string(free_slots - free_hits) + " of " + std::to_string(slot_count()) +
                     " slots free (the others are held by unreleased calls or hold this call's hits)",
                 ErrorKind::kMemory)
        .WithHint("raise the device budget or release earlier acquisitions");
  }
  std::vector<Placement> out(keys.size());
  auto hold = [&](size_t i, uint32_t slot) {
    if (holds_[slot]++ == 0) {
      lru_.Unlink(slot);
      ++held_;
    }
    out[i].slot = slot;
  };
  // Hits first: a miss takes the least recently used free slot, which may be
  // one of this call's own hits until that hit is held.
  for (size_t i = 0; i < keys.size(); ++i)
    if (slot_of_[keys[i]] != kNone) hold(i, slot_of_[keys[i]]);
  for (size_t i = 0; i < keys.size(); ++i) {
    uint32_t slot = slot_of_[keys[i]];
    if (slot == kNone) {
      slot = lru_.head(0);  // exists: checked above
      if (key_of_[slot] != kNone) {
        slot_of_[key_of_[slot]] = kNone;
        ++evictions_;
      } else {
        ++resident_;
      }
      key_of_[slot] = keys[i];
      slot_of_[keys[i]] = slot;
      out[i].load = true;
      hold(i, slot);
    }
  }
  return out;
}

void DeviceSlots::Release(std::span<const uint32_t> slots) {
  for (uint32_t s : slots) {
    if (s >= slot_count() || holds_[s] == 0) continue;
    if (--holds_[s] == 0) {
      // An emptied slot (failed copy) is the first to reuse: it costs no eviction.
      if (key_of_[s] == kNone) lru_.PushFront(0, s);
      else lru_.PushBack(0, s);
      --held_;
    }
  }
}

void DeviceSlots::Forget(uint32_t slot) {
  if (slot >= slot_count() || key_of_[slot] == kNone) return;
  slot_of_[key_of_[slot]] = kNone;
  key_of_[slot] = kNone;
  --resident_;
}

}  // namespace k3pack::store
