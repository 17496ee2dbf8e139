// Integer dot kernels against the exact dot of the operands they multiply:
// the decoded weight row and the decoded Q8_K / Q8_0 activation, summed in
// double. dot_test.cpp bounds the distance to the float activation (the
// quantization error, ~0.4 % of the magnitude); this bound is thousands of
// times tighter, so one wrong sub-scale, sign or element shows.
//
// Bound. The kernels' integer sums are exact; per block they round the scale
// product, its product with the integer sum and, for the affine types
// (Q2_K/Q4_K/Q5_K), the min product and the subtraction (<= 3 roundings), then
// add into a float running sum (nb - 1 roundings in all). The reference's
// float decode rounds <= 3 times per weight and once per activation. So
//   |dot - ref| <= (nb + 8) * 2^-24 * M,  M = sum_j |a_j| * (|s_j| + |m_j|)
// with s_j the weight's scale-times-quant part and m_j its min part (0 but
// for the affine types): the first-order bound of those roundings.
// Every kernel build runs: the generic one, and on AVX2 CPUs the
// auto-vectorized build and the hand-written IQ kernels. The float dot's
// scalar / AVX2 / AVX-512 builds are held to the plain float-sum bound.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "k3pack/quant.h"
#include "quant/dot_kernels.h"
#include "quant/fp.h"
#include "quant/kernels.h"
#include "quant_test_util.h"

namespace k3pack::quant {
namespace {

const GgmlType kIntegerTypes[] = {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::IQ4_NL, GgmlType::MXFP4,
                                  GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K,
                                  GgmlType::Q6_K, GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ3_XXS};

struct Kernel {
  std::string name;
  internal::IntDotFn fn;
};

std::vector<Kernel> KernelsFor(GgmlType t) {
  std::vector<Kernel> out = {{"generic", internal::IntegerDotForGeneric(t)}};
  if (static_cast<int>(DetectedIsa()) >= static_cast<int>(Isa::kAvx2)) {
    out.push_back({"avx2", internal::IntegerDotForAvx2(t)});
  }
  return out;
}

// Byte offsets of (d, dmin) for the affine types, whose weights are d*sc*q - dmin*m.
bool AffineScales(GgmlType t, size_t* d, size_t* dmin) {
  switch (t) {
    case GgmlType::Q2_K: *d = 80, *dmin = 82; return true;
    case GgmlType::Q4_K: case GgmlType::Q5_K: *d = 0, *dmin = 2; return true;
    default: return false;
  }
}

std::vector<float> Decode(GgmlType t, const std::vector<uint8_t>& bytes, size_t n) {
  std::vector<float> out(n);
  EXPECT_TRUE(DequantizeRow(t, bytes, out, Isa::kScalar).ok());
  return out;
}

// |s_j| + |m_j| per weight: for the affine types from two decodes with dmin
// and with d zeroed (d*sc*q - 0 and 0*q - dmin*m), else |w_j|.
std::vector<double> WeightMagnitudes(GgmlType t, const std::vector<uint8_t>& row, size_t n) {
  std::vector<double> mag(n);
  size_t d_off = 0, dmin_off = 0;
  if (!AffineScales(t, &d_off, &dmin_off)) {
    const auto w = Decode(t, row, n);
    for (size_t j = 0; j < n; ++j) mag[j] = std::fabs(w[j]);
    return mag;
  }
  const size_t size = GgmlTypeInfoFor(t)->type_size;
  auto zeroed = [&](size_t off) {
    std::vector<uint8_t> r = row;
    for (size_t b = 0; b < r.size() / size; ++b) r[b * size + off] = r[b * size + off + 1] = 0;
    return Decode(t, r, n);
  };
  const auto scale_part = zeroed(dmin_off), min_part = zeroed(d_off);
  for (size_t j = 0; j < n; ++j) mag[j] = std::fabs(scale_part[j]) + std::fabs(min_part[j]);
  return mag;
}

// Checks every kernel build (and DotRow's choice) on one (row, x) pair.
void ExpectExact(GgmlType t, const std::vector<uint8_t>& row, const std::vector<float>& x, const std::string& what) {
  const size_t n = x.size();
  auto act = PrepareActivation(t, x);
  ASSERT_TRUE(act.ok()) << act.error().message();
  const auto w = Decode(t, row, n);
  const auto a = Decode(act->act_type, act->q, n);
  const auto mag = WeightMagnitudes(t, row, n);
  double ref = 0, m = 0;
  for (size_t j = 0; j < n; ++j) {
    ref += static_cast<double>(w[j]) * a[j];
    m += std::fabs(static_cast<double>(a[j])) * mag[j];
  }
  const int64_t per = act->act_type == GgmlType::Q8_K ? 256 : 32;
  const int64_t nb = static_cast<int64_t>(n) / per;
  const double tol = static_cast<double>(nb + 8) * std::ldexp(1.0, -24) * m;
  for (const Kernel& k : KernelsFor(t)) {
    ASSERT_NE(k.fn, nullptr) << GgmlTypeName(t) << " " << k.name;
    const float got = k.fn(row.data(), act->q.data(), nb);
    EXPECT_NEAR(got, ref, tol) << GgmlTypeName(t) << " " << k.name << " " << what << " (M = " << m << ")";
  }
  auto dispatched = DotRow(row, *act);  // the kernel DotRow picks is one of the above
  ASSERT_TRUE(dispatched.ok());
  EXPECT_NEAR(*dispatched, ref, tol) << GgmlTypeName(t) << " DotRow " << what;
}

TEST(QuantDotExact, RandomRowsEveryKernelBuild) {
  std::mt19937 rng(515);
  std::normal_distribution<float> g(0, 1);
  const size_t n = 3072;  // Kimi-K3's moe_intermediate_size: 12 Q8_K or 96 Q8_0 blocks
  for (GgmlType t : kIntegerTypes) {
    for (int trial = 0; trial < 6; ++trial) {
      std::vector<float> x(n);
      for (size_t j = 0; j < n; ++j) {
        x[j] = g(rng);
        if (trial % 2 == 1 && j % 97 == 0) x[j] *= 1000.0f;  // outliers: most of a block quantizes to 0
      }
      const GgmlTypeInfo* info = GgmlTypeInfoFor(t);
      ExpectExact(t, RandomBlocks(t, n / info->block_size, rng), x, "trial " + std::to_string(trial));
    }
  }
}

// Every quant code at its extreme (all quant and sub-scale bytes 0x00, 0xFF,
// 0x80, 0x7F or alternating bits; fp16 scales 1.0, MXFP4's 2^-1) against
// activations quantized to +-127 with products of one sign or alternating:
// the largest integer sums the kernels can meet, so an int16/int32 overflow
// (maddubs-style saturation included) would show as a gross miss.
TEST(QuantDotExact, ExtremeCodesAndFullScaleActivations) {
  const size_t n = 1024;
  for (GgmlType t : kIntegerTypes) {
    const GgmlTypeInfo* info = GgmlTypeInfoFor(t);
    for (int fill : {0x00, 0xFF, 0x80, 0x7F, 0x55, 0xAA}) {
      std::vector<uint8_t> row(n / info->block_size * info->type_size, static_cast<uint8_t>(fill));
      for (size_t b = 0; b < row.size(); b += info->type_size) {
        for (size_t off : HalfScaleOffsets(t)) row[b + off] = 0x00, row[b + off + 1] = 0x3C;  // 1.0
        if (t == GgmlType::MXFP4) row[b] = 127;
      }
      for (int pattern = 0; pattern < 3; ++pattern) {
        std::vector<float> x(n);
        for (size_t j = 0; j < n; ++j) {
          x[j] = pattern == 0 ? 3.0f : pattern == 1 ? -3.0f : (j % 2 ? 3.0f : -3.0f);  // all at the block max
        }
        ExpectExact(t, row, x, "fill " + std::to_string(fill) + " pattern " + std::to_string(pattern));
      }
    }
  }
}

// The float dots (decoded rows and F32 weights) on every build the CPU has:
// each is a sum of n products in float, in lanes or not, so within the
// sequential worst case (n + 2) 2^-24 sum |a_j b_j| of the double dot; the
// lengths cover the SIMD main loops' multiples and their scalar tails.
TEST(QuantDotExact, FloatDotEveryBuild) {
  std::mt19937 rng(517);
  std::normal_distribution<float> g(0, 1);
  struct Impl {
    const char* name;
    float (*fn)(const float*, const float*, int64_t);
    Isa needs;
  };
  const Impl impls[] = {{"scalar", internal::DotF32Scalar, Isa::kScalar},
                        {"avx2", internal::DotF32Avx2, Isa::kAvx2},
                        {"avx512", internal::DotF32Avx512, Isa::kAvx512}};
  for (size_t n : {size_t{1}, size_t{7}, size_t{16}, size_t{37}, size_t{1000}, size_t{4099}}) {
    std::vector<float> a(n), b(n);
    for (size_t j = 0; j < n; ++j) a[j] = g(rng), b[j] = g(rng) * (j % 5 == 0 ? 100.0f : 1.0f);
    double ref = 0, m = 0;
    for (size_t j = 0; j < n; ++j) {
      ref += static_cast<double>(a[j]) * b[j];
      m += std::fabs(static_cast<double>(a[j]) * b[j]);
    }
    for (const Impl& impl : impls) {
      if (static_cast<int>(DetectedIsa()) < static_cast<int>(impl.needs)) continue;
      const float got = impl.fn(a.data(), b.data(), static_cast<int64_t>(n));
      EXPECT_NEAR(got, ref, static_cast<double>(n + 2) * std::ldexp(1.0, -24) * m) << impl.name << " n " << n;
    }
  }
}

}  // namespace
}  // namespace k3pack::quant
