// Routed-expert forward: a tiny case checked by hand, routing rules, errors,
// and a quantized expert against its float reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "k3pack/moe.h"
#include "k3pack/quant.h"
#include "quant_test_util.h"

namespace k3pack::moe {
namespace {

std::vector<uint8_t> F32Bytes(std::vector<float> v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

struct ExpertBytes {
  std::vector<uint8_t> up, gate, down;
};

TEST(Moe, SituMatchesFormula) {
  // beta*tanh(g/beta)*sigmoid(g) * lambda*tanh(u/lambda) at (1, 1) and (2, 3).
  EXPECT_NEAR(Situ(1, 1, 4, 25), 0.7158178, 1e-6);
  EXPECT_NEAR(Situ(2, 3, 4, 25), 4.8610666, 1e-5);
  EXPECT_NEAR(Situ(2, 2, 4, 25), 3.2493226, 1e-5);
  EXPECT_EQ(Situ(0, 5, 4, 25), 0.0f);                       // tanh(0) = 0
  EXPECT_NEAR(Situ(1, 3, 4, 0), 3 * Situ(1, 25 * std::atanh(1.0f / 25), 4, 25), 1e-4);  // lambda <= 0: u as is
}

TEST(Moe, TinyForwardCheckedByHand) {
  MoeConfig cfg;
  cfg.num_experts = 4;
  cfg.top_k = 2;
  cfg.latent = 2;
  cfg.inter = 2;
  cfg.expert_weights_scale = 2.0f;
  // Scores sigmoid(logit): 0.5, 0.881, 0.269, 0.731. With the bias the
  // selection scores are 0.5, -2.119, 0.269, 1.231 -> experts 3 then 0.
  // Weights use the unbiased scores: 2 * 0.731/1.231 and 2 * 0.5/1.231.
  const std::vector<float> logits = {0, 2, -1, 1};
  const std::vector<float> bias = {0, -3, 0, 0.5f};
  std::map<uint32_t, ExpertBytes> experts;
  // Rows are output channels (ggml ne = (in, out)).
  experts[0] = {F32Bytes({1, 0, 1, 1}), F32Bytes({1, 0, 0, 1}), F32Bytes({1, 0, 0, 1})};
  experts[3] = {F32Bytes({2, 0, 0, 0}), F32Bytes({0, 1, 1, 0}), F32Bytes({1, 1, 0, 2})};
  ExpertSource src = [&](uint32_t layer, uint32_t e) -> Result<ExpertWeights> {
    EXPECT_EQ(layer, 7u);
    auto it = experts.find(e);
    if (it == experts.end()) return Error("expert " + std::to_string(e) + " was not expected to run");
    return ExpertWeights{it->second.up, it->second.gate, it->second.down, GgmlType::F32, GgmlType::F32,
                         GgmlType::F32};
  };
  auto r = Route(logits, bias, cfg);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->experts, (std::vector<uint32_t>{3, 0}));
  EXPECT_NEAR(r->weights[0], 1.18769097f, 1e-6);
  EXPECT_NEAR(r->weights[1], 0.81230903f, 1e-6);
  // x = (1, 2). Expert 0: g = (1, 2), u = (1, 3), out = act.
  // Expert 3: g = (2, 1), u = (2, 0), act = (situ(2,2), 0), out = (act0, 0).
  // y = 0.8123 * (0.71582, 4.86107) + 1.18769 * (3.24932, 0) = (4.44066, 3.94869).
  for (bool q : {false, true}) {
    cfg.quantize_activations = q;  // F32 weights take the float path either way
    auto y = Forward(7, logits, bias, std::vector<float>{1, 2}, src, cfg);
    ASSERT_TRUE(y.ok()) << y.error().message();
    EXPECT_NEAR((*y)[0], 4.4406564, 1e-5);
    EXPECT_NEAR((*y)[1], 3.9486883, 1e-5);
  }
}

TEST(Moe, RoutingRules) {
  MoeConfig cfg;
  cfg.num_experts = 3;
  cfg.top_k = 2;
  cfg.expert_weights_norm = false;
  cfg.expert_weights_scale = 0.0f;  // 0 means "no scaling"
  auto r = Route(std::vector<float>{1, 1, 0}, {}, cfg);  // tie: lower id first
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->experts, (std::vector<uint32_t>{0, 1}));
  EXPECT_NEAR(r->weights[0], 0.7310586f, 1e-6);  // unnormalized sigmoid
  cfg.expert_weights_norm = true;
  auto tiny = Route(std::vector<float>{-40, -40, -50}, {}, cfg);  // sum clamps at 2^-14
  ASSERT_TRUE(tiny.ok());
  EXPECT_NEAR(tiny->weights[0], 1.0f / (1.0f + std::exp(40.0f)) / 6.103515625e-5f, 1e-12);
  EXPECT_FALSE(Route(std::vector<float>{1, 2}, {}, cfg).ok());  // wrong logit count
  cfg.top_k = 4;
  EXPECT_FALSE(Route(std::vector<float>{1, 2, 3}, {}, cfg).ok());
}

// A NaN selection score has no place in the top-k order (the comparison
// stops being a strict weak ordering: undefined behaviour, arbitrary picks);
// Route names the expert instead. Infinities are ordered and route.
TEST(Moe, NanSelectionScoresAreRefused) {
  MoeConfig cfg;
  cfg.num_experts = 4;
  cfg.top_k = 2;
  auto logit = Route(std::vector<float>{0, NAN, 1, 2}, {}, cfg);
  ASSERT_FALSE(logit.ok());
  EXPECT_NE(logit.error().message().find("expert 1"), std::string::npos) << logit.error().message();
  auto bias = Route(std::vector<float>{0, 1, 2, 3}, std::vector<float>{0, 0, NAN, 0}, cfg);
  ASSERT_FALSE(bias.ok());
  EXPECT_NE(bias.error().message().find("expert 2"), std::string::npos) << bias.error().message();
  EXPECT_NE(bias.error().message().find("exp_probs_b"), std::string::npos);
  auto inf = Route(std::vector<float>{0, INFINITY, -INFINITY, 1}, {}, cfg);
  ASSERT_TRUE(inf.ok());
  EXPECT_EQ(inf->experts, (std::vector<uint32_t>{1, 3}));
}

// A Routing built by a caller must pair every expert with a weight (the sum
// read weights[k] for each expert k: past the end when there were fewer).
TEST(Moe, RoutingWeightsMustMatchItsExperts) {
  MoeConfig cfg;
  cfg.num_experts = 2;
  cfg.top_k = 2;
  cfg.latent = 1;
  cfg.inter = 1;
  const std::vector<uint8_t> one = F32Bytes({1});
  ExpertSource src = [&](uint32_t, uint32_t) -> Result<ExpertWeights> {
    return ExpertWeights{one, one, one, GgmlType::F32, GgmlType::F32, GgmlType::F32};
  };
  Routing r;
  r.experts = {0, 1};
  r.weights = {0.5f};
  auto y = RoutedForward(0, r, std::vector<float>{1}, src, cfg);
  ASSERT_FALSE(y.ok());
  EXPECT_NE(y.error().message().find("2 experts and 1 weights"), std::string::npos) << y.error().message();
}

TEST(Moe, SourceErrorsAndShortWeightsAreReported) {
  MoeConfig cfg;
  cfg.num_experts = 2;
  cfg.top_k = 1;
  cfg.latent = 4;
  cfg.inter = 4;
  ExpertSource failing = [](uint32_t, uint32_t) -> Result<ExpertWeights> { return Error("store miss"); };
  auto y = Forward(3, std::vector<float>{0, 1}, {}, std::vector<float>(4, 1.0f), failing, cfg);
  ASSERT_FALSE(y.ok());
  EXPECT_NE(y.error().message().find("expert 1"), std::string::npos);
  EXPECT_NE(y.error().message().find("store miss"), std::string::npos);
  std::vector<uint8_t> small(8);
  ExpertSource short_src = [&](uint32_t, uint32_t) -> Result<ExpertWeights> {
    return ExpertWeights{small, small, small, GgmlType::F32, GgmlType::F32, GgmlType::F32};
  };
  EXPECT_FALSE(Forward(3, std::vector<float>{0, 1}, {}, std::vector<float>(4, 1.0f), short_src, cfg).ok());
}

// A MoeConfig::inter whose byte count wraps 2^64 (2^60 rows of 16 bytes is
// exactly 2^64, read as 0) or that is negative passed the size check and then
// threw std::bad_alloc / std::length_error out of the Result function.
TEST(Moe, AnInterWhoseByteCountOverflowsIsNamed) {
  MoeConfig cfg;
  cfg.latent = 4;
  std::vector<uint8_t> small(64);
  const ExpertWeights w{small, small, small, GgmlType::F32, GgmlType::F32, GgmlType::F32};
  for (int64_t inter : {int64_t{1} << 60, int64_t{-(int64_t{1} << 60)}, int64_t{-1}}) {
    cfg.inter = inter;
    Result<std::vector<float>> y = Error("not run");
    ASSERT_NO_THROW(y = ExpertForward(w, std::vector<float>(4, 1.0f), cfg)) << inter;
    ASSERT_FALSE(y.ok()) << inter;
    EXPECT_NE(y.error().message().find("MoeConfig::inter " + std::to_string(inter)), std::string::npos)
        << y.error().message();
  }
}

TEST(Moe, QuantizedExpertsTrackFloatReference) {
  std::mt19937 rng(11);
  std::normal_distribution<float> g(0, 1);
  MoeConfig cfg;
  cfg.num_experts = 8;
  cfg.top_k = 3;
  cfg.latent = 512;
  cfg.inter = 256;
  cfg.threads = 2;
  std::map<uint32_t, ExpertBytes> experts;
  for (uint32_t e = 0; e < cfg.num_experts; ++e) {
    // Expert-store types: Q2_K up/gate, Q3_K down, small scales.
    auto up = quant::RandomBlocks(GgmlType::Q2_K, 256 * 512 / 256, rng);
    auto gate = quant::RandomBlocks(GgmlType::Q2_K, 256 * 512 / 256, rng);
    auto down = quant::RandomBlocks(GgmlType::Q3_K, 512 * 256 / 256, rng);
    for (size_t b = 0; b < up.size() / 84; ++b) {  // d, dmin ~ 1e-2
      up[84 * b + 81] = gate[84 * b + 81] = 0x20;
      up[84 * b + 83] = gate[84 * b + 83] = 0x20;
    }
    for (size_t b = 0; b < down.size() / 110; ++b) down[110 * b + 109] = 0x20;
    experts[e] = {up, gate, down};
  }
  ExpertSource src = [&](uint32_t, uint32_t e) -> Result<ExpertWeights> {
    return ExpertWeights{experts[e].up, experts[e].gate, experts[e].down, GgmlType::Q2_K, GgmlType::Q2_K,
                         GgmlType::Q3_K};
  };
  std::vector<float> logits(8), x(512);
  for (auto& v : logits) v = g(rng);
  for (auto& v : x) v = g(rng);
  cfg.quantize_activations = false;
  auto ref = Forward(1, logits, {}, x, src, cfg);
  cfg.quantize_activations = true;
  auto got = Forward(1, logits, {}, x, src, cfg);
  ASSERT_TRUE(ref.ok() && got.ok());
  double num = 0, den = 0;
  for (size_t i = 0; i < ref->size(); ++i) {
    num += ((*got)[i] - (*ref)[i]) * ((*got)[i] - (*ref)[i]);
    den += (*ref)[i] * (*ref)[i];
  }
  ASSERT_GT(den, 0);
  EXPECT_LT(std::sqrt(num / den), 0.02) << "relative RMS error of Q8_K activations";
}

}  // namespace
}  // namespace k3pack::moe
