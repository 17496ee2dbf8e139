// moe::Forward on the float path against an independent double-precision
// evaluation of the spec's routed-expert block (§4.5): sigmoid scores, top-k
// of score + exp_probs_b, unbiased weights renormalized (sum clamped at
// 2^-14) and scaled, each expert down(situ(gate . x, up . x)) with
// situ(g, u) = beta tanh(g/beta) sigmoid(g) * lambda tanh(u/lambda) (u as is
// when lambda <= 0), summed with the weights. Weights are quantized blocks;
// both sides use the same decoded values, so only float rounding separates
// them.
//
// Bound, first order in u = 2^-24, per output i:
//   gate/up dots of L terms: E_g,j = (L + 2) u sum_l |G_jl x_l| (same for up);
//   SiTU: |d act/dg| E_g + |d act/du| E_u + 32 u |act| (the float libm calls,
//   quotients and products: a dozen roundings of a few ulps each);
//   down dot of F terms: (F + 2) u sum_j |D_ij act_j| + sum_j |D_ij| d act_j;
//   routing weight: 16 u w_k (sigmoid, sum, quotient, scale);
//   the weighted sum over k experts: (k + 1) u sum_k |w_k y_ki|.
// Every output must be within its bound, and the summed error far inside the
// summed bound (see the test).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>

#include "k3pack/moe.h"
#include "k3pack/quant.h"
#include "quant_test_util.h"

namespace k3pack::moe {
namespace {

constexpr double kU = 1.0 / (1 << 24);

struct Matrix {
  GgmlType type;
  std::vector<uint8_t> bytes;
  std::vector<float> w;  // decoded, rows x cols
  size_t rows, cols;
};

Matrix RandomMatrix(GgmlType t, size_t rows, size_t cols, std::mt19937& rng) {
  Matrix m{t, quant::RandomWeights(t, rows * cols, rng), {}, rows, cols};
  m.w.resize(rows * cols);
  EXPECT_TRUE(quant::DequantizeRow(t, m.bytes, m.w, quant::Isa::kScalar).ok());
  return m;
}

// y = M . v in double, and sum |M_ij v_j| per row.
void Dot(const Matrix& m, const std::vector<double>& v, std::vector<double>* y, std::vector<double>* mag) {
  y->assign(m.rows, 0.0);
  mag->assign(m.rows, 0.0);
  for (size_t r = 0; r < m.rows; ++r) {
    for (size_t c = 0; c < m.cols; ++c) {
      (*y)[r] += m.w[r * m.cols + c] * v[c];
      (*mag)[r] += std::fabs(m.w[r * m.cols + c] * v[c]);
    }
  }
}

struct ExpertMatrices {
  Matrix gate, up, down;
};

struct Reference {
  std::vector<uint32_t> experts;
  std::vector<double> out, tol;
};

double Sig(double v) { return 1.0 / (1.0 + std::exp(-v)); }

Reference Evaluate(const std::vector<float>& logits, const std::vector<float>& bias, const std::vector<float>& x,
                   const std::map<uint32_t, ExpertMatrices>& experts, const MoeConfig& cfg) {
  const size_t n = logits.size();
  std::vector<double> p(n), sel(n);
  for (size_t e = 0; e < n; ++e) {
    p[e] = Sig(logits[e]);
    sel[e] = p[e] + (bias.empty() ? 0.0 : bias[e]);
  }
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return sel[a] > sel[b]; });
  Reference r;
  r.experts.assign(order.begin(), order.begin() + cfg.top_k);
  std::vector<double> w;
  for (uint32_t e : r.experts) w.push_back(p[e]);
  if (cfg.expert_weights_norm) {
    const double sum = std::max(std::accumulate(w.begin(), w.end(), 0.0), 6.103515625e-5);
    for (double& v : w) v /= sum;
  }
  if (cfg.expert_weights_scale != 0.0f && cfg.expert_weights_scale != 1.0f) {
    for (double& v : w) v *= cfg.expert_weights_scale;
  }
  const double beta = cfg.situ_beta, lambda = cfg.situ_lambda;
  const std::vector<double> xd(x.begin(), x.end());
  r.out.assign(static_cast<size_t>(cfg.latent), 0.0);
  r.tol.assign(static_cast<size_t>(cfg.latent), 0.0);
  std::vector<double> sum_abs(static_cast<size_t>(cfg.latent), 0.0);
  for (size_t k = 0; k < r.experts.size(); ++k) {
    const ExpertMatrices& ex = experts.at(r.experts[k]);
    std::vector<double> g, g_mag, u, u_mag;
    Dot(ex.gate, xd, &g, &g_mag);
    Dot(ex.up, xd, &u, &u_mag);
    std::vector<double> act(g.size()), act_err(g.size());
    for (size_t j = 0; j < g.size(); ++j) {
      const double th = std::tanh(g[j] / beta), s = Sig(g[j]);
      const double gp = beta * th * s;
      const double dgp = (1 - th * th) * s + beta * th * s * (1 - s);
      const double tu = lambda > 0 ? std::tanh(u[j] / lambda) : 0.0;
      const double up = lambda > 0 ? lambda * tu : u[j];
      const double dup = lambda > 0 ? 1 - tu * tu : 1.0;
      act[j] = gp * up;
      act_err[j] = std::fabs(dgp * up) * (ex.gate.cols + 2) * kU * g_mag[j] +
                   std::fabs(gp * dup) * (ex.up.cols + 2) * kU * u_mag[j] + 32 * kU * std::fabs(act[j]);
    }
    std::vector<double> y, y_mag;
    Dot(ex.down, act, &y, &y_mag);
    for (size_t i = 0; i < y.size(); ++i) {
      double prop = 0;
      for (size_t j = 0; j < act.size(); ++j) prop += std::fabs(ex.down.w[i * act.size() + j]) * act_err[j];
      r.out[i] += w[k] * y[i];
      r.tol[i] += std::fabs(w[k]) * ((ex.down.cols + 2) * kU * y_mag[i] + prop) + 16 * kU * std::fabs(w[k] * y[i]);
      sum_abs[i] += std::fabs(w[k] * y[i]);
    }
  }
  for (size_t i = 0; i < r.tol.size(); ++i) r.tol[i] += (cfg.top_k + 1) * kU * sum_abs[i] + 1e-30;
  return r;
}

TEST(MoeReference, FloatPathMatchesDoubleEvaluation) {
  std::mt19937 rng(77);
  std::normal_distribution<float> g(0, 1);
  struct Case {
    bool norm;
    float scale, lambda;
    GgmlType gate, up, down;
  };
  const Case cases[] = {
      {true, 2.5f, 25.0f, GgmlType::Q4_K, GgmlType::IQ2_XS, GgmlType::Q6_K},
      {false, 1.0f, 0.0f, GgmlType::Q8_0, GgmlType::MXFP4, GgmlType::IQ3_XXS},  // lambda 0: u as is
      {true, 0.0f, 25.0f, GgmlType::BF16, GgmlType::F16, GgmlType::Q2_K},
  };
  for (const Case& c : cases) {
    MoeConfig cfg;
    cfg.num_experts = 16;
    cfg.top_k = 4;
    cfg.latent = 512;
    cfg.inter = 256;
    cfg.expert_weights_norm = c.norm;
    cfg.expert_weights_scale = c.scale;
    cfg.situ_lambda = c.lambda;
    cfg.quantize_activations = false;
    cfg.threads = 2;
    // Distinct selection scores, far enough apart that float and double agree on the order.
    std::vector<float> logits(cfg.num_experts), bias(cfg.num_experts), x(static_cast<size_t>(cfg.latent));
    std::vector<int> perm(cfg.num_experts);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (uint32_t e = 0; e < cfg.num_experts; ++e) {
      logits[e] = 0.25f * static_cast<float>(perm[e]) - 2.0f;
      bias[e] = (e % 3 == 0) ? -0.03f : 0.02f;
    }
    for (auto& v : x) v = g(rng);
    std::map<uint32_t, ExpertMatrices> experts;
    for (uint32_t e = 0; e < cfg.num_experts; ++e) {
      const size_t lat = static_cast<size_t>(cfg.latent), inter = static_cast<size_t>(cfg.inter);
      experts.emplace(e, ExpertMatrices{RandomMatrix(c.gate, inter, lat, rng), RandomMatrix(c.up, inter, lat, rng),
                                RandomMatrix(c.down, lat, inter, rng)});
    }
    ExpertSource src = [&](uint32_t, uint32_t e) -> Result<ExpertWeights> {
      const ExpertMatrices& ex = experts.at(e);
      return ExpertWeights{ex.up.bytes, ex.gate.bytes, ex.down.bytes, ex.up.type, ex.gate.type, ex.down.type};
    };
    const Reference ref = Evaluate(logits, bias, x, experts, cfg);
    auto routing = Route(logits, bias, cfg);
    ASSERT_TRUE(routing.ok());
    EXPECT_EQ(routing->experts, ref.experts);
    auto y = Forward(2, logits, bias, x, src, cfg);
    ASSERT_TRUE(y.ok()) << y.error().message();
    ASSERT_EQ(y->size(), ref.out.size());
    size_t bad = 0;
    double err_sum = 0, tol_sum = 0;
    for (size_t i = 0; i < ref.out.size(); ++i) {
      const double err = std::fabs((*y)[i] - ref.out[i]);
      bad += !(err <= ref.tol[i]);
      err_sum += err;
      tol_sum += ref.tol[i];
    }
    const std::string types = std::string(GgmlTypeName(c.gate)) + "/" + std::string(GgmlTypeName(c.up)) + "/" +
                              std::string(GgmlTypeName(c.down));
    EXPECT_EQ(bad, 0u) << types;
    // The bound is the worst case (every rounding the same way, no cancellation
    // in the sums); random roundings cancel, observed at ~1e-4 of it. So the
    // summed error must stay under 1 % of the summed bound: a formula slip of
    // 1e-4 relative (a misplaced factor, a wrong weight) cannot hide under it.
    EXPECT_LT(err_sum, 0.01 * tol_sum) << types;
  }
}

}  // namespace
}  // namespace k3pack::moe
