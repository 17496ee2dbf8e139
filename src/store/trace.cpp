#include "k3pack/trace.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>

#include "util/file.h"

namespace k3pack::trace {
namespace {

constexpr char kMagic[8] = {'K', '3', 'T', 'R', 'A', 'C', 'E', '\0'};
constexpr uint32_t kMaxVersion = 2;
constexpr uint32_t kFlagPrefill = 1u, kFlagRowRequests = 2u, kFlagPredictions = 4u,
                   kFlagTokenPredictions = 8u;

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

void Trace::SetRowRequests(std::span<const uint32_t> requests) {
  Record& r = records.back();
  r.has_row_requests = true;
  r.row_request_offset = row_requests.size();
  row_requests.insert(row_requests.end(), requests.begin(), requests.end());
}

void Trace::SetPredictions(std::span<const uint16_t> predicted) {
  Record& r = records.back();
  r.has_predictions = true;
  r.prediction_offset = predictions.size();
  predictions.insert(predictions.end(), predicted.begin(), predicted.end());
}

void Trace::SetTokenPredictions(std::span<const uint16_t> predicted) {
  Record& r = records.back();
  r.has_token_predictions = true;
  r.token_prediction_offset = token_predictions.size();
  token_predictions.insert(token_predictions.end(), predicted.begin(), predicted.end());
}

uint32_t Trace::version() const {
  if (predict_k != 0) return 2;
  for (const Record& r : records)
    if (r.has_row_requests || r.has_predictions || r.has_token_predictions) return 2;
  return 1;
}

std::string EncodeTrace(const Trace& t) {
  std::string out;
  out.reserve(40 + t.layer_ids.size() * 4 + t.records.size() * 16 + t.ids.size() * 2);
  out.append(kMagic, 8);
  const uint32_t version = t.version();
  Put<uint32_t>(&out, version);
  Put<uint32_t>(&out, t.num_experts);
  Put<uint32_t>(&out, t.top_k);
  Put<uint32_t>(&out, static_cast<uint32_t>(t.layer_ids.size()));
  Put<uint64_t>(&out, t.records.size());
  if (version >= 2) Put<uint32_t>(&out, t.predict_k);
  for (uint32_t l : t.layer_ids) Put<uint32_t>(&out, l);
  for (const Record& r : t.records) {
    Put<uint32_t>(&out, r.layer);
    Put<uint32_t>(&out, r.rows);
    Put<uint32_t>(&out, r.request);
    Put<uint32_t>(&out, (r.is_prefill ? kFlagPrefill : 0u) | (r.has_row_requests ? kFlagRowRequests : 0u) |
                            (r.has_predictions ? kFlagPredictions : 0u) |
                            (r.has_token_predictions ? kFlagTokenPredictions : 0u));
    auto ids = t.RecordIds(r);
    out.append(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(uint16_t));
    if (r.has_row_requests)
      out.append(reinterpret_cast<const char*>(t.row_requests.data() + r.row_request_offset),
                 size_t{r.rows} * sizeof(uint32_t));
    auto pred = t.RecordPredictions(r);
    out.append(reinterpret_cast<const char*>(pred.data()), pred.size() * sizeof(uint16_t));
    auto next = t.RecordTokenPredictions(r);
    out.append(reinterpret_cast<const char*>(next.data()), next.size() * sizeof(uint16_t));
  }
  return out;
}

Status WriteTrace(const std::string& path, const Trace& t) { return WriteFileAtomic(path, EncodeTrace(t)); }

Result<Trace> ReadTrace(const std::string& path) {
  K3_ASSIGN_OR_RETURN(std::string data, ReadFileToString(path));
  return ParseTrace(data, path);
}

Result<Trace> ParseTrace(std::string_view data, const std::string& path) {
  auto bad = [&](const std::string& why) { return Error(path + ": not a k3pack trace: " + why); };
  const std::string size = std::to_string(data.size()) + " bytes";
  if (data.empty()) return bad("the file is empty (a trace starts with the magic K3TRACE\\0)");
  // A prefix of the magic is a file cut short, not some other file.
  const size_t magic_part = std::min<size_t>(data.size(), 8);
  if (std::memcmp(data.data(), kMagic, magic_part) != 0)
    return bad("bad magic (a trace starts with K3TRACE\\0)");
  if (data.size() < 32) return bad("truncated header: the file holds " + size + ", a trace header is at least 32");
  Cursor c{data, 8};
  uint32_t version = 0, n_layers = 0;
  uint64_t n_records = 0;
  Trace t;
  c.Get(&version);
  c.Get(&t.num_experts);
  c.Get(&t.top_k);
  c.Get(&n_layers);
  c.Get(&n_records);
  if (version == 0 || version > kMaxVersion)
    return bad("unsupported version " + std::to_string(version) + " (this build reads 1 and 2)");
  if (t.top_k == 0 || t.num_experts == 0 || t.num_experts > 65536)
    return bad("invalid dimensions: " + std::to_string(t.num_experts) + " experts (1..65536), top_k " +
               std::to_string(t.top_k) + " (at least 1)");
  // A row routes top_k of the layer's experts; this also keeps rows x top_k
  // far from overflowing in the size checks below.
  if (t.top_k > t.num_experts)
    return bad("top_k " + std::to_string(t.top_k) + " exceeds " + std::to_string(t.num_experts) + " experts");
  if (n_records > data.size() / 16 + 1) return bad("record count exceeds the file size");
  if (version >= 2) {
    if (!c.Get(&t.predict_k))
      return bad("truncated header: the file holds " + size + ", a v2 trace header is at least 36");
    if (t.predict_k > t.num_experts)
      return bad("predict_k " + std::to_string(t.predict_k) + " exceeds " + std::to_string(t.num_experts) +
                 " experts");
  }
  // The layer count is checked against the bytes there before anything is
  // read or allocated by it.
  if (n_layers > (data.size() - c.pos) / 4)
    return bad("the header declares " + std::to_string(n_layers) + " layers, a " + std::to_string(uint64_t{n_layers} * 4) +
               "-byte layer list at offset " + std::to_string(c.pos) + ", but the file holds only " +
               std::to_string(data.size() - c.pos) + " bytes after the header");
  if (uint64_t{n_layers} * t.num_experts > kMaxObjects)
    return bad(std::to_string(n_layers) + " layers x " + std::to_string(t.num_experts) + " experts = " +
               std::to_string(uint64_t{n_layers} * t.num_experts) + " objects, more than a trace may declare (" +
               std::to_string(kMaxObjects) + " = 2^24; docs/FORMATS.md)");
  t.layer_ids.reserve(n_layers);
  for (uint32_t i = 0; i < n_layers; ++i) {
    const size_t at = c.pos;
    uint32_t l = 0;
    c.Get(&l);  // in the file: checked against its size above
    if (!t.layer_ids.empty() && l <= t.layer_ids.back())
      return bad("layer ids are not ascending: layer id " + std::to_string(l) + " at offset " + std::to_string(at) +
                 " follows " + std::to_string(t.layer_ids.back()) + " (entry " + std::to_string(i) + " of the " +
                 std::to_string(n_layers) + " the header declares" +
                 (version >= 2 ? "; a v2 header has predict_k before the list, which a v1 body marked v2 shifts)"
                               : ")"));
    t.layer_ids.push_back(l);
  }
  t.records.reserve(n_records);
  for (uint64_t i = 0; i < n_records; ++i) {
    uint32_t layer, rows, request, flags;
    if (!c.Get(&layer) || !c.Get(&rows) || !c.Get(&request) || !c.Get(&flags))
      return bad("truncated at record " + std::to_string(i));
    const std::string at = " at record " + std::to_string(i);
    if (rows == 0) return bad("0 rows" + at + " (a call routes at least one token)");
    // Every consumer looks the layer up in the header's list.
    if (!std::binary_search(t.layer_ids.begin(), t.layer_ids.end(), layer))
      return bad("layer " + std::to_string(layer) + at + " is not in the header's layer list");
    uint64_t n = uint64_t{rows} * t.top_k;
    if (n > (data.size() - c.pos) / 2) return bad("truncated ids" + at);
    if (version >= 2) {
      if (flags & ~(kFlagPrefill | kFlagRowRequests | kFlagPredictions | kFlagTokenPredictions))
        return bad("unknown flag bits 0x" + [&] { char b[16]; std::snprintf(b, sizeof b, "%x", flags); return std::string(b); }() + at);
      if ((flags & kFlagPredictions) && t.predict_k == 0)
        return bad("predictions flagged" + at + " but the header's predict_k is 0");
      if ((flags & kFlagTokenPredictions) && t.predict_k == 0)
        return bad("next-token predictions flagged" + at + " but the header's predict_k is 0");
    } else {
      flags &= kFlagPrefill;  // v1 readers ignored the other bits
    }
    Record r{layer, rows, request, (flags & kFlagPrefill) != 0, t.ids.size()};
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
    if (flags & kFlagRowRequests) {
      if (c.pos + uint64_t{rows} * 4 > data.size()) return bad("truncated row requests" + at);
      r.has_row_requests = true;
      r.row_request_offset = t.row_requests.size();
      t.row_requests.resize(t.row_requests.size() + rows);
      std::memcpy(t.row_requests.data() + r.row_request_offset, data.data() + c.pos, size_t{rows} * 4);
      c.pos += size_t{rows} * 4;
    }
    // Predicted ids (next layer, then next token): rows * predict_k, each below num_experts.
    auto read_predicted = [&](const std::string& kind, std::vector<uint16_t>* dst, uint64_t* offset) -> Status {
      uint64_t np = uint64_t{rows} * t.predict_k;
      if (c.pos + np * 2 > data.size()) return bad("truncated " + kind + "predictions" + at);
      *offset = dst->size();
      dst->resize(dst->size() + np);
      std::memcpy(dst->data() + *offset, data.data() + c.pos, np * 2);
      c.pos += np * 2;
      for (uint64_t k = *offset; k < dst->size(); ++k)
        if ((*dst)[k] >= t.num_experts)
          return bad(kind + "predicted expert id " + std::to_string((*dst)[k]) + at + " is not below " +
                     std::to_string(t.num_experts) + " experts");
      return Status::OK();
    };
    if (flags & kFlagPredictions) {
      K3_RETURN_IF_ERROR(read_predicted("", &t.predictions, &r.prediction_offset));
      r.has_predictions = true;
    }
    if (flags & kFlagTokenPredictions) {
      K3_RETURN_IF_ERROR(read_predicted("next-token ", &t.token_predictions, &r.token_prediction_offset));
      r.has_token_predictions = true;
    }
    t.records.push_back(r);
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
  // The chance that a draw hits an expert not marked in `used`: its share of
  // the cumulative table (a weight below the table's rounding, or 0, is
  // never drawn, whatever its value).
  double UnusedShare(const std::vector<uint8_t>& used) const {
    if (!(cum_.back() > 0)) return 0;
    double unused = 0;
    for (size_t e = 0; e < cum_.size(); ++e)
      if (!used[e]) unused += Weight(e);
    return unused / cum_.back();
  }
  // The experts not marked in `marked`, heaviest first (ties: lowest id).
  std::vector<uint32_t> Heaviest(const std::vector<uint8_t>& marked) const {
    std::vector<uint32_t> order;
    for (uint32_t e = 0; e < cum_.size(); ++e)
      if (!marked[e]) order.push_back(e);
    std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return Weight(a) > Weight(b); });
    return order;
  }

 private:
  // An expert's drawable weight: its step in the cumulative table (what a
  // draw sees, below-rounding weights as 0).
  double Weight(size_t e) const { return cum_[e] - (e ? cum_[e - 1] : 0.0); }
  std::vector<double> cum_;
};

// Rejection sampling stops paying off when the experts not yet chosen hold
// less than this share of the drawable weight: a draw would find one less
// than once in a million tries (a steep Zipf's tail weighs 1e-24, or 0 once
// pow overflows), and the loop effectively never ended.
constexpr double kMinUnusedShare = 1e-6;
// Rejections in a row between two looks at that share (each look is O(E)).
constexpr uint32_t kRejectionsPerCheck = 64;

// Fills out[n..K) with distinct experts not marked in `used` (marking them),
// drawn from `s` by rejection: the historical stream, so every trace whose
// draws made progress is byte for byte what it was. When they cannot (see
// kMinUnusedShare) the rest are taken deterministically, heaviest first,
// consuming no randomness; should every expert be marked (a prediction that
// must miss more of the true experts than there are others), the marked
// ones not yet in `out` follow, heaviest first.
void DrawDistinct(const Sampler& s, std::mt19937_64& g, std::vector<uint8_t>& used, uint16_t* out, uint32_t n,
                  uint32_t K) {
  uint32_t rejected = 0;
  while (n < K) {
    uint32_t e = s.Draw(g);
    if (!used[e]) {
      used[e] = 1;
      out[n++] = static_cast<uint16_t>(e);
      rejected = 0;
      continue;
    }
    if (++rejected % kRejectionsPerCheck != 0 || s.UnusedShare(used) >= kMinUnusedShare) continue;
    for (uint32_t h : s.Heaviest(used)) {
      if (n == K) return;
      used[h] = 1;
      out[n++] = static_cast<uint16_t>(h);
    }
    if (n == K) return;
    std::vector<uint8_t> chosen(used.size(), 0);
    for (uint32_t k = 0; k < n; ++k) chosen[out[k]] = 1;
    for (uint32_t h : s.Heaviest(chosen)) {
      if (n == K) return;
      out[n++] = static_cast<uint16_t>(h);
    }
  }
}

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

namespace {

// a x b, saturating at UINT64_MAX (the limits below are far from it).
uint64_t SatMul(uint64_t a, uint64_t b) {
  uint64_t p;
  return __builtin_mul_overflow(a, b, &p) ? UINT64_MAX : p;
}

uint64_t GenLayers(const GenOptions& o) { return o.layer_ids.empty() ? 92 : o.layer_ids.size(); }

}  // namespace

uint64_t GeneratedRoutes(const GenOptions& o) {
  const uint64_t tokens = uint64_t{o.prompt_tokens} + o.decode_tokens;
  return SatMul(SatMul(SatMul(o.requests, tokens), GenLayers(o)), o.top_k);
}

uint64_t GeneratorWeights(const GenOptions& o) {
  // Requests decoded side by side each keep their own weights (and their
  // sampler's cumulative table); with `truth` every request's are kept.
  const uint64_t live = std::min<uint64_t>(std::max<uint32_t>(1, o.concurrent), o.requests);
  const uint64_t tables = uint64_t{o.domains} + live + (o.truth ? o.requests : 0);
  return SatMul(SatMul(tables, GenLayers(o)), o.num_experts);
}

Result<Trace> Generate(const GenOptions& o) {
  if (o.top_k == 0 || o.num_experts < o.top_k || o.num_experts > 65536)
    return Error("trace: need 0 < top_k <= num_experts <= 65536");
  if (o.reuse < 0 || o.reuse > 1) return Error("trace: reuse must be within [0, 1]");
  if (o.requests == 0 || uint64_t{o.prompt_tokens} + o.decode_tokens == 0)
    return Error("trace: no tokens to generate");
  // Negative exponents used to read as flat (0): a typo passed unnoticed.
  if (!(o.skew >= 0) || !(o.request_skew >= 0)) return Error("trace: skew and request skew must be at least 0");
  if (o.concurrent == 0) return Error("trace: concurrent requests must be at least 1");
  {
    std::vector<uint32_t> ids = o.layer_ids;
    std::sort(ids.begin(), ids.end());
    // The reader refuses a list with a layer twice (ids ascend strictly).
    if (std::adjacent_find(ids.begin(), ids.end()) != ids.end()) return Error("trace: a layer id is given twice");
  }
  if (SatMul(GenLayers(o), o.num_experts) > kMaxObjects)
    return Error("trace: " + std::to_string(GenLayers(o)) + " layers x " + std::to_string(o.num_experts) +
                 " experts exceed the trace format's " + std::to_string(kMaxObjects) + " objects");
  if (GeneratedRoutes(o) > kMaxGeneratedRoutes)
    return Error("trace: requests x (prompt + decode tokens) x layers x top_k exceeds the generator's " +
                 std::to_string(kMaxGeneratedRoutes) + " routes");
  if (GeneratorWeights(o) > kMaxGeneratorWeights)
    return Error("trace: (domains + live requests) x layers x experts exceeds the generator's " +
                 std::to_string(kMaxGeneratorWeights) + " popularity weights");
  if (o.drift < 0 || o.drift > 1) return Error("trace: drift must be within [0, 1]");
  if (o.predict_accuracy < 0 || o.predict_accuracy > 1 || o.predict_surprise < 0 || o.predict_surprise >= 1)
    return Error("trace: prediction accuracy must be within [0, 1] and the surprise share within [0, 1)");
  Trace t;
  t.num_experts = o.num_experts;
  t.top_k = o.top_k;
  t.layer_ids = o.layer_ids;
  if (t.layer_ids.empty())
    for (uint32_t l = 1; l <= 92; ++l) t.layer_ids.push_back(l);
  std::sort(t.layer_ids.begin(), t.layer_ids.end());
  if (o.predict || o.predict_next_token) t.predict_k = o.top_k;
  const uint32_t L = static_cast<uint32_t>(t.layer_ids.size());
  const uint32_t E = o.num_experts, K = o.top_k;
  std::mt19937_64 rng(o.seed);
  std::vector<std::vector<double>> global(L);
  for (uint32_t l = 0; l < L; ++l) global[l] = ZipfWeights(E, o.skew, rng);
  std::vector<std::vector<std::vector<double>>> domain(o.domains, std::vector<std::vector<double>>(L));
  for (auto& d : domain)
    for (uint32_t l = 0; l < L; ++l) d[l] = ZipfWeights(E, o.request_skew, rng);
  std::bernoulli_distribution keep(o.reuse);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  TrueDistribution* truth = o.truth;
  if (truth) {
    *truth = TrueDistribution{};
    truth->reuse = o.reuse;
    truth->top_k = K;
  }

  struct Req {
    uint32_t id = 0, token = 0, prompt_done = 0, decoded = 0;
    std::vector<std::vector<double>> w;  // [layer][expert]
    std::vector<Sampler> samplers;
    std::vector<std::vector<uint16_t>> prev;  // previous token's experts per layer
    // predict_next_token: per layer, where the previous token's row keeps
    // its next-token predictions in Trace::token_predictions (filled once
    // this token is routed).
    std::vector<uint64_t> pending;
  };
  constexpr uint64_t kNone = UINT64_MAX;
  std::vector<uint8_t> used(E);
  auto start = [&](uint32_t id) {
    Req q;
    q.id = id;
    q.w.resize(L);
    q.samplers.resize(L);
    q.prev.resize(L);
    if (o.predict_next_token) q.pending.assign(L, kNone);
    for (uint32_t l = 0; l < L; ++l) {
      q.w[l] = o.domains ? domain[id % o.domains][l] : ZipfWeights(E, o.request_skew, rng);
      for (uint32_t e = 0; e < E; ++e) q.w[l][e] *= global[l][e];
      q.samplers[l].Build(q.w[l]);
    }
    if (truth) {
      std::vector<float> flat(size_t{L} * E);
      for (uint32_t l = 0; l < L; ++l) {
        double sum = 0;
        for (double x : q.w[l]) sum += x;
        for (uint32_t e = 0; e < E; ++e) flat[size_t{l} * E + e] = static_cast<float>(q.w[l][e] / sum);
      }
      if (truth->initial.size() <= id) truth->initial.resize(id + 1);
      truth->initial[id] = std::move(flat);
    }
    return q;
  };
  // Slow popularity drift: before each token, drift * E random pairs of
  // weights per layer trade places (the fraction is rounded at random).
  auto drift = [&](Req& q) {
    if (o.drift <= 0) return;
    std::uniform_int_distribution<uint32_t> pick(0, E - 1);
    for (uint32_t l = 0; l < L; ++l) {
      double want = o.drift * E;
      uint32_t n = static_cast<uint32_t>(want) + (unit(rng) < want - std::floor(want) ? 1 : 0);
      for (uint32_t i = 0; i < n; ++i) {
        uint32_t a = pick(rng), b = pick(rng);
        std::swap(q.w[l][a], q.w[l][b]);
        if (truth) truth->swaps.push_back({q.id, q.token, l, uint16_t(a), uint16_t(b)});
      }
      if (n) q.samplers[l].Build(q.w[l]);
    }
  };
  auto route = [&](Req& q, uint32_t l, uint16_t* out) {
    std::fill(used.begin(), used.end(), 0);
    uint32_t n = 0;
    for (uint16_t e : q.prev[l])
      if (keep(rng)) { out[n++] = e; used[e] = 1; }
    DrawDistinct(q.samplers[l], rng, used, out, n, K);
    std::shuffle(out, out + K, rng);  // route order carries no meaning
    q.prev[l].assign(out, out + K);
  };
  // Predicted ids for a row whose true next-layer experts are `next`: a
  // share `predict_surprise` of rows gets nothing right (misses come in
  // bursts, as when a token changes topic); the other rows keep each true
  // expert with the probability that makes the mean accuracy
  // `predict_accuracy`. Misses are filled with other experts drawn from the
  // request's popularity (a plausible wrong guess). Without `next` (a
  // request's last token has no next one, but its predictor still runs)
  // every id is such a guess.
  const double keep_p =
      std::min(1.0, o.predict_accuracy / std::max(1e-9, 1.0 - o.predict_surprise));
  auto predict = [&](std::mt19937_64& g, Req& q, uint32_t next_l, const uint16_t* next, uint16_t* out) {
    std::fill(used.begin(), used.end(), 0);
    uint32_t n = 0;
    if (next) {
      for (uint32_t k = 0; k < K; ++k) used[next[k]] = 1;
      bool surprise = unit(g) < o.predict_surprise;
      for (uint32_t k = 0; k < K; ++k)
        if (!surprise && unit(g) < keep_p) out[n++] = next[k];
    }
    DrawDistinct(q.samplers[next_l], g, used, out, n, K);
  };
  // One call per layer for `rows` tokens: routes every token through all
  // layers first (a prediction for layer l needs layer l+1's routes).
  std::vector<std::vector<uint16_t>> per_layer(L), pred(L);
  std::vector<uint32_t> row_req;
  // Predictions use streams of their own: turning them on, or changing their
  // accuracy, leaves the routes as they were (a timed sweep then runs on the
  // untimed sweep's trace, and accuracies compare on the same routes), and
  // next-token predictions leave the next-layer ones as they were. Before,
  // next-layer predictions drew from the routes' stream.
  std::mt19937_64 layer_rng(o.seed ^ 0x5851f42d4c957f2dull);
  std::mt19937_64 next_rng(o.seed ^ 0x9e3779b97f4a7c15ull);
  auto emit = [&](std::vector<Req*>& reqs, bool prefill, bool per_row_requests) {
    const uint32_t rows = static_cast<uint32_t>(reqs.size());
    // This call's records keep their next-token predictions here, filled
    // when each row's request routes its next token.
    const uint64_t token_base = t.token_predictions.size();
    if (o.predict_next_token) t.token_predictions.resize(token_base + uint64_t{L} * rows * K);
    for (uint32_t l = 0; l < L; ++l) {
      per_layer[l].resize(size_t{rows} * K);
      pred[l].resize(size_t{rows} * K);
    }
    row_req.clear();
    for (uint32_t r = 0; r < rows; ++r) {
      Req& q = *reqs[r];
      drift(q);
      for (uint32_t l = 0; l < L; ++l) route(q, l, per_layer[l].data() + size_t{r} * K);
      if (o.predict)
        for (uint32_t l = 0; l + 1 < L; ++l)
          predict(layer_rng, q, l + 1, per_layer[l + 1].data() + size_t{r} * K, pred[l].data() + size_t{r} * K);
      if (o.predict_next_token)
        for (uint32_t l = 0; l < L; ++l) {
          if (q.pending[l] != kNone)
            predict(next_rng, q, l, per_layer[l].data() + size_t{r} * K, t.token_predictions.data() + q.pending[l]);
          q.pending[l] = token_base + (uint64_t{l} * rows + r) * K;
        }
      ++q.token;
      row_req.push_back(q.id);
    }
    for (uint32_t l = 0; l < L; ++l) {
      t.Append(t.layer_ids[l], rows, reqs[0]->id, prefill, per_layer[l]);
      if (per_row_requests) t.SetRowRequests(row_req);
      if (o.predict && l + 1 < L) t.SetPredictions(pred[l]);
      if (o.predict_next_token) {
        t.records.back().has_token_predictions = true;
        t.records.back().token_prediction_offset = token_base + uint64_t{l} * rows * K;
      }
    }
  };
  // A finished request's last token still gets next-token predictions: the
  // predictor does not know the request ends, so they are all guesses.
  auto finish = [&](Req& q) {
    if (!o.predict_next_token) return;
    for (uint32_t l = 0; l < L; ++l)
      if (q.pending[l] != kNone) predict(next_rng, q, l, nullptr, t.token_predictions.data() + q.pending[l]);
  };

  // Continuous batching: up to `concurrent` requests are active; a new one
  // starts (its prompt as prefill calls) when one finishes. Decode steps
  // give every active request one token, either as one call per token or
  // (batched) one call per layer with a row per request.
  const uint32_t chunk = o.prefill_chunk == 0 ? 1 : o.prefill_chunk;
  const uint32_t concurrent = std::max<uint32_t>(1, o.concurrent);
  std::vector<Req> active;
  uint32_t next_id = 0;
  std::vector<Req*> rows;
  while (next_id < o.requests || !active.empty()) {
    while (active.size() < concurrent && next_id < o.requests) {
      active.push_back(start(next_id++));
      Req& q = active.back();
      while (q.prompt_done < o.prompt_tokens) {
        uint32_t n = std::min(chunk, o.prompt_tokens - q.prompt_done);
        // A chunk is n tokens of one request: rows of the same request.
        rows.assign(n, &q);
        emit(rows, true, false);
        q.prompt_done += n;
      }
    }
    if (o.batched) {
      rows.clear();
      for (Req& q : active)
        if (q.decoded < o.decode_tokens) rows.push_back(&q);
      if (!rows.empty()) emit(rows, false, true);
      for (Req* q : rows) ++q->decoded;
    } else {
      for (Req& q : active)
        if (q.decoded < o.decode_tokens) {
          rows.assign(1, &q);
          emit(rows, false, false);
          ++q.decoded;
        }
    }
    for (Req& q : active)
      if (q.decoded >= o.decode_tokens) finish(q);
    active.erase(std::remove_if(active.begin(), active.end(), [&](const Req& q) { return q.decoded >= o.decode_tokens; }),
                 active.end());
  }
  return t;
}

std::vector<std::string> FamilyNames() {
  return {"kimi", "drift", "interleaved", "batched", "layer-local", "prefill-burst"};
}

bool ApplyFamily(const std::string& name, GenOptions* o) {
  GenOptions d;  // the defaults, with the caller's dimensions and seed
  d.layer_ids = o->layer_ids;
  d.num_experts = o->num_experts;
  d.top_k = o->top_k;
  d.seed = o->seed;
  d.predict = o->predict;
  d.predict_accuracy = o->predict_accuracy;
  d.predict_surprise = o->predict_surprise;
  d.predict_next_token = o->predict_next_token;
  d.truth = o->truth;
  if (name == "kimi") {
    // Defaults: 4 requests x (32 + 256) tokens one after another.
  } else if (name == "drift") {
    // One long request whose popularity wanders: ~0.5% of a layer's experts
    // trade weights every token, so after ~200 tokens the favourites differ.
    d.requests = 1;
    d.prompt_tokens = 16;
    d.decode_tokens = 1024;
    d.drift = 0.005;
  } else if (name == "interleaved" || name == "batched") {
    // 16 short requests from 5 domains, 8 decoded side by side; a domain's
    // requests favour the same experts.
    d.requests = 16;
    d.concurrent = 8;
    d.domains = 5;
    d.prompt_tokens = 8;
    d.decode_tokens = 40;
    d.batched = name == "batched";
  } else if (name == "layer-local") {
    // Each layer keeps most of its experts from token to token; popularity
    // is nearly flat, so only recency tells the experts apart.
    d.requests = 2;
    d.prompt_tokens = 16;
    d.decode_tokens = 256;
    d.reuse = 0.8;
    d.request_skew = 0.05;
  } else if (name == "prefill-burst") {
    // A 2,000-token prompt as chunked prefill (16 rows per call, so a call's
    // distinct experts fit a 0.5% cache), then 256 decoded tokens.
    d.requests = 1;
    d.prompt_tokens = 2000;
    d.prefill_chunk = 16;
    d.decode_tokens = 256;
  } else {
    return false;
  }
  *o = d;
  return true;
}

uint64_t CountTokens(const Trace& t) {
  uint32_t lowest = UINT32_MAX;
  for (const Record& r : t.records) lowest = std::min(lowest, r.layer);
  uint64_t tokens = 0;
  for (const Record& r : t.records)
    if (r.layer == lowest) tokens += r.rows;
  return tokens;
}

double MeasuredReuse(const Trace& t) {
  // Compare consecutive tokens of the same request and layer, whatever
  // other requests' rows come in between.
  struct Key {
    uint32_t request;
    size_t layer;
    bool operator<(const Key& k) const { return request != k.request ? request < k.request : layer < k.layer; }
  };
  std::map<Key, std::vector<uint16_t>> prev;
  uint64_t shared = 0, total = 0;
  std::vector<uint16_t> cur, both;
  for (const Record& r : t.records) {
    auto it = std::lower_bound(t.layer_ids.begin(), t.layer_ids.end(), r.layer);
    if (it == t.layer_ids.end() || *it != r.layer) continue;
    size_t li = it - t.layer_ids.begin();
    auto ids = t.RecordIds(r);
    for (uint32_t row = 0; row < r.rows; ++row) {
      cur.assign(ids.begin() + size_t{row} * t.top_k, ids.begin() + size_t{row + 1} * t.top_k);
      std::sort(cur.begin(), cur.end());
      auto [p, fresh] = prev.try_emplace(Key{t.RowRequest(r, row), li});
      if (!fresh) {
        both.clear();
        std::set_intersection(cur.begin(), cur.end(), p->second.begin(), p->second.end(), std::back_inserter(both));
        shared += both.size();
        total += cur.size();
      }
      p->second = cur;
    }
  }
  return total ? static_cast<double>(shared) / static_cast<double>(total) : 0.0;
}

}  // namespace k3pack::trace
