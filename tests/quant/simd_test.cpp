// Every code path gives the scalar reference's exact bits, over random blocks
// of every decodable type (scale fields forced finite), plus exhaustive checks
// of the scalar number conversions against the hardware.
#include <gtest/gtest.h>

#include <immintrin.h>

#include <cstring>
#include <random>
#include <vector>

#include "k3pack/quant.h"
#include "quant/fp.h"
#include "quant_test_util.h"

namespace k3pack::quant {
namespace {

std::vector<GgmlType> AllDecodable() {
  std::vector<GgmlType> out;
  for (uint32_t id = 0; id < kGgmlTypeCount; ++id) {
    if (IsValidGgmlType(id) && CanDequantize(static_cast<GgmlType>(id))) out.push_back(static_cast<GgmlType>(id));
  }
  return out;
}

TEST(QuantSimd, EveryStorageTypeIsDecodable) {
  const char* names[] = {"F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64", "Q4_0", "Q4_1", "Q5_0",
                         "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS",
                         "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "IQ4_NL", "IQ4_XS",
                         "TQ1_0", "TQ2_0", "MXFP4", "NVFP4", "Q1_0", "Q2_0"};
  for (const char* n : names) {
    auto t = GgmlTypeFromName(n);
    ASSERT_TRUE(t.has_value()) << n;
    EXPECT_TRUE(CanDequantize(*t)) << n;
  }
  EXPECT_FALSE(CanDequantize(GgmlType::Q8_1));
  EXPECT_EQ(AllDecodable().size(), std::size(names));
}

TEST(QuantSimd, AllPathsMatchScalarBitsOnRandomBlocks) {
  std::mt19937 rng(1234);
  std::vector<Isa> paths;
  if (static_cast<int>(DetectedIsa()) >= 1) paths.push_back(Isa::kAvx2);
  if (static_cast<int>(DetectedIsa()) >= 2) paths.push_back(Isa::kAvx512);
  if (paths.empty()) GTEST_SKIP() << "CPU has no SIMD path";
  for (GgmlType t : AllDecodable()) {
    const GgmlTypeInfo* info = GgmlTypeInfoFor(t);
    // An odd element count exercises the tails of the per-element types.
    const size_t nblocks = info->block_size == 1 ? 1037 : 61;
    const size_t n = nblocks * info->block_size;
    std::vector<uint8_t> src(nblocks * info->type_size);
    for (auto& x : src) x = static_cast<uint8_t>(rng());
    for (size_t i = 0; i < nblocks && info->block_size > 1; ++i) Sanitize(t, &src[i * info->type_size], rng);
    std::vector<float> ref(n), got(n);
    ASSERT_TRUE(DequantizeRow(t, src, ref, Isa::kScalar).ok());
    for (Isa isa : paths) {
      std::fill(got.begin(), got.end(), -7.0f);
      ASSERT_TRUE(DequantizeRow(t, src, got, isa).ok());
      size_t bad = 0;
      for (size_t i = 0; i < n; ++i) bad += FloatToBits(ref[i]) != FloatToBits(got[i]);
      EXPECT_EQ(bad, 0u) << GgmlTypeName(t) << " on " << IsaName(isa)
                         << (HasKernel(t, isa) ? " (own kernel)" : " (fallback)");
    }
  }
}

// The same with every scale field left random and one block in four given a
// NaN or Inf scale: invalid blocks (NaN payloads and signs included) decode
// to the scalar reference's bits on every path too.
TEST(QuantSimd, AllPathsMatchScalarBitsWithNonFiniteScales) {
  std::mt19937 rng(4321);
  std::vector<Isa> paths;
  if (static_cast<int>(DetectedIsa()) >= 1) paths.push_back(Isa::kAvx2);
  if (static_cast<int>(DetectedIsa()) >= 2) paths.push_back(Isa::kAvx512);
  if (paths.empty()) GTEST_SKIP() << "CPU has no SIMD path";
  const uint16_t specials[] = {0x7C00, 0xFC00, 0x7E01, 0xFD55, 0x7C01, 0x0000, 0x8000};
  for (GgmlType t : AllDecodable()) {
    const GgmlTypeInfo* info = GgmlTypeInfoFor(t);
    const size_t nblocks = info->block_size == 1 ? 1037 : 64;
    const size_t n = nblocks * info->block_size;
    std::vector<uint8_t> src(nblocks * info->type_size);
    for (auto& x : src) x = static_cast<uint8_t>(rng());
    if (info->block_size > 1) {
      for (size_t i = 0; i < nblocks; i += 4) {  // first two bytes: the fp16 d of most block types
        const uint16_t h = specials[(i / 4) % std::size(specials)];
        std::memcpy(&src[i * info->type_size], &h, 2);
      }
    }
    std::vector<float> ref(n), got(n);
    ASSERT_TRUE(DequantizeRow(t, src, ref, Isa::kScalar).ok());
    for (Isa isa : paths) {
      ASSERT_TRUE(DequantizeRow(t, src, got, isa).ok());
      size_t bad = 0;
      for (size_t i = 0; i < n; ++i) bad += FloatToBits(ref[i]) != FloatToBits(got[i]);
      EXPECT_EQ(bad, 0u) << GgmlTypeName(t) << " on " << IsaName(isa);
    }
  }
}

// DequantizeParallel: any thread count gives the single-call bits, for block
// counts that do not divide evenly.
TEST(QuantSimd, ParallelMatchesOneCall) {
  std::mt19937 rng(99);
  for (GgmlType t : {GgmlType::BF16, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::IQ2_XS}) {
    const GgmlTypeInfo* info = GgmlTypeInfoFor(t);
    const size_t nblocks = (size_t{3} << 20) / info->block_size + 7;  // a few 1 MiB pieces plus a remainder
    const size_t n = nblocks * info->block_size;
    std::vector<uint8_t> src = RandomBlocks(t, nblocks, rng);
    std::vector<float> ref(n), got(n);
    ASSERT_TRUE(DequantizeRow(t, src, ref).ok());
    for (int threads : {0, 1, 2, 3, 5, 64}) {
      std::fill(got.begin(), got.end(), -7.0f);
      ASSERT_TRUE(DequantizeParallel(t, src, got, threads).ok());
      EXPECT_EQ(std::memcmp(ref.data(), got.data(), n * 4), 0) << GgmlTypeName(t) << " threads " << threads;
    }
  }
  std::vector<float> small(64);
  std::vector<uint8_t> few(10);
  EXPECT_FALSE(DequantizeParallel(GgmlType::Q8_0, few, small, 4).ok());  // too few bytes
}

TEST(QuantSimd, KernelCoverageOfHotTypes) {
  if (static_cast<int>(DetectedIsa()) < 1) GTEST_SKIP();
  for (GgmlType t : {GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K,
                     GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::IQ2_XS, GgmlType::IQ2_XXS, GgmlType::IQ3_XXS}) {
    EXPECT_TRUE(HasKernel(t, Isa::kAvx2)) << GgmlTypeName(t);
  }
}

__attribute__((target("f16c"))) float HwHalf(uint16_t h) { return _cvtsh_ss(h); }

TEST(QuantSimd, Fp16ToFp32ExhaustiveAgainstF16c) {
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP();
  for (uint32_t h = 0; h < 65536; ++h) {
    ASSERT_EQ(FloatToBits(Fp16ToFp32(static_cast<uint16_t>(h))), FloatToBits(HwHalf(static_cast<uint16_t>(h))))
        << std::hex << h;
  }
}

__attribute__((target("f16c"))) uint16_t HwToHalf(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}

TEST(QuantSimd, Fp32ToFp16RoundsLikeF16c) {
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP();
  std::mt19937 rng(7);
  for (int i = 0; i < 2000000; ++i) {
    uint32_t bits = rng();
    if (i % 2) bits = (bits & 0x8FFFFFFFu) | 0x30000000u;  // concentrate near the fp16 range
    const float f = BitsToFloat(bits);
    if (f != f) continue;
    ASSERT_EQ(Fp32ToFp16(f), HwToHalf(f)) << std::hex << bits;
  }
}

}  // namespace
}  // namespace k3pack::quant
