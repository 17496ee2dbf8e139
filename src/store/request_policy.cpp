// "request-aware": evicts the object least likely to be routed at the next
// token of any active request, with every probability learned from the
// routes (docs/store.md, "Request-aware eviction").
//
// A request's next route at a layer is, to a good approximation, either one
// of its own previous token's experts at that layer (routers keep some
// experts from token to token) or a draw from its own popularity. So the
// policy keeps, per request: its previous token's experts per layer; a
// count table (a Cluster: one per request today; requests of one domain
// could share one) of its arrivals, the routes its previous token at that
// layer did not have, decayed per token; and one global reuse rate rho (the
// share of a row's routes its request's previous token at that layer also
// had). For request r and object o = (layer l, expert e):
//   q    = arrivals(l, e) / tokens(l), smoothed: the chance of a fresh draw
//   p_r  = rho + (1 - rho) q  if e was in r's previous token at l, else q
//   score(o) = 1 - prod over active requests r of (1 - p_r)
// which is the distribution-informed bound's rule with learned estimates
// in place of the generator's truth.
//
// Scores change only when a request routes at a layer (its previous-token
// set and counts there), when the active set or rho changes, or as the
// counts' normalization moves; residents sit in one RankedSet and only those
// objects are re-scored (a layer at a time when its normalization has moved
// by a few percent, everything when the active set or rho changes).
//
// Requests come from CallRows; a call without them is one row of the
// request "unknown" (the call's distinct experts), so the policy degrades to
// a single stream. A request is active until it has not called for two
// rounds of every active request through every layer.
#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <utility>

#include "store/policy.h"
#include "store/ranked_set.h"

namespace k3pack::store {
namespace {

constexpr uint64_t kUnknownRequest = UINT64_MAX;

class RequestAware final : public Policy {
 public:
  RequestAware(const ObjectSpace& space, uint64_t cap, double half_life_tokens)
      : Policy(space, cap),
        L_(space.num_active_layers()),
        E_(space.num_experts),
        gamma_(half_life_tokens > 0 ? std::exp2(-1.0 / half_life_tokens) : 1.0),
        order_(space.num_objects()),
        stamp_of_(space.num_objects(), 0),
        resident_(space.num_objects(), 0),
        prev_mask_(space.num_objects(), 0) {}
  std::string name() const override { return "request-aware"; }

 protected:
  void OnCall(std::span<const ObjectId> keys, bool) override {
    // The previous call's keys return to the order (see pending_).
    for (ObjectId k : pending_)
      if (resident_[k]) Place(k);
    pending_.assign(keys.begin(), keys.end());
    for (ObjectId k : keys) order_.Erase(k);
    if (keys.empty()) return;
    ++calls_;
    const uint32_t l = space_.LayerIndexOf(keys[0]);
    CallRows own;
    const CallRows* rows = call_rows();
    if (rows == nullptr || rows->width == 0 || rows->keys.empty()) {
      own.keys = keys;
      own.requests = {&kUnknownRequest, 1};
      own.width = static_cast<uint32_t>(keys.size());
      rows = &own;
    }
    for (ObjectId k : keys) stamp_of_[k] = ++stamp_;
    touched_.clear();
    touched_clusters_.clear();
    for (uint32_t row = 0; row < rows->rows(); ++row) {
      const uint32_t r = Touch(rows->request(row));
      Req& q = reqs_[r];
      cur_.clear();
      for (ObjectId k : rows->keys.subspan(size_t{row} * rows->width, rows->width))
        cur_.push_back(static_cast<uint16_t>(space_.ExpertOf(k)));
      std::sort(cur_.begin(), cur_.end());
      cur_.erase(std::unique(cur_.begin(), cur_.end()), cur_.end());
      auto& prev = q.prev[l];
      if (!prev.empty()) {
        uint32_t shared = 0;
        for (uint16_t e : cur_) shared += std::binary_search(prev.begin(), prev.end(), e);
        reuse_num_ = reuse_num_ * kReuseDecay + shared;
        reuse_den_ = reuse_den_ * kReuseDecay + double(cur_.size());
      }
      for (uint16_t e : prev) touched_.push_back(space_.Id(l, e));
      for (uint16_t e : cur_) touched_.push_back(space_.Id(l, e));
      if (q.pos < 64) {  // the active requests' previous-token masks (see Score)
        const uint64_t bit = uint64_t{1} << q.pos;
        for (uint16_t e : prev) prev_mask_[space_.Id(l, e)] &= ~bit;
        for (uint16_t e : cur_) prev_mask_[space_.Id(l, e)] |= bit;
      }
      old_.swap(prev);
      prev = cur_;
      Cluster& c = clusters_[q.cluster];
      c.tokens[l] += 1;
      c.up[l] /= gamma_;
      float* counts = c.counts.data() + size_t{l} * E_;
      // Only arrivals count (routes the request's previous token at this
      // layer did not have): a kept expert says little about popularity.
      for (uint16_t e : cur_)
        if (!std::binary_search(old_.begin(), old_.end(), e)) counts[e] += static_cast<float>(c.up[l]);
      touched_clusters_.push_back(q.cluster);
    }
    Expire();
    const double rho = Rho();
    if (std::abs(rho - rho_) > 0.01) {
      rho_ = rho;
      active_changed_ = true;
    }
    if (active_changed_) {
      active_changed_ = false;
      RebuildMasks();
      for (uint32_t a : active_)
        for (uint32_t li = 0; li < L_; ++li) Snapshot(clusters_[reqs_[a].cluster], li);
      for (uint32_t li = 0; li < L_; ++li) RerankLayer(li);
      return;
    }
    bool stale = false;
    for (uint32_t ci : touched_clusters_) {
      Cluster& c = clusters_[ci];
      const double n = c.snap_n[l];
      if (c.tokens[l] - c.snap_tokens[l] >= std::clamp(kRenormShare * n, 1.0, 16.0)) {
        Snapshot(c, l);
        stale = true;
      }
    }
    if (stale) {
      RerankLayer(l);
    } else {
      for (ObjectId k : touched_)
        if (order_.Contains(k)) Place(k);
    }
  }
  void OnHit(ObjectId) override {}
  void OnInsert(ObjectId k, bool demand) override {
    resident_[k] = 1;
    if (!demand) Place(k);  // a demand insert is the call's key: pending
  }
  void OnRemove(ObjectId k) override {
    resident_[k] = 0;
    order_.Erase(k);
  }
  ObjectId PickVictim(bool, std::span<const ObjectId> call, const PinCounts* pins) override {
    const uint32_t v = order_.FirstNot([&](uint32_t id) { return Protected(id, call, pins); });
    return v == decltype(order_)::kNone ? kNoObject : v;
  }

 private:
  static constexpr double kReuseDecay = 1.0 - 1.0 / 4096.0;  // rows
  static constexpr double kPrior = 2.0;                      // tokens of a flat popularity
  static constexpr double kRenormShare = 0.08;  // re-rank a layer when its token count grew by this
  static constexpr uint32_t kMaxRequests = 256, kMaxClusters = 64;

  struct Cluster {
    std::vector<float> counts;         // [layer][expert], times up[layer] at the count
    std::vector<double> up;            // per layer: gamma^-tokens
    std::vector<uint32_t> tokens;      // per layer
    // Scoring snapshot per layer: q = counts * a + b, taken at snap_tokens.
    std::vector<double> a, b, snap_n;
    std::vector<uint32_t> snap_tokens;
    uint64_t last_use = 0;
  };
  struct Req {
    uint64_t id = 0;
    uint32_t cluster = 0;
    uint64_t last_call = 0;
    bool active = false;
    uint32_t pos = 64;  // index in active_ when below 64 (its bit in prev_mask_)
    std::vector<std::vector<uint16_t>> prev;  // per layer, sorted
  };

  double Rho() const { return (reuse_num_ + 0.3 * 16) / (reuse_den_ + 16); }

  // The request's slot, created (with a fresh cluster) or re-activated.
  uint32_t Touch(uint64_t id) {
    auto it = slot_of_.find(id);
    uint32_t r;
    if (it != slot_of_.end()) {
      r = it->second;
    } else {
      if (reqs_.size() < kMaxRequests) {
        r = static_cast<uint32_t>(reqs_.size());
        reqs_.emplace_back();
      } else {
        r = UINT32_MAX;
        for (uint32_t i = 0; i < reqs_.size(); ++i)
          if (!reqs_[i].active && (r == UINT32_MAX || reqs_[i].last_call < reqs_[r].last_call)) r = i;
        if (r == UINT32_MAX) r = 0;  // more active requests than slots: share the first
        slot_of_.erase(reqs_[r].id);
        if (reqs_[r].active) Deactivate(r);
      }
      Req& q = reqs_[r];
      q.id = id;
      q.prev.assign(L_, {});
      q.cluster = NewCluster();
      slot_of_[id] = r;
    }
    Req& q = reqs_[r];
    q.last_call = calls_;
    clusters_[q.cluster].last_use = calls_;
    if (!q.active) {
      q.active = true;
      active_.push_back(r);
      q.pos = static_cast<uint32_t>(active_.size() - 1);
      active_changed_ = true;
    }
    return r;
  }
  void Deactivate(uint32_t r) {
    reqs_[r].active = false;
    reqs_[r].pos = 64;
    active_.erase(std::find(active_.begin(), active_.end(), r));
    active_changed_ = true;
  }
  // Requests silent for two rounds of all active requests through all layers.
  void Expire() {
    const uint64_t window = 2ull * L_ * std::max<size_t>(1, active_.size());
    for (size_t i = 0; i < active_.size();) {
      const uint32_t r = active_[i];
      if (calls_ - reqs_[r].last_call > window) {
        Deactivate(r);
      } else {
        ++i;
      }
    }
  }
  uint32_t NewCluster() {
    uint32_t c = UINT32_MAX;
    if (clusters_.size() < kMaxClusters) {
      c = static_cast<uint32_t>(clusters_.size());
      clusters_.emplace_back();
    } else {
      std::vector<uint8_t> used(clusters_.size(), 0);
      for (uint32_t r : active_) used[reqs_[r].cluster] = 1;
      for (uint32_t i = 0; i < clusters_.size(); ++i)
        if (!used[i] && (c == UINT32_MAX || clusters_[i].last_use < clusters_[c].last_use)) c = i;
      if (c == UINT32_MAX) return 0;  // all in use: share
    }
    Cluster& cl = clusters_[c];
    cl.counts.assign(size_t{L_} * E_, 0.0f);
    cl.up.assign(L_, 1.0);
    cl.tokens.assign(L_, 0);
    cl.a.assign(L_, 0.0);
    cl.b.assign(L_, 0.0);
    cl.snap_n.assign(L_, 0.0);
    cl.snap_tokens.assign(L_, 0);
    for (uint32_t l = 0; l < L_; ++l) Snapshot(cl, l);
    cl.last_use = calls_;
    return c;
  }
  void Snapshot(Cluster& c, uint32_t l) {
    if (c.up[l] > 1e12) {  // rebase the stored counts (float range)
      const float s = static_cast<float>(1.0 / c.up[l]);
      float* counts = c.counts.data() + size_t{l} * E_;
      for (uint32_t e = 0; e < E_; ++e) counts[e] *= s;
      c.up[l] = 1.0;
    }
    const uint32_t t = c.tokens[l];
    const double n = gamma_ < 1.0 ? (1.0 - std::pow(gamma_, t)) / (1.0 - gamma_) : double(t);
    c.a[l] = 1.0 / (c.up[l] * (n + kPrior));
    c.b[l] = kPrior * double(space_.top_k) * (1.0 - rho_) / double(E_) / (n + kPrior);
    c.snap_n[l] = n + kPrior;
    c.snap_tokens[l] = t;
  }
  float Score(ObjectId o) const {
    const uint32_t l = space_.LayerIndexOf(o);
    const uint16_t e = static_cast<uint16_t>(space_.ExpertOf(o));
    double none = 1.0;
    const uint64_t mask = prev_mask_[o];
    for (size_t i = 0; i < active_.size(); ++i) {
      const Req& q = reqs_[active_[i]];
      const Cluster& c = clusters_[q.cluster];
      const double fresh = std::min(1.0, double(c.counts[size_t{l} * E_ + e]) * c.a[l] + c.b[l]);
      bool in_prev;
      if (i < 64) {
        in_prev = (mask >> i) & 1;
      } else {
        const auto& pv = q.prev[l];
        in_prev = std::binary_search(pv.begin(), pv.end(), e);
      }
      none *= 1.0 - (in_prev ? rho_ + (1.0 - rho_) * fresh : fresh);
    }
    return static_cast<float>(1.0 - none);
  }
  // prev_mask_[o] bit i: active_[i] routed o at its previous token (i < 64).
  void RebuildMasks() {
    std::fill(prev_mask_.begin(), prev_mask_.end(), 0);
    for (auto& q : reqs_) q.pos = 64;
    for (size_t i = 0; i < active_.size() && i < 64; ++i) {
      Req& q = reqs_[active_[i]];
      q.pos = static_cast<uint32_t>(i);
      for (uint32_t l = 0; l < L_; ++l)
        for (uint16_t e : q.prev[l]) prev_mask_[space_.Id(l, e)] |= uint64_t{1} << i;
    }
  }
  // Ties (new requests know nothing yet) evict the least recently used.
  void Place(ObjectId k) { order_.Set(k, {Score(k), stamp_of_[k]}); }
  void RerankLayer(uint32_t l) {
    for (uint32_t e = 0; e < E_; ++e) {
      const ObjectId k = space_.Id(l, e);
      if (order_.Contains(k)) Place(k);
    }
  }

  const uint32_t L_, E_;
  const double gamma_;
  uint64_t calls_ = 0, stamp_ = 0;
  double reuse_num_ = 0, reuse_den_ = 0, rho_ = 0.3;
  bool active_changed_ = false;
  std::vector<Req> reqs_;
  std::unordered_map<uint64_t, uint32_t> slot_of_;
  std::vector<uint32_t> active_;
  std::vector<Cluster> clusters_;
  RankedSet<std::pair<float, uint64_t>> order_;
  std::vector<uint64_t> stamp_of_;  // last use, per object
  std::vector<uint8_t> resident_;
  std::vector<uint64_t> prev_mask_;
  // The keys of the last call stay out of the order until the next call:
  // they are protected during their call anyway (a victim search would have
  // to step over them, and a chunked prefill call's many low-ranked keys made
  // that quadratic), and a prefetch admitted between calls should not evict
  // the working set just used.
  std::vector<ObjectId> pending_;
  std::vector<ObjectId> touched_;
  std::vector<uint32_t> touched_clusters_;
  std::vector<uint16_t> cur_, old_;
};

}  // namespace

std::unique_ptr<Policy> MakeRequestAwarePolicy(const ObjectSpace& space, uint64_t capacity_bytes,
                                               double half_life_tokens) {
  return std::make_unique<RequestAware>(space, capacity_bytes, half_life_tokens);
}

}  // namespace k3pack::store
