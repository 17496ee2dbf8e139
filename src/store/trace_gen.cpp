// `trace::Generate`: seeded synthetic Kimi-like routing traces, and the
// workload families (docs/store.md) as presets of its options.
#include <algorithm>
#include <cmath>
#include <random>

#include "k3pack/trace.h"

namespace k3pack::trace {

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
  // One expert not marked in `used`, drawn in proportion to the weights of
  // those (what rejection draws, conditioned on missing the marked ones) by
  // one uniform over their cumulative weight: O(E) per draw, for when the
  // unmarked share is too small for rejection. Needs that share > 0.
  uint32_t DrawUnused(std::mt19937_64& rng, const std::vector<uint8_t>& used) const {
    double total = 0;
    for (size_t e = 0; e < cum_.size(); ++e)
      if (!used[e]) total += Weight(e);
    std::uniform_real_distribution<double> u(0.0, total);
    const double x = u(rng);
    double seen = 0;
    uint32_t last = 0;
    for (uint32_t e = 0; e < cum_.size(); ++e) {
      if (used[e] || !(Weight(e) > 0)) continue;
      last = e;
      if ((seen += Weight(e)) > x) return e;
    }
    return last;  // x at the top of the range after rounding
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
// Below this share (and at least kMinUnusedShare) an expert is drawn exactly
// among those not yet chosen instead: the same distribution, but rejection
// spent ~1/share draws per expert there (`--skew 6` leaves ~2e-6 after ten
// experts: 30-43 s for 10 tokens of 92 layers, an hour for the default trace).
// Traces whose draws went there differ from those before session 41; at
// 1e-3 or 1e-4 a pinned trace of --skew 2 --request-skew 3 changed too.
constexpr double kExactDrawShare = 1e-5;
// Rejections in a row before the one look at that share (O(E)): the share
// cannot change during a run of rejections (only a drawn expert marks one),
// so a second look would see the same value. Looking every 64 rejections
// instead made top-k near E take minutes (65,535 of 65,536: ~1,000 scans of
// 65,536 weights per expert drawn near the end), with the same draws.
constexpr uint32_t kRejectionsBeforeCheck = 64;

// Fills out[n..K) with distinct experts not marked in `used` (marking them),
// drawn from `s` by rejection: the historical stream, so every trace whose
// draws kept at least kExactDrawShare of the weight unchosen is byte for byte
// what it was. Below it the rest of the row is drawn exactly among the
// unchosen (kExactDrawShare); below kMinUnusedShare it is taken
// deterministically, heaviest first, consuming no randomness; should every
// expert be marked (a prediction that must miss more of the true experts than
// there are others), the marked ones not yet in `out` follow, heaviest first.
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
    if (++rejected != kRejectionsBeforeCheck) continue;
    const double unused = s.UnusedShare(used);
    if (unused >= kExactDrawShare) continue;
    if (unused >= kMinUnusedShare) {
      // The rest of the row exactly; the share only shrinks as it fills.
      for (; n < K && s.UnusedShare(used) >= kMinUnusedShare; ++n) {
        const uint32_t drawn = s.DrawUnused(g, used);
        used[drawn] = 1;
        out[n] = static_cast<uint16_t>(drawn);
      }
      if (n == K) return;
    }
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

uint64_t GeneratedPasses(const GenOptions& o) {
  const uint64_t tokens = uint64_t{o.prompt_tokens} + o.decode_tokens;
  return SatMul(SatMul(o.requests, tokens), GenLayers(o));
}

uint64_t GeneratedRoutes(const GenOptions& o) { return SatMul(GeneratedPasses(o), o.top_k); }

uint64_t GeneratorWeights(const GenOptions& o) {
  // Requests decoded side by side each keep their own weights (and their
  // sampler's cumulative table); with `truth` every request's are kept.
  const uint64_t live = std::min<uint64_t>(std::max<uint32_t>(1, o.concurrent), o.requests);
  const uint64_t tables = uint64_t{o.domains} + live + (o.truth ? o.requests : 0);
  return SatMul(SatMul(tables, GenLayers(o)), o.num_experts);
}

namespace {

// Everything above that GenOptions can get wrong, before any weight is drawn.
Status CheckGenOptions(const GenOptions& o) {
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
  if (GeneratedPasses(o) > kMaxGeneratedPasses)
    return Error("trace: requests x (prompt + decode tokens) x layers exceeds the generator's " +
                 std::to_string(kMaxGeneratedPasses) + " token passes");
  if (GeneratorWeights(o) > kMaxGeneratorWeights)
    return Error("trace: (domains + live requests) x layers x experts exceeds the generator's " +
                 std::to_string(kMaxGeneratorWeights) + " popularity weights");
  if (o.drift < 0 || o.drift > 1) return Error("trace: drift must be within [0, 1]");
  if (o.predict_accuracy < 0 || o.predict_accuracy > 1 || o.predict_surprise < 0 || o.predict_surprise >= 1)
    return Error("trace: prediction accuracy must be within [0, 1] and the surprise share within [0, 1)");
  // The rows that are no surprise are right with chance accuracy / (1 -
  // surprise): above 1 the mean accuracy asked for cannot be met (it was
  // capped, and the trace's accuracy came out as 1 - surprise).
  if (o.predict_accuracy > 1.0 - o.predict_surprise + 1e-12)
    return Error("trace: prediction accuracy " + std::to_string(o.predict_accuracy) + " with a surprise share of " +
                 std::to_string(o.predict_surprise) + " cannot be met: the other rows would have to be right more "
                 "often than always (the accuracy is at most 1 - surprise)");
  return Status::OK();
}

// One trace's generation. Every random draw comes in the order it always
// came, so a seed gives the trace it always gave.
class Generator {
 public:
  explicit Generator(const GenOptions& o);
  Trace Run();

 private:
  struct Request {
    uint32_t id = 0, token = 0, prompt_done = 0, decoded = 0;
    std::vector<std::vector<double>> w;  // [layer][expert]
    std::vector<Sampler> samplers;
    std::vector<std::vector<uint16_t>> prev;  // previous token's experts per layer
    // predict_next_token: per layer, where the previous token's row keeps
    // its next-token predictions in Trace::token_predictions (filled once
    // this token is routed).
    std::vector<uint64_t> pending;
  };
  static constexpr uint64_t kNone = UINT64_MAX;

  Request Start(uint32_t id);
  void Drift(Request& q);
  void Route(Request& q, uint32_t l, uint16_t* out);
  void Predict(std::mt19937_64& g, Request& q, uint32_t next_l, const uint16_t* next, uint16_t* out);
  void Emit(const std::vector<Request*>& reqs, bool prefill, bool per_row_requests);
  void Finish(Request& q);

  const GenOptions& o_;
  Trace t_;
  uint32_t L_ = 0, E_ = 0, K_ = 0;
  std::mt19937_64 rng_;
  std::vector<std::vector<double>> global_;                // [layer][expert]
  std::vector<std::vector<std::vector<double>>> domain_;  // [domain][layer][expert]
  std::bernoulli_distribution keep_;
  std::uniform_real_distribution<double> unit_{0.0, 1.0};
  TrueDistribution* truth_;
  std::vector<uint8_t> used_;
  double keep_p_ = 0;
  // One call's routes and next-layer predictions, per layer.
  std::vector<std::vector<uint16_t>> per_layer_, pred_;
  std::vector<uint32_t> row_req_;
  // Predictions use streams of their own: turning them on, or changing their
  // accuracy, leaves the routes as they were (a timed sweep then runs on the
  // untimed sweep's trace, and accuracies compare on the same routes), and
  // next-token predictions leave the next-layer ones as they were. Before,
  // next-layer predictions drew from the routes' stream.
  std::mt19937_64 layer_rng_, next_rng_;
};

Generator::Generator(const GenOptions& o)
    : o_(o),
      rng_(o.seed),
      keep_(o.reuse),
      truth_(o.truth),
      layer_rng_(o.seed ^ 0x5851f42d4c957f2dull),
      next_rng_(o.seed ^ 0x9e3779b97f4a7c15ull) {
  t_.num_experts = o.num_experts;
  t_.top_k = o.top_k;
  t_.layer_ids = o.layer_ids;
  if (t_.layer_ids.empty())
    for (uint32_t l = 1; l <= 92; ++l) t_.layer_ids.push_back(l);
  std::sort(t_.layer_ids.begin(), t_.layer_ids.end());
  if (o.predict || o.predict_next_token) t_.predict_k = o.top_k;
  L_ = static_cast<uint32_t>(t_.layer_ids.size());
  E_ = o.num_experts;
  K_ = o.top_k;
  global_.resize(L_);
  for (uint32_t l = 0; l < L_; ++l) global_[l] = ZipfWeights(E_, o.skew, rng_);
  domain_.assign(o.domains, std::vector<std::vector<double>>(L_));
  for (auto& d : domain_)
    for (uint32_t l = 0; l < L_; ++l) d[l] = ZipfWeights(E_, o.request_skew, rng_);
  if (truth_) {
    *truth_ = TrueDistribution{};
    truth_->reuse = o.reuse;
    truth_->top_k = K_;
  }
  used_.resize(E_);
  keep_p_ = std::min(1.0, o.predict_accuracy / std::max(1e-9, 1.0 - o.predict_surprise));
  per_layer_.resize(L_);
  pred_.resize(L_);
}

Generator::Request Generator::Start(uint32_t id) {
  Request q;
  q.id = id;
  q.w.resize(L_);
  q.samplers.resize(L_);
  q.prev.resize(L_);
  if (o_.predict_next_token) q.pending.assign(L_, kNone);
  for (uint32_t l = 0; l < L_; ++l) {
    q.w[l] = o_.domains ? domain_[id % o_.domains][l] : ZipfWeights(E_, o_.request_skew, rng_);
    for (uint32_t e = 0; e < E_; ++e) q.w[l][e] *= global_[l][e];
    q.samplers[l].Build(q.w[l]);
  }
  if (truth_) {
    std::vector<float> flat(size_t{L_} * E_);
    for (uint32_t l = 0; l < L_; ++l) {
      double sum = 0;
      for (double x : q.w[l]) sum += x;
      for (uint32_t e = 0; e < E_; ++e) flat[size_t{l} * E_ + e] = static_cast<float>(q.w[l][e] / sum);
    }
    if (truth_->initial.size() <= id) truth_->initial.resize(id + 1);
    truth_->initial[id] = std::move(flat);
  }
  return q;
}

// Slow popularity drift: before each token, drift * E random pairs of
// weights per layer trade places (the fraction is rounded at random).
void Generator::Drift(Request& q) {
  if (o_.drift <= 0) return;
  std::uniform_int_distribution<uint32_t> pick(0, E_ - 1);
  for (uint32_t l = 0; l < L_; ++l) {
    double want = o_.drift * E_;
    uint32_t n = static_cast<uint32_t>(want) + (unit_(rng_) < want - std::floor(want) ? 1 : 0);
    for (uint32_t i = 0; i < n; ++i) {
      uint32_t a = pick(rng_), b = pick(rng_);
      std::swap(q.w[l][a], q.w[l][b]);
      if (truth_) truth_->swaps.push_back({q.id, q.token, l, uint16_t(a), uint16_t(b)});
    }
    if (n) q.samplers[l].Build(q.w[l]);
  }
}

void Generator::Route(Request& q, uint32_t l, uint16_t* out) {
  std::fill(used_.begin(), used_.end(), 0);
  uint32_t n = 0;
  for (uint16_t e : q.prev[l])
    if (keep_(rng_)) {
      out[n++] = e;
      used_[e] = 1;
    }
  DrawDistinct(q.samplers[l], rng_, used_, out, n, K_);
  std::shuffle(out, out + K_, rng_);  // route order carries no meaning
  q.prev[l].assign(out, out + K_);
}

// Predicted ids for a row whose true next-layer experts are `next`: a
// share `predict_surprise` of rows gets nothing right (misses come in
// bursts, as when a token changes topic); the other rows keep each true
// expert with the probability that makes the mean accuracy
// `predict_accuracy`. Misses are filled with other experts drawn from the
// request's popularity (a plausible wrong guess). Without `next` (a
// request's last token has no next one, but its predictor still runs)
// every id is such a guess.
void Generator::Predict(std::mt19937_64& g, Request& q, uint32_t next_l, const uint16_t* next, uint16_t* out) {
  std::fill(used_.begin(), used_.end(), 0);
  uint32_t n = 0;
  if (next) {
    for (uint32_t k = 0; k < K_; ++k) used_[next[k]] = 1;
    bool surprise = unit_(g) < o_.predict_surprise;
    for (uint32_t k = 0; k < K_; ++k)
      if (!surprise && unit_(g) < keep_p_) out[n++] = next[k];
  }
  DrawDistinct(q.samplers[next_l], g, used_, out, n, K_);
}

// One call per layer for `reqs.size()` rows: routes every row through all
// layers first (a prediction for layer l needs layer l+1's routes).
void Generator::Emit(const std::vector<Request*>& reqs, bool prefill, bool per_row_requests) {
  const uint32_t rows = static_cast<uint32_t>(reqs.size());
  // This call's records keep their next-token predictions here, filled
  // when each row's request routes its next token.
  const uint64_t token_base = t_.token_predictions.size();
  if (o_.predict_next_token) t_.token_predictions.resize(token_base + uint64_t{L_} * rows * K_);
  for (uint32_t l = 0; l < L_; ++l) {
    per_layer_[l].resize(size_t{rows} * K_);
    pred_[l].resize(size_t{rows} * K_);
  }
  row_req_.clear();
  for (uint32_t r = 0; r < rows; ++r) {
    Request& q = *reqs[r];
    Drift(q);
    for (uint32_t l = 0; l < L_; ++l) Route(q, l, per_layer_[l].data() + size_t{r} * K_);
    if (o_.predict)
      for (uint32_t l = 0; l + 1 < L_; ++l)
        Predict(layer_rng_, q, l + 1, per_layer_[l + 1].data() + size_t{r} * K_, pred_[l].data() + size_t{r} * K_);
    if (o_.predict_next_token)
      for (uint32_t l = 0; l < L_; ++l) {
        if (q.pending[l] != kNone)
          Predict(next_rng_, q, l, per_layer_[l].data() + size_t{r} * K_, t_.token_predictions.data() + q.pending[l]);
        q.pending[l] = token_base + (uint64_t{l} * rows + r) * K_;
      }
    ++q.token;
    row_req_.push_back(q.id);
  }
  for (uint32_t l = 0; l < L_; ++l) {
    t_.Append(t_.layer_ids[l], rows, reqs[0]->id, prefill, per_layer_[l]);
    if (per_row_requests) t_.SetRowRequests(row_req_);
    if (o_.predict && l + 1 < L_) t_.SetPredictions(pred_[l]);
    if (o_.predict_next_token) {
      t_.records.back().has_token_predictions = true;
      t_.records.back().token_prediction_offset = token_base + uint64_t{l} * rows * K_;
    }
  }
}

// A finished request's last token still gets next-token predictions: the
// predictor does not know the request ends, so they are all guesses.
void Generator::Finish(Request& q) {
  if (!o_.predict_next_token) return;
  for (uint32_t l = 0; l < L_; ++l)
    if (q.pending[l] != kNone) Predict(next_rng_, q, l, nullptr, t_.token_predictions.data() + q.pending[l]);
}

// Continuous batching: up to `concurrent` requests are active; a new one
// starts (its prompt as prefill calls) when one finishes. Decode steps give
// every active request one token, either as one call per token or
// (batched) one call per layer with a row per request.
Trace Generator::Run() {
  const uint32_t chunk = o_.prefill_chunk == 0 ? 1 : o_.prefill_chunk;
  const uint32_t concurrent = std::max<uint32_t>(1, o_.concurrent);
  std::vector<Request> active;
  uint32_t next_id = 0;
  std::vector<Request*> rows;
  const uint64_t total_tokens = uint64_t{o_.requests} * (uint64_t{o_.prompt_tokens} + o_.decode_tokens);
  uint64_t done_tokens = 0;
  auto routed = [&](size_t tokens) {
    done_tokens += tokens;
    if (o_.progress) o_.progress(done_tokens, total_tokens);
  };
  while (next_id < o_.requests || !active.empty()) {
    while (active.size() < concurrent && next_id < o_.requests) {
      active.push_back(Start(next_id++));
      Request& q = active.back();
      while (q.prompt_done < o_.prompt_tokens) {
        uint32_t n = std::min(chunk, o_.prompt_tokens - q.prompt_done);
        // A chunk is n tokens of one request: rows of the same request.
        rows.assign(n, &q);
        Emit(rows, true, false);
        routed(n);
        q.prompt_done += n;
      }
    }
    if (o_.batched) {
      rows.clear();
      for (Request& q : active)
        if (q.decoded < o_.decode_tokens) rows.push_back(&q);
      if (!rows.empty()) Emit(rows, false, true);
      routed(rows.size());
      for (Request* q : rows) ++q->decoded;
    } else {
      for (Request& q : active)
        if (q.decoded < o_.decode_tokens) {
          rows.assign(1, &q);
          Emit(rows, false, false);
          routed(1);
          ++q.decoded;
        }
    }
    for (Request& q : active)
      if (q.decoded >= o_.decode_tokens) Finish(q);
    active.erase(std::remove_if(active.begin(), active.end(),
                                [&](const Request& q) { return q.decoded >= o_.decode_tokens; }),
                 active.end());
  }
  return std::move(t_);
}

}  // namespace

Result<Trace> Generate(const GenOptions& o) {
  K3_RETURN_IF_ERROR(CheckGenOptions(o));
  return Generator(o).Run();
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
  d.progress = o->progress;
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

}  // namespace k3pack::trace
