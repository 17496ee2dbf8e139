// "request-aware": evicts the object least likely to be routed at the next
// token of any active request, with every probability learned from the
// routes (docs/store.md, "Request-aware eviction").
//
// A request's next route at a layer is, to a good approximation, either one
// of its own previous token's experts at that layer (routers keep some
// experts from token to token) or a draw from its own popularity. So the
// policy keeps, per request: its previous token's experts per layer; a
// count table (a Cluster) of its arrivals, the routes its previous token at
// that layer did not have, of the rows whose previous token had each expert
// and of those that routed it again, decayed per token; and one global
// reuse rate rho (the share of a previous token's experts routed again
// beyond what fresh draws explain). For request r and object o = (layer l,
// expert e):
//   q    = the chance of a fresh draw: arrivals over the rows that could
//          have had e arrive, with the held rows' evidence (see Fresh)
//   p_r  = rho + (1 - rho) q  if e was in r's previous token at l, else q
//   score(o) = 1 - prod over active requests r of (1 - p_r)
// which is the distribution-informed bound's rule with learned estimates
// in place of the generator's truth. With keep hints (the router
// look-ahead's predictions, Policy::SetKeepHints) a previous-token expert
// without a hint uses rho_unhinted in place of rho: the look-ahead has
// already named the next token's experts, so the others return far less
// often, and that rate too is learned from the routes.
//
// Scores change only when a request routes at a layer (its previous-token
// set and counts there), when the active set or rho changes, or as the
// counts' normalization moves; residents sit in one RankedSet and only those
// objects are re-scored (a layer at a time when its normalization has moved
// by a few percent, everything when the active set or rho changes).
//
// Learning faster than one request's own routes allow:
// - Pooling. Requests of one kind (a domain, a task) favour the same
//   experts, and a short request is over before it has taught its own
//   table much. A new request's first routes (256 to 4,096 arrivals, a few
//   K3 tokens) are scored against every other cluster's table and against
//   the global one (all tables together); once one cluster's table gives
//   them a clearly larger share than the global table (by 0.06 of a flat
//   share per route, at 4 standard errors) the request's counts move into
//   it and the two rank with one pooled table. The global table is the
//   reference so that popularity every request shares (a skewed router)
//   does not make unrelated requests look alike.
// - Two memories. Each table counts with the policy's half-life (short)
//   and with 1,024 tokens (long): a steady request learns its tail of
//   favourites only with the long one, a drifting one needs the short
//   one. A cluster ranks with the memory that orders its arrivals better
//   (JudgeMemory).
//
// Requests come from CallRows; a call without them is one row of the
// request "unknown" (the call's distinct experts), so the policy degrades to
// a single stream. A request is active until it has not called for two
// rounds of every active request through every layer.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <unordered_map>
#include <utility>

#include "store/policy.h"
#include "store/ranked_set.h"

namespace k3pack::store {
namespace {

constexpr uint64_t kUnknownRequest = kNoRequestId;

class RequestAware final : public Policy {
 public:
  RequestAware(const ObjectSpace& space, uint64_t cap, double half_life_tokens)
      : Policy(space, cap),
        L_(space.num_active_layers()),
        E_(space.num_experts),
        gamma_{half_life_tokens > 0 ? std::exp2(-1.0 / half_life_tokens) : 1.0, std::exp2(-1.0 / kLongHalfLife)},
        order_(space.num_objects()),
        stamp_of_(space.num_objects(), 0),
        resident_(space.num_objects(), 0),
        prev_mask_(space.num_objects(), 0),
        unhinted_(space.num_objects(), 0),
        mark_(space.num_experts, 0) {
  }
  std::string name() const override { return "request-aware"; }
  // Each table's member count is the number of requests that name it.
  std::string BrokenBookkeeping() const override {
    std::vector<uint32_t> naming(clusters_.size(), 0);
    for (const Req& q : reqs_)
      if (q.cluster != kNoCluster) ++naming[q.cluster];
    for (size_t c = 0; c < clusters_.size(); ++c)
      if (naming[c] != clusters_[c].members)
        return "request-aware: cluster " + std::to_string(c) + " counts " + std::to_string(clusters_[c].members) +
               " members, " + std::to_string(naming[c]) + " requests name it";
    return {};
  }

 protected:
  void OnCall(std::span<const ObjectId> keys, bool) override {
    announced_ = true;
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
      // mark_[e]: 2 * row serial if e was in the previous token, + 1 once
      // seen in this row (a row's distinct experts, no sort).
      auto& prev = q.prev[l];
      // After 2^31 rows (~23M K3 tokens) the serial wraps: an expert last
      // marked a wrap ago would read as marked now, so the marks restart.
      if (mark_serial_ >= UINT32_MAX - 2) {
        std::fill(mark_.begin(), mark_.end(), 0);
        mark_serial_ = 0;
      }
      const uint32_t was = mark_serial_ += 2;
      for (uint16_t e : prev) mark_[e] = was;
      cur_.clear();
      arrivals_.clear();
      stayed_.clear();
      // Arrivals (routes the request's previous token at this layer did not
      // have) and stays are counted apart: a stay is mostly a keep, and says
      // little about popularity (see Fresh).
      for (ObjectId k : rows->keys.subspan(size_t{row} * rows->width, rows->width)) {
        const uint16_t e = static_cast<uint16_t>(space_.ExpertOf(k));
        if (mark_[e] == was + 1) continue;
        (mark_[e] == was ? stayed_ : arrivals_).push_back(e);
        mark_[e] = was + 1;
        cur_.push_back(e);
      }
      if (!prev.empty()) {
        // rho is the share of the previous token's experts kept beyond what
        // fresh draws bring back: routed = rho + (1 - rho) * fresh per expert,
        // so rho = (routed - sum fresh) / (count - sum fresh).
        double fresh = 0;
        for (uint16_t e : prev) fresh += PrevFresh(q, l, e);
        reuse_num_ = reuse_num_ * kReuseDecay + double(cur_.size() - arrivals_.size()) - fresh;
        reuse_den_ = reuse_den_ * kReuseDecay + double(prev.size()) - fresh;
        if (keep_hints() != nullptr) CountUnhintedReuse(q, l, prev, was);
      }
      for (uint16_t e : prev) touched_.push_back(space_.Id(l, e));
      for (uint16_t e : cur_) touched_.push_back(space_.Id(l, e));
      if (q.pos < 64) {  // the active requests' previous-token masks (see Score)
        const uint64_t bit = uint64_t{1} << q.pos;
        for (uint16_t e : prev) prev_mask_[space_.Id(l, e)] &= ~bit;
        for (uint16_t e : cur_) prev_mask_[space_.Id(l, e)] |= bit;
      }
      Cluster& c = clusters_[q.cluster];
      // Both judgements score the row before it is counted (a prediction).
      if (l % kJudgeStride == 0) JudgeMemory(c, l);
      if (q.probe_arrivals != kNotProbing) Probe(q, l);
      c.tokens[l] += 1;
      for (int m = 0; m < 2; ++m) {
        KeepInFloatRange(c, l, m);
        c.mem[m].Count(l, E_, gamma_[m], arrivals_, prev, stayed_);
      }
      prev = cur_;
      q.arrived[l] = arrivals_;
      touched_clusters_.push_back(q.cluster);
      if (q.probe_arrivals != kNotProbing) MaybeJoin(r);
    }
    Expire();
    const double rho = Rho();
    if (std::abs(rho - rho_) > 0.01) {
      rho_ = rho;
      active_changed_ = true;
    }
    const double rho_unhinted = RhoUnhinted();
    if (std::abs(rho_unhinted - rho_unhinted_) > std::max(0.002, 0.05 * rho_unhinted_)) {
      rho_unhinted_ = rho_unhinted;
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
  void OnCallEnd() override {
    // The end of a call this policy was not told of (`adaptive` tells it
    // only of calls with request ids) is past the next call for the last
    // one's keys: they return to the order, or they were never evictable
    // while this policy led calls without ids.
    if (!announced_) {
      for (ObjectId k : pending_)
        if (resident_[k]) Place(k);
      pending_.clear();
    }
    announced_ = false;
  }
  void OnHit(ObjectId) override {}
  void OnInsert(ObjectId k, bool demand) override {
    resident_[k] = 1;
    // A demand insert is the call's key: pending, ranked at the next call.
    // A call this policy was not told of (`adaptive` tells it only of calls
    // with request ids) put nothing in pending_: ranked now, or it would
    // never be evicted while this policy leads.
    if (!demand || !announced_) Place(k);
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
  static constexpr double kInCallRebase = 1e30;  // up beyond which a call's row rebases (floats reach 3e38)
  static constexpr double kRenormShare = 0.08;  // re-rank a layer when its token count grew by this
  static constexpr uint32_t kMaxRequests = 256, kMaxClusters = 64;
  // The long memory: long enough to learn a steady request's tail of
  // favourites, finite so that a pooled table still forgets over hours.
  static constexpr double kLongHalfLife = 1024.0;  // tokens
  // Which memory ranks a cluster is judged on every kJudgeStride-th layer
  // (window ~512 judged rows), kJudgePairs pairs per arrival.
  static constexpr uint32_t kJudgeStride = 4, kJudgePairs = 4;
  static constexpr double kJudgeDecay = 1.0 - 1.0 / 512.0;
  // Pooling: a new request's first arrivals (kProbeMin up to kProbeMax) are
  // scored under every other cluster's table and under the global one; it
  // joins the best cluster once that predicts its routes better than the
  // global table by kJoinNats per route (log-likelihood ratio).
  static constexpr uint32_t kProbeMin = 256, kProbeMax = 4096;
  static constexpr uint32_t kNotProbing = UINT32_MAX;
  static constexpr uint32_t kNoCluster = UINT32_MAX;  // Req::cluster of a request whose table was reused
  static constexpr double kJoinGain = 0.06, kJoinZ = 4.0;
  static constexpr double kProbeAlpha = 0.5;  // pseudo-routes per expert in the probe's tables

  // Decayed arrival counts per (layer, expert) at one half-life. Stored
  // counts are scaled by up[layer] = gamma^-rows so a row's decay is one
  // multiply per layer, not per expert.
  struct Memory {
    // Per [layer][expert], times up[layer]. One cell holds all three, as
    // Fresh() reads them together (one cache line, not three).
    struct Cell {
      float counts = 0;   // arrivals
      float present = 0;  // rows whose previous token had it (no arrival possible)
      float stays = 0;    // of those, rows that routed it again
    };
    std::vector<Cell> cells;
    std::vector<double> up;     // per layer: gamma^-rows
    std::vector<double> n;      // per layer: decayed rows (tokens) counted
    std::vector<double> sum;    // per layer: sum of stored counts
    void Reset(uint32_t L, uint32_t E) {
      cells.assign(size_t{L} * E, Cell{});
      up.assign(L, 1.0);
      n.assign(L, 0.0);
      sum.assign(L, 0.0);
    }
    void Count(uint32_t l, uint32_t E, double gamma, const std::vector<uint16_t>& arrivals,
               const std::vector<uint16_t>& prev, const std::vector<uint16_t>& stayed) {
      up[l] /= gamma;
      n[l] = n[l] * gamma + 1.0;
      const float u = static_cast<float>(up[l]);
      Cell* row = cells.data() + size_t{l} * E;
      for (uint16_t e : arrivals) row[e].counts += u;
      for (uint16_t e : prev) row[e].present += u;
      for (uint16_t e : stayed) row[e].stays += u;
      sum[l] += up[l] * double(arrivals.size());
    }
    // Keeps the stored counts within float range.
    void Rebase(uint32_t l, uint32_t E) {
      if (up[l] <= 1e12) return;
      const float s = static_cast<float>(1.0 / up[l]);
      Cell* row = cells.data() + size_t{l} * E;
      for (uint32_t e = 0; e < E; ++e) {
        row[e].counts *= s;
        row[e].present *= s;
        row[e].stays *= s;
      }
      sum[l] /= up[l];
      up[l] = 1.0;
    }
    // Adds `o`'s counts at layer l (another table of the same half-life).
    void Absorb(const Memory& o, uint32_t l, uint32_t E) {
      const double s = up[l] / o.up[l];
      Cell* row = cells.data() + size_t{l} * E;
      const Cell* other = o.cells.data() + size_t{l} * E;
      for (uint32_t e = 0; e < E; ++e) {
        row[e].counts += static_cast<float>(other[e].counts * s);
        row[e].present += static_cast<float>(other[e].present * s);
        row[e].stays += static_cast<float>(other[e].stays * s);
      }
      sum[l] += o.sum[l] * s;
      n[l] += o.n[l];
    }
    // The probe's smoothed share of a layer's arrivals that go to e.
    double Share(uint32_t l, uint32_t E, uint16_t e) const {
      return (cells[size_t{l} * E + e].counts + kProbeAlpha * up[l]) / (sum[l] + kProbeAlpha * up[l] * E);
    }
  };
  // A count table shared by the requests judged alike (one per request
  // until it joins another's), with a short and a long memory.
  struct Cluster {
    Memory mem[2];                  // [0]: the policy's half-life, [1]: kLongHalfLife
    bool use_long = false;          // which memory ranks
    double judge = 0;               // decayed pair score, long minus short
    std::vector<uint32_t> tokens;   // per layer
    // Scoring snapshot per layer, taken at snap_tokens (see Fresh):
    // inv_up = 1 / up, prior = kPrior tokens' worth of a flat arrival rate,
    // snap_n = counted rows + kPrior.
    std::vector<double> inv_up, prior, snap_n;
    std::vector<uint32_t> snap_tokens;
    uint32_t members = 0;           // requests whose table this is
    const Memory& Live() const { return mem[use_long]; }
    uint64_t last_use = 0;
  };
  struct Req {
    uint64_t id = 0;
    uint32_t cluster = 0;
    uint64_t last_call = 0;
    bool active = false;
    uint32_t pos = 64;  // index in active_ when below 64 (its bit in prev_mask_)
    std::vector<std::vector<uint16_t>> prev;  // per layer, distinct experts
    std::vector<std::vector<uint16_t>> arrived;  // per layer, prev's arrivals
    // Pooling probe: routes scored so far (kNotProbing once decided), the
    // log-likelihood of them under each cluster's table and the global one.
    uint32_t probe_arrivals = kNotProbing;
    std::vector<double> gain, gain_sq;
  };

  double Rho() const { return std::clamp((reuse_num_ + 0.3 * 16) / (reuse_den_ + 16), 0.0, 1.0); }
  // Until the hints have taught it, an unhinted expert is kept as often as
  // any other.
  double RhoUnhinted() const {
    return std::clamp((unhinted_num_ + rho_ * 64) / (unhinted_den_ + 64), 0.0, 1.0);
  }
  // The row's previous-token experts at layer l that had no keep hint when
  // last ranked (their marks: `was`, or `was + 1` if this row routes them
  // again), net of fresh draws as for rho.
  void CountUnhintedReuse(const Req& q, uint32_t l, const std::vector<uint16_t>& prev, uint32_t was) {
    for (uint16_t e : prev) {
      if (!unhinted_[space_.Id(l, e)]) continue;
      const double fresh = PrevFresh(q, l, e);
      unhinted_num_ = unhinted_num_ * kReuseDecay + (mark_[e] == was + 1 ? 1.0 : 0.0) - fresh;
      unhinted_den_ = unhinted_den_ * kReuseDecay + 1.0 - fresh;
    }
  }

  // The counts are rebased (Snapshot) at the end of a call, which is enough
  // for a decode call's few rows. A call of thousands of rows of one request
  // (a long prefill chunk) multiplies up by gamma^-rows before that: at about
  // 7,800 rows the float cells overflowed to inf, the scores became NaN and
  // the victim search never ended. So a memory about to leave the range is
  // rebased here, and the cluster's snapshot scale follows it, which leaves
  // every Fresh() unchanged.
  void KeepInFloatRange(Cluster& c, uint32_t l, int m) {
    Memory& mem = c.mem[m];
    const double up = mem.up[l];
    if (up <= kInCallRebase) return;
    mem.Rebase(l, E_);
    if (m == int{c.use_long}) c.inv_up[l] *= up;
  }

  // The request's slot, created (with a fresh cluster) or re-activated.
  uint32_t Touch(uint64_t id) {
    auto it = slot_of_.find(id);
    uint32_t r;
    if (it != slot_of_.end()) {
      r = it->second;
      // Its table was given to another request while it was away (NewCluster).
      if (reqs_[r].cluster == kNoCluster) StartCluster(r);
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
        if (reqs_[r].cluster != kNoCluster) --clusters_[reqs_[r].cluster].members;
      }
      Req& q = reqs_[r];
      q.id = id;
      q.prev.assign(L_, {});
      q.arrived.assign(L_, {});
      q.cluster = kNoCluster;
      StartCluster(r);
      slot_of_[id] = r;
    }
    Req& q = reqs_[r];
    q.last_call = calls_;
    clusters_[q.cluster].last_use = calls_;
    if (!q.active) {
      active_.push_back(r);  // first: a request marked active but not listed never expires
      q.active = true;
      q.pos = static_cast<uint32_t>(active_.size() - 1);
      active_changed_ = true;
    }
    return r;
  }
  // Request r ranks with a fresh table of its own until it joins another.
  void StartCluster(uint32_t r) {
    const uint32_t c = NewCluster();
    Req& q = reqs_[r];
    q.cluster = c;
    ++clusters_[c].members;
    // Probe only when there is another table to join.
    q.probe_arrivals = clusters_.size() > 1 ? 0 : kNotProbing;
    q.gain.assign(clusters_.size(), 0.0);
    q.gain_sq.assign(clusters_.size(), 0.0);
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
  // A fresh cluster: a new one, else the least recently used that no active
  // request ranks with (one no request joined any more first).
  uint32_t NewCluster() {
    uint32_t c = UINT32_MAX;
    if (clusters_.size() < kMaxClusters) {
      c = static_cast<uint32_t>(clusters_.size());
      clusters_.emplace_back();
    } else {
      std::vector<uint8_t> used(clusters_.size(), 0);
      for (uint32_t r : active_) used[reqs_[r].cluster] = 1;
      auto older = [&](uint32_t i, uint32_t j) {
        const bool fi = clusters_[i].members == 0, fj = clusters_[j].members == 0;
        return fi != fj ? fi : clusters_[i].last_use < clusters_[j].last_use;
      };
      for (uint32_t i = 0; i < clusters_.size(); ++i)
        if (!used[i] && (c == UINT32_MAX || older(i, c))) c = i;
      if (c == UINT32_MAX) return 0;  // all in use: share
      // Requests away (inactive) may still name it: they would come back to
      // another request's counts, and their members count, taken off again
      // when their slot is reused, went below zero (wrapping: the table then
      // looked in use for ever). They get a fresh table when they return.
      for (Req& q : reqs_)
        if (!q.active && q.cluster == c) q.cluster = kNoCluster;
      // Probes that scored against the old table must not join the new one.
      for (uint32_t r : active_)
        if (reqs_[r].probe_arrivals != kNotProbing && c < reqs_[r].gain.size())
          reqs_[r].gain[c] = -std::numeric_limits<double>::infinity();
    }
    Cluster& cl = clusters_[c];
    for (Memory& m : cl.mem) m.Reset(L_, E_);
    cl.use_long = false;
    cl.judge = 0;
    cl.tokens.assign(L_, 0);
    cl.inv_up.assign(L_, 1.0);
    cl.prior.assign(L_, 0.0);
    cl.snap_n.assign(L_, 0.0);
    cl.snap_tokens.assign(L_, 0);
    cl.members = 0;
    for (uint32_t l = 0; l < L_; ++l) Snapshot(cl, l);
    cl.last_use = calls_;
    return c;
  }
  void Snapshot(Cluster& c, uint32_t l) {
    for (Memory& m : c.mem) m.Rebase(l, E_);
    const Memory& m = c.mem[c.use_long];
    const double n = m.n[l];
    c.inv_up[l] = 1.0 / m.up[l];
    c.prior[l] = kPrior * double(space_.top_k) * (1.0 - rho_) / double(E_);
    c.snap_n[l] = n + kPrior;
    c.snap_tokens[l] = c.tokens[l];
  }

  // Which memory ranks this cluster's routes better: a request whose
  // favourites drift needs the short one, a steady (or long pooled) one
  // learns its tail only with the long one. What eviction needs is the
  // order, so each judged row scores both memories on pairs: each arrival
  // against kJudgePairs experts drawn at random from those the row did not
  // route, +1 where the memory counts the arrival higher, -1 where lower
  // (the area under its ROC curve). A proper score of the counts as
  // probabilities (Brier) favoured the long memory's smoother but stale
  // counts on fast drift. The policy ranks with the memory ahead.
  void JudgeMemory(Cluster& c, uint32_t l) {
    const Memory::Cell* s = c.mem[0].cells.data() + size_t{l} * E_;
    const Memory::Cell* g = c.mem[1].cells.data() + size_t{l} * E_;
    const uint32_t routed = mark_serial_ + 1;  // this row's experts (see OnCall)
    double d = 0;
    for (uint16_t e : arrivals_)
      for (uint32_t k = 0; k < kJudgePairs; ++k) {
        rng_ ^= rng_ << 13;
        rng_ ^= rng_ >> 7;
        rng_ ^= rng_ << 17;
        const uint32_t f = static_cast<uint32_t>(rng_ % E_);
        if (mark_[f] == routed) continue;
        d += ((g[e].counts > g[f].counts) - (g[e].counts < g[f].counts)) -
             ((s[e].counts > s[f].counts) - (s[e].counts < s[f].counts));
      }
    c.judge = c.judge * kJudgeDecay + d;
    const bool want = c.judge > 0;
    if (want != c.use_long) {
      c.use_long = want;
      active_changed_ = true;  // every layer re-snapshotted and re-ranked
    }
  }

  // Scores this row's arrivals under every other cluster's long table
  // against the global one (all clusters' long tables together). A table's
  // score for a route to e is E * share(e) - 1: zero on average over routes
  // unrelated to the table (the shares sum to one), however sparse or
  // skewed the table; positive where the routes go to its favourites.
  void Probe(Req& q, uint32_t l) {
    const uint32_t n = std::min<uint32_t>(static_cast<uint32_t>(q.gain.size()), static_cast<uint32_t>(clusters_.size()));
    const size_t A = arrivals_.size();
    gx_.assign(A, 0.0);
    double total = 0;
    for (const Cluster& c : clusters_) {
      if (c.members == 0) continue;
      const Memory& m = c.mem[1];
      const double inv = 1.0 / m.up[l];
      const Memory::Cell* row = m.cells.data() + size_t{l} * E_;
      for (size_t i = 0; i < A; ++i) gx_[i] += row[arrivals_[i]].counts * inv;
      total += m.sum[l] * inv;
    }
    for (size_t i = 0; i < A; ++i) gx_[i] = double(E_) * (gx_[i] + kProbeAlpha) / (total + kProbeAlpha * E_);
    for (uint32_t ci = 0; ci < n; ++ci) {
      if (ci == q.cluster || clusters_[ci].members == 0) continue;
      const Memory& m = clusters_[ci].mem[1];
      if (m.sum[l] <= 0) continue;
      for (size_t i = 0; i < A; ++i) {
        const double d = double(E_) * m.Share(l, E_, arrivals_[i]) - gx_[i];
        q.gain[ci] += d;
        q.gain_sq[ci] += d * d;
      }
    }
    q.probe_arrivals += static_cast<uint32_t>(A);
  }
  // Joins the cluster whose table beats the global one by kJoinGain per
  // route on average, at kJoinZ standard errors; gives up after kProbeMax.
  void MaybeJoin(uint32_t r) {
    Req& q = reqs_[r];
    if (q.probe_arrivals < kProbeMin) return;
    uint32_t best = UINT32_MAX;
    const uint32_t n = std::min<uint32_t>(static_cast<uint32_t>(q.gain.size()), static_cast<uint32_t>(clusters_.size()));
    for (uint32_t ci = 0; ci < n; ++ci)
      if (ci != q.cluster && clusters_[ci].members > 0 && (best == UINT32_MAX || q.gain[ci] > q.gain[best])) best = ci;
    bool join = false;
    if (best != UINT32_MAX && clusters_[q.cluster].members == 1) {
      const double k = q.probe_arrivals, mean = q.gain[best] / k;
      const double var = std::max(0.0, q.gain_sq[best] / k - mean * mean);
      join = mean >= kJoinGain && mean * mean * k >= kJoinZ * kJoinZ * var;
    }
    if (join) {
      Join(r, best);
    } else if (q.probe_arrivals < kProbeMax) {
      return;
    }
    q.probe_arrivals = kNotProbing;
    std::vector<double>().swap(q.gain);
    std::vector<double>().swap(q.gain_sq);
  }
  // The request's counts move into cluster `to`, which it ranks with from now on.
  void Join(uint32_t r, uint32_t to) {
    Req& q = reqs_[r];
    Cluster& from = clusters_[q.cluster];
    Cluster& c = clusters_[to];
    for (uint32_t l = 0; l < L_; ++l) {
      for (int m = 0; m < 2; ++m) c.mem[m].Absorb(from.mem[m], l, E_);
      c.tokens[l] += from.tokens[l];
    }
    from.members = 0;
    from.last_use = 0;
    q.cluster = to;
    ++c.members;
    c.last_use = calls_;
    active_changed_ = true;
  }

  // The chance of a fresh draw of e at the cluster's next row at layer l,
  // smoothed by kPrior rows of a flat rate. Two kinds of rows tell it:
  // - a row whose previous token did not hold e (an open row) is one fresh
  //   draw's chance to route it, an arrival when it did;
  // - a row whose previous token held it kept it with chance rho and
  //   otherwise was such a chance too: per row (1 - rho) of a trial, and of
  //   its stays all but rho per row were fresh draws.
  // Over all rows and arrivals alone, a favourite routed at most tokens
  // would look rare (its repeats are not arrivals); over open rows alone,
  // one routed at nearly every token has nothing to learn from. The held
  // rows are much noisier (a keep is a coin of chance rho, worth little
  // beside a tail expert's rare arrivals), so they count with the weight
  // inverse-variance gives them against an open row, at the open rows'
  // estimate f0: (1 - rho)^2 f0 (1 - f0) / (p0 (1 - p0)), p0 = rho + (1 -
  // rho) f0. That is ~0.05 for a tail expert and ~0.5 for a favourite.
  // `left_out` arrivals (and their rows) are taken off first: see PrevFresh.
  double Fresh(const Cluster& c, uint32_t l, uint16_t e, double left_out = 0) const {
    const size_t i = size_t{l} * E_ + e;
    const Memory::Cell& m = c.Live().cells[i];
    const double held = double(m.present) * c.inv_up[l];
    const double arrivals = std::max(0.0, double(m.counts) * c.inv_up[l] - left_out);
    const double open = std::max(kPrior, c.snap_n[l] - left_out - held);
    const double f0 = std::min(1.0, (arrivals + c.prior[l]) / open);
    const double p0 = rho_ + (1.0 - rho_) * f0;
    const double weight = (1.0 - rho_) * (1.0 - rho_) * f0 * (1.0 - f0) / std::max(1e-9, p0 * (1.0 - p0));
    const double drawn = arrivals + weight * (double(m.stays) * c.inv_up[l] - rho_ * held);
    const double trials = open + weight * (1.0 - rho_) * held;
    return std::clamp((drawn + c.prior[l]) / trials, 0.0, 1.0);
  }
  // Fresh() of an expert of request q's previous token at layer l, as the
  // reuse rates need it: an expert that arrived at that token is judged
  // without that arrival. Counting it, every one-off that just arrived
  // looks a little popular, the fresh draws seem to explain more of the
  // reuse than they do, and rho comes out low (a few tenths of a point of
  // hits lost on small caches of side-by-side requests).
  double PrevFresh(const Req& q, uint32_t l, uint16_t e) const {
    const auto& arrived = q.arrived[l];
    const bool just_arrived = std::find(arrived.begin(), arrived.end(), e) != arrived.end();
    return Fresh(clusters_[q.cluster], l, e, just_arrived ? 1.0 : 0.0);
  }

  float Score(ObjectId o) const {
    const uint32_t l = space_.LayerIndexOf(o);
    const uint16_t e = static_cast<uint16_t>(space_.ExpertOf(o));
    double none = 1.0;
    // A previous-token expert the look-ahead does not predict for the next
    // call is kept much less often than rho says (unhinted_, set by Place).
    const double reuse = unhinted_[o] ? rho_unhinted_ : rho_;
    const uint64_t mask = prev_mask_[o];
    for (size_t i = 0; i < active_.size(); ++i) {
      const Req& q = reqs_[active_[i]];
      const Cluster& c = clusters_[q.cluster];
      const double fresh = Fresh(c, l, e);
      bool in_prev;
      if (i < 64) {
        in_prev = (mask >> i) & 1;
      } else {
        const auto& pv = q.prev[l];
        in_prev = std::find(pv.begin(), pv.end(), e) != pv.end();
      }
      none *= 1.0 - (in_prev ? reuse + (1.0 - reuse) * fresh : fresh);
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
  void Place(ObjectId k) {
    if (const PinCounts* keep = keep_hints()) unhinted_[k] = (*keep)[k] == 0;
    const float score = Score(k);
    // A NaN would rank nowhere; evicted first rather than lost in the order.
    order_.Set(k, {std::isnan(score) ? 0.0f : score, stamp_of_[k]});
  }
  void RerankLayer(uint32_t l) {
    for (uint32_t e = 0; e < E_; ++e) {
      const ObjectId k = space_.Id(l, e);
      if (order_.Contains(k)) Place(k);
    }
  }

  const uint32_t L_, E_;
  const double gamma_[2];  // per row: short (the policy's half-life), long
  uint64_t calls_ = 0, stamp_ = 0;
  double reuse_num_ = 0, reuse_den_ = 0, rho_ = 0.3;
  // With keep hints: how often a previous-token expert that had no hint when
  // it was last ranked is routed again by its request's next token. With
  // 95%-accurate predictions that is a few percent, not rho's ~30%.
  double unhinted_num_ = 0, unhinted_den_ = 0, rho_unhinted_ = 0.3;
  bool active_changed_ = false;
  bool announced_ = false;  // inside a call OnCall was told of
  std::vector<Req> reqs_;
  std::unordered_map<uint64_t, uint32_t> slot_of_;
  std::vector<uint32_t> active_;
  std::vector<Cluster> clusters_;
  RankedSet<std::pair<float, uint64_t>> order_;
  std::vector<uint64_t> stamp_of_;  // last use, per object
  std::vector<uint8_t> resident_;
  std::vector<uint64_t> prev_mask_;
  std::vector<uint8_t> unhinted_;  // per object: no keep hint when last ranked
  // The keys of the last call stay out of the order until the next call:
  // they are protected during their call anyway (a victim search would have
  // to step over them, and a chunked prefill call's many low-ranked keys made
  // that quadratic), and a prefetch admitted between calls should not evict
  // the working set just used.
  std::vector<ObjectId> pending_;
  std::vector<ObjectId> touched_;
  std::vector<uint32_t> touched_clusters_;
  std::vector<uint16_t> cur_, arrivals_, stayed_;
  std::vector<double> gx_;
  std::vector<uint32_t> mark_;  // per expert, see OnCall
  uint32_t mark_serial_ = 0;
  uint64_t rng_ = 0x9e3779b97f4a7c15ull;
};

}  // namespace

std::unique_ptr<Policy> MakeRequestAwarePolicy(const ObjectSpace& space, uint64_t capacity_bytes,
                                               double half_life_tokens) {
  return std::make_unique<RequestAware>(space, capacity_bytes, half_life_tokens);
}

}  // namespace k3pack::store
