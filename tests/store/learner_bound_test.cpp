// The learning reference of `trace sweep --learner`: LevelPosterior's
// filter worked by hand, and the learner against the informed bound.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <filesystem>
#include <vector>

#include "../cli_run.h"
#include "k3pack/trace.h"
#include "small_family.h"
#include "store/level_posterior.h"
#include "store/simulate.h"
#include "store/synthetic_pack.h"

namespace k3pack::store {
namespace {

TEST(LevelPosterior, ArrivalsAndAbsencesMoveTheBeliefAndKeptExpertsDoNot) {
  // Two levels, 0.4 and 0.1, half of the experts each; a 10% chance per token
  // that an expert's weight is replaced.
  const std::vector<float> w = {0.1f, 0.4f, 0.1f, 0.4f};
  LevelPosterior p(w, 2, 0.1);
  ASSERT_EQ(p.num_levels(), 2u);
  EXPECT_DOUBLE_EQ(p.level(0), 0.4f);
  EXPECT_NEAR(p.level(1), 0.1, 1e-7);
  // First token: expert 0 arrives, one fresh draw.
  // Expert 0: (0.5*0.4, 0.5*0.1) / 0.25 = (0.8, 0.2); mixed 0.9 x + 0.1 x 0.5 = (0.77, 0.23).
  // The others did not arrive: (0.5*0.6, 0.5*0.9) / 0.75 = (0.4, 0.6); mixed (0.41, 0.59).
  const std::vector<uint16_t> none, first = {0}, second = {0, 2};
  p.Observe(none, first);
  EXPECT_NEAR(p.Belief(0, 0), 0.77, 1e-6);
  EXPECT_NEAR(p.Belief(0, 1), 0.23, 1e-6);
  for (uint32_t e : {1u, 2u, 3u}) EXPECT_NEAR(p.Belief(e, 0), 0.41, 1e-6) << e;
  // E[min(1, 2 w)] for expert 0: 0.77 x 0.8 + 0.23 x 0.2.
  EXPECT_NEAR(p.Fresh(0, 2.0), 0.662, 1e-6);
  // Second token keeps expert 0 (no evidence: only the mixing step) and
  // expert 2 arrives as the one fresh draw.
  p.Observe(first, second);
  EXPECT_NEAR(p.Belief(0, 0), 0.9 * 0.77 + 0.05, 1e-6);
  // Expert 2: (0.41*0.4, 0.59*0.1) / 0.223 then mixed.
  EXPECT_NEAR(p.Belief(2, 0), 0.9 * (0.164 / 0.223) + 0.05, 1e-6);
  // Expert 1 stayed away again: (0.41*0.6, 0.59*0.9) / 0.777 then mixed.
  const double b1 = 0.9 * (0.246 / 0.777) + 0.05;
  EXPECT_NEAR(p.Belief(1, 0), b1, 1e-6);
  // Third token drops expert 0 (no evidence: the previous token had it) and
  // brings two new experts, 1 and 3: m = 2, arrival chance 1 - (1 - level)^2
  // = 0.64 at 0.4 and 0.19 at 0.1.
  const double b0 = p.Belief(0, 0), b3 = p.Belief(3, 0);
  const std::vector<uint16_t> third = {1, 2, 3};
  p.Observe(second, third);
  EXPECT_NEAR(p.Belief(0, 0), 0.9 * b0 + 0.05, 1e-6);
  auto arrived = [](double hi) { return 0.9 * (hi * 0.64 / (hi * 0.64 + (1 - hi) * 0.19)) + 0.05; };
  EXPECT_NEAR(p.Belief(1, 0), arrived(b1), 1e-6);
  EXPECT_NEAR(p.Belief(3, 0), arrived(b3), 1e-6);
}

TEST(LevelPosterior, TheDriftRateIsTwoSwapsPerExpertAndToken) {
  trace::TrueDistribution truth;
  trace::GenOptions o = testing_traces::SmallFamily("drift");
  o.drift = 0.05;  // 3.2 swaps per layer and token among 64 experts
  o.truth = &truth;
  auto t = trace::Generate(o);
  ASSERT_TRUE(t.ok());
  ObjectSpace space = SpaceForTrace(*t, 4096);
  auto seq = BuildCallSeq(*t, space);
  ASSERT_TRUE(seq.ok());
  auto rate = DriftChangeRates(*t, *seq, truth, space.num_active_layers(), space.num_experts);
  ASSERT_EQ(rate.size(), 1u);
  EXPECT_NEAR(rate[0], 2 * o.drift, 0.1 * o.drift);
  o.drift = 0;
  t = trace::Generate(o);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(DriftChangeRates(*t, *BuildCallSeq(*t, space), truth, space.num_active_layers(), space.num_experts)[0], 0);
}

TEST(LevelPosterior, AFlatLayerHasOneLevelAndNothingToLearn) {
  const std::vector<float> w(8, 0.125f);
  LevelPosterior p(w, 16, 0.0);
  ASSERT_EQ(p.num_levels(), 1u);
  const std::vector<uint16_t> none, row = {1, 5};
  p.Observe(none, row);
  EXPECT_EQ(p.Belief(1, 0), 1.0f);
  EXPECT_EQ(p.Fresh(3, 2.0), 0.25);
}

Result<SimResult> Replay(const trace::GenOptions& o, uint64_t slots, bool learner) {
  auto g = testing_traces::GenerateWithTruth(o);
  if (!g.ok()) return g.error();
  return learner ? SimulateLearner(g->trace, g->seq, g->space, slots, g->truth)
                 : SimulateInformed(g->trace, g->seq, g->space, slots, g->truth);
}

TEST(LearnerBound, EqualsTheInformedBoundWhenPopularityIsFlat) {
  // Nothing to learn: every expert holds the same weight, so both rank alike.
  trace::GenOptions o = testing_traces::SmallFamily("interleaved");
  o.domains = 0;
  o.request_skew = 0;
  o.skew = 0;
  for (uint64_t slots : {40u, 90u}) {
    auto learner = Replay(o, slots, true), informed = Replay(o, slots, false);
    ASSERT_TRUE(learner.ok() && informed.ok());
    EXPECT_EQ(learner->hits, informed->hits) << slots;
    EXPECT_EQ(learner->evictions, informed->evictions) << slots;
  }
}

TEST(LearnerBound, LearnsASteadyRequestsFavourites) {
  // One long request with a strongly skewed popularity and no reuse: the
  // learner starts from the popularity values alone and ends close to the
  // bound told which expert holds which, well above ranking by chance.
  trace::GenOptions o = testing_traces::SmallFamily("kimi");
  o.requests = 1;
  o.decode_tokens = 600;
  o.reuse = 0;
  o.request_skew = 1.2;
  const uint64_t slots = 60;  // 16% of 6 x 64 objects
  auto learner = Replay(o, slots, true), informed = Replay(o, slots, false);
  ASSERT_TRUE(learner.ok() && informed.ok());
  EXPECT_GE(learner->hit_rate(), 0.95 * informed->hit_rate());
  EXPECT_LE(learner->hit_rate(), informed->hit_rate() + 0.01);
  // A cache of 60 random objects of 384 holds a route with chance 60/384.
  EXPECT_GT(learner->hit_rate(), 2 * 60.0 / 384.0);
}

TEST(LearnerBound, BatchedAndPrefillRowsAreLearnedRowByRow) {
  // Records of several rows (a batched decode step of several requests, a
  // prefill chunk of one request's tokens): the learner stays within the
  // informed bound's reach and well above a cache of random objects.
  for (const char* family : {"batched", "prefill-burst"}) {
    trace::GenOptions o = testing_traces::SmallFamily(family);
    o.reuse = 0;
    o.request_skew = 1.2;
    const uint64_t slots = 60;
    auto learner = Replay(o, slots, true), informed = Replay(o, slots, false);
    ASSERT_TRUE(learner.ok() && informed.ok()) << family;
    EXPECT_LE(learner->hit_rate(), informed->hit_rate() + 0.02) << family;
    EXPECT_GE(learner->hit_rate(), 0.85 * informed->hit_rate()) << family;
    EXPECT_GT(learner->hit_rate(), 1.5 * 60.0 / 384.0) << family;
  }
}

// `--learner` and `--informed-next` (informed_next_test.cpp) are columns of
// the plain sweep of a generated trace: each adds its series, between what
// it must lie, and refuses a trace file, which carries no truth.
TEST(LearnerBound, SweepFlagAddsTheSeriesAndRefusesTracesWithoutTruth) {
  const std::string small = " --layers 6 --experts 64 --top-k 4 --decode-tokens 30 --prompt-tokens 32";
  std::string dir = testing::TinyPack::TempDir("learner");
  for (const auto& [flag, series] : {std::pair<std::string, std::string>{"--learner", "learner"},
                                     {"--informed-next", "informed+next"}}) {
    SCOPED_TRACE(flag);
    auto r = testing_cli::Cli("trace sweep --family interleaved " + flag + " --policies lru --json --sizes 64 --svg " +
                              dir + "/p.svg" + small);
    ASSERT_EQ(r.code, 0) << r.out;
    auto hr = nlohmann::json::parse(r.out)["hit_rate"];
    ASSERT_TRUE(hr.contains(series)) << r.out;
    const double value = hr[series][0].get<double>();
    EXPECT_GT(value, 0.0);
    EXPECT_LE(value, hr["belady"][0].get<double>());
    if (series == "informed+next") {
      EXPECT_GT(value, hr["informed"][0].get<double>());
    }
    auto bad = testing_cli::Cli("trace sweep --trace " + dir + "/none.k3trace " + flag + " --svg " + dir + "/q.svg");
    EXPECT_EQ(bad.code, 2) << bad.out;
    EXPECT_NE(bad.out.find(flag + " and --trace cannot be used together"), std::string::npos) << bad.out;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace k3pack::store
