// AVX2 decoders for the hot types. Each performs the same float operations as
// the scalar reference in the same order (multiplies and subtracts as separate
// instructions, no FMA), so the output bits are identical; tests compare them
// over random blocks. Functions carry target attributes so the rest of the
// build stays generic; they run only after the CPU check in dequant.cpp.
#include <immintrin.h>

#include <cstring>

#include "quant/fp.h"
#include "quant/iq_tables.h"
#include "quant/kernels.h"

#define K3_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace k3pack::quant::internal {
namespace {

K3_AVX2 inline __m256 U8x8ToPs(const uint8_t* p) {
  __m128i b;
  uint64_t v;
  std::memcpy(&v, p, 8);
  b = _mm_cvtsi64_si128(static_cast<long long>(v));
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
}
K3_AVX2 inline __m256 I8x8ToPs(__m128i b) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)); }

// Sign-bit mask per lane from the 8 bits of `signs` (bit j set = flip lane
// j), xor-ed into the product as the scalar reference does (see
// dequant_scalar_iq.cpp for why a flip and not a multiply by -1).
K3_AVX2 inline __m256 SignMask(uint8_t signs) {
  const __m256i bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256i hit = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(signs), bits), bits);
  return _mm256_castsi256_ps(_mm256_and_si256(hit, _mm256_set1_epi32(static_cast<int>(0x80000000u))));
}

// fp16 scale -> float with F16C; the same bits as Fp16ToFp32 for every input
// (QuantSimd.Fp16ToFp32ExhaustiveAgainstF16c) and branch-free.
K3_AVX2 inline float HalfAt(const uint8_t* p) { return _cvtsh_ss(LoadU16(p)); }

// The plain conversions are bound by memory traffic: four vectors per
// iteration keep enough loads and stores in flight.
K3_AVX2 void DqF16(const uint8_t* s, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int k = 0; k < 4; ++k) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 2 * (i + 8 * k)));
      _mm256_storeu_ps(y + i + 8 * k, _mm256_cvtph_ps(h));
    }
  }
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 2 * i));
    _mm256_storeu_ps(y + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) y[i] = LoadHalf(s + 2 * i);
}

K3_AVX2 inline __m256 Bf16x8(const uint8_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

K3_AVX2 void DqBf16(const uint8_t* s, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256 a = Bf16x8(s + 2 * i), b = Bf16x8(s + 2 * i + 16);
    const __m256 c = Bf16x8(s + 2 * i + 32), d = Bf16x8(s + 2 * i + 48);
    _mm256_storeu_ps(y + i, a);
    _mm256_storeu_ps(y + i + 8, b);
    _mm256_storeu_ps(y + i + 16, c);
    _mm256_storeu_ps(y + i + 24, d);
  }
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, Bf16x8(s + 2 * i));
  for (; i < n; ++i) y[i] = Bf16ToFp32(LoadU16(s + 2 * i));
}

K3_AVX2 void DqQ8_0(const uint8_t* s, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, s += 34, y += 32) {
    const __m256 d = _mm256_set1_ps(HalfAt(s));
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 2));
    const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    _mm256_storeu_ps(y + 0, _mm256_mul_ps(I8x8ToPs(lo), d));
    _mm256_storeu_ps(y + 8, _mm256_mul_ps(I8x8ToPs(_mm_srli_si128(lo, 8)), d));
    _mm256_storeu_ps(y + 16, _mm256_mul_ps(I8x8ToPs(hi), d));
    _mm256_storeu_ps(y + 24, _mm256_mul_ps(I8x8ToPs(_mm_srli_si128(hi, 8)), d));
  }
}

K3_AVX2 void DqQ4_0(const uint8_t* s, float* y, int64_t nb) {
  const __m128i m4 = _mm_set1_epi8(0x0F);
  const __m128i eight = _mm_set1_epi8(8);
  for (int64_t i = 0; i < nb; ++i, s += 18, y += 32) {
    const __m256 d = _mm256_set1_ps(HalfAt(s));
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 2));
    const __m128i lo = _mm_sub_epi8(_mm_and_si128(q, m4), eight);
    const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(q, 4), m4), eight);
    _mm256_storeu_ps(y + 0, _mm256_mul_ps(I8x8ToPs(lo), d));
    _mm256_storeu_ps(y + 8, _mm256_mul_ps(I8x8ToPs(_mm_srli_si128(lo, 8)), d));
    _mm256_storeu_ps(y + 16, _mm256_mul_ps(I8x8ToPs(hi), d));
    _mm256_storeu_ps(y + 24, _mm256_mul_ps(I8x8ToPs(_mm_srli_si128(hi, 8)), d));
  }
}

// 16 bytes -> 16 floats of ((b >> shift) & 3), stored as dl*q - ml.
K3_AVX2 inline void Q2Group(const uint8_t* q, int shift, float dl, float ml, float* y) {
  const __m128i b = _mm_and_si128(_mm_srl_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)),
                                                _mm_cvtsi32_si128(shift)),
                                  _mm_set1_epi8(3));
  const __m256 vdl = _mm256_set1_ps(dl), vml = _mm256_set1_ps(ml);
  const __m256 f0 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b));
  const __m256 f1 = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(b, 8)));
  _mm256_storeu_ps(y, _mm256_sub_ps(_mm256_mul_ps(vdl, f0), vml));
  _mm256_storeu_ps(y + 8, _mm256_sub_ps(_mm256_mul_ps(vdl, f1), vml));
}

K3_AVX2 void DqQ2K(const uint8_t* s, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, s += 84) {
    const float d = HalfAt(s + 80);
    const float dmin = HalfAt(s + 82);
    const uint8_t* q = s + 16;
    int is = 0;
    for (int half = 0; half < 2; ++half, q += 32) {
      for (int j = 0; j < 4; ++j) {
        for (int g = 0; g < 2; ++g, y += 16) {
          const uint8_t sc = s[is++];
          Q2Group(q + 16 * g, 2 * j, d * (sc & 0xF), dmin * (sc >> 4), y);
        }
      }
    }
  }
}

K3_AVX2 void DqQ3K(const uint8_t* s, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, s += 110) {
    const uint8_t* hm = s;
    const uint8_t* q = s + 32;
    const uint8_t* b = s + 96;
    const float d_all = HalfAt(s + 108);
    int is = 0;
    int bit = 0;
    for (int half = 0; half < 2; ++half, q += 32) {
      for (int j = 0; j < 4; ++j, ++bit) {
        const __m128i mbit = _mm_set1_epi8(static_cast<char>(1 << bit));
        for (int g = 0; g < 2; ++g, y += 16) {
          const int i16 = is++;
          const int low4 = i16 < 8 ? (b[i16] & 0xF) : (b[i16 - 8] >> 4);
          const int high2 = (b[8 + (i16 % 4)] >> (2 * (i16 / 4))) & 3;
          const float dl = d_all * ((low4 | (high2 << 4)) - 32);
          const __m128i qv = _mm_and_si128(
              _mm_srl_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16 * g)), _mm_cvtsi32_si128(2 * j)),
              _mm_set1_epi8(3));
          const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(hm + 16 * g));
          const __m128i nohi = _mm_cmpeq_epi8(_mm_and_si128(h, mbit), _mm_setzero_si128());  // 0xFF where bit clear
          const __m128i v = _mm_sub_epi8(qv, _mm_and_si128(nohi, _mm_set1_epi8(4)));
          const __m256 vdl = _mm256_set1_ps(dl);
          _mm256_storeu_ps(y, _mm256_mul_ps(vdl, I8x8ToPs(v)));
          _mm256_storeu_ps(y + 8, _mm256_mul_ps(vdl, I8x8ToPs(_mm_srli_si128(v, 8))));
        }
      }
    }
  }
}

K3_AVX2 inline void ScaleMinK4(int j, const uint8_t* q, int* d, int* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// 32 values (as uint8 in a 256-bit register) -> dl*q - ml, 32 floats.
K3_AVX2 inline void Store32Affine(__m256i q8, __m256 vd, __m256 vm, float* y) {
  const __m128i lo = _mm256_castsi256_si128(q8), hi = _mm256_extracti128_si256(q8, 1);
  const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
  for (int k = 0; k < 4; ++k) {
    const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[k]));
    _mm256_storeu_ps(y + 8 * k, _mm256_sub_ps(_mm256_mul_ps(vd, f), vm));
  }
}

K3_AVX2 void DqQ4K(const uint8_t* s, float* y, int64_t nb) {
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  for (int64_t i = 0; i < nb; ++i, s += 144) {
    const float d = HalfAt(s);
    const float dmin = HalfAt(s + 2);
    const uint8_t* q = s + 16;
    for (int c = 0; c < 4; ++c, q += 32, y += 64) {
      int sc, m;
      ScaleMinK4(2 * c, s + 4, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      ScaleMinK4(2 * c + 1, s + 4, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
      Store32Affine(_mm256_and_si256(qv, m4), _mm256_set1_ps(d1), _mm256_set1_ps(m1), y);
      Store32Affine(_mm256_and_si256(_mm256_srli_epi16(qv, 4), m4), _mm256_set1_ps(d2), _mm256_set1_ps(m2), y + 32);
    }
  }
}

K3_AVX2 void DqQ6K(const uint8_t* s, float* y, int64_t nb) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3), c32 = _mm256_set1_epi8(32);
  for (int64_t i = 0; i < nb; ++i, s += 210) {
    const float d = HalfAt(s + 208);
    const uint8_t* ql = s;
    const uint8_t* qh = s + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(s + 192);
    for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
      const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
      const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh));
      __m256i qs[4];
      qs[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(h, m3), 4));
      qs[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                              _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m3), 4));
      qs[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                              _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m3), 4));
      qs[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                              _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m3), 4));
      for (int k = 0; k < 4; ++k) {
        const __m256i v = _mm256_sub_epi8(qs[k], c32);  // -32..31 as int8
        const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
        const __m256 ds0 = _mm256_set1_ps(d * sc[2 * k]);      // elements l = 0..15
        const __m256 ds1 = _mm256_set1_ps(d * sc[2 * k + 1]);  // elements l = 16..31
        float* yo = y + 32 * k;
        _mm256_storeu_ps(yo + 0, _mm256_mul_ps(ds0, I8x8ToPs(lo)));
        _mm256_storeu_ps(yo + 8, _mm256_mul_ps(ds0, I8x8ToPs(_mm_srli_si128(lo, 8))));
        _mm256_storeu_ps(yo + 16, _mm256_mul_ps(ds1, I8x8ToPs(hi)));
        _mm256_storeu_ps(yo + 24, _mm256_mul_ps(ds1, I8x8ToPs(_mm_srli_si128(hi, 8))));
      }
    }
  }
}

K3_AVX2 void DqIq2Xxs(const uint8_t* s, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, s += 66) {
    const float d = HalfAt(s);
    for (int ib = 0; ib < 8; ++ib) {
      const uint32_t a0 = LoadU32(s + 2 + 8 * ib);
      const uint32_t a1 = LoadU32(s + 6 + 8 * ib);
      const __m256 db = _mm256_set1_ps(d * (0.5f + (a1 >> 28)) * 0.25f);
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint8_t* g = reinterpret_cast<const uint8_t*>(&tables::kIq2xxsGrid[(a0 >> (8 * l)) & 0xFF]);
        const uint8_t signs = tables::kKsignsIq2xs[(a1 >> (7 * l)) & 127];
        _mm256_storeu_ps(y, _mm256_xor_ps(_mm256_mul_ps(db, U8x8ToPs(g)), SignMask(signs)));
      }
    }
  }
}

K3_AVX2 void DqIq2Xs(const uint8_t* s, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, s += 74) {
    const float d = HalfAt(s);
    const uint8_t* scales = s + 66;
    for (int ib = 0; ib < 8; ++ib) {
      const __m256 db0 = _mm256_set1_ps(d * (0.5f + (scales[ib] & 0xf)) * 0.25f);
      const __m256 db1 = _mm256_set1_ps(d * (0.5f + (scales[ib] >> 4)) * 0.25f);
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint16_t w = LoadU16(s + 2 + 2 * (4 * ib + l));
        const uint8_t* g = reinterpret_cast<const uint8_t*>(&tables::kIq2xsGrid[w & 511]);
        const __m256 db = l < 2 ? db0 : db1;
        _mm256_storeu_ps(y, _mm256_xor_ps(_mm256_mul_ps(db, U8x8ToPs(g)), SignMask(tables::kKsignsIq2xs[w >> 9])));
      }
    }
  }
}

K3_AVX2 void DqIq3Xxs(const uint8_t* s, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, s += 98) {
    const float d = HalfAt(s);
    const uint8_t* qs = s + 2;
    for (int ib = 0; ib < 8; ++ib, qs += 8) {
      const uint32_t aux32 = LoadU32(s + 66 + 4 * ib);
      const __m256 db = _mm256_set1_ps(d * (0.5f + (aux32 >> 28)) * 0.5f);
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint8_t signs = tables::kKsignsIq2xs[(aux32 >> (7 * l)) & 127];
        const __m128i g = _mm_setr_epi32(static_cast<int>(tables::kIq3xxsGrid[qs[2 * l]]),
                                         static_cast<int>(tables::kIq3xxsGrid[qs[2 * l + 1]]), 0, 0);
        const __m256 gf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(g));
        _mm256_storeu_ps(y, _mm256_xor_ps(_mm256_mul_ps(db, gf), SignMask(signs)));
      }
    }
  }
}

}  // namespace

float DotF32Avx2(const float* a, const float* b, int64_t n) __attribute__((target("avx2,fma")));
float DotF32Avx2(const float* a, const float* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  acc0 = _mm256_add_ps(acc0, acc1);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc0), _mm256_extractf128_ps(acc0, 1));
  s = _mm_hadd_ps(s, s);
  s = _mm_hadd_ps(s, s);
  float r = _mm_cvtss_f32(s);
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

const DequantTable& Avx2Table() {
  static const DequantTable table = [] {
    DequantTable t;
    auto set = [&](GgmlType type, DequantFn f) { t.fn[static_cast<uint32_t>(type)] = f; };
    set(GgmlType::F16, DqF16);
    set(GgmlType::BF16, DqBf16);
    set(GgmlType::Q8_0, DqQ8_0);
    set(GgmlType::Q4_0, DqQ4_0);
    set(GgmlType::Q2_K, DqQ2K);
    set(GgmlType::Q3_K, DqQ3K);
    set(GgmlType::Q4_K, DqQ4K);
    set(GgmlType::Q6_K, DqQ6K);
    set(GgmlType::IQ2_XXS, DqIq2Xxs);
    set(GgmlType::IQ2_XS, DqIq2Xs);
    set(GgmlType::IQ3_XXS, DqIq3Xxs);
    return t;
  }();
  return table;
}

}  // namespace k3pack::quant::internal
