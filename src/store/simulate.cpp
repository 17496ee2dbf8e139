#include "store/simulate.h"

#include <algorithm>
#include <utility>

#include "store/policy.h"
#include "store/ranked_set.h"

namespace k3pack::store {

ObjectSpace SpaceForTrace(const trace::Trace& t, uint64_t object_bytes) {
  ObjectSpace s;
  s.active_layer_ids = t.layer_ids;
  s.num_experts = t.num_experts;
  s.top_k = t.top_k;
  s.object_bytes.assign(t.layer_ids.size(), object_bytes);
  s.num_layers_total = t.layer_ids.empty() ? 0 : t.layer_ids.back() + 1;
  return s;
}

Result<CallSeq> BuildCallSeq(const trace::Trace& t, const ObjectSpace& space) {
  CallSeq seq;
  seq.route_width = t.top_k;
  std::vector<int64_t> ids;
  std::vector<ObjectId> distinct;
  // Not the space's first layer: a manifest's may be one the trace never routes.
  seq.tokens = trace::CountTokens(t);
  for (size_t i = 0; i < t.records.size(); ++i) {
    const trace::Record& r = t.records[i];
    auto raw = t.RecordIds(r);
    ids.assign(raw.begin(), raw.end());
    int64_t shape[2] = {r.rows, t.top_k};
    Status st = ValidateRoute(space, r.layer, shape, ids);
    if (!st.ok()) return st.error().WithContext("trace record " + std::to_string(i));
    uint32_t li = static_cast<uint32_t>(space.LayerIndex(r.layer));
    DistinctSorted(space, li, ids.data(), ids.size(), &distinct);
    seq.calls.push_back({li, r.is_prefill, r.rows, seq.keys.size(), seq.keys.size() + distinct.size(),
                         seq.row_keys.size(), seq.row_requests.size()});
    for (int64_t e : ids) seq.row_keys.push_back(space.Id(li, static_cast<uint32_t>(e)));
    for (uint32_t row = 0; row < r.rows; ++row) seq.row_requests.push_back(t.RowRequest(r, row));
    seq.keys.insert(seq.keys.end(), distinct.begin(), distinct.end());
    seq.routes += ids.size();
  }
  return seq;
}

uint64_t LargestCall(const CallSeq& seq) {
  uint64_t m = 0;
  for (const auto& c : seq.calls) m = std::max<uint64_t>(m, c.end - c.begin);
  return m;
}

uint64_t LargestCallBytes(const CallSeq& seq, const ObjectSpace& space) {
  uint64_t need = 0;
  for (const auto& call : seq.calls) {
    uint64_t bytes = 0;
    for (uint64_t p = call.begin; p < call.end; ++p) bytes += space.Cost(seq.keys[p]);
    need = std::max(need, bytes);
  }
  return need;
}

const CallRows* RowsOf(const CallSeq& seq, size_t i, CallRows* storage) {
  if (!seq.has_rows()) return nullptr;
  const auto& c = seq.calls[i];
  storage->keys = {seq.row_keys.data() + c.route_begin, size_t{c.rows} * seq.route_width};
  storage->requests = {seq.row_requests.data() + c.row_begin, c.rows};
  storage->width = seq.route_width;
  return storage;
}

static SimResult NewResult(const std::string& name, const ObjectSpace& space, uint64_t cap) {
  SimResult r;
  r.policy = name;
  r.capacity_bytes = cap;
  r.capacity_objects = space.max_object_bytes() ? cap / space.max_object_bytes() : 0;
  r.layer_hits.assign(space.num_active_layers(), 0);
  r.layer_misses.assign(space.num_active_layers(), 0);
  return r;
}

namespace {
constexpr uint64_t kCallsPerReport = 4096;
void ReportCalls(const CallsDoneFn& calls_done, uint64_t done, uint64_t total) {
  if (calls_done && (done % kCallsPerReport == 0 || done == total)) calls_done(done);
}
}  // namespace

Result<SimResult> Simulate(const CallSeq& seq, const ObjectSpace& space, const std::string& name,
                           uint64_t capacity_bytes, const CallsDoneFn& calls_done) {
  K3_ASSIGN_OR_RETURN(auto policy, MakePolicy(name, space, capacity_bytes));
  SimResult res = NewResult(policy->name(), space, capacity_bytes);
  AccessResult ar;
  std::vector<uint64_t> gens;
  CallRows rows;
  uint64_t done = 0;
  for (const auto& c : seq.calls) {
    const CallRows* call_rows = RowsOf(seq, done, &rows);
    ReportCalls(calls_done, done++, seq.calls.size());
    std::span<const ObjectId> keys(seq.keys.data() + c.begin, c.end - c.begin);
    gens.assign(keys.size(), 1);
    Status st = policy->Access(keys, gens, c.is_prefill, nullptr, &ar, call_rows);
    // The real store's words for a cache too small for a call (records and
    // calls are one to one).
    if (!st.ok())
      return ExplainCannotEvict(st.error(), keys.size(), res.capacity_objects, false)
          .WithContext("trace record " + std::to_string(done - 1));
    for (size_t i = 0; i < keys.size(); ++i) {
      if (ar.hit[i]) {
        ++res.hits;
        ++res.layer_hits[c.layer_index];
      } else {
        ++res.misses;
        ++res.layer_misses[c.layer_index];
        res.bytes_read += space.Cost(keys[i]);
      }
    }
    res.evictions += ar.evictions;
  }
  ReportCalls(calls_done, done, seq.calls.size());
  return res;
}

Result<SimResult> SimulateBelady(const CallSeq& seq, const ObjectSpace& space, uint64_t slots,
                                 const CallsDoneFn& calls_done) {
  SimResult res = NewResult("belady", space, slots * space.max_object_bytes());
  res.capacity_objects = slots;
  const uint64_t n = seq.keys.size();
  constexpr uint64_t kNever = UINT64_MAX;
  // next_use[p]: position of the next call-key entry for the same object.
  std::vector<uint64_t> next_use(n, kNever);
  {
    std::vector<uint64_t> last(space.num_objects(), kNever);
    for (uint64_t p = n; p-- > 0;) {
      next_use[p] = last[seq.keys[p]];
      last[seq.keys[p]] = p;
    }
  }
  std::vector<uint8_t> resident(space.num_objects(), 0);
  // Evictable residents, farthest next use (then highest id) first.
  RankedSet<std::pair<uint64_t, uint32_t>> order(space.num_objects());
  uint64_t count = 0, done = 0;
  for (const auto& c : seq.calls) {
    ReportCalls(calls_done, done++, seq.calls.size());
    if (c.end - c.begin > slots)
      return Error("Belady: a call needs " + std::to_string(c.end - c.begin) + " objects but the cache holds " +
                   std::to_string(slots));
    // Protect the call's resident keys by taking them out of the evictable set.
    for (uint64_t p = c.begin; p < c.end; ++p) {
      ObjectId k = seq.keys[p];
      if (resident[k]) order.Erase(k);
    }
    for (uint64_t p = c.begin; p < c.end; ++p) {
      ObjectId k = seq.keys[p];
      if (resident[k]) {
        ++res.hits;
        ++res.layer_hits[c.layer_index];
        continue;
      }
      ++res.misses;
      ++res.layer_misses[c.layer_index];
      res.bytes_read += space.Cost(k);
      if (count == slots) {
        const ObjectId victim = order.FirstNot([](ObjectId) { return false; });
        resident[victim] = 0;
        order.Erase(victim);
        --count;
        ++res.evictions;
      }
      resident[k] = 1;
      ++count;
    }
    for (uint64_t p = c.begin; p < c.end; ++p) {
      ObjectId k = seq.keys[p];
      order.Set(k, {~next_use[p], ~k});
    }
  }
  ReportCalls(calls_done, done, seq.calls.size());
  return res;
}

}  // namespace k3pack::store
