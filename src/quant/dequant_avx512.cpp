// AVX-512 decoders (16 floats per instruction) for the widest-traffic types.
// Same float operations and order as the scalar reference, so identical bits.
// Types missing here fall back to the AVX2 table.
// GCC 12 reports false "uninitialized" warnings inside the AVX-512 intrinsic
// headers when they are used from target-attributed functions.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <immintrin.h>

#include "quant/fp.h"
#include "quant/kernels.h"

#define K3_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

namespace k3pack::quant::internal {
namespace {

// fp16 scale -> float with F16C (bit-identical to Fp16ToFp32, branch-free).
K3_AVX512 inline float HalfAt(const uint8_t* p) { return _cvtsh_ss(LoadU16(p)); }

// Plain conversions are bound by memory traffic: four vectors per iteration.
K3_AVX512 void DqF16(const uint8_t* s, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    for (int k = 0; k < 4; ++k) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 2 * (i + 16 * k)));
      _mm512_storeu_ps(y + i + 16 * k, _mm512_cvtph_ps(h));
    }
  }
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 2 * i));
    _mm512_storeu_ps(y + i, _mm512_cvtph_ps(h));
  }
  for (; i < n; ++i) y[i] = LoadHalf(s + 2 * i);
}

K3_AVX512 inline __m512 Bf16x16(const uint8_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

K3_AVX512 void DqBf16(const uint8_t* s, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m512 a = Bf16x16(s + 2 * i), b = Bf16x16(s + 2 * i + 32);
    const __m512 c = Bf16x16(s + 2 * i + 64), d = Bf16x16(s + 2 * i + 96);
    _mm512_storeu_ps(y + i, a);
    _mm512_storeu_ps(y + i + 16, b);
    _mm512_storeu_ps(y + i + 32, c);
    _mm512_storeu_ps(y + i + 48, d);
  }
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, Bf16x16(s + 2 * i));
  for (; i < n; ++i) y[i] = Bf16ToFp32(LoadU16(s + 2 * i));
}

K3_AVX512 inline __m512 I8x16ToPs(__m128i b) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)); }
K3_AVX512 inline __m512 U8x16ToPs(__m128i b) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)); }

K3_AVX512 void DqQ8_0(const uint8_t* s, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, s += 34, y += 32) {
    const __m512 d = _mm512_set1_ps(HalfAt(s));
    const __m128i b0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 2));
    const __m128i b1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 18));
    _mm512_storeu_ps(y, _mm512_mul_ps(I8x16ToPs(b0), d));
    _mm512_storeu_ps(y + 16, _mm512_mul_ps(I8x16ToPs(b1), d));
  }
}

K3_AVX512 inline void ScaleMinK4(int j, const uint8_t* q, int* d, int* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

K3_AVX512 void DqQ4K(const uint8_t* s, float* y, int64_t nb) {
  const __m128i m4 = _mm_set1_epi8(0x0F);
  for (int64_t i = 0; i < nb; ++i, s += 144) {
    const float d = HalfAt(s);
    const float dmin = HalfAt(s + 2);
    const uint8_t* q = s + 16;
    for (int c = 0; c < 4; ++c, q += 32, y += 64) {
      int sc, m;
      ScaleMinK4(2 * c, s + 4, &sc, &m);
      const __m512 d1 = _mm512_set1_ps(d * sc), m1 = _mm512_set1_ps(dmin * m);
      ScaleMinK4(2 * c + 1, s + 4, &sc, &m);
      const __m512 d2 = _mm512_set1_ps(d * sc), m2 = _mm512_set1_ps(dmin * m);
      for (int h = 0; h < 2; ++h) {
        const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16 * h));
        const __m512 lo = U8x16ToPs(_mm_and_si128(b, m4));
        const __m512 hi = U8x16ToPs(_mm_and_si128(_mm_srli_epi16(b, 4), m4));
        _mm512_storeu_ps(y + 16 * h, _mm512_sub_ps(_mm512_mul_ps(d1, lo), m1));
        _mm512_storeu_ps(y + 32 + 16 * h, _mm512_sub_ps(_mm512_mul_ps(d2, hi), m2));
      }
    }
  }
}

K3_AVX512 void DqQ6K(const uint8_t* s, float* y, int64_t nb) {
  const __m128i m4 = _mm_set1_epi8(0x0F), m3 = _mm_set1_epi8(3), c32 = _mm_set1_epi8(32);
  for (int64_t i = 0; i < nb; ++i, s += 210) {
    const float d = HalfAt(s + 208);
    const uint8_t* ql = s;
    const uint8_t* qh = s + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(s + 192);
    for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int is = 0; is < 2; ++is) {  // l = 16*is .. 16*is+15
        const __m128i l0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(ql + 16 * is));
        const __m128i l1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(ql + 32 + 16 * is));
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qh + 16 * is));
        __m128i q[4];
        q[0] = _mm_or_si128(_mm_and_si128(l0, m4), _mm_slli_epi16(_mm_and_si128(h, m3), 4));
        q[1] = _mm_or_si128(_mm_and_si128(l1, m4), _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(h, 2), m3), 4));
        q[2] = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(l0, 4), m4),
                            _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(h, 4), m3), 4));
        q[3] = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(l1, 4), m4),
                            _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(h, 6), m3), 4));
        for (int k = 0; k < 4; ++k) {
          const __m512 ds = _mm512_set1_ps(d * sc[is + 2 * k]);
          _mm512_storeu_ps(y + 32 * k + 16 * is, _mm512_mul_ps(ds, I8x16ToPs(_mm_sub_epi8(q[k], c32))));
        }
      }
    }
  }
}

}  // namespace

float DotF32Avx512(const float* a, const float* b, int64_t n) __attribute__((target("avx512f,fma")));
float DotF32Avx512(const float* a, const float* b, int64_t n) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
  }
  float r = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

const DequantTable& Avx512Table() {
  static const DequantTable table = [] {
    DequantTable t;
    auto set = [&](GgmlType type, DequantFn f) { t.fn[static_cast<uint32_t>(type)] = f; };
    set(GgmlType::F16, DqF16);
    set(GgmlType::BF16, DqBf16);
    set(GgmlType::Q8_0, DqQ8_0);
    set(GgmlType::Q4_K, DqQ4K);
    set(GgmlType::Q6_K, DqQ6K);
    return t;
  }();
  return table;
}

}  // namespace k3pack::quant::internal
