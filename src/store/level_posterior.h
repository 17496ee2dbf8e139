// Which popularity value each expert of one layer holds, learned from a
// request's routes: the estimate behind `trace sweep --learner`.
//
// The layer's sampling weights are known as a multiset (grouped into a few
// levels of equal size, each the mean of its group) but not which expert
// holds which. Per expert a distribution over the levels starts at the
// groups' shares and is updated once per token, a hidden Markov filter:
// - an expert the previous token did not have is an arrival or not, with
//   chance 1 - (1 - level)^m of arriving among the token's m fresh draws
//   (a kept expert says nothing about popularity);
// - then each expert's value is replaced by a random one with chance
//   `change` (popularity drift trades weights between experts).
// With the true change rate this is, up to the grouping, the best estimate
// any learner can make of the weights from the routes alone.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace k3pack::store {

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
  std::vector<uint8_t> seen_;  // scratch: 1 kept-eligible, 2 arrived
  uint32_t E_;
  double change_;
};

}  // namespace k3pack::store
