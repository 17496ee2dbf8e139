// The distribution-informed demand-only bound of `trace sweep` (simulate.h).
//
// Scores change only when a layer is called (a request's previous token at
// that layer changes), when popularity drifts, or when requests start or
// finish; so each layer caches the minimum score over its residents and
// recomputes it only when marked dirty, and a victim is the smallest of the
// layers' minima.
#include <algorithm>
#include <cmath>
#include <limits>

#include "store/policy.h"
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
  std::vector<std::vector<ObjectId>> res_of(L);
  std::vector<uint32_t> pos(space.num_objects(), 0);
  std::vector<uint8_t> resident(space.num_objects(), 0), dirty(L, 1);
  std::vector<std::pair<float, ObjectId>> layer_min(L);
  uint64_t count = 0;
  constexpr float kInf = std::numeric_limits<float>::infinity();

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
  std::span<const ObjectId> call_keys;
  uint32_t cur_layer = UINT32_MAX;
  auto refresh = [&](uint32_t li) {
    std::pair<float, ObjectId> best{kInf, kNoObject};
    for (ObjectId o : res_of[li]) {
      if (li == cur_layer && std::binary_search(call_keys.begin(), call_keys.end(), o)) continue;
      float s = score(o);
      if (s < best.first || (s == best.first && o < best.second)) best = {s, o};
    }
    layer_min[li] = best;
    dirty[li] = 0;
  };

  std::vector<uint16_t> row;
  for (uint64_t i = 0; i < seq.calls.size(); ++i) {
    const auto& c = seq.calls[i];
    const auto& rec = t.records[i];
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
    if (changed) std::fill(dirty.begin(), dirty.end(), 1);
    // This call's rows become their requests' previous tokens at this layer;
    // the first layer advances their token count (and popularity drift).
    const uint32_t li = c.layer_index;
    auto ids = t.RecordIds(rec);
    for (uint32_t row_i = 0; row_i < rec.rows; ++row_i) {
      uint32_t q = t.RowRequest(rec, row_i);
      Req& r = reqs[q];
      row.assign(ids.begin() + size_t{row_i} * t.top_k, ids.begin() + size_t{row_i + 1} * t.top_k);
      std::sort(row.begin(), row.end());
      r.prev[li] = row;
      if (li == 0) {
        ++r.tokens;
        while (r.next_swap < r.swaps.size() && truth.swaps[r.swaps[r.next_swap]].token <= r.tokens) {
          const auto& s = truth.swaps[r.swaps[r.next_swap++]];
          std::swap(r.w[size_t{s.layer_index} * E + s.a], r.w[size_t{s.layer_index} * E + s.b]);
          dirty[s.layer_index] = 1;
        }
      }
    }
    call_keys = std::span<const ObjectId>(seq.keys.data() + c.begin, c.end - c.begin);
    if (call_keys.size() > slots)
      return Error("informed bound: a call needs " + std::to_string(call_keys.size()) +
                   " objects but the cache holds " + std::to_string(slots));
    cur_layer = li;
    dirty[li] = 1;
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
        uint32_t vl = UINT32_MAX;
        for (uint32_t l = 0; l < L; ++l) {
          if (dirty[l]) refresh(l);
          if (layer_min[l].second != kNoObject && (vl == UINT32_MAX || layer_min[l].first < layer_min[vl].first)) vl = l;
        }
        if (vl == UINT32_MAX) return Error(kCannotEvictText, ErrorKind::kRuntime);
        ObjectId v = layer_min[vl].second;
        auto& vec = res_of[vl];
        vec[pos[v]] = vec.back();
        pos[vec[pos[v]]] = pos[v];
        vec.pop_back();
        resident[v] = 0;
        dirty[vl] = 1;
        --count;
        ++res.evictions;
      }
      resident[k] = 1;
      pos[k] = static_cast<uint32_t>(res_of[li].size());
      res_of[li].push_back(k);
      ++count;
    }
    cur_layer = UINT32_MAX;
    dirty[li] = 1;
  }
  return res;
}

}  // namespace k3pack::store
