// A set of objects ranked by a key, for policies and bounds that evict "the
// lowest-ranked object not protected": an indexed 4-ary min-heap in flat
// arrays instead of a node-based std::set (half the levels of a binary
// heap, and a node's children share a cache line or two).
//
// Raising a member's key is deferred: the heap keeps the old key, which is
// then a lower bound, and the member's current key sits in a flat array.
// Only when a member reaches the top with a stale key is it moved down to
// its place. The decayed-frequency policies raise the key of every object
// they use (a use always raises its score), so a hit costs O(1) and only
// evictions pay O(log n). Lowering a key moves the member up at once.
//
// The victims are the ones a std::set of the same keys gives, provided keys
// are unique among members (every user puts a sequence number or the id in
// them): the top, once its key is current, is the minimum, because every
// other member's current key is at least its heap key.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "store/object_space.h"

namespace k3pack::store {

template <typename Key>  // ordered by operator< and compared with ==
class RankedSet {
 public:
  static constexpr uint32_t kNone = 0xffffffffu;

  // Members are indices 0..objects-1.
  explicit RankedSet(uint64_t objects) : pos_(objects, kNone), key_(objects) {}

  // Inserts `id` with rank `key`, or re-ranks it.
  void Set(uint32_t id, const Key& key) {
    key_[id] = key;
    const uint32_t p = pos_[id];
    if (p == kNone) {
      heap_.push_back({key, id});
      pos_[id] = static_cast<uint32_t>(heap_.size() - 1);
      Up(pos_[id]);
    } else if (key < heap_[p].key) {
      heap_[p].key = key;
      Up(p);
    }  // else: raised; fixed when it reaches the top
  }
  void Erase(uint32_t id) {
    const uint32_t p = pos_[id];
    if (p == kNone) return;
    RemoveAt(p);
  }
  void Clear() {
    for (const Entry& e : heap_) pos_[e.id] = kNone;
    heap_.clear();
  }
  bool Contains(uint32_t id) const { return pos_[id] != kNone; }
  uint64_t size() const { return heap_.size(); }

  // The lowest-ranked member for which skip(id) is false, or kNone; the
  // membership is unchanged (skipped members are put back).
  template <typename Skip>
  uint32_t FirstNot(Skip&& skip) {
    uint32_t found = kNone;
    while (!heap_.empty()) {
      Entry& top = heap_[0];
      if (!(top.key == key_[top.id])) {  // raised since it was placed
        top.key = key_[top.id];
        Down(0);
        continue;
      }
      if (!skip(top.id)) {
        found = top.id;
        break;
      }
      held_.push_back(top.id);
      RemoveAt(0);
    }
    for (uint32_t id : held_) Set(id, key_[id]);
    held_.clear();
    return found;
  }

 private:
  static constexpr uint32_t kArity = 4;
  struct Entry {
    Key key;
    uint32_t id;
  };
  void Place(uint32_t p, Entry e) {
    pos_[e.id] = p;
    heap_[p] = std::move(e);
  }
  void Up(uint32_t p) {
    Entry e = heap_[p];
    while (p > 0) {
      const uint32_t parent = (p - 1) / kArity;
      if (!(e.key < heap_[parent].key)) break;
      Place(p, heap_[parent]);
      p = parent;
    }
    Place(p, e);
  }
  void Down(uint32_t p) {
    const uint32_t n = static_cast<uint32_t>(heap_.size());
    Entry e = heap_[p];
    for (;;) {
      const uint32_t first = kArity * p + 1;
      if (first >= n) break;
      uint32_t c = first;
      const uint32_t end = std::min(n, first + kArity);
      for (uint32_t k = first + 1; k < end; ++k)
        if (heap_[k].key < heap_[c].key) c = k;
      if (!(heap_[c].key < e.key)) break;
      Place(p, heap_[c]);
      p = c;
    }
    Place(p, e);
  }
  void RemoveAt(uint32_t p) {
    pos_[heap_[p].id] = kNone;
    const uint32_t last = static_cast<uint32_t>(heap_.size() - 1);
    if (p != last) {
      Entry moved = heap_[last];
      heap_.pop_back();
      Place(p, moved);
      Up(p);
      Down(pos_[moved.id]);
    } else {
      heap_.pop_back();
    }
  }

  std::vector<Entry> heap_;
  std::vector<uint32_t> pos_;  // per index: heap position, kNone = not a member
  std::vector<Key> key_;       // per index: current key (heap key may be lower)
  std::vector<uint32_t> held_;
};

}  // namespace k3pack::store
