#include "store/timed_sim.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <mutex>
#include <optional>
#include <queue>
#include <set>
#include <span>
#include <thread>

#include "store/next_call_holds.h"
#include "store/miss_rows.h"
#include "store/policy.h"
#include "util/threads.h"

namespace k3pack::store {
namespace {

// Belady's MIN as a Policy, so the timed replay drives it like any other:
// the victim is the unprotected resident whose next use (call index) is
// farthest. `SetCall(c)` moves the clock; an object used or admitted at call
// c is next needed at its first use after c.
class NextUseMin final : public Policy {
 public:
  NextUseMin(const ObjectSpace& space, uint64_t cap, const CallSeq& seq)
      : Policy(space, cap), uses_(space.num_objects()), ptr_(space.num_objects(), 0), next_(space.num_objects(), 0) {
    for (uint32_t c = 0; c < seq.calls.size(); ++c)
      for (uint64_t p = seq.calls[c].begin; p < seq.calls[c].end; ++p) uses_[seq.keys[p]].push_back(c);
  }
  std::string name() const override { return "belady"; }
  void SetCall(uint64_t c) { call_ = c; }
  // A use at the current call that the policy did not see (behind a device
  // tier, a device hit): without it the object keeps a next use in the past
  // and looks needed soonest for good.
  void Used(ObjectId k) {
    if (Resident(k)) Track(k);
  }
  // MIN with prefetch: reading `k` ahead is worth it only if the cache has
  // room or its victim is one demand MIN would evict for `k` (a resident
  // needed farthest off) and that is needed strictly later than `k`. If
  // every resident needed farthest off is pinned (this call's own objects),
  // the victim would be one needed sooner than what MIN evicts once the pin
  // is gone; on a tie with `k` the victim is needed by `k`'s own call. Either
  // way reading ahead would add a read that demand MIN does not make. Among
  // residents tied for farthest (often "never again") any unpinned one will
  // do: the set's order by id must not decide.
  bool WorthAdmitting(ObjectId k, const PinCounts* pins) const {
    if (used_bytes() + space().Cost(k) <= capacity_bytes()) return true;
    if (order_.empty()) return false;
    const auto& u = uses_[k];
    auto it = std::upper_bound(u.begin(), u.end(), static_cast<uint32_t>(call_));
    const uint64_t nk = it == u.end() ? UINT64_MAX : *it;
    const uint64_t farthest = order_.rbegin()->first;
    for (auto v = order_.rbegin(); v != order_.rend() && v->first == farthest; ++v)
      if (!Protected(v->second, {}, pins)) return farthest > nk;
    return false;
  }

 protected:
  void OnHit(ObjectId k) override { Track(k); }
  void OnInsert(ObjectId k, bool) override { Track(k); }
  void OnRemove(ObjectId k) override { order_.erase({next_[k], k}); }
  ObjectId PickVictim(bool, std::span<const ObjectId> call, const PinCounts* pins) override {
    for (auto it = order_.rbegin(); it != order_.rend(); ++it)
      if (!Protected(it->second, call, pins)) return it->second;
    return kNoObject;
  }

 private:
  void Track(ObjectId k) {
    order_.erase({next_[k], k});
    auto& u = uses_[k];
    while (ptr_[k] < u.size() && u[ptr_[k]] <= call_) ++ptr_[k];
    next_[k] = ptr_[k] < u.size() ? u[ptr_[k]] : UINT64_MAX;
    order_.insert({next_[k], k});
  }
  std::vector<std::vector<uint32_t>> uses_;
  std::vector<uint32_t> ptr_;
  std::vector<uint64_t> next_;
  std::set<std::pair<uint64_t, ObjectId>> order_;
  uint64_t call_ = 0;
};

// The SSD: FIFO at a fixed bandwidth, at most `depth` reads in flight.
class Ssd {
 public:
  explicit Ssd(const TimingOptions& o) : o_(o) {}
  // Returns when a read of `bytes` issued at `t` completes.
  double Read(double t, uint64_t bytes) {
    double start = std::max(t, busy_until_);
    while (!inflight_.empty() && inflight_.top() <= start) inflight_.pop();
    if (inflight_.size() >= std::max<uint32_t>(1, o_.queue_depth)) {
      start = std::max(start, inflight_.top());
      inflight_.pop();
    }
    busy_until_ = start + double(bytes) / o_.ssd_bytes_per_s;
    double done = busy_until_ + o_.ssd_latency_s;
    inflight_.push(done);
    return done;
  }

 private:
  const TimingOptions& o_;
  double busy_until_ = 0;
  std::priority_queue<double, std::vector<double>, std::greater<double>> inflight_;
};

// The host-to-device link: one copy engine at a fixed bandwidth. A copy
// starts once its source is ready, in the earliest idle gap from then: a
// prefetch copy booked for when its SSD read lands does not hold the link
// before that, so a demand copy issued later whose source is ready can go
// first.
class Link {
 public:
  explicit Link(const TimingOptions& o) : o_(o) {}
  // Returns when a copy of `bytes` whose source is ready at `t` lands.
  double Copy(double t, uint64_t bytes) {
    const double d = double(bytes) / o_.h2d_bytes_per_s;
    double start = t;
    for (const auto& [from, to] : busy_) {  // disjoint, in order
      if (to <= start) continue;
      if (from >= start + d) break;  // the gap before it fits
      start = to;
    }
    busy_.insert({start, start + d});
    return start + d + o_.h2d_latency_s;
  }
  // No copy is issued for a source ready before `t` any more (the replay's
  // clock): forget the copies that ended by then.
  void Forget(double t) {
    while (!busy_.empty() && busy_.begin()->second <= t) busy_.erase(busy_.begin());
  }

 private:
  const TimingOptions& o_;
  std::set<std::pair<double, double>> busy_;  // booked (start, end), disjoint
};

}  // namespace

Result<TimedResult> SimulateTimed(const trace::Trace& t, const CallSeq& seq, const ObjectSpace& space,
                                  const std::string& name, uint64_t capacity_bytes, const TimingOptions& o) {
  if (seq.calls.size() != t.records.size()) return Error("timed replay: call sequence does not match the trace");
  if (o.ssd_bytes_per_s <= 0 || o.layer_compute_s < 0 || o.ssd_latency_s < 0)
    return Error("timed replay: bandwidth must be positive and times non-negative");
  const bool tiered = o.device_bytes != 0;
  if (tiered && (o.h2d_bytes_per_s <= 0 || o.h2d_latency_s < 0))
    return Error("timed replay: the host-to-device bandwidth must be positive and its latency non-negative");
  if (tiered) {
    // Every call's objects must fit on the device together (they are its working set).
    const uint64_t need = LargestCallBytes(seq, space);
    if (o.device_bytes < need)
      return Error("timed replay: the device tier (" + std::to_string(o.device_bytes) +
                   " bytes) cannot hold a call's working set of " + std::to_string(need) + " bytes")
          .WithHint("give the device tier at least " + std::to_string((need + (1u << 20) - 1) >> 20) + " MiB");
  }
  std::unique_ptr<Policy> policy, device;
  NextUseMin* min = nullptr;
  NextUseMin* device_min = nullptr;
  if (name == "belady") {
    auto p = std::make_unique<NextUseMin>(space, capacity_bytes, seq);
    min = p.get();
    policy = std::move(p);
    if (tiered) {
      auto d = std::make_unique<NextUseMin>(space, o.device_bytes, seq);
      device_min = d.get();
      device = std::move(d);
    }
  } else {
    K3_ASSIGN_OR_RETURN(policy, MakePolicy(name, space, capacity_bytes));
    if (tiered) {
      K3_ASSIGN_OR_RETURN(device, MakePolicy(o.device_policy, space, o.device_bytes));
    }
  }
  TimedResult r;
  r.policy = policy->name();
  r.prefetch = o.prefetch;
  r.keep_predicted = o.keep_predicted && !min;
  r.staged = o.prefetch && o.prefetch_staged && !min;
  r.tokens = seq.tokens;
  if (tiered) r.device_policy = device->name();
  const bool staging = r.staged;
  Ssd ssd(o);
  Link link(o);
  const uint64_t n = space.num_objects();
  std::vector<double> ready(n, 0.0);       // when the host copy is readable
  std::vector<double> dev_ready(tiered ? n : 0, 0.0);  // when the device copy is
  std::vector<uint8_t> speculative(n, 0);  // prefetched, not yet used
  PinCounts pins(n, 0), dev_pins(tiered ? n : 0, 0);
  std::vector<uint64_t> gens;
  AccessResult ar, dar;
  std::vector<ObjectId> evicted, predicted, row_predicted, host_keys, miss_routes;
  std::vector<uint64_t> miss_requests, miss_row_requests;
  std::vector<size_t> miss_route_of;
  std::vector<int64_t> pred_ids;
  std::vector<std::pair<double, uint64_t>> spec_inflight;  // (done, bytes) of speculative reads
  std::vector<ObjectId> spec_pinned;  // this call's prefetches, pinned until the next call starts
  std::vector<ObjectId> dev_pinned;   // the same on the device
  // Next-token look-ahead: per layer index, the prefetches pinned until the
  // next call of that layer starts (host and device).
  const bool token_ahead = o.lookahead == TimingOptions::Lookahead::kNextToken;
  const bool token_hints = o.lookahead != TimingOptions::Lookahead::kNextLayer;
  // Layers are indexed as in the object space (CallSeq's layer_index), which
  // a manifest can make wider than the trace: indexing by the trace's own
  // list named every prediction's objects at the wrong layer there.
  const size_t num_layers = space.num_active_layers();
  // Per space layer index, the space index of the trace's next layer (what
  // a record's next-layer predictions name), num_layers after the last.
  std::vector<size_t> next_layer(num_layers + 1, num_layers);
  for (size_t i = 0; i + 1 < t.layer_ids.size(); ++i) {
    const int32_t from = space.LayerIndex(t.layer_ids[i]), to = space.LayerIndex(t.layer_ids[i + 1]);
    if (from >= 0 && to >= 0) next_layer[size_t(from)] = size_t(to);
  }
  std::vector<std::vector<ObjectId>> pinned_at(token_ahead ? num_layers + 1 : 0), dev_pinned_at(pinned_at.size());
  // Keep hints: per target layer, each row's predicted objects for its
  // request (see NextCallHolds).
  const bool keeping = o.keep_predicted && !min;
  std::optional<NextCallHolds> hints;
  if (keeping) {
    hints.emplace(n, num_layers + 1);
    policy->SetKeepHints(hints->counts());
  }
  auto call_requests = [&](size_t c) {
    CallRows rows;
    const CallRows* r = RowsOf(seq, c, &rows);
    return r ? r->requests : std::span<const uint64_t>();
  };
  // Belady's perfect next-token prefetch: the next call of the same layer.
  std::vector<uint64_t> next_same_layer;
  auto layer_index = [&](uint64_t c) { return size_t{seq.calls[c].layer_index}; };
  if (token_ahead && min) {
    next_same_layer.assign(seq.calls.size(), UINT64_MAX);
    std::vector<uint64_t> last(num_layers + 1, UINT64_MAX);
    for (uint64_t c = seq.calls.size(); c-- > 0;) {
      size_t li = layer_index(c);
      next_same_layer[c] = last[li];
      last[li] = c;
    }
  }
  std::vector<std::pair<double, ObjectId>> copies;  // (source ready, object) of this call's device misses
  // The most objects the host store always holds (StoreInfo::
  // effective_capacity_objects; at least top_k, as its open checks).
  const size_t host_chunk = static_cast<size_t>(std::max<uint64_t>(
      {1, space.top_k, space.max_object_bytes() ? capacity_bytes / space.max_object_bytes() : UINT64_MAX}));
  // Staging (prefetch_staged): per object, whether staged and when its read
  // lands; what each row staged waits for its request's next host acquire
  // of the layer, as in the store (stage_refs: the groups naming an object).
  std::vector<uint8_t> staged(n, 0);
  NextCallHolds stage_holds(staging ? n : 0, num_layers + 1);
  uint64_t staged_bytes = 0;
  double now = 0;
  auto waste = [&](ObjectId k) {
    if (speculative[k]) {
      r.prefetch_wasted_bytes += space.Cost(k);
      speculative[k] = 0;
    }
  };
  // A prefetched object is wasted when it leaves the host unused, unless the
  // device still holds its copy (a device hit on it is still a use): then
  // when the device evicts it too.
  auto drop = [&](ObjectId k) {
    if (!(tiered && device->Resident(k))) waste(k);
  };
  auto device_drop = [&](ObjectId k) {
    if (!policy->Resident(k)) waste(k);
  };
  for (uint64_t c = 0; c < seq.calls.size(); ++c) {
    const auto& call = seq.calls[c];
    std::span<const ObjectId> keys(seq.keys.data() + call.begin, call.end - call.begin);
    if (min) min->SetCall(c);
    if (device_min) device_min->SetCall(c);
    link.Forget(now);  // every copy from here on has its source ready at `now` or later
    // Prefetched objects stay pinned until the call they were read for
    // starts (like the store's live prefetches), so one batch of
    // prefetches cannot evict its own members.
    for (ObjectId k : spec_pinned) --pins[k];
    spec_pinned.clear();
    for (ObjectId k : dev_pinned) --dev_pins[k];
    dev_pinned.clear();
    const size_t li = layer_index(c);
    if (keeping) hints->CallStarts(li, call_requests(c));
    if (token_ahead) {
      for (ObjectId k : pinned_at[li]) --pins[k];
      pinned_at[li].clear();
      for (ObjectId k : dev_pinned_at[li]) --dev_pins[k];
      dev_pinned_at[li].clear();
    }
    double call_ready = now;
    // With a device tier the call is served from the device; only its
    // device misses are acquired from the host tier (as the slot cache and
    // the device tier do), then copied.
    if (tiered) {
      gens.assign(keys.size(), 1);
      Status st = device->Access(keys, gens, call.is_prefill, nullptr, &dar);
      if (!st.ok()) return st.error().WithContext("timed replay, device tier");
      for (ObjectId v : dar.evicted) device_drop(v);
      host_keys.clear();
      for (size_t i = 0; i < keys.size(); ++i) {
        ++r.accesses;
        if (!dar.hit[i]) {
          host_keys.push_back(keys[i]);
          continue;
        }
        if (min) min->Used(keys[i]);  // the host policy does not see device hits
        if (speculative[keys[i]]) {  // read and copied by a prefetch, used here
          r.prefetch_useful_bytes += space.Cost(keys[i]);
          speculative[keys[i]] = 0;
        }
        if (dev_ready[keys[i]] <= now) {
          ++r.hits;
        } else {
          ++r.late_prefetches;  // its prefetch copy is still on the link
          call_ready = std::max(call_ready, dev_ready[keys[i]]);
        }
      }
    }
    // The host tier's acquire of `hk` starting at `at` (the call's keys, or
    // behind a device tier some of its misses, `hreq` their requests: empty
    // when unknown); returns when its objects are usable: read, and behind a
    // device tier copied.
    // `stage_end`: whose staged holds end with this acquire (what they staged
    // and it did not take is dropped): the acquire's own requests; none, for
    // a device tier's chunk before its call's last; or the call's misses'.
    enum class StageEnd { kThisAcquire, kNone, kCall };
    auto host_acquire = [&](std::span<const ObjectId> hk, std::span<const uint64_t> hreq, double at,
                            StageEnd stage_end, std::span<const uint64_t> call_requests) -> Result<double> {
      double usable = at;
      CallRows rows, miss_rows;
      const CallRows* host_rows = RowsOf(seq, c, &rows);
      if (tiered && host_rows != nullptr) {
        // Behind a device tier the host sees only the device misses, each in
        // a row of the first request that asked for it, as the tier passes
        // them on.
        MissRows(hk, hreq, host_rows->width, &miss_routes, &miss_row_requests, &miss_route_of);
        miss_rows = {miss_routes, miss_row_requests, host_rows->width};
        host_rows = &miss_rows;
      }
      gens.assign(hk.size(), 1);
      Status st = policy->Access(hk, gens, call.is_prefill, nullptr, &ar, host_rows);
      if (!st.ok()) return st.error();
      for (ObjectId v : ar.evicted) drop(v);
      copies.clear();
      for (size_t i = 0; i < hk.size(); ++i) {
        ObjectId k = hk[i];
        bool demand = false;
        if (staging && !ar.hit[i] && staged[k]) {
          // Taken from staging: a miss for the policy, but no second read.
          staged[k] = 0;
          staged_bytes -= space.Cost(k);
          r.prefetch_useful_bytes += space.Cost(k);
        } else if (ar.hit[i]) {
          if (speculative[k]) {
            r.prefetch_useful_bytes += space.Cost(k);
            speculative[k] = 0;
          }
        } else {
          ready[k] = ssd.Read(at, space.Cost(k));
          r.bytes_read += space.Cost(k);
          demand = true;
        }
        if (!demand) {
          if (ready[k] <= at) {
            ++(tiered ? r.host_hits : r.hits);
          } else {
            ++r.late_prefetches;  // resident or staged but its read is still in flight: a miss
          }
        }
        if (tiered) copies.push_back({std::max(at, ready[k]), k});
        else usable = std::max(usable, ready[k]);
      }
      // Device misses are copied as their host copies become ready.
      std::sort(copies.begin(), copies.end());
      for (auto [from, k] : copies) {
        dev_ready[k] = link.Copy(from, space.Cost(k));
        r.bytes_copied += space.Cost(k);
        usable = std::max(usable, dev_ready[k]);
      }
      if (staging && stage_end != StageEnd::kNone) {
        // What this host acquire's requests staged and it did not route to
        // is dropped; a read still in flight keeps its budget charge until
        // it lands.
        const auto host_requests = stage_end == StageEnd::kCall ? call_requests
                                   : host_rows                  ? host_rows->requests
                                                                : std::span<const uint64_t>();
        stage_holds.CallStarts(li, host_requests, [&](ObjectId k) {
          if (!staged[k]) return;  // taken
          staged[k] = 0;
          staged_bytes -= space.Cost(k);
          r.prefetch_wasted_bytes += space.Cost(k);
          if (o.prefetch_budget_bytes && ready[k] > at) spec_inflight.push_back({ready[k], space.Cost(k)});
        });
      }
      return usable;
    };
    if (!tiered) {
      r.accesses += keys.size();
      K3_ASSIGN_OR_RETURN(call_ready, host_acquire(keys, {}, now, StageEnd::kThisAcquire, {}));
    } else if (!host_keys.empty()) {
      // The device tier reads its misses through the host tier in chunks the
      // host always holds (DeviceExpertTier::Load, SlotCache's
      // CopyFromHostTier); each chunk's acquire starts once the previous
      // chunk's copies have landed, as the tier waits for them before
      // releasing its host objects.
      miss_requests.clear();
      CallRows rows;
      if (const CallRows* call_rows = RowsOf(seq, c, &rows))
        FirstRowRequests(call_rows->keys, call_rows->width, call_rows->requests,
                         std::span<const ObjectId>(host_keys), &miss_requests);
      const std::span<const ObjectId> misses(host_keys);
      const std::span<const uint64_t> requests(miss_requests);
      // The staged holds of the call's requests end once, with its last
      // chunk: ended by the first, they dropped what later chunks would take
      // (read again, and counted wasted), as DeviceExpertTier::Load now
      // tells the host store (BeginChunkedCall).
      double at = now;
      const bool chunked = misses.size() > host_chunk;
      for (size_t first = 0; first < misses.size(); first += host_chunk) {
        const size_t count = std::min(host_chunk, misses.size() - first);
        const StageEnd end = !chunked ? StageEnd::kThisAcquire
                             : first + count < misses.size() ? StageEnd::kNone
                                                             : StageEnd::kCall;
        K3_ASSIGN_OR_RETURN(at, host_acquire(misses.subspan(first, count),
                                             requests.empty() ? requests : requests.subspan(first, count), at, end,
                                             requests));
        call_ready = std::max(call_ready, at);
      }
    }
    r.stall_s += call_ready - now;
    now = call_ready;
    // Look-ahead: start reads for the next layer's (or, with next-token
    // look-ahead, the next token's same layer's) predicted objects while
    // this call computes.
    if ((o.prefetch || keeping) && c + 1 < seq.calls.size()) {
      predicted.clear();
      const size_t target = token_ahead ? li : next_layer[li];
      const auto p = min ? std::span<const uint16_t>()
                         : token_ahead ? t.RecordTokenPredictions(t.records[c]) : t.RecordPredictions(t.records[c]);
      if (!o.prefetch) {
        // The predictions steer eviction only (below): nothing is read ahead.
      } else if (min) {
        const uint64_t nc = token_ahead ? next_same_layer[c] : c + 1;
        if (nc != UINT64_MAX)
          predicted.assign(seq.keys.begin() + seq.calls[nc].begin, seq.keys.begin() + seq.calls[nc].end);
      } else if (!p.empty() && target < num_layers) {
        pred_ids.assign(p.begin(), p.end());
        DistinctSorted(space, static_cast<uint32_t>(target), pred_ids.data(), pred_ids.size(), &predicted);
      }
      // Each row's predicted objects (`preds` for layer index `tgt`), with
      // the row's request (any request when the trace gives none).
      auto for_each_row = [&](std::span<const uint16_t> preds, size_t tgt, auto&& fn) {
        if (tgt >= num_layers) return;
        const auto requests = call_requests(c);
        const uint32_t pk = t.predict_k;
        for (uint32_t row = 0; pk != 0 && row < call.rows && size_t(row + 1) * pk <= preds.size(); ++row) {
          pred_ids.assign(preds.begin() + size_t(row) * pk, preds.begin() + size_t(row + 1) * pk);
          DistinctSorted(space, static_cast<uint32_t>(tgt), pred_ids.data(), pred_ids.size(), &row_predicted);
          fn(requests.empty() ? NextCallHolds::kAnyRequest : requests[row]);
        }
      };
      // A prefill chunk's next-token predictions are mostly its own next
      // rows (already loaded by this call) and name hundreds of objects: as
      // hints they would shield a whole prompt's experts from the decode
      // that follows. Only decode calls give hints.
      if (keeping && !call.is_prefill) {
        const size_t hint_target = token_hints ? li : next_layer[li];
        const auto hp = token_hints ? t.RecordTokenPredictions(t.records[c]) : t.RecordPredictions(t.records[c]);
        for_each_row(hp, hint_target, [&](uint64_t request) { hints->Give(hint_target, request, row_predicted); });
      }
      std::vector<ObjectId>& pin_list = token_ahead ? pinned_at[li] : spec_pinned;
      std::vector<ObjectId>& dev_pin_list = token_ahead ? dev_pinned_at[li] : dev_pinned;
      for (ObjectId k : keys) ++pins[k];
      if (tiered)
        for (ObjectId k : keys) ++dev_pins[k];
      for (ObjectId k : predicted) {
        if (tiered && device->Resident(k)) continue;
        if (!policy->Resident(k)) {
          if (staging) {
            if (staged[k]) continue;
            if (o.prefetch_budget_bytes) {
              uint64_t held = staged_bytes;
              std::erase_if(spec_inflight, [&](const auto& e) { return e.first <= now; });
              for (const auto& e : spec_inflight) held += e.second;
              if (held + space.Cost(k) > o.prefetch_budget_bytes) continue;  // skip it, not the rest
            }
            ready[k] = ssd.Read(now, space.Cost(k));
            staged[k] = 1;
            staged_bytes += space.Cost(k);
            r.bytes_read += space.Cost(k);
            r.prefetch_bytes += space.Cost(k);
            continue;  // staging feeds the host tier only, as the store's Prefetch()
          }
          if (o.prefetch_budget_bytes) {
            uint64_t in_flight = 0;
            std::erase_if(spec_inflight, [&](const auto& e) { return e.first <= now; });
            for (const auto& e : spec_inflight) in_flight += e.second;
            // Over budget: skip this read, not the rest; a later object that
            // is already in host memory needs no read, only its device copy.
            if (in_flight + space.Cost(k) > o.prefetch_budget_bytes) continue;
          }
          if (min && !min->WorthAdmitting(k, &pins)) continue;
          evicted.clear();
          bool admitted = policy->Admit(k, 1, &pins, &evicted);
          for (ObjectId v : evicted) drop(v);
          if (!admitted) continue;
          ready[k] = ssd.Read(now, space.Cost(k));
          speculative[k] = 1;
          ++pins[k];
          pin_list.push_back(k);
          r.bytes_read += space.Cost(k);
          r.prefetch_bytes += space.Cost(k);
          if (o.prefetch_budget_bytes) spec_inflight.push_back({ready[k], space.Cost(k)});
        }
        if (!tiered || staging) continue;
        // On to the device, without evicting this call's objects or the
        // batch's: copied once its host copy is readable.
        if (device_min && !device_min->WorthAdmitting(k, &dev_pins)) continue;
        evicted.clear();
        const bool on_device = device->Admit(k, 1, &dev_pins, &evicted);
        for (ObjectId v : evicted) device_drop(v);
        if (!on_device) continue;
        dev_ready[k] = link.Copy(std::max(now, ready[k]), space.Cost(k));
        r.bytes_copied += space.Cost(k);
        r.prefetch_copied_bytes += space.Cost(k);
        ++dev_pins[k];
        dev_pin_list.push_back(k);
      }
      for (ObjectId k : keys) --pins[k];
      if (tiered)
        for (ObjectId k : keys) --dev_pins[k];
      // What each row staged (or found staged) waits for its request.
      if (staging)
        for_each_row(p, target, [&](uint64_t request) {
          std::erase_if(row_predicted, [&](ObjectId k) { return !staged[k]; });
          stage_holds.Give(target, request, row_predicted);
        });
    }
    now += o.layer_compute_s * (call.is_prefill ? double(call.rows) : 1.0);
  }
  for (ObjectId k = 0; k < n; ++k) {  // never used before the end, on either tier
    waste(k);
    if (staged[k]) r.prefetch_wasted_bytes += space.Cost(k);
  }
  r.total_s = now;
  return r;
}

}  // namespace k3pack::store

namespace k3pack::store {

Result<std::vector<TimedRow>> TimedSweep(const trace::Trace& t, const CallSeq& seq, const ObjectSpace& space,
                                         const std::vector<std::string>& policies,
                                         const std::vector<uint64_t>& sizes, const TimingOptions& base,
                                         unsigned threads, const ProgressFn& progress) {
  struct Job {
    uint64_t size;
    std::string policy;
    bool prefetch, staged, keep;
  };
  std::vector<Job> jobs;
  for (uint64_t s : sizes) {
    for (const auto& p : policies) {
      // Demand-only is the baseline and stays unsteered; with keep hints a
      // run that reads nothing ahead shows what the hints alone buy.
      jobs.push_back({s, p, false, false, false});
      if (base.keep_predicted) jobs.push_back({s, p, false, false, true});
      jobs.push_back({s, p, true, false, base.keep_predicted});
      if (base.prefetch_staged) jobs.push_back({s, p, true, true, base.keep_predicted});
    }
    jobs.push_back({s, "belady", true, false, false});
  }
  std::vector<TimedRow> rows(jobs.size());
  std::atomic<size_t> next{0};
  std::mutex mu;
  SweepProgress done(progress, jobs.size());
  std::optional<Error> first_error;
  auto work = [&] {
    for (size_t j; (j = next.fetch_add(1)) < jobs.size();) {
      TimingOptions o = base;
      o.prefetch = jobs[j].prefetch;
      o.prefetch_staged = jobs[j].staged;
      o.keep_predicted = jobs[j].keep;
      auto r = SimulateTimed(t, seq, space, jobs[j].policy, jobs[j].size * space.max_object_bytes(), o);
      std::lock_guard<std::mutex> lock(mu);
      if (!r.ok()) {
        if (!first_error) first_error = r.error();
        next = jobs.size();
        continue;
      }
      rows[j] = {jobs[j].size, *r};
      done.JobDone();
    }
  };
  RunOnThreads(threads, work);
  if (first_error) return *first_error;
  return rows;
}

const char* PrefetchLabel(const TimedResult& r) {
  if (r.keep_predicted) return r.staged ? "staged+k" : r.prefetch ? "yes+keep" : "keep";
  return r.staged ? "staged" : r.prefetch ? "yes" : "no";
}

std::string TimedText(const std::vector<TimedRow>& rows, uint64_t num_objects) {
  std::string out;
  char buf[320];
  const bool tiered = !rows.empty() && !rows.front().result.device_policy.empty();
  std::snprintf(buf, sizeof buf, "%8s %7s %-17s %8s %12s %10s %10s %11s %11s%s\n", "objects", "share", "policy",
                "prefetch", "stall ms/tok", "MB/tok", "stall-free", "useful MB/t", "wasted MB/t",
                tiered ? "  H2D MB/tok" : "");
  out += buf;
  for (const auto& row : rows) {
    const TimedResult& r = row.result;
    const double tok = double(std::max<uint64_t>(1, r.tokens));
    int len = std::snprintf(buf, sizeof buf, "%8llu %6.2f%% %-17s %8s %12.3f %10.1f %9.1f%% %11.1f %11.1f",
                            (unsigned long long)row.capacity_objects,
                            100.0 * double(row.capacity_objects) / double(std::max<uint64_t>(1, num_objects)),
                            r.policy.c_str(), PrefetchLabel(r),
                            1e3 * r.stall_per_token_s(), r.bytes_per_token() / 1e6, 100.0 * r.stall_free_fraction(),
                            double(r.prefetch_useful_bytes) / tok / 1e6, double(r.prefetch_wasted_bytes) / tok / 1e6);
    if (tiered && len > 0 && size_t(len) < sizeof buf)
      std::snprintf(buf + len, sizeof buf - size_t(len), " %12.1f", r.copied_per_token() / 1e6);
    out += buf;
    out += "\n";
  }
  return out;
}

}  // namespace k3pack::store
