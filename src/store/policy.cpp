#include "store/policy.h"

#include <algorithm>

namespace k3pack::store {

Error ExplainCannotEvict(const Error& error, size_t call_objects, uint64_t capacity_objects,
                         bool waited_for_other_threads) {
  if (error.message() != kCannotEvictText) return error;
  if (call_objects > capacity_objects) {
    return error.WithHint("this call routes " + std::to_string(call_objects) +
                          " distinct experts of one layer and the cache holds " + std::to_string(capacity_objects) +
                          " objects: give it room for a call's distinct experts, or route fewer tokens per call");
  }
  if (waited_for_other_threads) {
    return error.WithHint(
        "other threads' unreleased acquisitions held the rest of the cache for 10 s: release each call "
        "(mark_used) before the next, or give the cache room for every thread's working set at once");
  }
  return error;
}

Policy::Policy(const ObjectSpace& space, uint64_t capacity_bytes)
    : space_(space),
      capacity_bytes_(capacity_bytes),
      resident_(space.num_objects(), 0),
      generation_(space.num_objects(), 0) {}

bool Policy::Protected(ObjectId key, std::span<const ObjectId> call_keys, const PinCounts* pins) const {
  if (pins != nullptr && (*pins)[key] != 0) return true;
  const Policy& m = *marks_owner_;
  if (m.marked_ != nullptr && call_keys.data() == m.marked_) {
    if (m.call_mark_[key] == m.call_serial_) return true;
  } else if (!call_keys.empty() && key >= call_keys.front() && key <= call_keys.back() &&
             std::binary_search(call_keys.begin(), call_keys.end(), key)) {
    // Call keys are sorted and all of one layer: most candidates (other
    // layers) fall outside their range, which is two compares, not a search.
    return true;
  }
  // Otherwise evictable, unless a victim search is passing over keep hints:
  // it passes over at most kMaxKeptPassed (a flood of hints, e.g. a batched
  // step's, must not make every eviction scan the cache).
  return m.avoiding_kept_ && (*m.keep_)[key] != 0 && m.kept_passed_++ < kMaxKeptPassed;
}

void Policy::Insert(ObjectId key, uint64_t generation) {
  resident_[key] = 1;
  generation_[key] = generation;
  used_bytes_ += space_.Cost(key);
  ++resident_count_;
}

void Policy::Remove(ObjectId key) {
  OnRemove(key);
  resident_[key] = 0;
  used_bytes_ -= space_.Cost(key);
  --resident_count_;
}

bool Policy::MakeRoom(uint64_t cost, bool is_prefill, std::span<const ObjectId> call_keys, const PinCounts* pins,
                      std::vector<ObjectId>* evicted) {
  while (used_bytes_ + cost > capacity_bytes_) {
    ObjectId victim = kNoObject;
    if (keep_ != nullptr) {
      avoiding_kept_ = true;
      kept_passed_ = 0;
      victim = PickVictim(is_prefill, call_keys, pins);
      avoiding_kept_ = false;
    }
    if (victim == kNoObject) victim = PickVictim(is_prefill, call_keys, pins);
    if (victim == kNoObject) return false;
    // Reported first: if that allocation fails, the victim stays resident
    // (an eviction the caller never hears of would keep its bytes for good).
    if (evicted) evicted->push_back(victim);
    Remove(victim);
  }
  return true;
}

Status Policy::Access(std::span<const ObjectId> keys, std::span<const uint64_t> generations, bool is_prefill,
                      const PinCounts* pins, AccessResult* out, const CallRows* rows) {
  out->hit.assign(keys.size(), 0);
  out->evicted.clear();
  out->evictions = 0;
  if (call_mark_.empty()) call_mark_.assign(space_.num_objects(), 0);
  if (++call_serial_ == 0) {  // wrapped: old marks could alias the new serial
    std::fill(call_mark_.begin(), call_mark_.end(), 0);
    call_serial_ = 1;
  }
  for (ObjectId k : keys) call_mark_[k] = call_serial_;
  marked_ = keys.data();
  rows_ = rows;
  // The call ends however OnCall or the loop leave it (std::bad_alloc under
  // `ulimit -v`): a call left open kept its keys held out of the ranking and
  // a follower of `adaptive` "in call", which later linked a key twice.
  // Every OnCallEnd accepts an OnCall that stopped halfway, and none
  // allocates (it runs in a destructor).
  struct EndCall {
    Policy* p;
    ~EndCall() {
      p->marked_ = nullptr;
      p->rows_ = nullptr;
      p->OnCallEnd();
    }
  } end_call{this};
  OnCall(keys, is_prefill);
  rows_ = nullptr;
  for (size_t i = 0; i < keys.size(); ++i) {
    ObjectId key = keys[i];
    if (resident_[key] && generation_[key] == generations[i]) {
      out->hit[i] = 1;
      OnHit(key);
      continue;
    }
    if (resident_[key]) {
      // Stale generation: the slot is reused in place; its old content is an
      // eviction (reported first, as in MakeRoom).
      out->evicted.push_back(key);
      Remove(key);
    }
    if (!MakeRoom(space_.Cost(key), is_prefill, keys, pins, &out->evicted)) {
      out->evictions = out->evicted.size();
      return Error(kCannotEvictText, ErrorKind::kRuntime);
    }
    Insert(key, generations[i]);
    OnInsert(key, true);
  }
  out->evictions = out->evicted.size();
  return Status::OK();
}

bool Policy::Admit(ObjectId key, uint64_t generation, const PinCounts* pins, std::vector<ObjectId>* evicted) {
  if (resident_[key]) return false;
  ObjectId self[1] = {key};
  // If room cannot be made, objects evicted on the way stay evicted (they are
  // reported), which only happens when nearly everything is pinned.
  uint64_t cost = space_.Cost(key);
  if (!MakeRoom(cost, /*is_prefill=*/false, self, pins, evicted)) return false;
  Insert(key, generation);
  OnInsert(key, false);
  return true;
}

void Policy::Erase(ObjectId key) {
  if (resident_[key]) Remove(key);
}

}  // namespace k3pack::store
