// The replay loop the two demand-only references of `trace sweep` share:
// the informed bound (told each request's true popularity) and the learner
// (told only the popularity values, learning which expert holds which).
//
// Both evict, on a miss with a full cache, the resident object least likely
// to be routed at the next token of any active request:
//   p_r(o) = reuse + (1 - reuse) * fresh   if o's expert was in r's previous
//                                          token at o's layer, else fresh
//   score(o) = 1 - prod over active requests r of (1 - p_r(o))
// where `fresh` (the chance of a fresh draw) is the only thing the two
// know differently. A Model supplies it:
//   void Start(uint32_t q)            request q's first call is here
//   void End(uint32_t q)              q will not call again
//   bool Route(q, li, prev, row)      q routed `row` at layer li after `prev`
//                                     (both sorted); true when every score of
//                                     that layer may have moved
//   void Token(q, tokens, changed)    q's token count at the first layer is now
//                                     `tokens`; changed(li, e) for each weight
//                                     that moved
//   double Fresh(q, li, e, draws)     the chance e is among `draws` fresh draws
// Scores change only on those events, so residents sit in one RankedSet and
// only the objects an event touched are re-scored (every resident when the
// active set changes).
//
// With `know_next` the loop is also told each request's true next call of
// every layer (what 100%-accurate next-token predictions would name). Then an
// object that call routes is certain to be needed, one it does not route can
// only come back as a fresh draw at the token after, and one of a layer the
// request will not call again is worth nothing to it:
//   certain(o) = number of active requests whose next call routes o
//   p_r(o)     = reuse + (1 - reuse) * fresh  if r's next call routes o,
//                0 if r has no next call of o's layer, else fresh
//   score(o)   = certain(o) + 1 - prod over active r of (1 - p_r(o))
// so certain objects rank above every other, ordered by their chance at the
// token after.
#pragma once

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "k3pack/trace.h"
#include "store/policy.h"
#include "store/ranked_set.h"
#include "store/simulate.h"

namespace k3pack::store {

template <class Model>
Result<SimResult> RunDemandBound(const std::string& name, const trace::Trace& t, const CallSeq& seq,
                                 const ObjectSpace& space, uint64_t slots, const trace::TrueDistribution& truth,
                                 Model& model, bool know_next = false) {
  if (seq.calls.size() != t.records.size()) return Error(name + " bound: call sequence does not match the trace");
  const uint32_t L = space.num_active_layers(), E = space.num_experts, K = truth.top_k;
  const uint64_t num_requests = truth.initial.size();
  for (const auto& w : truth.initial)
    if (!w.empty() && w.size() != size_t{L} * E) return Error(name + " bound: distribution does not match the trace");
  SimResult res;
  res.policy = name;
  res.capacity_objects = slots;
  res.capacity_bytes = slots * space.max_object_bytes();
  res.layer_hits.assign(L, 0);
  res.layer_misses.assign(L, 0);

  struct Req {
    std::vector<std::vector<uint16_t>> prev;  // sorted experts of the last token per layer
    uint64_t first = UINT64_MAX, last = 0;    // call indices
    uint32_t tokens = 0;                      // rows seen at the first layer
    // know_next: per layer, the request's calls in order, the position of
    // its next one, and that call's experts (sorted, every row of the request)
    std::vector<std::vector<uint64_t>> calls;
    std::vector<uint32_t> next_pos;
    std::vector<std::vector<uint16_t>> next;
  };
  std::vector<Req> reqs(num_requests);
  for (auto& r : reqs) {
    r.prev.resize(L);
    if (know_next) {
      r.calls.resize(L);
      r.next_pos.assign(L, 0);
      r.next.resize(L);
    }
  }
  for (uint64_t i = 0; i < t.records.size(); ++i) {
    const auto& r = t.records[i];
    for (uint32_t row = 0; row < r.rows; ++row) {
      uint32_t q = t.RowRequest(r, row);
      if (q >= num_requests || truth.initial[q].empty())
        return Error(name + " bound: request " + std::to_string(q) + " has no distribution");
      reqs[q].first = std::min(reqs[q].first, i);
      reqs[q].last = std::max(reqs[q].last, i);
      if (know_next) {
        auto& at = reqs[q].calls[seq.calls[i].layer_index];
        if (at.empty() || at.back() != i) at.push_back(i);
      }
    }
  }
  // Fills r.next[li] with the experts of r's call at position next_pos[li].
  auto load_next = [&](uint32_t q, uint32_t li) {
    Req& r = reqs[q];
    r.next[li].clear();
    if (r.next_pos[li] >= r.calls[li].size()) return;
    const auto& rec = t.records[r.calls[li][r.next_pos[li]]];
    auto ids = t.RecordIds(rec);
    for (uint32_t row_i = 0; row_i < rec.rows; ++row_i)
      if (t.RowRequest(rec, row_i) == q)
        r.next[li].insert(r.next[li].end(), ids.begin() + size_t{row_i} * t.top_k,
                          ids.begin() + size_t{row_i + 1} * t.top_k);
    std::sort(r.next[li].begin(), r.next[li].end());
    r.next[li].erase(std::unique(r.next[li].begin(), r.next[li].end()), r.next[li].end());
  };

  const double reuse = truth.reuse, m = double(K) * (1.0 - reuse);
  std::vector<uint32_t> active;
  std::vector<uint8_t> resident(space.num_objects(), 0);
  std::vector<float> score_of(space.num_objects(), 0.0f);
  RankedSet<std::pair<float, ObjectId>> order(space.num_objects());  // residents, lowest score first
  uint64_t count = 0;

  auto score = [&](ObjectId o) {
    const uint32_t li = space.LayerIndexOf(o), e = space.ExpertOf(o);
    double none = 1.0;
    if (know_next) {
      uint32_t certain = 0;
      for (uint32_t q : active) {
        const Req& r = reqs[q];
        if (r.next_pos[li] >= r.calls[li].size()) continue;
        const double fresh = model.Fresh(q, li, e, m);
        if (std::binary_search(r.next[li].begin(), r.next[li].end(), uint16_t(e))) {
          ++certain;
          none *= 1.0 - (reuse + (1.0 - reuse) * fresh);
        } else {
          none *= 1.0 - fresh;
        }
      }
      return float(certain + 1.0 - none);
    }
    for (uint32_t q : active) {
      const auto& pv = reqs[q].prev[li];
      double p;
      if (pv.empty()) p = model.Fresh(q, li, e, double(K));
      else if (std::binary_search(pv.begin(), pv.end(), uint16_t(e))) p = reuse + (1.0 - reuse) * model.Fresh(q, li, e, m);
      else p = model.Fresh(q, li, e, m);
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
        model.Start(q);
        if (know_next)
          for (uint32_t layer = 0; layer < L; ++layer) load_next(q, layer);
        changed = true;
      }
    }
    for (size_t a = 0; a < active.size();) {
      if (reqs[active[a]].last < i) {
        model.End(active[a]);
        active.erase(active.begin() + a);
        changed = true;
      } else {
        ++a;
      }
    }
    // This call's rows become their requests' previous tokens at this layer;
    // the first layer advances their token count (and popularity drift).
    auto ids = t.RecordIds(rec);
    bool rescore_layer = false;  // once after the rows, however many moved the whole layer
    for (uint32_t row_i = 0; row_i < rec.rows; ++row_i) {
      uint32_t q = t.RowRequest(rec, row_i);
      Req& r = reqs[q];
      row.assign(ids.begin() + size_t{row_i} * t.top_k, ids.begin() + size_t{row_i + 1} * t.top_k);
      std::sort(row.begin(), row.end());
      const bool whole_layer = model.Route(q, li, r.prev[li], row);
      old.swap(r.prev[li]);
      r.prev[li] = row;
      rescore_layer |= whole_layer;
      if (!changed && !rescore_layer) {
        for (uint16_t e : old) rescore(space.Id(li, e));
        for (uint16_t e : row) rescore(space.Id(li, e));
      }
      if (li == 0) {
        ++r.tokens;
        model.Token(q, r.tokens, [&](uint32_t layer, uint32_t e) {
          if (!changed) rescore(space.Id(layer, e));
        });
      }
    }
    // know_next: each request of the call moves on to its following call of
    // this layer (a prefill call has several rows of one request: once).
    if (know_next) {
      for (uint32_t row_i = 0; row_i < rec.rows; ++row_i) {
        uint32_t q = t.RowRequest(rec, row_i);
        Req& r = reqs[q];
        if (r.next_pos[li] >= r.calls[li].size() || r.calls[li][r.next_pos[li]] != i) continue;
        old.swap(r.next[li]);
        ++r.next_pos[li];
        load_next(q, li);
        // Its last call of the layer: every object of the layer lost its worth to it.
        if (r.next_pos[li] >= r.calls[li].size()) rescore_layer = true;
        if (!changed && !rescore_layer) {
          for (uint16_t e : old) rescore(space.Id(li, e));
          for (uint16_t e : r.next[li]) rescore(space.Id(li, e));
        }
      }
    }
    if (rescore_layer && !changed)
      for (uint32_t e = 0; e < E; ++e) rescore(space.Id(li, e));
    if (changed) {
      order.Clear();
      for (ObjectId o = 0; o < space.num_objects(); ++o)
        if (resident[o]) order.Set(o, {score_of[o] = score(o), o});
    }
    std::span<const ObjectId> call_keys(seq.keys.data() + c.begin, c.end - c.begin);
    if (call_keys.size() > slots)
      return Error(name + " bound: a call needs " + std::to_string(call_keys.size()) +
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
