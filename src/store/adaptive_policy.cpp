// "adaptive": a policy that follows whichever candidate is winning.
//
// No single rule wins on every workload (docs/store.md): per-layer quotas
// with a one-token half-life win when a request's tokens come one after
// another, SGLang's never-forgetting frequency wins when several requests
// are interleaved token by token, plain LRU wins when layers keep their
// experts and popularity is flat, and a global decayed frequency wins on
// large caches. So the adaptive policy runs every candidate twice:
// - as a shadow ("ghost") cache over a sample of the layers (every s-th
//   layer, with the same share of the capacity), which measures what that
//   candidate would hit on this workload right now, at a fraction of the
//   cost (set dueling with layers as the sets);
// - as a follower that ranks the residents of the real cache (it sees every
//   use, insertion and removal of it).
// Each miss evicts the victim of the leader: the candidate whose ghost has
// the most hits over a sliding window (exponential decay). A challenger
// takes over only when clearly ahead, so the cache is not churned by noise.
// Protection (the call's keys, pinned keys) is the followers' usual
// Protected() test, so the working set of an acquire and every pinned object
// stay resident whatever the leader.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "store/policy.h"

namespace k3pack::store {
namespace {

// The last candidate needs to know each row's request: it takes part only
// once calls carry request ids (CallRows), so without them the adaptive
// policy is exactly the four-candidate race.
constexpr const char* kCandidates[] = {"quota-decay", "lru", "reuse-lfu-lru-v2", "decay-lfu", "request-aware"};
constexpr size_t kNone = SIZE_MAX;

class Adaptive final : public Policy {
 public:
  Adaptive(const ObjectSpace& space, uint64_t cap, std::span<const char* const> candidates)
      : Policy(space, cap), names_(candidates.begin(), candidates.end()) {
    n_ = names_.size();
    for (size_t c = 0; c < n_; ++c)
      if (names_[c] == "request-aware") request_aware_ = c;
    const uint32_t L = space.num_active_layers();
    // About a dozen sampled layers: enough calls to compare candidates,
    // little enough work (K3: every 7th of 92 layers).
    stride_ = std::max<uint32_t>(1, L / 12);
    const uint32_t phase = stride_ / 2;
    sub_layer_.assign(L, -1);
    ObjectSpace sub;
    sub.num_experts = space.num_experts;
    sub.top_k = space.top_k;
    sub.num_layers_total = space.num_layers_total;
    uint64_t sub_bytes = 0, all_bytes = 0;
    for (uint32_t l = 0; l < L; ++l) {
      all_bytes += space.object_bytes[l];
      if (l % stride_ != phase) continue;
      sub_layer_[l] = static_cast<int32_t>(sub.active_layer_ids.size());
      sub.active_layer_ids.push_back(space.active_layer_ids[l]);
      sub.object_bytes.push_back(space.object_bytes[l]);
      sub_bytes += space.object_bytes[l];
    }
    // The ghosts' capacity is the real one scaled by the sampled layers' share of the bytes.
    const uint64_t sub_cap =
        all_bytes ? static_cast<uint64_t>(double(cap) * double(sub_bytes) / double(all_bytes)) : cap;
    for (size_t c = 0; c < n_; ++c) {
      auto f = MakePolicy(names_[c], space, cap);
      auto g = MakePolicy(names_[c], sub, sub_cap);
      followers_.push_back(std::move(f).value());
      followers_.back()->ShareCallMarks(*this);
      ghosts_.push_back(std::move(g).value());
    }
    score_.assign(n_, 0.0);
    alive_.assign(n_, 1);
    if (request_aware_ != kNone) alive_[request_aware_] = 0;  // until a call carries request ids
  }
  std::string name() const override { return "adaptive"; }
  std::string BrokenBookkeeping() const override {
    for (const auto* set : {&followers_, &ghosts_})
      for (const auto& p : *set)
        if (std::string broken = p->BrokenBookkeeping(); !broken.empty()) return "adaptive: " + broken;
    return {};
  }
  // The candidate currently followed (tests, stats).
  const std::string& leader() const { return names_[leader_]; }

 protected:
  void OnCall(std::span<const ObjectId> keys, bool is_prefill) override {
    const CallRows* rows = call_rows();
    if (rows != nullptr && !seen_requests_ && request_aware_ != kNone) {
      seen_requests_ = true;
      alive_[request_aware_] = 1;
    }
    for (size_t c = 0; c < n_; ++c)
      if (c != request_aware_ || rows != nullptr) followers_[c]->FollowCall(keys, is_prefill, rows);
    if (keys.empty()) return;
    const uint32_t li = space_.LayerIndexOf(keys[0]);
    if (sub_layer_[li] < 0) return;
    sub_keys_.clear();
    const ObjectId base = static_cast<ObjectId>(sub_layer_[li]) * space_.num_experts;
    for (ObjectId k : keys) sub_keys_.push_back(base + space_.ExpertOf(k));
    gens_.assign(sub_keys_.size(), 1);
    CallRows sub_rows;
    if (rows != nullptr) {
      sub_row_keys_.clear();
      for (ObjectId k : rows->keys) sub_row_keys_.push_back(base + space_.ExpertOf(k));
      sub_rows = {sub_row_keys_, rows->requests, rows->width};
    }
    MirrorKeepHints();
    for (size_t c = 0; c < n_; ++c) {
      score_[c] *= kDecay;
      if (!alive_[c] || (c == request_aware_ && rows == nullptr)) continue;
      // A ghost too small for a call (tiny caches) drops out of the race.
      if (!ghosts_[c]->Access(sub_keys_, gens_, is_prefill, nullptr, &ar_, rows ? &sub_rows : nullptr).ok()) {
        alive_[c] = 0;
        score_[c] = -1;
        continue;
      }
      for (uint8_t h : ar_.hit) score_[c] += h;
    }
    size_t best = leader_;
    for (size_t c = 0; c < n_; ++c)
      if (alive_[c] && score_[c] > score_[best]) best = c;
    // Hysteresis: 0.5% (and one hit) better before switching.
    if (best != leader_ && (!alive_[leader_] || score_[best] > score_[leader_] * 1.005 + 1.0)) leader_ = best;
  }
  void OnCallEnd() override {
    for (auto& f : followers_) f->FollowCallEnd();
  }
  void OnHit(ObjectId k) override {
    for (auto& f : followers_) f->FollowHit(k);
  }
  void OnInsert(ObjectId k, bool demand) override {
    for (auto& f : followers_) f->FollowInsert(k, demand);
  }
  void OnRemove(ObjectId k) override {
    for (auto& f : followers_) f->FollowRemove(k);
  }
  ObjectId PickVictim(bool is_prefill, std::span<const ObjectId> call, const PinCounts* pins) override {
    return followers_[leader_]->FollowVictim(is_prefill, call, pins);
  }

 private:
  // The ghosts race with the keep hints of their sampled layers, so that a
  // candidate that uses hints well is measured with them (request-aware
  // learns from them how rarely an unhinted previous-token expert returns).
  void MirrorKeepHints() {
    const PinCounts* keep = keep_hints();
    if (keep == nullptr) return;
    const uint32_t E = space_.num_experts;
    if (ghost_keep_.empty()) {
      ghost_keep_.assign(ghosts_[0]->space().num_objects(), 0);
      for (auto& g : ghosts_) g->SetKeepHints(&ghost_keep_);
    }
    for (uint32_t l = 0; l < sub_layer_.size(); ++l)
      if (sub_layer_[l] >= 0)
        std::copy_n(keep->begin() + size_t{l} * E, E, ghost_keep_.begin() + size_t(sub_layer_[l]) * E);
  }

  static constexpr double kDecay = 1.0 - 1.0 / 2048.0;  // window ~2k sampled calls (~150 K3 tokens)
  std::vector<std::string> names_;
  size_t n_ = 0, request_aware_ = kNone;
  uint32_t stride_ = 1;
  std::vector<int32_t> sub_layer_;  // active layer index -> ghost layer index, -1 if not sampled
  std::vector<std::unique_ptr<Policy>> followers_, ghosts_;
  std::vector<double> score_;
  std::vector<uint8_t> alive_;
  size_t leader_ = 0;
  bool seen_requests_ = false;
  std::vector<ObjectId> sub_keys_, sub_row_keys_;
  PinCounts ghost_keep_;  // the ghosts' keep hints (MirrorKeepHints)
  std::vector<uint64_t> gens_;
  AccessResult ar_;
};

}  // namespace

std::unique_ptr<Policy> MakeAdaptivePolicy(const ObjectSpace& space, uint64_t capacity_bytes,
                                           std::span<const char* const> candidates) {
  if (candidates.empty()) candidates = kCandidates;
  return std::make_unique<Adaptive>(space, capacity_bytes, candidates);
}

}  // namespace k3pack::store
