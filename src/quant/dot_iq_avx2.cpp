// Hand-written AVX2 integer dots for the IQ2_XXS / IQ2_XS / IQ3_XXS expert
// types. Per 32 elements: four grid words form 32 unsigned bytes, the sign
// bits flip the activation bytes (_mm256_sign_epi8), and maddubs + madd give
// the exact int32 sum. The integer sums equal the generic kernels' and the
// float steps are the same, so results are identical (tested).
#include <immintrin.h>

#include <cstring>

#include "quant/dot_kernels.h"
#include "quant/fp.h"
#include "quant/iq_tables.h"

#define K3_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace k3pack::quant::internal {
namespace {

// +1 / -1 bytes: byte k takes bit (k % 8) of signs[k / 8].
K3_AVX2 inline __m256i SignBytes(uint8_t s0, uint8_t s1, uint8_t s2, uint8_t s3) {
  // Unsigned multiply: the byte broadcast must wrap, and signed overflow would be UB.
  auto spread = [](uint8_t s) { return static_cast<long long>(0x0101010101010101ULL * s); };
  const __m256i bytes = _mm256_set_epi64x(spread(s3), spread(s2), spread(s1), spread(s0));
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
  return _mm256_or_si256(set, _mm256_set1_epi8(1));
}

// Sum over 32 bytes of grid[k] * sign[k] * q8[k].
K3_AVX2 inline int Dot32(__m256i grid, __m256i sign, const int8_t* q8) {
  const __m256i q = _mm256_sign_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8)), sign);
  const __m256i p16 = _mm256_maddubs_epi16(grid, q);  // grid <= 62, |q| <= 127: no saturation
  const __m256i p32 = _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(p32), _mm256_extracti128_si256(p32, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

K3_AVX2 inline long long G(uint64_t v) { return static_cast<long long>(v); }

K3_AVX2 float DotIq2XxsAvx2(const uint8_t* w, const uint8_t* a, int64_t nb) {
  const auto& grid = tables::kIq2xxsGrid;
  const uint8_t* ks = tables::kKsignsIq2xs;
  float sumf = 0;
  for (int64_t i = 0; i < nb; ++i, w += 66, a += kQ8KBytes) {
    float yd;
    std::memcpy(&yd, a, 4);
    const int8_t* q8 = reinterpret_cast<const int8_t*>(a + 4);
    int bsum = 0;
    for (int ib = 0; ib < 8; ++ib, q8 += 32) {
      const uint32_t a0 = LoadU32(w + 2 + 8 * ib), a1 = LoadU32(w + 6 + 8 * ib);
      const __m256i g = _mm256_set_epi64x(G(grid[a0 >> 24]), G(grid[(a0 >> 16) & 0xFF]), G(grid[(a0 >> 8) & 0xFF]),
                                          G(grid[a0 & 0xFF]));
      const __m256i s = SignBytes(ks[a1 & 127], ks[(a1 >> 7) & 127], ks[(a1 >> 14) & 127], ks[(a1 >> 21) & 127]);
      bsum += Dot32(g, s, q8) * (2 * static_cast<int>(a1 >> 28) + 1);
    }
    sumf += (LoadHalf(w) * yd) * bsum;
  }
  return 0.125f * sumf;
}

K3_AVX2 float DotIq2XsAvx2(const uint8_t* w, const uint8_t* a, int64_t nb) {
  const auto& grid = tables::kIq2xsGrid;
  const uint8_t* ks = tables::kKsignsIq2xs;
  float sumf = 0;
  for (int64_t i = 0; i < nb; ++i, w += 74, a += kQ8KBytes) {
    float yd;
    std::memcpy(&yd, a, 4);
    const int8_t* q8 = reinterpret_cast<const int8_t*>(a + 4);
    int bsum = 0;
    for (int ib = 0; ib < 8; ++ib, q8 += 32) {
      uint16_t v[4];
      for (int l = 0; l < 4; ++l) v[l] = LoadU16(w + 2 + 2 * (4 * ib + l));
      const int ls1 = 2 * (w[66 + ib] & 0xF) + 1, ls2 = 2 * (w[66 + ib] >> 4) + 1;
      // Two 16-byte halves have different scales: zero the other half's signs.
      const __m256i g = _mm256_set_epi64x(G(grid[v[3] & 511]), G(grid[v[2] & 511]), G(grid[v[1] & 511]),
                                          G(grid[v[0] & 511]));
      const __m256i s = SignBytes(ks[v[0] >> 9], ks[v[1] >> 9], ks[v[2] >> 9], ks[v[3] >> 9]);
      const __m256i lo = _mm256_set_epi64x(0, 0, -1, -1);
      const int s1 = Dot32(g, _mm256_and_si256(s, lo), q8);
      const int s2 = Dot32(g, _mm256_andnot_si256(lo, s), q8);
      bsum += s1 * ls1 + s2 * ls2;
    }
    sumf += (LoadHalf(w) * yd) * bsum;
  }
  return 0.125f * sumf;
}

K3_AVX2 float DotIq3XxsAvx2(const uint8_t* w, const uint8_t* a, int64_t nb) {
  const auto& grid = tables::kIq3xxsGrid;
  const uint8_t* ks = tables::kKsignsIq2xs;
  float sumf = 0;
  for (int64_t i = 0; i < nb; ++i, w += 98, a += kQ8KBytes) {
    float yd;
    std::memcpy(&yd, a, 4);
    const int8_t* q8 = reinterpret_cast<const int8_t*>(a + 4);
    const uint8_t* qs = w + 2;
    int bsum = 0;
    for (int ib = 0; ib < 8; ++ib, qs += 8, q8 += 32) {
      const uint32_t aux = LoadU32(w + 66 + 4 * ib);
      const __m256i g = _mm256_setr_epi32(static_cast<int>(grid[qs[0]]), static_cast<int>(grid[qs[1]]),
                                          static_cast<int>(grid[qs[2]]), static_cast<int>(grid[qs[3]]),
                                          static_cast<int>(grid[qs[4]]), static_cast<int>(grid[qs[5]]),
                                          static_cast<int>(grid[qs[6]]), static_cast<int>(grid[qs[7]]));
      const __m256i s = SignBytes(ks[aux & 127], ks[(aux >> 7) & 127], ks[(aux >> 14) & 127], ks[(aux >> 21) & 127]);
      bsum += Dot32(g, s, q8) * (2 * static_cast<int>(aux >> 28) + 1);
    }
    sumf += (LoadHalf(w) * yd) * bsum;
  }
  return 0.25f * sumf;
}

}  // namespace

IntDotFn IqDotAvx2(GgmlType weight) {
  switch (weight) {
    case GgmlType::IQ2_XXS: return DotIq2XxsAvx2;
    case GgmlType::IQ2_XS: return DotIq2XsAvx2;
    case GgmlType::IQ3_XXS: return DotIq3XxsAvx2;
    default: return nullptr;
  }
}

}  // namespace k3pack::quant::internal
