// Which popularity value each expert of one layer holds, learned from a
// request's routes: the estimate behind `trace sweep --learner`.
//
// The layer's sampling weights are known as a multiset (grouped into a few
// levels of equal size, each the mean of its group) but not which expert
// holds which. Per expert a distribution over the levels starts at the
// groups' shares and is updated once per token, a hidden Markov filter:
// - an expert the previous token did not have is an arrival or not, with
//   chance 1 - (1 - level)^m of arriving among the token's m new experts;
//   one the previous token had is taken as no evidence, kept or dropped
//   (routers keep experts from token to token whatever their popularity);
// - then each expert's value is replaced by a random one with chance
//   `change` (popularity drift trades weights between experts).
// It treats experts independently and draws as made with replacement: a
// close approximation of the Bayes estimate from the routes, not an exact
// one (64 levels, or counting a dropped expert as evidence, moved the
// sweep's hit rates by at most 0.05 point).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "k3pack/trace.h"
#include "store/simulate.h"

namespace k3pack::store {

// Per request of `truth`, the per-token chance that an expert's weight is
// replaced by the generator's drift: the learner is told it.
std::vector<double> DriftChangeRates(const trace::Trace& t, const CallSeq& seq, const trace::TrueDistribution& truth,
                                     uint32_t num_layers, uint32_t num_experts);

class LevelPosterior {
 public:
  // `weights`: the layer's sampling weights (any order; normalized);
  // `max_levels`: how many groups; `change`: the per-token chance that an
  // expert's weight is replaced.
  LevelPosterior(std::span<const float> weights, uint32_t max_levels, double change);

  // One token routed `row` after the previous token's `prev` (both sorted,
  // distinct; `prev` empty at the request's first token).
  void Observe(std::span<const uint16_t> prev, std::span<const uint16_t> row);

  // The expected chance that expert e is among `draws` fresh draws,
  // E[min(1, draws * weight)] (the informed bound's approximation).
  double Fresh(uint32_t e, double draws) const;

  uint32_t num_levels() const { return static_cast<uint32_t>(levels_.size()); }
  double level(uint32_t b) const { return levels_[b]; }
  // The chance that expert e holds level b.
  double Belief(uint32_t e, uint32_t b) const { return belief_[size_t{e} * levels_.size() + b]; }

 private:
  std::vector<double> levels_, prior_;
  std::vector<float> belief_;  // [expert][level]
  std::vector<float> mix_;     // change * prior, the mixing step's share
  std::vector<float> arrive_, stay_;  // scratch: one token's likelihoods
  std::vector<uint8_t> seen_;  // scratch: 1 in the previous token, 2 arrived
  uint32_t E_;
  double change_;
};

}  // namespace k3pack::store
