// Cache replacement policies: pure, I/O-free state machines over ObjectIds.
//
// The simulator (`k3pack trace replay --simulate`, sweeps, the bench) and the
// real ExpertStore drive the very same objects, so a hit rate measured in
// simulation is the hit rate the store gets for the same route sequence.
//
// Capacity is in bytes. With one object size (every Kimi-K3 pack) that is
// exactly SGLang's slot model (slots = budget / object_bytes, a miss takes a
// free slot if there is one); with per-layer sizes a miss evicts until the
// new object fits.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "k3pack/error.h"
#include "store/object_space.h"

namespace k3pack::store {

// Keys pinned by someone else (outstanding acquires of other threads, live
// prefetches): a count per ObjectId, non-zero = must not be evicted. May be null.
using PinCounts = std::vector<uint32_t>;

struct AccessResult {
  std::vector<uint8_t> hit;        // parallel to the keys of the call
  std::vector<ObjectId> evicted;   // objects dropped by this call, in order
  uint64_t evictions = 0;          // == evicted.size() (a stale reuse counts too)
};

// The request id that stands for none (a call, keep hint or staged read
// without one): the store refuses it as a caller's id (CheckRequestId), so
// a request given it never shares another's state.
inline constexpr uint64_t kNoRequestId = UINT64_MAX;

// Who asked for one acquire call's routes, for policies that keep per-request
// state: `keys` holds every row's routes as ObjectIds (rows x width, route
// order, duplicates kept), `requests` the request of each row, or one id
// for all rows. A call without it (nullptr) is of unknown requests.
struct CallRows {
  std::span<const ObjectId> keys;
  std::span<const uint64_t> requests;
  uint32_t width = 0;
  uint32_t rows() const { return width ? static_cast<uint32_t>(keys.size() / width) : 0; }
  uint64_t request(uint32_t row) const { return requests.size() == 1 ? requests[0] : requests[row]; }
};

// SGLang's text when every resident object is protected.
inline constexpr const char* kCannotEvictText = "expert cache cannot evict the active top-k working set";

// SGLang's text alone left a user guessing why: a hint after it says when
// the call's own distinct objects outnumber the cache, or when the call
// waited (10 s) for other threads' unreleased acquisitions. Other errors
// pass unchanged.
Error ExplainCannotEvict(const Error& error, size_t call_objects, uint64_t capacity_objects,
                         bool waited_for_other_threads);

class Policy {
 public:
  Policy(const ObjectSpace& space, uint64_t capacity_bytes);
  virtual ~Policy() = default;
  virtual std::string name() const = 0;

  // One acquire call. `keys` are the call's distinct objects in ascending
  // order (all of one layer), `generations` parallel to them. Every key is
  // resident afterwards; the call's own keys are never chosen as victims.
  // Fails with kCannotEvictText (RuntimeError) when no victim exists; like
  // SGLang, keys processed before the failure keep their new state.
  // `rows` (may be null): the call's routes by request (see CallRows).
  Status Access(std::span<const ObjectId> keys, std::span<const uint64_t> generations, bool is_prefill,
                const PinCounts* pins, AccessResult* out, const CallRows* rows = nullptr);

  // Prefetch admission: makes `key` resident without counting a use.
  // Returns false if it is resident already or if not enough unprotected
  // bytes can be evicted for it (victims dropped on the way are reported).
  bool Admit(ObjectId key, uint64_t generation, const PinCounts* pins, std::vector<ObjectId>* evicted);

  // Forgets a resident object (its read failed).
  void Erase(ObjectId key);

  // Keep hints (may be null; owned by the caller, a count per ObjectId):
  // objects the router look-ahead predicts for the next call of their layer.
  // A victim search passes over them while any other unprotected resident
  // is left, so a prediction keeps its object through the misses of the
  // calls before that one; when only hinted objects are left, they are
  // evicted in the policy's order. One search passes over at most
  // kMaxKeptPassed hinted residents (then takes the next one in order), so
  // a flood of hints cannot make every eviction scan the whole cache.
  void SetKeepHints(const PinCounts* keep) { keep_ = keep; }
  static constexpr uint32_t kMaxKeptPassed = 1024;

  // For tests: the first inconsistency in the policy's own bookkeeping
  // (beyond what Access checks), or "" when there is none.
  virtual std::string BrokenBookkeeping() const { return {}; }

  bool Resident(ObjectId key) const { return resident_[key] != 0; }
  uint64_t used_bytes() const { return used_bytes_; }
  uint64_t capacity_bytes() const { return capacity_bytes_; }
  uint64_t resident_count() const { return resident_count_; }
  const ObjectSpace& space() const { return space_; }

  // Follower mode: drives only this policy's ranking hooks, so it ranks the
  // residents of a cache someone else manages (the adaptive policy keeps one
  // follower per candidate and evicts with the current leader's choice). The
  // caller reports every use, insertion and removal of that cache.
  void FollowCall(std::span<const ObjectId> keys, bool is_prefill, const CallRows* rows = nullptr) {
    rows_ = rows;
    OnCall(keys, is_prefill);
    rows_ = nullptr;
  }
  void FollowCallEnd() { OnCallEnd(); }
  // A follower's victim searches get the owner's call keys: Protected() then
  // reads the owner's per-object marks instead of searching the keys.
  void ShareCallMarks(const Policy& owner) { marks_owner_ = &owner; }
  void FollowHit(ObjectId key) { OnHit(key); }
  void FollowInsert(ObjectId key, bool demand) { OnInsert(key, demand); }
  void FollowRemove(ObjectId key) { OnRemove(key); }
  ObjectId FollowVictim(bool is_prefill, std::span<const ObjectId> call_keys, const PinCounts* pins) {
    return PickVictim(is_prefill, call_keys, pins);
  }

 protected:
  // Hooks. OnCall sees every call's keys before any hit/miss processing;
  // call_rows() is the call's CallRows there (null when not given).
  virtual void OnCall(std::span<const ObjectId> keys, bool is_prefill) { (void)keys; (void)is_prefill; }
  // The call OnCall announced is over (also when it failed): its keys are no
  // longer protected.
  virtual void OnCallEnd() {}
  virtual void OnHit(ObjectId key) = 0;
  virtual void OnInsert(ObjectId key, bool demand) = 0;  // demand=false: prefetch admission
  virtual void OnRemove(ObjectId key) = 0;
  // A resident key that is not protected, or ObjectId(-1) if none.
  virtual ObjectId PickVictim(bool is_prefill, std::span<const ObjectId> call_keys, const PinCounts* pins) = 0;

  bool Protected(ObjectId key, std::span<const ObjectId> call_keys, const PinCounts* pins) const;
  const CallRows* call_rows() const { return rows_; }
  // The keep hints in force (the owner's for a follower), or null.
  const PinCounts* keep_hints() const { return marks_owner_->keep_; }

  const ObjectSpace space_;

 private:
  void Insert(ObjectId key, uint64_t generation);
  void Remove(ObjectId key);
  bool MakeRoom(uint64_t cost, bool is_prefill, std::span<const ObjectId> call_keys, const PinCounts* pins,
                std::vector<ObjectId>* evicted);

  // The keys of the Access call in progress, marked per object so that
  // Protected() is one load for them (a victim search in the call's own
  // layer meets them often); marked_ is null outside Access.
  std::vector<uint32_t> call_mark_;
  uint32_t call_serial_ = 0;
  const ObjectId* marked_ = nullptr;
  const Policy* marks_owner_ = this;  // whose marks Protected() reads
  const CallRows* rows_ = nullptr;    // during OnCall only
  const PinCounts* keep_ = nullptr;   // SetKeepHints
  bool avoiding_kept_ = false;        // a victim search that passes over keep_
  mutable uint32_t kept_passed_ = 0;  // hinted residents that search passed over

  uint64_t capacity_bytes_;
  uint64_t used_bytes_ = 0;
  uint64_t resident_count_ = 0;
  std::vector<uint8_t> resident_;
  std::vector<uint64_t> generation_;
};

inline constexpr ObjectId kNoObject = 0xffffffffu;

// Policy names: "reuse-lfu-lru-v2" (SGLang's), "lru", "decay-lfu",
// "quota-decay", "request-aware", "adaptive" (ours).
std::vector<std::string> PolicyNames();
// The adaptive policy (adaptive_policy.cpp): follows whichever candidate
// policy is winning on shadow caches of a sample of layers. `candidates`:
// policy names (empty: quota-decay, lru, reuse-lfu-lru-v2, decay-lfu and
// request-aware, which races only once calls carry request ids).
std::unique_ptr<Policy> MakeAdaptivePolicy(const ObjectSpace& space, uint64_t capacity_bytes,
                                           std::span<const char* const> candidates = {});
// The request-aware policy (request_policy.cpp): ranks objects by their
// estimated chance of being routed at the next token of an active request;
// route counts decay with `half_life_tokens` (0: never).
std::unique_ptr<Policy> MakeRequestAwarePolicy(const ObjectSpace& space, uint64_t capacity_bytes,
                                               double half_life_tokens);
Result<std::unique_ptr<Policy>> MakePolicy(const std::string& name, const ObjectSpace& space,
                                           uint64_t capacity_bytes);

}  // namespace k3pack::store
