// Dot products against the exact dequantize-then-dot reference, within the
// bound documented in docs/quant.md: the integer path's only error
// beyond float rounding is the activation's own quantization.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "k3pack/quant.h"
#include "quant/dot_kernels.h"
#include "quant/fp.h"
#include "quant_test_util.h"

namespace k3pack::quant {
namespace {

std::vector<uint8_t> RandomWeights(GgmlType t, size_t n, std::mt19937& rng) {
  const GgmlTypeInfo* info = GgmlTypeInfoFor(t);
  if (info->block_size > 1) return RandomBlocks(t, n / info->block_size, rng);
  std::normal_distribution<float> g(0, 1);
  std::vector<uint8_t> out(n * info->type_size);
  for (size_t i = 0; i < n; ++i) {
    const float v = g(rng);
    if (t == GgmlType::F32) std::memcpy(&out[4 * i], &v, 4);
    if (t == GgmlType::F16) { const uint16_t h = Fp32ToFp16(v); std::memcpy(&out[2 * i], &h, 2); }
    if (t == GgmlType::BF16) { const uint16_t h = static_cast<uint16_t>(FloatToBits(v) >> 16); std::memcpy(&out[2 * i], &h, 2); }
  }
  return out;
}

// Documented tolerance: sum over activation blocks of c * amax_b / 127 *
// sum_{j in b} |w_j| (c = 0.5 for Q8_K, 0.6 for Q8_0 whose scale is also
// rounded to fp16), plus 1e-4 * sum |w_j x_j| for float accumulation.
double Tolerance(GgmlType act, const std::vector<float>& w, const std::vector<float>& x) {
  const size_t blk = act == GgmlType::Q8_K ? 256 : act == GgmlType::Q8_0 ? 32 : x.size();
  const double c = act == GgmlType::Q8_K ? 0.5 : act == GgmlType::Q8_0 ? 0.6 : 0.0;
  double tol = 0, mag = 0;
  for (size_t b = 0; b < x.size(); b += blk) {
    double amax = 0, wsum = 0;
    for (size_t j = b; j < b + blk; ++j) {
      amax = std::max(amax, std::fabs(static_cast<double>(x[j])));
      wsum += std::fabs(w[j]);
      mag += std::fabs(static_cast<double>(w[j]) * x[j]);
    }
    tol += c * amax / 127.0 * wsum;
  }
  return tol + 1e-4 * mag + 1e-6;
}

TEST(QuantDot, AgreesWithDequantizeThenDot) {
  std::mt19937 rng(99);
  std::normal_distribution<float> g(0, 1);
  const GgmlType types[] = {GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K,
                            GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::IQ4_NL, GgmlType::IQ2_XS,
                            GgmlType::IQ2_XXS, GgmlType::IQ3_XXS, GgmlType::MXFP4, GgmlType::IQ2_S,
                            GgmlType::IQ1_M, GgmlType::TQ1_0, GgmlType::NVFP4, GgmlType::F16, GgmlType::BF16,
                            GgmlType::F32};
  const size_t n = 3072;  // Kimi-K3's moe_intermediate_size
  for (GgmlType t : types) {
    double err_sum = 0, tol_sum = 0;
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> x(n);
      for (auto& v : x) v = g(rng) * (trial % 3 == 0 ? 10.0f : 1.0f);
      const std::vector<uint8_t> row = RandomWeights(t, n, rng);
      auto act = PrepareActivation(t, x);
      ASSERT_TRUE(act.ok()) << act.error().message();
      auto got = DotRow(row, *act);
      ASSERT_TRUE(got.ok());
      auto ref = DotRowReference(t, row, x);
      ASSERT_TRUE(ref.ok());
      std::vector<float> w(n);
      ASSERT_TRUE(DequantizeRow(t, row, w).ok());
      const double tol = Tolerance(act->act_type, w, x);
      EXPECT_NEAR(*got, *ref, tol) << GgmlTypeName(t) << " trial " << trial;
      err_sum += std::fabs(*got - *ref);
      tol_sum += tol;
    }
    // The bound is worst case; random rounding errors mostly cancel (observed
    // ~0.05-0.1 of it), so a kernel bug hiding under the bound still shows here.
    EXPECT_LT(err_sum, 0.25 * tol_sum) << GgmlTypeName(t);
  }
}

TEST(QuantDot, IntegerPathsForExpertTypes) {
  for (GgmlType t : {GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0,
                     GgmlType::IQ2_XS, GgmlType::IQ2_XXS, GgmlType::IQ3_XXS, GgmlType::MXFP4}) {
    EXPECT_TRUE(HasIntegerDot(t)) << GgmlTypeName(t);
  }
  EXPECT_EQ(ActivationTypeFor(GgmlType::Q2_K), GgmlType::Q8_K);
  EXPECT_EQ(ActivationTypeFor(GgmlType::MXFP4), GgmlType::Q8_0);
  EXPECT_EQ(ActivationTypeFor(GgmlType::IQ2_S), GgmlType::F32);
}

TEST(QuantDot, Q8KQuantizerMatchesLayout) {
  // Hand case: a block whose largest magnitude is -2 at index 5.
  std::vector<float> x(256, 0.0f);
  x[5] = -2.0f;
  x[6] = 1.0f;
  x[7] = 0.0079f;  // 0.0079 * 63.5 = 0.50 -> rounds to even 0 (nearbyint)
  x[200] = 0.5f;
  std::vector<uint8_t> q(292);
  QuantizeRowQ8K(x, q.data());
  float d;
  std::memcpy(&d, q.data(), 4);
  EXPECT_FLOAT_EQ(d, 1.0f / (-127.0f / -2.0f));
  EXPECT_EQ(static_cast<int8_t>(q[4 + 5]), -127);
  EXPECT_EQ(static_cast<int8_t>(q[4 + 6]), 64);  // 63.5 rounds to even 64
  EXPECT_EQ(static_cast<int8_t>(q[4 + 200]), 32);
  int16_t bsums[16];
  std::memcpy(bsums, q.data() + 260, 32);
  EXPECT_EQ(bsums[0], -127 + 64 + static_cast<int8_t>(q[4 + 7]));
  EXPECT_EQ(bsums[12], 32);
}

TEST(QuantDot, MatVecThreadsAgree) {
  std::mt19937 rng(5);
  std::normal_distribution<float> g(0, 1);
  const size_t n = 512, rows = 37;
  std::vector<float> x(n);
  for (auto& v : x) v = g(rng);
  const auto bytes = RandomBlocks(GgmlType::Q4_K, rows * n / 256, rng);
  auto act = PrepareActivation(GgmlType::Q4_K, x);
  ASSERT_TRUE(act.ok());
  std::vector<float> y1(rows), y4(rows);
  ASSERT_TRUE(MatVec(bytes, rows, *act, y1, 1).ok());
  ASSERT_TRUE(MatVec(bytes, rows, *act, y4, 4).ok());
  EXPECT_EQ(y1, y4);
  auto one = DotRow({bytes.data() + 5 * 144 * 2, 288}, *act);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(*one, y1[5]);
  EXPECT_FALSE(MatVec(bytes, rows + 1, *act, y1).ok());
}

}  // namespace
}  // namespace k3pack::quant

namespace k3pack::quant {
namespace {

TEST(QuantDot, Avx2BuildOfIntegerKernelsMatchesGeneric) {
  if (static_cast<int>(DetectedIsa()) < 1) GTEST_SKIP();
  std::mt19937 rng(21);
  std::normal_distribution<float> g(0, 1);
  for (GgmlType t : {GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K,
                     GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::IQ4_NL, GgmlType::IQ2_XS, GgmlType::IQ2_XXS,
                     GgmlType::IQ3_XXS, GgmlType::MXFP4}) {
    std::vector<float> x(1024);
    for (auto& v : x) v = g(rng);
    const auto row = RandomBlocks(t, 1024 / GgmlTypeInfoFor(t)->block_size, rng);
    auto act = PrepareActivation(t, x);
    ASSERT_TRUE(act.ok());
    const int64_t per = act->act_type == GgmlType::Q8_K ? 256 : 32;
    const float a = internal::IntegerDotForGeneric(t)(row.data(), act->q.data(), 1024 / per);
    const float b = internal::IntegerDotForAvx2(t)(row.data(), act->q.data(), 1024 / per);
    EXPECT_EQ(FloatToBits(a), FloatToBits(b)) << GgmlTypeName(t);
  }
}

}  // namespace
}  // namespace k3pack::quant
