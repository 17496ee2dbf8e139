#include "k3pack/trace.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "util/file.h"

namespace k3pack::trace {
namespace {

constexpr char kMagic[8] = {'K', '3', 'T', 'R', 'A', 'C', 'E', '\0'};
constexpr uint32_t kVersion = 1;

template <typename T>
void Put(std::string* s, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian host (x86-64/aarch64)
  s->append(b, sizeof(T));
}

struct Cursor {
  std::string_view s;
  size_t pos = 0;
  template <typename T>
  bool Get(T* v) {
    if (pos + sizeof(T) > s.size()) return false;
    std::memcpy(v, s.data() + pos, sizeof(T));
    pos += sizeof(T);
    return true;
  }
};

}  // namespace

void Trace::Append(uint32_t layer, uint32_t rows, uint32_t request, bool prefill, std::span<const uint16_t> route_ids) {
  Record r{layer, rows, request, prefill, ids.size()};
  records.push_back(r);
  ids.insert(ids.end(), route_ids.begin(), route_ids.end());
}

Status WriteTrace(const std::string& path, const Trace& t) {
  std::string out;
  out.reserve(40 + t.layer_ids.size() * 4 + t.records.size() * 16 + t.ids.size() * 2);
  out.append(kMagic, 8);
  Put<uint32_t>(&out, kVersion);
  Put<uint32_t>(&out, t.num_experts);
  Put<uint32_t>(&out, t.top_k);
  Put<uint32_t>(&out, static_cast<uint32_t>(t.layer_ids.size()));
  Put<uint64_t>(&out, t.records.size());
  for (uint32_t l : t.layer_ids) Put<uint32_t>(&out, l);
  for (const Record& r : t.records) {
    Put<uint32_t>(&out, r.layer);
    Put<uint32_t>(&out, r.rows);
    Put<uint32_t>(&out, r.request);
    Put<uint32_t>(&out, r.is_prefill ? 1u : 0u);
    auto ids = t.RecordIds(r);
    out.append(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(uint16_t));
  }
  return WriteFileAtomic(path, out);
}

Result<Trace> ReadTrace(const std::string& path) {
  K3_ASSIGN_OR_RETURN(std::string data, ReadFileToString(path));
  return ParseTrace(data, path);
}

Result<Trace> ParseTrace(std::string_view data, const std::string& path) {
  auto bad = [&](const std::string& why) { return Error(path + ": not a k3pack trace: " + why); };
  if (data.size() < 32 || std::memcmp(data.data(), kMagic, 8) != 0) return bad("bad magic");
  Cursor c{data, 8};
  uint32_t version, n_layers;
  uint64_t n_records;
  Trace t;
  c.Get(&version);
  c.Get(&t.num_experts);
  c.Get(&t.top_k);
  c.Get(&n_layers);
  c.Get(&n_records);
  if (version != kVersion) return bad("unsupported version " + std::to_string(version));
  if (t.top_k == 0 || t.num_experts == 0 || t.num_experts > 65536) return bad("invalid dimensions");
  if (n_records > data.size() / 16 + 1) return bad("record count exceeds the file size");
  for (uint32_t i = 0; i < n_layers; ++i) {
    uint32_t l;
    if (!c.Get(&l)) return bad("truncated layer list");
    if (!t.layer_ids.empty() && l <= t.layer_ids.back()) return bad("layer ids are not ascending");
    t.layer_ids.push_back(l);
  }
  t.records.reserve(n_records);
  for (uint64_t i = 0; i < n_records; ++i) {
    uint32_t layer, rows, request, flags;
    if (!c.Get(&layer) || !c.Get(&rows) || !c.Get(&request) || !c.Get(&flags))
      return bad("truncated at record " + std::to_string(i));
    uint64_t n = uint64_t{rows} * t.top_k;
    if (rows == 0 || c.pos + n * 2 > data.size()) return bad("truncated ids at record " + std::to_string(i));
    Record r{layer, rows, request, (flags & 1u) != 0, t.ids.size()};
    t.records.push_back(r);
    size_t old = t.ids.size();
    t.ids.resize(old + n);
    std::memcpy(t.ids.data() + old, data.data() + c.pos, n * 2);
    c.pos += n * 2;
    // Every consumer indexes per-expert tables by these ids (found by trace_fuzz).
    for (size_t k = old; k < t.ids.size(); ++k) {
      if (t.ids[k] >= t.num_experts) {
        return bad("expert id " + std::to_string(t.ids[k]) + " at record " + std::to_string(i) + " is not below " +
                   std::to_string(t.num_experts) + " experts");
      }
    }
  }
  if (c.pos != data.size()) return bad(std::to_string(data.size() - c.pos) + " trailing bytes");
  return t;
}

namespace {

// Weighted sampling of distinct experts from a cumulative table.
class Sampler {
 public:
  void Build(const std::vector<double>& w) {
    cum_.resize(w.size());
    double s = 0;
    for (size_t i = 0; i < w.size(); ++i) cum_[i] = (s += w[i]);
  }
  uint32_t Draw(std::mt19937_64& rng) const {
    std::uniform_real_distribution<double> u(0.0, cum_.back());
    double x = u(rng);
    return static_cast<uint32_t>(std::upper_bound(cum_.begin(), cum_.end(), x) - cum_.begin()) %
           static_cast<uint32_t>(cum_.size());
  }

 private:
  std::vector<double> cum_;
};

std::vector<double> ZipfWeights(uint32_t n, double s, std::mt19937_64& rng) {
  std::vector<double> w(n, 1.0);
  if (s <= 0) return w;
  std::vector<uint32_t> perm(n);
  for (uint32_t i = 0; i < n; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  for (uint32_t r = 0; r < n; ++r) w[perm[r]] = 1.0 / std::pow(r + 1.0, s);
  return w;
}

}  // namespace

Result<Trace> Generate(const GenOptions& o) {
  if (o.top_k == 0 || o.num_experts < o.top_k || o.num_experts > 65536)
    return Error("trace: need 0 < top_k <= num_experts <= 65536");
  if (o.reuse < 0 || o.reuse > 1) return Error("trace: reuse must be within [0, 1]");
  if (o.requests == 0 || o.prompt_tokens + o.decode_tokens == 0) return Error("trace: no tokens to generate");
  Trace t;
  t.num_experts = o.num_experts;
  t.top_k = o.top_k;
  t.layer_ids = o.layer_ids;
  if (t.layer_ids.empty())
    for (uint32_t l = 1; l <= 92; ++l) t.layer_ids.push_back(l);
  std::sort(t.layer_ids.begin(), t.layer_ids.end());
  const uint32_t L = static_cast<uint32_t>(t.layer_ids.size());
  const uint32_t E = o.num_experts, K = o.top_k;
  std::mt19937_64 rng(o.seed);
  std::vector<std::vector<double>> global(L);
  for (uint32_t l = 0; l < L; ++l) global[l] = ZipfWeights(E, o.skew, rng);
  std::bernoulli_distribution keep(o.reuse);
  std::vector<uint8_t> used(E);
  for (uint32_t req = 0; req < o.requests; ++req) {
    std::vector<Sampler> samplers(L);
    for (uint32_t l = 0; l < L; ++l) {
      std::vector<double> w = ZipfWeights(E, o.request_skew, rng);
      for (uint32_t e = 0; e < E; ++e) w[e] *= global[l][e];
      samplers[l].Build(w);
    }
    std::vector<std::vector<uint16_t>> prev(L);  // previous token's experts per layer
    auto route = [&](uint32_t l, uint16_t* out) {
      std::fill(used.begin(), used.end(), 0);
      uint32_t n = 0;
      for (uint16_t e : prev[l])
        if (keep(rng)) { out[n++] = e; used[e] = 1; }
      while (n < K) {
        uint32_t e = samplers[l].Draw(rng);
        if (used[e]) continue;
        used[e] = 1;
        out[n++] = static_cast<uint16_t>(e);
      }
      std::shuffle(out, out + K, rng);  // route order carries no meaning
      prev[l].assign(out, out + K);
    };
    // Prompt: chunks of `prefill_chunk` rows (0: one token per record, flagged prefill).
    uint32_t chunk = o.prefill_chunk == 0 ? 1 : o.prefill_chunk;
    std::vector<uint16_t> buf;
    for (uint32_t start = 0; start < o.prompt_tokens; start += chunk) {
      uint32_t rows = std::min(chunk, o.prompt_tokens - start);
      // Each token passes every layer; a chunk is one call per layer.
      std::vector<std::vector<uint16_t>> per_layer(L, std::vector<uint16_t>(size_t{rows} * K));
      for (uint32_t r = 0; r < rows; ++r)
        for (uint32_t l = 0; l < L; ++l) route(l, per_layer[l].data() + size_t{r} * K);
      for (uint32_t l = 0; l < L; ++l) t.Append(t.layer_ids[l], rows, req, true, per_layer[l]);
    }
    buf.resize(K);
    for (uint32_t tok = 0; tok < o.decode_tokens; ++tok)
      for (uint32_t l = 0; l < L; ++l) {
        route(l, buf.data());
        t.Append(t.layer_ids[l], 1, req, false, buf);
      }
  }
  return t;
}

double MeasuredReuse(const Trace& t) {
  // Compare consecutive tokens of the same request and layer.
  std::vector<std::vector<uint16_t>> prev(t.layer_ids.size());
  std::vector<uint32_t> prev_req(t.layer_ids.size(), UINT32_MAX);
  uint64_t shared = 0, total = 0;
  for (const Record& r : t.records) {
    auto it = std::lower_bound(t.layer_ids.begin(), t.layer_ids.end(), r.layer);
    if (it == t.layer_ids.end() || *it != r.layer) continue;
    size_t li = it - t.layer_ids.begin();
    auto ids = t.RecordIds(r);
    for (uint32_t row = 0; row < r.rows; ++row) {
      std::vector<uint16_t> cur(ids.begin() + size_t{row} * t.top_k, ids.begin() + size_t{row + 1} * t.top_k);
      std::sort(cur.begin(), cur.end());
      if (prev_req[li] == r.request) {
        std::vector<uint16_t> both;
        std::set_intersection(cur.begin(), cur.end(), prev[li].begin(), prev[li].end(), std::back_inserter(both));
        shared += both.size();
        total += cur.size();
      }
      prev[li] = std::move(cur);
      prev_req[li] = r.request;
    }
  }
  return total ? static_cast<double>(shared) / static_cast<double>(total) : 0.0;
}

}  // namespace k3pack::trace
