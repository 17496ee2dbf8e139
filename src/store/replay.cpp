#include "store/replay.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <mutex>
#include <optional>
#include <thread>

#include "util/threads.h"

namespace k3pack::store {

using nlohmann::json;

Error TraceDimensionMismatch(const std::string& trace_path, const trace::Trace& t, const std::string& manifest_path,
                             uint32_t num_experts, uint32_t top_k) {
  return Error((trace_path.empty() ? std::string() : trace_path + ": ") + "trace dimensions (experts " +
               std::to_string(t.num_experts) + ", top_k " + std::to_string(t.top_k) + ") do not match manifest " +
               manifest_path + " (" + std::to_string(num_experts) + ", " + std::to_string(top_k) + ")");
}

Result<json> ReplayOnStore(const trace::Trace& t, const ReplayOptions& o) {
  if (o.prefetch != "none" && o.prefetch != "oracle-lookahead")
    return Error("unknown prefetch mode '" + o.prefetch + "' (known: none, oracle-lookahead)");
  K3_ASSIGN_OR_RETURN(auto store, ExpertStore::Open(o.pack_path, o.manifest_path, o.store));
  const StoreInfo& info = store->info();
  if (t.num_experts != info.num_experts || t.top_k != info.top_k)
    return TraceDimensionMismatch(o.trace_path, t, o.manifest_path, info.num_experts, info.top_k);
  if (!info.ep.whole()) {
    // A rank pack serves only its own experts; a whole trace routes to all.
    const ep::ExpertRange owned = info.owned_experts;
    for (const auto& r : t.records)
      for (uint16_t e : t.RecordIds(r))
        if (!owned.contains(e))
          return Error(o.manifest_path + " is the manifest of a rank pack, " + ep::Describe(info.ep, info.num_experts) +
                       ", and the trace routes layer " + std::to_string(r.layer) + " expert " + std::to_string(e) +
                       ", which another rank serves")
              .WithHint("replay on the full pack's manifest (`trace sweep --ep-size " + std::to_string(info.ep.size) +
                        "` simulates each rank's cache)");
  }
  std::vector<int64_t> ids, ahead;
  std::vector<uint64_t> requests;
  auto start = std::chrono::steady_clock::now();
  const bool oracle = o.prefetch == "oracle-lookahead";
  const size_t n = t.records.size();
  if (oracle) {
    for (size_t j = 0; j < std::min<size_t>(o.lookahead, n); ++j) {
      auto r = t.RecordIds(t.records[j]);
      ahead.assign(r.begin(), r.end());
      K3_RETURN_IF_ERROR(store->Prefetch(t.records[j].layer, ahead));
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const trace::Record& rec = t.records[i];
    if (oracle && i + o.lookahead < n) {
      const trace::Record& next = t.records[i + o.lookahead];
      auto r = t.RecordIds(next);
      ahead.assign(r.begin(), r.end());
      K3_RETURN_IF_ERROR(store->Prefetch(next.layer, ahead));
    }
    auto r = t.RecordIds(rec);
    ids.assign(r.begin(), r.end());
    int64_t shape[2] = {rec.rows, t.top_k};
    requests.clear();
    for (uint32_t row = 0; row < rec.rows; ++row) requests.push_back(t.RowRequest(rec, row));
    auto acq = store->Acquire(rec.layer, ids, shape, rec.is_prefill, requests);
    if (!acq.ok()) return acq.error().WithContext("trace record " + std::to_string(i));
    K3_RETURN_IF_ERROR(store->MarkUsed(*acq));
    // Every record: at full scale one record reads ~190 MB (16 misses of
    // 12 MB), and the reporter throttles what it prints.
    if (o.progress) o.progress(i + 1, n);
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  json stats = store->Snapshot();
  K3_RETURN_IF_ERROR(store->Close());
  json out;
  uint64_t hits = stats["cache_hits"], misses = stats["cache_misses"], bytes = stats["pack_read_bytes"];
  // The store counts tokens at the model's first routed layer, which a trace
  // of some layers never reaches (its per-token figures read 0).
  const uint64_t tokens = trace::CountTokens(t);
  out["policy"] = stats["cache_policy"];
  out["io_backend"] = stats["k3pack"]["io_backend"];
  out["direct_io"] = o.store.direct_io;
  out["prefetch"] = o.prefetch;
  out["cache_bytes"] = o.store.cache_bytes;
  out["effective_capacity_experts"] = info.effective_capacity_objects;
  out["open_seconds"] = info.open_seconds;
  out["hits"] = hits;
  out["misses"] = misses;
  out["hit_rate"] = hits + misses ? double(hits) / double(hits + misses) : 0.0;
  out["tokens"] = tokens;
  out["bytes_read"] = bytes;
  out["bytes_per_token"] = tokens ? double(bytes) / double(tokens) : 0.0;
  out["seconds"] = seconds;
  out["gb_per_s"] = seconds > 0 ? double(bytes) / seconds / 1e9 : 0.0;
  out["read_latency_ms"] = stats["k3pack"]["read_latency_ms"];
  out["prefetch_useful"] = stats["k3pack"]["prefetch_useful"];
  out["prefetch_wasted"] = stats["k3pack"]["prefetch_wasted"];
  out["io_errors"] = stats["io_errors"];
  out["stats"] = stats;
  return out;
}

Result<SweepTable> Sweep(const CallSeq& seq, const ObjectSpace& space, const std::vector<std::string>& policies,
                         const std::vector<uint64_t>& sizes, bool belady, const trace::Trace* trace,
                         const trace::TrueDistribution* truth, unsigned threads, const ProgressFn& progress,
                         SweepReferences references) {
  SweepTable t;
  t.capacity_objects = sizes;
  t.num_objects = space.num_objects();
  t.series = policies;
  // The references told the generator's truth need it, and objects of one size.
  const bool told = trace && truth && space.uniform();
  if (belady && space.uniform()) t.series.push_back("belady");
  if (belady && told) t.series.push_back("informed");
  if (references.informed_next && told) t.series.push_back("informed+next");
  if (references.learner && told) t.series.push_back("learner");
  t.hit_rate.assign(t.series.size(), std::vector<double>(sizes.size(), 0.0));
  for (auto* counts : {&t.hits, &t.misses, &t.bytes_read})
    counts->assign(t.series.size(), std::vector<uint64_t>(sizes.size(), 0));
  // One job per (series, size); simulations are independent. The slowest
  // series go first, so no thread is left alone with one at the end.
  const size_t jobs = t.series.size() * sizes.size();
  std::vector<size_t> series_order(t.series.size());
  for (size_t s = 0; s < series_order.size(); ++s) series_order[s] = s;
  auto cost = [](const std::string& name) {
    static const char* kSlowestFirst[] = {"learner",     "adaptive",  "informed+next", "informed",
                                          "quota-decay", "decay-lfu", "belady"};
    for (size_t r = 0; r < std::size(kSlowestFirst); ++r)
      if (name == kSlowestFirst[r]) return r;
    return std::size(kSlowestFirst);
  };
  std::stable_sort(series_order.begin(), series_order.end(),
                   [&](size_t x, size_t y) { return cost(t.series[x]) < cost(t.series[y]); });
  std::atomic<size_t> next{0};
  std::mutex mu;
  SweepProgress done(progress, jobs);
  std::optional<Error> first_error;
  auto work = [&] {
    for (size_t j; (j = next.fetch_add(1)) < jobs;) {
      const size_t s = series_order[j / sizes.size()], i = j % sizes.size();
      const std::string& name = t.series[s];
      Result<SimResult> r = name == "belady"          ? SimulateBelady(seq, space, sizes[i])
                            : name == "informed"      ? SimulateInformed(*trace, seq, space, sizes[i], *truth)
                            : name == "informed+next" ? SimulateInformedNext(*trace, seq, space, sizes[i], *truth)
                            : name == "learner"       ? SimulateLearner(*trace, seq, space, sizes[i], *truth)
                                                      : Simulate(seq, space, name, sizes[i] * space.max_object_bytes());
      std::lock_guard<std::mutex> lock(mu);
      if (!r.ok()) {
        if (!first_error) first_error = r.error();
        next = jobs;
        continue;
      }
      t.hit_rate[s][i] = r->hit_rate();
      t.hits[s][i] = r->hits;
      t.misses[s][i] = r->misses;
      t.bytes_read[s][i] = r->bytes_read;
      done.JobDone();
    }
  };
  RunOnThreads(threads, work);
  if (first_error) return *first_error;
  return t;
}

std::vector<uint64_t> DefaultSweepSizes(const ObjectSpace& space, std::string* note, const std::string& owner,
                                        uint64_t min_objects) {
  static constexpr double kShares[] = {0.0054, 0.01, 0.02, 0.035, 0.05, 0.08, 0.12, 0.20};
  const uint64_t n = space.num_objects();
  const uint64_t top_k = std::max<uint64_t>(1, space.top_k);
  // No size below what one call needs: top_k for one token, more for a
  // batched call or a prefill chunk (its objects stay co-resident).
  const uint64_t lo = std::max(top_k, min_objects);
  std::vector<uint64_t> sizes;
  for (double f : kShares) sizes.push_back(std::max<uint64_t>(lo, uint64_t(f * double(n))));
  note->clear();
  if (std::adjacent_find(sizes.begin(), sizes.end()) == sizes.end()) return sizes;
  // Geometric steps from lo (the least cache that serves every call) to 20%
  // of the objects, or 6 x lo when that is more, capped at all objects.
  const uint64_t hi = std::max(lo, std::min(n, std::max(uint64_t(0.20 * double(n)), 6 * lo)));
  std::vector<uint64_t> fit;
  for (int i = 0; i < 6; ++i) {
    const double v = double(lo) * std::pow(double(hi) / double(lo), i / 5.0);
    const uint64_t s = std::clamp<uint64_t>(uint64_t(std::llround(v)), lo, hi);
    if (fit.empty() || s > fit.back()) fit.push_back(s);
  }
  // A range of six values or fewer: every integer in it.
  if (hi - lo < 6) {
    fit.clear();
    for (uint64_t s = lo; s <= hi && fit.size() < 6; ++s) fit.push_back(s);
  }
  std::string list;
  for (uint64_t s : fit) list += (list.empty() ? "" : ",") + std::to_string(s);
  const std::string why = lo > top_k ? "a cache below the largest call's " + std::to_string(lo) +
                                           " distinct objects cannot serve that call"
                                     : "a cache below top_k holds less than one token's experts";
  *note = owner + " has only " + std::to_string(n) + " expert objects (top_k " + std::to_string(space.top_k) +
          "): the default sizes, 0.54%-20% of them, are " + std::to_string(uint64_t(kShares[0] * double(n))) + "-" +
          std::to_string(uint64_t(kShares[7] * double(n))) + " objects and would give identical rows (" + why +
          "); using " + list + " instead (pass --sizes to choose)";
  return fit;
}

std::string SweepText(const SweepTable& t) {
  std::string out;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%10s %8s", "objects", "share");
  out += buf;
  for (const auto& s : t.series) {
    std::snprintf(buf, sizeof buf, " %17s", s.c_str());
    out += buf;
  }
  out += "\n";
  for (size_t i = 0; i < t.capacity_objects.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%10llu %7.2f%%", (unsigned long long)t.capacity_objects[i],
                  100.0 * double(t.capacity_objects[i]) / double(std::max<uint64_t>(1, t.num_objects)));
    out += buf;
    for (size_t s = 0; s < t.series.size(); ++s) {
      std::snprintf(buf, sizeof buf, " %16.1f%%", 100.0 * t.hit_rate[s][i]);
      out += buf;
    }
    out += "\n";
  }
  return out;
}

json SweepJson(const SweepTable& t) {
  json j;
  j["capacity_objects"] = t.capacity_objects;
  j["num_objects"] = t.num_objects;
  for (size_t s = 0; s < t.series.size(); ++s) {
    j["hit_rate"][t.series[s]] = t.hit_rate[s];
    if (s < t.hits.size()) {
      j["hits"][t.series[s]] = t.hits[s];
      j["misses"][t.series[s]] = t.misses[s];
      j["bytes_read"][t.series[s]] = t.bytes_read[s];
    }
  }
  return j;
}

std::string SweepSvg(const SweepTable& t, const std::string& title) {
  const double W = 720, H = 440, L = 70, R = 190, T = 40, B = 60;
  const double pw = W - L - R, ph = H - T - B;
  uint64_t xmax = 1;
  for (uint64_t c : t.capacity_objects) xmax = std::max(xmax, c);
  double ymax = 0.1;
  for (const auto& row : t.hit_rate)
    for (double v : row) ymax = std::max(ymax, v);
  ymax = std::ceil(ymax * 10.0) / 10.0;
  auto X = [&](double c) { return L + pw * c / double(xmax); };
  auto Y = [&](double v) { return T + ph * (1.0 - v / ymax); };
  static const char* kColors[] = {"#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#000000"};
  std::string s;
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
                "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
                W, H);
  s += buf;
  std::snprintf(buf, sizeof buf, "<text x=\"%.0f\" y=\"22\" font-size=\"15\">", L);
  s += buf;
  for (char c : title) s += c == '<' ? std::string("&lt;") : c == '&' ? std::string("&amp;") : std::string(1, c);
  s += "</text>\n";
  for (int i = 0; i <= 5; ++i) {
    double v = ymax * i / 5, y = Y(v);
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/><text x=\"%.1f\" y=\"%.1f\" "
                  "text-anchor=\"end\">%.0f%%</text>\n",
                  L, y, L + pw, y, L - 6, y + 4, v * 100);
    s += buf;
  }
  for (uint64_t c : t.capacity_objects) {
    std::snprintf(buf, sizeof buf,
                  "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%llu</text>\n", X(double(c)), T + ph + 18,
                  (unsigned long long)c);
    s += buf;
  }
  std::snprintf(buf, sizeof buf,
                "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">cache size (objects)</text>\n<text x=\"16\" "
                "y=\"%.1f\" transform=\"rotate(-90 16 %.1f)\" text-anchor=\"middle\">hit rate</text>\n",
                L + pw / 2, H - 18, T + ph / 2, T + ph / 2);
  s += buf;
  std::snprintf(buf, sizeof buf, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#333\"/>\n",
                L, T, pw, ph);
  s += buf;
  for (size_t k = 0; k < t.series.size(); ++k) {
    const char* color = kColors[k % 7];
    bool dashed = t.series[k] == "belady";
    s += "<polyline fill=\"none\" stroke-width=\"2\" stroke=\"" + std::string(color) + "\"" +
         (dashed ? " stroke-dasharray=\"6 4\"" : "") + " points=\"";
    for (size_t i = 0; i < t.capacity_objects.size(); ++i) {
      std::snprintf(buf, sizeof buf, "%.1f,%.1f ", X(double(t.capacity_objects[i])), Y(t.hit_rate[k][i]));
      s += buf;
    }
    s += "\"/>\n";
    for (size_t i = 0; i < t.capacity_objects.size(); ++i) {
      std::snprintf(buf, sizeof buf, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n",
                    X(double(t.capacity_objects[i])), Y(t.hit_rate[k][i]), color);
      s += buf;
    }
    double ly = T + 10 + 20.0 * double(k);
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"%s/>"
                  "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n",
                  L + pw + 14, ly, L + pw + 38, ly, color, dashed ? " stroke-dasharray=\"6 4\"" : "", L + pw + 44,
                  ly + 4, t.series[k].c_str());
    s += buf;
  }
  s += "</svg>\n";
  return s;
}

}  // namespace k3pack::store
