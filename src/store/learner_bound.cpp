// The learning reference of `trace sweep --learner` (simulate.h): the
// informed bound's rule with each request's weights learned from its own
// routes by LevelPosterior, in the shared demand-bound loop.
#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>

#include "store/demand_bound.h"
#include "store/level_posterior.h"

namespace k3pack::store {

LevelPosterior::LevelPosterior(std::span<const float> weights, uint32_t max_levels, double change)
    : E_(static_cast<uint32_t>(weights.size())), change_(change) {
  std::vector<double> sorted(weights.begin(), weights.end());
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  const size_t groups = std::max<size_t>(1, std::min<size_t>(max_levels, sorted.size()));
  for (size_t g = 0, begin = 0; g < groups; ++g) {
    const size_t end = sorted.size() * (g + 1) / groups;
    if (end == begin) continue;
    double sum = 0;
    for (size_t i = begin; i < end; ++i) sum += sorted[i];
    const double mean = sum / double(end - begin), share = double(end - begin) / double(sorted.size());
    // Groups of one value are one level: a flat layer has nothing to learn.
    if (!levels_.empty() && levels_.back() == mean) prior_.back() += share;
    else levels_.push_back(mean), prior_.push_back(share);
    begin = end;
  }
  belief_.resize(size_t{E_} * levels_.size());
  for (uint32_t e = 0; e < E_; ++e)
    for (size_t b = 0; b < levels_.size(); ++b) belief_[e * levels_.size() + b] = float(prior_[b]);
  seen_.assign(E_, 0);
  arrive_.resize(levels_.size());
  stay_.resize(levels_.size());
  for (double share : prior_) mix_.push_back(float(change_ * share));
}

void LevelPosterior::Observe(std::span<const uint16_t> prev, std::span<const uint16_t> row) {
  const size_t B = levels_.size();
  if (B < 2) return;
  for (uint16_t e : prev) seen_[e] = 1;
  uint32_t draws = 0;
  for (uint16_t e : row) {
    if (seen_[e]) continue;  // the previous token had it (or a repeated id)
    seen_[e] = 2;
    ++draws;
  }
  for (size_t b = 0; b < B; ++b) {
    const double p = 1.0 - std::pow(1.0 - std::min(1.0, levels_[b]), double(draws));
    arrive_[b] = float(p);
    stay_[b] = float(1.0 - p);
  }
  const float keep = float(1.0 - change_);
  for (uint32_t e = 0; e < E_; ++e) {
    float* x = &belief_[size_t{e} * B];
    if (seen_[e] != 1) {
      const float* lik = seen_[e] == 2 ? arrive_.data() : stay_.data();
      float sum = 0;
      for (size_t b = 0; b < B; ++b) sum += x[b] *= lik[b];
      // An observation every level rules out (underflow) resets the belief to the groups' shares.
      const float scale = sum > 0 ? keep / sum : 0.0f;
      if (sum > 0)
        for (size_t b = 0; b < B; ++b) x[b] = x[b] * scale + mix_[b];
      else
        for (size_t b = 0; b < B; ++b) x[b] = float(prior_[b]);
    } else {
      for (size_t b = 0; b < B; ++b) x[b] = x[b] * keep + mix_[b];
    }
  }
  for (uint16_t e : prev) seen_[e] = 0;
  for (uint16_t e : row) seen_[e] = 0;
}

double LevelPosterior::Fresh(uint32_t e, double draws) const {
  const size_t B = levels_.size();
  const float* x = &belief_[size_t{e} * B];
  double p = 0;
  for (size_t b = 0; b < B; ++b) p += double(x[b]) * std::min(1.0, draws * levels_[b]);
  return p;
}

std::vector<double> DriftChangeRates(const trace::Trace& t, const CallSeq& seq, const trace::TrueDistribution& truth,
                                     uint32_t L, uint32_t E) {
  // A swap gives two experts each other's weights, and another expert's
  // weight is a draw from the layer's values: per layer and token an
  // expert's weight is replaced with chance 2 swaps / E.
  std::vector<uint64_t> tokens(truth.initial.size(), 0), swaps(truth.initial.size(), 0);
  for (uint64_t i = 0; i < seq.calls.size() && i < t.records.size(); ++i)
    if (seq.calls[i].layer_index == 0)
      for (uint32_t row = 0; row < t.records[i].rows; ++row)
        if (uint32_t q = t.RowRequest(t.records[i], row); q < tokens.size()) ++tokens[q];
  for (const auto& s : truth.swaps)
    if (s.request < swaps.size()) ++swaps[s.request];
  std::vector<double> rate(truth.initial.size(), 0.0);
  for (size_t q = 0; q < rate.size(); ++q)
    if (tokens[q] && L && E) rate[q] = std::min(1.0, 2.0 * double(swaps[q]) / (double(L) * double(E) * double(tokens[q])));
  return rate;
}

namespace {

constexpr uint32_t kLevels = 16;

class LearnerModel {
 public:
  LearnerModel(const trace::Trace& t, const CallSeq& seq, const trace::TrueDistribution& truth, uint32_t L, uint32_t E)
      : truth_(truth), L_(L), E_(E), posts_(truth.initial.size()), change_(DriftChangeRates(t, seq, truth, L, E)) {}
  void Start(uint32_t q) {
    posts_[q].clear();
    for (uint32_t l = 0; l < L_; ++l)
      posts_[q].emplace_back(std::span<const float>(truth_.initial[q]).subspan(size_t{l} * E_, E_), kLevels,
                             change_[q]);
  }
  void End(uint32_t q) { std::vector<LevelPosterior>().swap(posts_[q]); }
  bool Route(uint32_t q, uint32_t li, const std::vector<uint16_t>& prev, const std::vector<uint16_t>& row) {
    LevelPosterior& p = posts_[q][li];
    p.Observe(prev, row);
    return p.num_levels() > 1;
  }
  template <class Changed>
  void Token(uint32_t, uint32_t, Changed&&) {}
  double Fresh(uint32_t q, uint32_t li, uint32_t e, double draws) const { return posts_[q][li].Fresh(e, draws); }

 private:
  const trace::TrueDistribution& truth_;
  const uint32_t L_, E_;
  std::vector<std::vector<LevelPosterior>> posts_;  // [request][layer index], active requests only
  std::vector<double> change_;
};

}  // namespace

Result<SimResult> SimulateLearner(const trace::Trace& t, const CallSeq& seq, const ObjectSpace& space,
                                  uint64_t slots, const trace::TrueDistribution& truth) {
  LearnerModel model(t, seq, truth, space.num_active_layers(), space.num_experts);
  return RunDemandBound("learner", t, seq, space, slots, truth, model);
}

}  // namespace k3pack::store
