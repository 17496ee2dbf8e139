#include "store/timed_sim.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <functional>
#include <mutex>
#include <optional>
#include <queue>
#include <set>
#include <thread>

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

}  // namespace

Result<TimedResult> SimulateTimed(const trace::Trace& t, const CallSeq& seq, const ObjectSpace& space,
                                  const std::string& name, uint64_t capacity_bytes, const TimingOptions& o) {
  if (seq.calls.size() != t.records.size()) return Error("timed replay: call sequence does not match the trace");
  if (o.ssd_bytes_per_s <= 0 || o.layer_compute_s < 0 || o.ssd_latency_s < 0)
    return Error("timed replay: bandwidth must be positive and times non-negative");
  std::unique_ptr<Policy> policy;
  NextUseMin* min = nullptr;
  if (name == "belady") {
    auto p = std::make_unique<NextUseMin>(space, capacity_bytes, seq);
    min = p.get();
    policy = std::move(p);
  } else {
    K3_ASSIGN_OR_RETURN(policy, MakePolicy(name, space, capacity_bytes));
  }
  TimedResult r;
  r.policy = policy->name();
  r.prefetch = o.prefetch;
  r.staged = o.prefetch && o.prefetch_staged && !min;
  r.tokens = seq.tokens;
  const bool staging = r.staged;
  Ssd ssd(o);
  const uint64_t n = space.num_objects();
  std::vector<double> ready(n, 0.0);
  std::vector<uint8_t> speculative(n, 0);  // prefetched, not yet used
  PinCounts pins(n, 0);
  std::vector<uint64_t> gens;
  AccessResult ar;
  std::vector<ObjectId> evicted, predicted;
  std::vector<int64_t> pred_ids;
  std::vector<std::pair<double, uint64_t>> spec_inflight;  // (done, bytes) of speculative reads
  std::vector<ObjectId> spec_pinned;  // this call's prefetches, pinned until the next call starts
  // Staging (prefetch_staged): per object, whether staged and when its read
  // lands; per layer, what is staged for its next call.
  std::vector<uint8_t> staged(n, 0);
  std::vector<std::vector<ObjectId>> staged_by_layer(space.num_active_layers());
  uint64_t staged_bytes = 0;
  double now = 0;
  auto drop = [&](ObjectId k) {
    if (speculative[k]) {
      r.prefetch_wasted_bytes += space.Cost(k);
      speculative[k] = 0;
    }
  };
  for (uint64_t c = 0; c < seq.calls.size(); ++c) {
    const auto& call = seq.calls[c];
    std::span<const ObjectId> keys(seq.keys.data() + call.begin, call.end - call.begin);
    if (min) min->SetCall(c);
    // Prefetched objects stay pinned until the call they were read for
    // starts (like the store's live prefetches), so one batch of
    // prefetches cannot evict its own members.
    for (ObjectId k : spec_pinned) --pins[k];
    spec_pinned.clear();
    gens.assign(keys.size(), 1);
    CallRows rows;
    Status st = policy->Access(keys, gens, call.is_prefill, nullptr, &ar, RowsOf(seq, c, &rows));
    if (!st.ok()) return st.error();
    for (ObjectId v : ar.evicted) drop(v);
    double call_ready = now;
    for (size_t i = 0; i < keys.size(); ++i) {
      ObjectId k = keys[i];
      ++r.accesses;
      if (staging && !ar.hit[i] && staged[k]) {
        // Taken from staging: a miss for the policy, but no second read.
        staged[k] = 0;
        staged_bytes -= space.Cost(k);
        r.prefetch_useful_bytes += space.Cost(k);
        if (ready[k] <= now) {
          ++r.hits;
        } else {
          ++r.late_prefetches;
          call_ready = std::max(call_ready, ready[k]);
        }
        continue;
      }
      if (ar.hit[i]) {
        if (speculative[k]) {
          r.prefetch_useful_bytes += space.Cost(k);
          speculative[k] = 0;
        }
        if (ready[k] <= now) {
          ++r.hits;
        } else {
          ++r.late_prefetches;  // resident but its read is still in flight: a miss
          call_ready = std::max(call_ready, ready[k]);
        }
        continue;
      }
      ready[k] = ssd.Read(now, space.Cost(k));
      r.bytes_read += space.Cost(k);
      call_ready = std::max(call_ready, ready[k]);
    }
    if (staging && !keys.empty()) {
      // What this call did not route to is dropped; a read still in flight
      // keeps its budget charge until it lands.
      auto& list = staged_by_layer[space.LayerIndexOf(keys.front())];
      for (ObjectId k : list) {
        if (!staged[k]) continue;
        staged[k] = 0;
        staged_bytes -= space.Cost(k);
        r.prefetch_wasted_bytes += space.Cost(k);
        if (o.prefetch_budget_bytes && ready[k] > now) spec_inflight.push_back({ready[k], space.Cost(k)});
      }
      list.clear();
    }
    r.stall_s += call_ready - now;
    now = call_ready;
    // Look-ahead: start reads for the next layer's predicted objects while this call computes.
    if (o.prefetch && c + 1 < seq.calls.size()) {
      predicted.clear();
      const auto& next = seq.calls[c + 1];
      if (min) {
        predicted.assign(seq.keys.begin() + next.begin, seq.keys.begin() + next.end);
      } else {
        const auto& rec = t.records[c];
        auto p = t.RecordPredictions(rec);
        const auto pos = std::lower_bound(t.layer_ids.begin(), t.layer_ids.end(), rec.layer);
        if (!p.empty() && pos + 1 < t.layer_ids.end()) {
          pred_ids.assign(p.begin(), p.end());
          DistinctSorted(space, static_cast<uint32_t>(pos + 1 - t.layer_ids.begin()), pred_ids.data(),
                         pred_ids.size(), &predicted);
        }
      }
      for (ObjectId k : keys) ++pins[k];
      for (ObjectId k : predicted) {
        if (policy->Resident(k)) continue;
        if (staging) {
          if (staged[k]) continue;
          if (o.prefetch_budget_bytes) {
            uint64_t held = staged_bytes;
            std::erase_if(spec_inflight, [&](const auto& e) { return e.first <= now; });
            for (const auto& e : spec_inflight) held += e.second;
            if (held + space.Cost(k) > o.prefetch_budget_bytes) break;
          }
          ready[k] = ssd.Read(now, space.Cost(k));
          staged[k] = 1;
          staged_bytes += space.Cost(k);
          staged_by_layer[space.LayerIndexOf(k)].push_back(k);
          r.bytes_read += space.Cost(k);
          r.prefetch_bytes += space.Cost(k);
          continue;
        }
        if (o.prefetch_budget_bytes) {
          uint64_t in_flight = 0;
          std::erase_if(spec_inflight, [&](const auto& e) { return e.first <= now; });
          for (const auto& e : spec_inflight) in_flight += e.second;
          if (in_flight + space.Cost(k) > o.prefetch_budget_bytes) break;
        }
        evicted.clear();
        bool admitted = policy->Admit(k, 1, &pins, &evicted);
        for (ObjectId v : evicted) drop(v);
        if (!admitted) continue;
        ready[k] = ssd.Read(now, space.Cost(k));
        speculative[k] = 1;
        ++pins[k];
        spec_pinned.push_back(k);
        r.bytes_read += space.Cost(k);
        r.prefetch_bytes += space.Cost(k);
        if (o.prefetch_budget_bytes) spec_inflight.push_back({ready[k], space.Cost(k)});
      }
      for (ObjectId k : keys) --pins[k];
    }
    now += o.layer_compute_s * (call.is_prefill ? double(call.rows) : 1.0);
  }
  for (ObjectId k = 0; k < n; ++k) {  // never used before the end
    drop(k);
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
                                         unsigned threads) {
  struct Job {
    uint64_t size;
    std::string policy;
    bool prefetch, staged;
  };
  std::vector<Job> jobs;
  for (uint64_t s : sizes) {
    for (const auto& p : policies) {
      jobs.push_back({s, p, false, false});
      jobs.push_back({s, p, true, false});
      if (base.prefetch_staged) jobs.push_back({s, p, true, true});
    }
    jobs.push_back({s, "belady", true, false});
  }
  std::vector<TimedRow> rows(jobs.size());
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::optional<Error> first_error;
  auto work = [&] {
    for (size_t j; (j = next.fetch_add(1)) < jobs.size();) {
      TimingOptions o = base;
      o.prefetch = jobs[j].prefetch;
      o.prefetch_staged = jobs[j].staged;
      auto r = SimulateTimed(t, seq, space, jobs[j].policy, jobs[j].size * space.max_object_bytes(), o);
      std::lock_guard<std::mutex> lock(mu);
      if (!r.ok()) {
        if (!first_error) first_error = r.error();
        next = jobs.size();
        continue;
      }
      rows[j] = {jobs[j].size, *r};
    }
  };
  RunOnThreads(threads, work);
  if (first_error) return *first_error;
  return rows;
}

std::string TimedText(const std::vector<TimedRow>& rows, uint64_t num_objects) {
  std::string out;
  char buf[256];
  std::snprintf(buf, sizeof buf, "%8s %7s %-17s %8s %12s %10s %10s %11s %11s\n", "objects", "share", "policy",
                "prefetch", "stall ms/tok", "MB/tok", "stall-free", "useful MB/t", "wasted MB/t");
  out += buf;
  for (const auto& row : rows) {
    const TimedResult& r = row.result;
    const double tok = double(std::max<uint64_t>(1, r.tokens));
    std::snprintf(buf, sizeof buf, "%8llu %6.2f%% %-17s %8s %12.3f %10.1f %9.1f%% %11.1f %11.1f\n",
                  (unsigned long long)row.capacity_objects,
                  100.0 * double(row.capacity_objects) / double(std::max<uint64_t>(1, num_objects)), r.policy.c_str(),
                  r.staged ? "staged" : r.prefetch ? "yes" : "no", 1e3 * r.stall_per_token_s(), r.bytes_per_token() / 1e6,
                  100.0 * r.stall_free_fraction(), double(r.prefetch_useful_bytes) / tok / 1e6,
                  double(r.prefetch_wasted_bytes) / tok / 1e6);
    out += buf;
  }
  return out;
}

}  // namespace k3pack::store
