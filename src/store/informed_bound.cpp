// The distribution-informed demand-only bound of `trace sweep` (simulate.h).
//
// An object's score changes only when it enters or leaves a request's
// previous-token set at its layer, when its weight drifts, or when requests
// start or finish; so residents sit in one RankedSet by score and only
// those objects are re-scored (everything on a change of the active set).
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "store/policy.h"
#include "store/ranked_set.h"
#include "store/simulate.h"

namespace k3pack::store {

Result<SimResult> SimulateInformed(const trace::Trace& t, const CallSeq& seq, const ObjectSpace& space,
                                   uint64_t slots, const trace::TrueDistribution& truth) {
  if (seq.calls.size() != t.records.size()) return Error("informed bound: call sequence does not match the trace");
  const uint32_t L = space.num_active_layers(), E = space.num_experts, K = truth.top_k;
  const uint64_t num_requests = truth.initial.size();
  for (const auto& w : truth.initial)
    if (!w.empty() && w.size() != size_t{L} * E) return Error("informed bound: distribution does not match the trace");
  SimResult res;
  res.policy = "informed";
  res.capacity_objects = slots;
  res.capacity_bytes = slots * space.max_object_bytes();
  res.layer_hits.assign(L, 0);
  res.layer_misses.assign(L, 0);

  struct Req {
    std::vector<float> w;                     // [layer][expert], drifted to the current token
    std::vector<std::vector<uint16_t>> prev;  // sorted experts of the last token per layer
    uint64_t first = UINT64_MAX, last = 0;    // call indices
    uint32_t tokens = 0;                      // rows seen at the first layer
    std::vector<uint32_t> swaps;              // indices into truth.swaps, token order
    size_t next_swap = 0;
  };
  std::vector<Req> reqs(num_requests);
  for (uint64_t i = 0; i < t.records.size(); ++i) {
    const auto& r = t.records[i];
    for (uint32_t row = 0; row < r.rows; ++row) {
      uint32_t q = t.RowRequest(r, row);
      if (q >= num_requests) return Error("informed bound: request " + std::to_string(q) + " has no distribution");
      reqs[q].first = std::min(reqs[q].first, i);
      reqs[q].last = std::max(reqs[q].last, i);
    }
  }
  for (uint32_t s = 0; s < truth.swaps.size(); ++s)
    if (truth.swaps[s].request < num_requests) reqs[truth.swaps[s].request].swaps.push_back(s);
  for (uint64_t q = 0; q < num_requests; ++q) {
    reqs[q].prev.resize(L);
  }

  const double reuse = truth.reuse, m = double(K) * (1.0 - reuse);
  std::vector<uint32_t> active;
  std::vector<uint8_t> resident(space.num_objects(), 0);
  std::vector<float> score_of(space.num_objects(), 0.0f);
  RankedSet<std::pair<float, ObjectId>> order(space.num_objects());  // residents, lowest score first
  uint64_t count = 0;

  auto score = [&](ObjectId o) {
    const uint32_t li = space.LayerIndexOf(o), e = space.ExpertOf(o);
    double none = 1.0;
    for (uint32_t q : active) {
      const Req& r = reqs[q];
      double w = r.w[size_t{li} * E + e];
      double p;
      const auto& pv = r.prev[li];
      if (pv.empty()) p = std::min(1.0, double(K) * w);
      else if (std::binary_search(pv.begin(), pv.end(), uint16_t(e))) p = reuse + (1.0 - reuse) * std::min(1.0, m * w);
      else p = std::min(1.0, m * w);
      none *= 1.0 - p;
    }
    return float(1.0 - none);
  };
  auto rescore = [&](ObjectId o) {
    if (!resident[o]) return;
    score_of[o] = score(o);
    order.Set(o, {score_of[o], o});
  };

  std::vector<uint16_t> row, old;
  for (uint64_t i = 0; i < seq.calls.size(); ++i) {
    const auto& c = seq.calls[i];
    const auto& rec = t.records[i];
    const uint32_t li = c.layer_index;
    // Requests that start here or finished before here change the active set.
    bool changed = false;
    for (uint32_t row_i = 0; row_i < rec.rows; ++row_i) {
      uint32_t q = t.RowRequest(rec, row_i);
      if (reqs[q].first == i && std::find(active.begin(), active.end(), q) == active.end()) {
        active.push_back(q);
        reqs[q].w = truth.initial[q];
        changed = true;
      }
    }
    for (size_t a = 0; a < active.size();) {
      if (reqs[active[a]].last < i) {
        std::vector<float>().swap(reqs[active[a]].w);
        active.erase(active.begin() + a);
        changed = true;
      } else {
        ++a;
      }
    }
    // This call's rows become their requests' previous tokens at this layer;
    // the first layer advances their token count (and popularity drift).
    auto ids = t.RecordIds(rec);
    for (uint32_t row_i = 0; row_i < rec.rows; ++row_i) {
      uint32_t q = t.RowRequest(rec, row_i);
      Req& r = reqs[q];
      row.assign(ids.begin() + size_t{row_i} * t.top_k, ids.begin() + size_t{row_i + 1} * t.top_k);
      std::sort(row.begin(), row.end());
      old.swap(r.prev[li]);
      r.prev[li] = row;
      if (!changed) {
        for (uint16_t e : old) rescore(space.Id(li, e));
        for (uint16_t e : row) rescore(space.Id(li, e));
      }
      if (li == 0) {
        ++r.tokens;
        while (r.next_swap < r.swaps.size() && truth.swaps[r.swaps[r.next_swap]].token <= r.tokens) {
          const auto& s = truth.swaps[r.swaps[r.next_swap++]];
          std::swap(r.w[size_t{s.layer_index} * E + s.a], r.w[size_t{s.layer_index} * E + s.b]);
          if (!changed) {
            rescore(space.Id(s.layer_index, s.a));
            rescore(space.Id(s.layer_index, s.b));
          }
        }
      }
    }
    if (changed) {
      order.Clear();
      for (ObjectId o = 0; o < space.num_objects(); ++o)
        if (resident[o]) order.Set(o, {score_of[o] = score(o), o});
    }
    std::span<const ObjectId> call_keys(seq.keys.data() + c.begin, c.end - c.begin);
    if (call_keys.size() > slots)
      return Error("informed bound: a call needs " + std::to_string(call_keys.size()) +
                   " objects but the cache holds " + std::to_string(slots));
    // The call's keys are protected: they leave the order for the call (a
    // victim search never meets them) and return with their scores after.
    for (ObjectId k : call_keys)
      if (resident[k]) order.Erase(k);
    for (ObjectId k : call_keys) {
      if (resident[k]) {
        ++res.hits;
        ++res.layer_hits[li];
        continue;
      }
      ++res.misses;
      ++res.layer_misses[li];
      res.bytes_read += space.Cost(k);
      if (count == slots) {
        const ObjectId victim = order.FirstNot([](ObjectId) { return false; });
        if (victim == decltype(order)::kNone) return Error(kCannotEvictText, ErrorKind::kRuntime);
        resident[victim] = 0;
        order.Erase(victim);
        --count;
        ++res.evictions;
      }
      resident[k] = 1;
      score_of[k] = score(k);
      ++count;
    }
    for (ObjectId k : call_keys) order.Set(k, {score_of[k], k});
  }
  return res;
}

}  // namespace k3pack::store
