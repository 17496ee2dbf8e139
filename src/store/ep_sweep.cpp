#include "store/ep_sweep.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <optional>
#include <thread>

#include "k3pack/ep.h"
#include "util/threads.h"

namespace k3pack::store {

using nlohmann::json;

ObjectSpace RankSpace(const ObjectSpace& space, uint32_t ep_size) {
  ObjectSpace s = space;
  s.num_experts = space.num_experts / ep_size;
  return s;
}

CallSeq RankCallSeq(const CallSeq& seq, const ObjectSpace& space, uint32_t ep_size, uint32_t rank) {
  const ep::ExpertRange owned = ep::OwnedExperts(ep::Rank{ep_size, rank}, space.num_experts);
  CallSeq out;
  out.tokens = seq.tokens;
  for (const auto& c : seq.calls) {
    const uint64_t begin = out.keys.size();
    for (uint64_t p = c.begin; p < c.end; ++p) {
      const uint32_t e = space.ExpertOf(seq.keys[p]);
      if (owned.contains(e)) out.keys.push_back(c.layer_index * owned.count() + (e - owned.first));
    }
    // Rows stay the call's rows: CallSeq keeps no per-row routes, and no
    // policy or bound reads them.
    if (out.keys.size() > begin) out.calls.push_back({c.layer_index, c.is_prefill, c.rows, begin, out.keys.size()});
  }
  // Routes here are the rank's distinct objects per call (duplicates inside a
  // call were merged when `seq` was built).
  out.routes = out.keys.size();
  return out;
}

Result<EpSweepTable> EpSweep(const CallSeq& seq, const ObjectSpace& space, const std::vector<std::string>& policies,
                             const std::vector<uint64_t>& sizes, uint32_t ep_size, bool belady, unsigned threads,
                             const ProgressFn& progress) {
  K3_RETURN_IF_ERROR(ep::CheckRank(ep::Rank{ep_size, 0}, space.num_experts));
  EpSweepTable t;
  t.ep_size = ep_size;
  t.series = policies;
  if (belady && space.uniform()) t.series.push_back("belady");
  t.capacity_objects = sizes;
  const ObjectSpace rank_space = RankSpace(space, ep_size);
  t.rank_objects = rank_space.num_objects();
  t.experts_per_rank = rank_space.num_experts;
  t.tokens = seq.tokens;
  std::vector<CallSeq> rank_seqs;
  for (uint32_t r = 0; r < ep_size; ++r) rank_seqs.push_back(RankCallSeq(seq, space, ep_size, r));
  t.ranks.assign(t.series.size(), std::vector<std::vector<SimResult>>(sizes.size(), std::vector<SimResult>(ep_size)));
  t.single.assign(t.series.size(), std::vector<SimResult>(sizes.size()));
  // Jobs: (series, size, rank), rank == ep_size being the one-machine run.
  // A cache smaller than a call's objects cannot serve it (every policy
  // protects the call's keys); such a cell is left unavailable.
  const size_t per_size = ep_size + 1, jobs = t.series.size() * sizes.size() * per_size;
  std::atomic<size_t> next{0};
  std::mutex mu;
  SweepProgress done(progress, jobs);
  std::optional<Error> first_error;
  auto work = [&] {
    for (size_t j; (j = next.fetch_add(1)) < jobs;) {
      const size_t s = j / (sizes.size() * per_size), i = j / per_size % sizes.size(), r = j % per_size;
      const bool single = r == ep_size;
      const CallSeq& q = single ? seq : rank_seqs[r];
      const ObjectSpace& sp = single ? space : rank_space;
      SimResult& out = single ? t.single[s][i] : t.ranks[s][i][r];
      out.policy = t.series[s];
      out.capacity_objects = sizes[i];
      const bool unavailable = sizes[i] < LargestCall(q);  // capacity_bytes stays 0
      Result<SimResult> res = unavailable            ? Result<SimResult>(out)
                              : t.series[s] == "belady" ? SimulateBelady(q, sp, sizes[i])
                                                        : Simulate(q, sp, t.series[s], sizes[i] * sp.max_object_bytes());
      std::lock_guard<std::mutex> lock(mu);
      if (!res.ok()) {
        if (!first_error) first_error = res.error();
        next = jobs;
        continue;
      }
      out = std::move(res).value();
      done.JobDone();
    }
  };
  RunOnThreads(threads, work);
  if (first_error) return *first_error;
  return t;
}

namespace {

bool Available(const SimResult& r) { return r.capacity_bytes != 0; }

struct Total {
  bool available = true;
  uint64_t hits = 0, misses = 0, bytes = 0, max_rank_bytes = 0;
};

Total Sum(const std::vector<SimResult>& ranks) {
  Total s;
  for (const auto& r : ranks) {
    if (!Available(r)) s.available = false;
    s.hits += r.hits;
    s.misses += r.misses;
    s.bytes += r.bytes_read;
    s.max_rank_bytes = std::max(s.max_rank_bytes, r.bytes_read);
  }
  return s;
}

double Rate(uint64_t hits, uint64_t misses) { return hits + misses ? double(hits) / double(hits + misses) : 0.0; }
double PerToken(uint64_t bytes, uint64_t tokens) { return tokens ? double(bytes) / double(tokens) : 0.0; }

}  // namespace

std::string EpSweepText(const EpSweepTable& t) {
  std::string out;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "ep-size %u: each rank owns %u of the %u experts of every layer and runs its own cache; sizes are "
                "per rank (share of the rank's %llu objects); MB read per token\n",
                t.ep_size, t.experts_per_rank, t.experts_per_rank * t.ep_size, (unsigned long long)t.rank_objects);
  out += buf;
  // An unavailable cell (cache smaller than a call) prints "-" in the same width.
  auto cell = [&](bool ok, const char* fmt, double v) {
    const int width = std::snprintf(buf, sizeof buf, fmt, ok ? v : 0.0);
    if (!ok) std::snprintf(buf, sizeof buf, "%*s", width, "-");
    out += buf;
  };
  for (size_t s = 0; s < t.series.size(); ++s) {
    out += t.series[s] + "\n";
    std::snprintf(buf, sizeof buf, "%10s %7s", "objects", "share");
    out += buf;
    for (uint32_t r = 0; r < t.ep_size; ++r) {
      std::snprintf(buf, sizeof buf, " %7s%-2u", "rank ", r);
      out += buf;
    }
    std::snprintf(buf, sizeof buf, " | %9s %9s %9s | %11s %9s\n", "all ranks", "MB/token", "max rank", "one machine",
                  "MB/token");
    out += buf;
    for (size_t i = 0; i < t.capacity_objects.size(); ++i) {
      std::snprintf(buf, sizeof buf, "%10llu %6.2f%%", (unsigned long long)t.capacity_objects[i],
                    100.0 * double(t.capacity_objects[i]) / double(std::max<uint64_t>(1, t.rank_objects)));
      out += buf;
      for (uint32_t r = 0; r < t.ep_size; ++r) {
        const SimResult& x = t.ranks[s][i][r];
        cell(Available(x), " %8.1f%%", 100.0 * x.hit_rate());
      }
      const Total tot = Sum(t.ranks[s][i]);
      out += " |";
      cell(tot.available, " %8.1f%%", 100.0 * Rate(tot.hits, tot.misses));
      cell(tot.available, " %9.1f", PerToken(tot.bytes, t.tokens) / 1e6);
      cell(tot.available, " %9.1f", PerToken(tot.max_rank_bytes, t.tokens) / 1e6);
      out += " |";
      const SimResult& one = t.single[s][i];
      cell(Available(one), " %10.1f%%", 100.0 * one.hit_rate());
      cell(Available(one), " %9.1f", PerToken(one.bytes_read, t.tokens) / 1e6);
      out += "\n";
    }
  }
  out += "max rank: MB per token of the busiest rank (ranks read in parallel); one machine: every expert, one cache "
         "of the same size\n";
  return out;
}

json EpSweepJson(const EpSweepTable& t) {
  json j;
  j["ep_size"] = t.ep_size;
  j["experts_per_rank"] = t.experts_per_rank;
  j["rank_objects"] = t.rank_objects;
  j["tokens"] = t.tokens;
  j["capacity_objects_per_rank"] = t.capacity_objects;
  for (size_t s = 0; s < t.series.size(); ++s) {
    json hit = json::array(), bpt = json::array(), max_bpt = json::array(), one_hit = json::array(),
         one_bpt = json::array();
    json ranks = json::array();
    for (uint32_t r = 0; r < t.ep_size; ++r)
      ranks.push_back({{"rank", r}, {"experts", {r * t.experts_per_rank, (r + 1) * t.experts_per_rank}}, {"hits", json::array()}, {"misses", json::array()},
                       {"hit_rate", json::array()}, {"bytes_per_token", json::array()}});
    for (size_t i = 0; i < t.capacity_objects.size(); ++i) {
      const Total tot = Sum(t.ranks[s][i]);
      hit.push_back(tot.available ? json(Rate(tot.hits, tot.misses)) : json());
      bpt.push_back(tot.available ? json(PerToken(tot.bytes, t.tokens)) : json());
      max_bpt.push_back(tot.available ? json(PerToken(tot.max_rank_bytes, t.tokens)) : json());
      for (uint32_t r = 0; r < t.ep_size; ++r) {
        const SimResult& x = t.ranks[s][i][r];
        const bool ok = Available(x);
        ranks[r]["hits"].push_back(ok ? json(x.hits) : json());
        ranks[r]["misses"].push_back(ok ? json(x.misses) : json());
        ranks[r]["hit_rate"].push_back(ok ? json(x.hit_rate()) : json());
        ranks[r]["bytes_per_token"].push_back(ok ? json(PerToken(x.bytes_read, t.tokens)) : json());
      }
      const SimResult& one = t.single[s][i];
      one_hit.push_back(Available(one) ? json(one.hit_rate()) : json());
      one_bpt.push_back(Available(one) ? json(PerToken(one.bytes_read, t.tokens)) : json());
    }
    j["series"][t.series[s]] = {{"hit_rate", hit},
                                {"bytes_per_token", bpt},
                                {"max_rank_bytes_per_token", max_bpt},
                                {"ranks", ranks},
                                {"one_machine", {{"hit_rate", one_hit}, {"bytes_per_token", one_bpt}}}};
  }
  return j;
}

}  // namespace k3pack::store
