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
//
// Holding: an acquire call's own keys are protected until it ends, and a
// victim search that meets them first (fresh inserts rank lowest among
// equal scores) would walk past them on every miss of the call. Hold()
// takes an id out of the heap until ReleaseHeld(); meanwhile Set/Erase
// keep its key and membership, and the release puts every held member back
// with its current key: with unique keys that is exactly the order keeping
// them would have given.
//
// Going unordered: a set that is changed far more often than it is asked
// (adaptive's followers of the candidates it does not follow are asked
// nothing until one leads) stops sifting once it has taken more changes
// since its last question than it has members; the next question rebuilds
// the heap in one linear pass. With unique keys every answer is the one the
// always-ordered heap gives.
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

  // Members are indices 0..objects-1. Every buffer is sized here, for the
  // most it can hold (each index is in the heap, held_ids_ and skipped_ at
  // most once): after construction nothing allocates, so a policy's
  // mutators cannot fail halfway under `ulimit -v`, and ReleaseHeld (run
  // from a call's end, in a destructor) cannot throw.
  explicit RankedSet(uint64_t objects) : pos_(objects, kNone), key_(objects), held_(objects, 0) {
    heap_.reserve(objects);
    held_ids_.reserve(objects);
    skipped_.reserve(objects);
  }

  // Inserts `id` with rank `key`, or re-ranks it.
  void Set(uint32_t id, const Key& key) {
    key_[id] = key;
    const uint32_t p = pos_[id];
    CountChange();
    if (held_[id]) {
      if (p == kNone) ++held_members_;
      pos_[id] = kHeldOut;
    } else if (p == kNone) {
      heap_.push_back({key, id});
      pos_[id] = static_cast<uint32_t>(heap_.size() - 1);
      if (!unordered_) Up(pos_[id]);
    } else if (key < heap_[p].key) {
      heap_[p].key = key;
      if (!unordered_) Up(p);
    }  // else: raised; fixed when it reaches the top
  }
  void Erase(uint32_t id) {
    const uint32_t p = pos_[id];
    CountChange();
    if (p == kNone) return;
    if (p == kHeldOut) {
      pos_[id] = kNone;
      --held_members_;
      return;
    }
    RemoveAt(p);
  }
  void Clear() {
    ReleaseHeld();
    for (const Entry& e : heap_) pos_[e.id] = kNone;
    heap_.clear();
    unordered_ = false;
    changes_since_asked_ = 0;
  }
  bool Contains(uint32_t id) const { return pos_[id] != kNone; }
  // Members, held ones included.
  uint64_t size() const { return heap_.size() + held_members_; }
  bool empty() const { return size() == 0; }

  // Keeps `id` (a member or not yet) out of FirstNot until ReleaseHeld().
  void Hold(uint32_t id) {
    if (held_[id]) return;
    held_ids_.push_back(id);
    held_[id] = 1;
    if (pos_[id] == kNone) return;
    RemoveAt(pos_[id]);
    pos_[id] = kHeldOut;
    ++held_members_;
  }
  void ReleaseHeld() {
    for (uint32_t id : held_ids_) {
      held_[id] = 0;
      if (pos_[id] != kHeldOut) continue;
      pos_[id] = kNone;
      --held_members_;
      Set(id, key_[id]);
    }
    held_ids_.clear();
  }

  // The lowest-ranked member for which skip(id) is false, or kNone; the
  // membership is unchanged (skipped members are put back).
  template <typename Skip>
  uint32_t FirstNot(Skip&& skip) {
    changes_since_asked_ = 0;
    if (unordered_) Reorder();
    uint32_t found = kNone;
    while (!heap_.empty()) {
      Entry& top = heap_[0];
      // Raised since it was placed. A key that equals nothing, itself
      // included (a NaN from a policy's arithmetic), is taken as it stands:
      // re-placing it would find it stale again, forever.
      if (!(top.key == key_[top.id]) && key_[top.id] == key_[top.id]) {
        top.key = key_[top.id];
        Down(0);
        continue;
      }
      if (!skip(top.id)) {
        found = top.id;
        break;
      }
      skipped_.push_back(top.id);
      RemoveAt(0);
    }
    for (uint32_t id : skipped_) Set(id, key_[id]);
    skipped_.clear();
    return found;
  }

 private:
  static constexpr uint32_t kArity = 4;
  static constexpr uint32_t kHeldOut = 0xfffffffeu;  // pos_ of a held member
  static constexpr uint64_t kUnorderedAfter = 64;     // changes beyond the member count
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
  void CountChange() {
    if (!unordered_ && ++changes_since_asked_ > heap_.size() + kUnorderedAfter) unordered_ = true;
  }
  // Floyd's heap construction with every member's current key.
  void Reorder() {
    for (Entry& e : heap_) e.key = key_[e.id];
    const uint32_t n = static_cast<uint32_t>(heap_.size());
    for (uint32_t p = n > 1 ? (n - 2) / kArity + 1 : 0; p-- > 0;) Down(p);
    unordered_ = false;
  }
  void RemoveAt(uint32_t p) {
    pos_[heap_[p].id] = kNone;
    const uint32_t last = static_cast<uint32_t>(heap_.size() - 1);
    if (p != last) {
      Entry moved = heap_[last];
      heap_.pop_back();
      Place(p, moved);
      if (unordered_) return;
      Up(p);
      Down(pos_[moved.id]);
    } else {
      heap_.pop_back();
    }
  }

  std::vector<Entry> heap_;
  std::vector<uint32_t> pos_;  // per index: heap position, kNone = not a member, kHeldOut
  std::vector<Key> key_;       // per index: current key (heap key may be lower)
  std::vector<uint8_t> held_;  // per index: held until ReleaseHeld()
  std::vector<uint32_t> held_ids_, skipped_;
  uint64_t held_members_ = 0;
  uint64_t changes_since_asked_ = 0;
  bool unordered_ = false;  // heap_ holds the members in no order (see Reorder)
};

}  // namespace k3pack::store
