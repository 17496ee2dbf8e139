// The concrete replacement policies (see policy.h for the contract).
#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <limits>
#include <utility>

#include "store/intrusive_list.h"
#include "store/policy.h"
#include "store/ranked_set.h"

namespace k3pack::store {
namespace {

// SGLang's `reuse-lfu-lru-v2`, reproduced rule for rule:
// - every call first bumps the persistent per-object frequency of each of its
//   distinct keys, saturating at 255; the counter survives eviction;
// - a hit refreshes the resident copy's frequency and moves it to the MRU end;
// - a miss takes free room if any; otherwise the victim is the unprotected
//   resident object with the smallest frequency, ties broken by the first one
//   met walking the LRU order oldest->newest (decode) or newest->oldest
//   (prefill, "preserve oldest");
// - protected = every key of the current call.
// Resident objects sit in one list per frequency value, each in LRU order, so
// "first minimum along the LRU walk" is the head (or tail) of the lowest
// non-empty list: the same victim as SGLang's linear walk, in O(1). Keys a
// call touches join their lists when the call ends, in the order touched:
// they are protected meanwhile, and a prefill walk (newest first) would
// otherwise pass every one of them on each miss of the call.
class ReuseLfuLruV2 final : public Policy {
 public:
  ReuseLfuLruV2(const ObjectSpace& space, uint64_t cap)
      : Policy(space, cap), key_freq_(space.num_objects(), 0), slot_freq_(space.num_objects(), 0),
        lists_(space.num_objects(), 256), waiting_(space.num_objects(), 0) {
    touched_.reserve(space.num_objects());  // a key waits at most once: hooks never allocate
  }
  std::string name() const override { return "reuse-lfu-lru-v2"; }

 protected:
  void OnCall(std::span<const ObjectId> keys, bool) override {
    for (ObjectId k : keys) key_freq_[k] = key_freq_[k] < 255 ? key_freq_[k] + 1 : 255;
    in_call_ = true;
  }
  void OnCallEnd() override {
    in_call_ = false;
    for (ObjectId k : touched_)
      if (std::exchange(waiting_[k], 0)) Link(k);
    touched_.clear();
  }
  void OnHit(ObjectId k) override { Touch(k); }
  void OnInsert(ObjectId k, bool) override { Touch(k); }
  void OnRemove(ObjectId k) override {
    Unlink(k);
    waiting_[k] = 0;  // an object removed mid-call is not linked at its end
  }
  ObjectId PickVictim(bool is_prefill, std::span<const ObjectId> call, const PinCounts* pins) override {
    // Non-empty frequency lists, lowest first (a bit per list).
    for (uint32_t w = 0; w < 4; ++w) {
      for (uint64_t bits = nonempty_[w]; bits != 0; bits &= bits - 1) {
        const uint32_t f = w * 64 + static_cast<uint32_t>(std::countr_zero(bits));
        uint32_t id = is_prefill ? lists_.tail(f) : lists_.head(f);
        while (id != ListFamily::kNil) {
          if (!Protected(id, call, pins)) return id;
          id = is_prefill ? lists_.prev(id) : lists_.next(id);
        }
      }
    }
    return kNoObject;
  }

 private:
  void Touch(ObjectId k) {
    Unlink(k);
    slot_freq_[k] = key_freq_[k];
    if (!in_call_) {
      Link(k);
    } else if (!waiting_[k]) {  // twice in one call: linked once, at the end
      waiting_[k] = 1;
      touched_.push_back(k);
    }
  }
  void Link(ObjectId k) {
    lists_.PushBack(slot_freq_[k], k);
    nonempty_[slot_freq_[k] / 64] |= uint64_t{1} << (slot_freq_[k] % 64);
  }
  void Unlink(ObjectId k) {
    if (!lists_.Linked(k)) return;
    const uint32_t f = slot_freq_[k];
    lists_.Unlink(k);
    if (lists_.head(f) == ListFamily::kNil) nonempty_[f / 64] &= ~(uint64_t{1} << (f % 64));
  }
  std::vector<uint8_t> key_freq_;
  std::vector<uint8_t> slot_freq_;
  ListFamily lists_;
  uint64_t nonempty_[4] = {0, 0, 0, 0};
  bool in_call_ = false;
  std::vector<ObjectId> touched_;  // this call's keys, linked when it ends
  std::vector<uint8_t> waiting_;   // per object: in touched_
};

// Plain LRU: the victim is the least recently used unprotected object.
class Lru final : public Policy {
 public:
  Lru(const ObjectSpace& space, uint64_t cap) : Policy(space, cap), lists_(space.num_objects(), 1) {}
  std::string name() const override { return "lru"; }

 protected:
  void OnHit(ObjectId k) override { lists_.Unlink(k); lists_.PushBack(0, k); }
  void OnInsert(ObjectId k, bool) override { lists_.PushBack(0, k); }
  void OnRemove(ObjectId k) override { lists_.Unlink(k); }
  ObjectId PickVictim(bool, std::span<const ObjectId> call, const PinCounts* pins) override {
    for (uint32_t id = lists_.head(0); id != ListFamily::kNil; id = lists_.next(id))
      if (!Protected(id, call, pins)) return id;
    return kNoObject;
  }

 private:
  ListFamily lists_;
};

// The decayed-frequency policies' ranking: (normalized score, ~use
// sequence), lowest first; the sequence makes keys unique and ranks the
// newest first among equal scores. A call's own keys are held out of it
// until the call ends (they are protected), so a victim search never walks
// past them.
using ScoreKey = std::pair<double, uint64_t>;
using ScoreOrder = RankedSet<ScoreKey>;

// Ours: frequency with exponential decay (an LRFU-style score), remembered
// for evicted objects too, with newest-first eviction among equal scores.
//   score(k, now) = sum over past uses u of 2^-((now - u) / half_life)
// where time counts routing calls / active layers (one unit ~ one token
// through the whole model). A use adds 1. The victim is the unprotected
// resident object with the lowest current score. Decay lets the cache follow
// each request's hot experts (SGLang's counter saturates at 255 and never
// forgets, so old favourites squat); remembering scores across evictions
// lets a returning object beat one-off visitors (plain LRU cycles through
// all of them and hits nothing once a token's working set exceeds the cache).
// Scores are stored as log(score) + now*ln2/half_life, which does not change
// with time, so resident objects stay ordered without updates.
class DecayLfu final : public Policy {
 public:
  DecayLfu(const ObjectSpace& space, uint64_t cap, double half_life_tokens)
      : Policy(space, cap),
        rate_(std::log(2.0) / (half_life_tokens * std::max<uint32_t>(1, space.num_active_layers()))),
        norm_(space.num_objects(), -std::numeric_limits<double>::infinity()),
        order_(space.num_objects()) {}
  std::string name() const override { return "decay-lfu"; }

 protected:
  void OnCall(std::span<const ObjectId> keys, bool) override {
    now_ += 1.0;
    for (ObjectId k : keys) order_.Hold(k);
  }
  void OnCallEnd() override { order_.ReleaseHeld(); }
  void OnHit(ObjectId k) override { Bump(k); }
  void OnInsert(ObjectId k, bool) override { Bump(k); }
  void OnRemove(ObjectId k) override { order_.Erase(k); }
  ObjectId PickVictim(bool, std::span<const ObjectId> call, const PinCounts* pins) override {
    const uint32_t v = order_.FirstNot([&](uint32_t id) { return Protected(id, call, pins); });
    return v == ScoreOrder::kNone ? kNoObject : v;
  }

 private:
  void Bump(ObjectId k) {
    double t = now_ * rate_;
    double current = std::isinf(norm_[k]) ? 0.0 : std::exp(norm_[k] - t);
    norm_[k] = std::log(current + 1.0) + t;
    order_.Set(k, {norm_[k], ~++seq_counter_});
  }
  double rate_;
  double now_ = 0;
  uint64_t seq_counter_ = 0;
  std::vector<double> norm_;
  ScoreOrder order_;
};


// Ours, the default recommendation: per-layer quotas + decayed frequency.
// Kimi-K3 routes every token through all 92 layers, 16 experts each, so a
// token touches ~1,472 objects: more than a small cache holds. Global LRU then
// evicts every object before its layer comes round again (0% hits at SGLang's
// 5 GiB). Here each layer is entitled to an equal share of the bytes; a miss
// evicts from the layer furthest over its share, so every layer keeps its
// best objects resident across tokens. Inside a layer the victim is the
// object with the lowest decayed use count, time measured in that layer's
// own calls (tokens):
//   score = sum over past uses of 2^-(calls since the use / half_life)
// which ranks the previous token's experts above older ones while letting a
// request's recurring experts outrank one-off visitors. Scores persist across
// eviction; ties evict the newest. Stored as log(score) + t*ln2/half_life so
// a layer's residents stay ordered without updates as time passes.
class QuotaDecay final : public Policy {
 public:
  QuotaDecay(const ObjectSpace& space, uint64_t cap, double half_life_calls)
      : Policy(space, cap),
        rate_(std::log(2.0) / half_life_calls),
        now_(space.num_active_layers(), 0.0),
        layer_bytes_(space.num_active_layers(), 0),
        norm_(space.num_objects(), -std::numeric_limits<double>::infinity()) {
    // One ranking per layer, over its experts.
    order_.reserve(space.num_active_layers());
    for (uint32_t l = 0; l < space.num_active_layers(); ++l) order_.emplace_back(space.num_experts);
    quota_ = space.num_active_layers() ? cap / space.num_active_layers() : cap;
    while (leaves_ < space.num_active_layers()) leaves_ *= 2;
    weight_.assign(leaves_, -2);
    for (uint32_t l = 0; l < space.num_active_layers(); ++l) weight_[l] = -1;
    winner_.assign(2 * leaves_, 0);
    for (uint32_t i = 0; i < leaves_; ++i) winner_[leaves_ + i] = i;
    for (uint32_t n = leaves_; n-- > 1;) winner_[n] = Better(winner_[2 * n], winner_[2 * n + 1]);
    tried_.reserve(space.num_active_layers());  // PickVictim's scan never allocates
  }
  std::string name() const override { return "quota-decay"; }

 protected:
  void OnCall(std::span<const ObjectId> keys, bool) override {
    if (keys.empty()) return;
    held_layer_ = space_.LayerIndexOf(keys[0]);  // a call's keys are all of one layer
    now_[held_layer_] += 1.0;
    for (ObjectId k : keys) order_[held_layer_].Hold(space_.ExpertOf(k));
  }
  void OnCallEnd() override {
    if (held_layer_ != kNoLayer) order_[held_layer_].ReleaseHeld();
    held_layer_ = kNoLayer;
  }
  void OnHit(ObjectId k) override { Bump(k); }
  void OnInsert(ObjectId k, bool) override {
    const uint32_t l = space_.LayerIndexOf(k);
    layer_bytes_[l] += space_.Cost(k);
    Bump(k);
    Replay(l);
  }
  void OnRemove(ObjectId k) override {
    uint32_t l = space_.LayerIndexOf(k);
    order_[l].Erase(space_.ExpertOf(k));
    layer_bytes_[l] -= space_.Cost(k);
    Replay(l);
  }
  ObjectId PickVictim(bool, std::span<const ObjectId> call, const PinCounts* pins) override {
    // Layers by excess over their quota, largest first (the first layer among
    // equals); first evictable object wins. The tournament tree gives the
    // first choice and, when all of that layer's residents are protected (a
    // call's own layer, held out of its ranking), the second; only when that
    // one fails too (pinned objects) are the others ranked by a scan.
    const uint32_t L = space_.num_active_layers();
    const uint32_t first = winner_[1];
    if (first >= L || order_[first].empty()) return kNoObject;
    ObjectId v = FirstEvictable(first, call, pins);
    if (v != kNoObject) return v;
    const uint32_t second = WinnerWithout(first);
    if (second >= L || order_[second].empty()) return kNoObject;
    v = FirstEvictable(second, call, pins);
    if (v != kNoObject) return v;
    tried_.assign(L, 0);
    tried_[first] = tried_[second] = 1;
    for (uint32_t round = 2; round < L; ++round) {
      int64_t best_excess = INT64_MIN;
      uint32_t best = UINT32_MAX;
      for (uint32_t l = 0; l < L; ++l) {
        if (tried_[l] || order_[l].empty()) continue;
        int64_t excess = static_cast<int64_t>(layer_bytes_[l]) - static_cast<int64_t>(quota_);
        if (excess > best_excess) { best_excess = excess; best = l; }
      }
      if (best == UINT32_MAX) break;
      v = FirstEvictable(best, call, pins);
      if (v != kNoObject) return v;
      tried_[best] = 1;
    }
    return kNoObject;
  }

 private:
  static constexpr uint32_t kNoLayer = UINT32_MAX;
  ObjectId FirstEvictable(uint32_t l, std::span<const ObjectId> call, const PinCounts* pins) {
    const uint32_t e = order_[l].FirstNot([&](uint32_t x) { return Protected(space_.Id(l, x), call, pins); });
    return e == ScoreOrder::kNone ? kNoObject : space_.Id(l, e);
  }
  void Bump(ObjectId k) {
    uint32_t l = space_.LayerIndexOf(k);
    double t = now_[l] * rate_;
    double current = std::isinf(norm_[k]) ? 0.0 : std::exp(norm_[k] - t);
    norm_[k] = std::log(current + 1.0) + t;
    order_[l].Set(space_.ExpertOf(k), {norm_[k], ~++seq_counter_});
  }
  // Tournament tree over the layers: winner_[n] is the layer with the most
  // bytes (the lower index among equals) under node n; empty layers (weight
  // -1) and the padding leaves (-2) never win against a layer with residents.
  uint32_t Better(uint32_t a, uint32_t b) const {
    const int64_t wa = weight_[a], wb = weight_[b];
    return wb > wa || (wb == wa && b < a) ? b : a;
  }
  void Replay(uint32_t l) {
    weight_[l] = order_[l].empty() ? -1 : static_cast<int64_t>(layer_bytes_[l]);
    for (uint32_t n = (leaves_ + l) / 2; n >= 1; n /= 2) winner_[n] = Better(winner_[2 * n], winner_[2 * n + 1]);
  }
  // The tree's winner if layer `skip` took no part: along skip's path to the
  // root, its siblings' winners are exactly the other layers' subtrees.
  uint32_t WinnerWithout(uint32_t skip) const {
    uint32_t best = kNoLayer;
    for (uint32_t n = leaves_ + skip; n > 1; n /= 2) {
      const uint32_t other = winner_[n ^ 1];
      best = best == kNoLayer ? other : Better(best, other);
    }
    return best;
  }
  uint32_t leaves_ = 1;
  std::vector<int64_t> weight_;  // per leaf
  std::vector<uint32_t> winner_;
  double rate_;
  uint64_t quota_ = 0;
  uint64_t seq_counter_ = 0;
  std::vector<double> now_;
  std::vector<uint64_t> layer_bytes_;
  std::vector<double> norm_;
  std::vector<ScoreOrder> order_;
  uint32_t held_layer_ = kNoLayer;
  std::vector<uint8_t> tried_;
};

}  // namespace

std::vector<std::string> PolicyNames() {
  return {"reuse-lfu-lru-v2", "lru", "decay-lfu", "quota-decay", "request-aware", "adaptive"};
}

Result<std::unique_ptr<Policy>> MakePolicy(const std::string& name, const ObjectSpace& space,
                                           uint64_t capacity_bytes) {
  if (name == "reuse-lfu-lru-v2") return std::unique_ptr<Policy>(new ReuseLfuLruV2(space, capacity_bytes));
  if (name == "lru") return std::unique_ptr<Policy>(new Lru(space, capacity_bytes));
  if (name == "decay-lfu") return std::unique_ptr<Policy>(new DecayLfu(space, capacity_bytes, 8.0));
  if (name == "adaptive") return MakeAdaptivePolicy(space, capacity_bytes);
  // Half-life 64 tokens: long enough to learn a request's favourites, short
  // enough to follow a drifting one (docs/store.md).
  if (name == "request-aware") return MakeRequestAwarePolicy(space, capacity_bytes, 64.0);
  if (name == "quota-decay") {
    // Half-life: one token, or as many tokens as the cache holds token
    // working sets (92 x 16 objects for K3) when it is larger than one.
    double per_token = double(space.num_active_layers()) * space.top_k * double(space.max_object_bytes());
    double half_life = per_token > 0 ? std::max(1.0, double(capacity_bytes) / per_token) : 1.0;
    return std::unique_ptr<Policy>(new QuotaDecay(space, capacity_bytes, half_life));
  }
  std::string known;
  for (const auto& n : PolicyNames()) known += (known.empty() ? "" : ", ") + n;
  return Error("unknown cache policy '" + name + "' (known: " + known + ")", ErrorKind::kValue);
}

}  // namespace k3pack::store
