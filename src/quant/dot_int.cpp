// Scalar integer dot kernels (weight row x Q8_0 / Q8_K activation row).
// Per block: exact int32 sums of quant products times integer sub-scales,
// then one float scale per block, as ggml's generic vec_dot does.
#include <cstring>

#include "quant/dot_kernels.h"
#include "quant/fp.h"
#include "quant/iq_tables.h"

namespace k3pack::quant::internal {
namespace {

struct Q8K {
  float d;
  const int8_t* qs;
  int16_t bsums[16];
  explicit Q8K(const uint8_t* p) {
    std::memcpy(&d, p, 4);
    qs = reinterpret_cast<const int8_t*>(p + 4);
    std::memcpy(bsums, p + 260, 32);
  }
};

inline float Q8_0D(const uint8_t* p) { return LoadHalf(p); }
inline const int8_t* Q8_0Qs(const uint8_t* p) { return reinterpret_cast<const int8_t*>(p + 2); }

float DotQ8_0(const uint8_t* w, const uint8_t* a, int64_t nb) {
  float sumf = 0;
  for (int64_t i = 0; i < nb; ++i, w += 34, a += kQ8_0Bytes) {
    const int8_t* x = reinterpret_cast<const int8_t*>(w + 2);
    const int8_t* y = Q8_0Qs(a);
    int sumi = 0;
    for (int j = 0; j < 32; ++j) sumi += x[j] * y[j];
    sumf += sumi * (LoadHalf(w) * Q8_0D(a));
  }
  return sumf;
}

// 32-element blocks whose 16 bytes hold two 4-bit codes mapped by `map`.
template <int kBytes, int kHeader>
float DotNibbles(const uint8_t* w, const uint8_t* a, int64_t nb, const int8_t* map, float (*scale)(const uint8_t*)) {
  float sumf = 0;
  for (int64_t i = 0; i < nb; ++i, w += kBytes, a += kQ8_0Bytes) {
    const uint8_t* qs = w + kHeader;
    const int8_t* y = Q8_0Qs(a);
    int s1 = 0, s2 = 0;
    for (int j = 0; j < 16; ++j) {
      s1 += y[j] * map[qs[j] & 0xF];
      s2 += y[j + 16] * map[qs[j] >> 4];
    }
    sumf += (Q8_0D(a) * scale(w)) * (s1 + s2);
  }
  return sumf;
}

const int8_t kQ4Map[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};
float HalfAt0(const uint8_t* w) { return LoadHalf(w); }
float E8m0At0(const uint8_t* w) { return E8m0ToFp32Half(w[0]); }

float DotQ4_0(const uint8_t* w, const uint8_t* a, int64_t nb) { return DotNibbles<18, 2>(w, a, nb, kQ4Map, HalfAt0); }
float DotIq4Nl(const uint8_t* w, const uint8_t* a, int64_t nb) {
  return DotNibbles<18, 2>(w, a, nb, tables::kValuesIq4nl, HalfAt0);
}
float DotMxfp4(const uint8_t* w, const uint8_t* a, int64_t nb) {
  return DotNibbles<17, 1>(w, a, nb, tables::kValuesFp4, E8m0At0);
}

float DotQ2K(const uint8_t* w, const uint8_t* a, int64_t nb) {
  float sumf = 0;
  for (int64_t i = 0; i < nb; ++i, w += 84, a += kQ8KBytes) {
    const Q8K y(a);
    const uint8_t* sc = w;
    int summs = 0;
    for (int j = 0; j < 16; ++j) summs += y.bsums[j] * (sc[j] >> 4);
    const float dall = y.d * LoadHalf(w + 80);
    const float dmin = y.d * LoadHalf(w + 82);
    const uint8_t* q2 = w + 16;
    const int8_t* q8 = y.qs;
    int isum = 0, is = 0;
    for (int k = 0; k < 2; ++k, q2 += 32) {
      for (int shift = 0; shift < 8; shift += 2, q8 += 32) {
        for (int g = 0; g < 2; ++g) {
          int s = 0;
          for (int l = 0; l < 16; ++l) s += q8[16 * g + l] * ((q2[16 * g + l] >> shift) & 3);
          isum += (sc[is++] & 0xF) * s;
        }
      }
    }
    sumf += dall * isum - dmin * summs;
  }
  return sumf;
}

float DotQ3K(const uint8_t* w, const uint8_t* a, int64_t nb) {
  float sumf = 0;
  for (int64_t i = 0; i < nb; ++i, w += 110, a += kQ8KBytes) {
    const Q8K y(a);
    const uint8_t* hm = w;
    const uint8_t* q3 = w + 32;
    const uint8_t* b = w + 96;
    const int8_t* q8 = y.qs;
    int isum = 0, is = 0, bit = 0;
    for (int k = 0; k < 2; ++k, q3 += 32) {
      for (int shift = 0; shift < 8; shift += 2, q8 += 32, ++bit) {
        for (int g = 0; g < 2; ++g, ++is) {
          const int low4 = is < 8 ? (b[is] & 0xF) : (b[is - 8] >> 4);
          const int high2 = (b[8 + (is % 4)] >> (2 * (is / 4))) & 3;
          int s = 0;
          for (int l = 0; l < 16; ++l) {
            const int idx = 16 * g + l;
            const int q = ((q3[idx] >> shift) & 3) - ((hm[idx] >> bit) & 1 ? 0 : 4);
            s += q8[idx] * q;
          }
          isum += ((low4 | (high2 << 4)) - 32) * s;
        }
      }
    }
    sumf += (LoadHalf(w + 108) * y.d) * isum;
  }
  return sumf;
}

inline void ScaleMinK4(int j, const uint8_t* q, int* d, int* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

template <bool kFive>
float DotQ45K(const uint8_t* w, const uint8_t* a, int64_t nb) {
  constexpr int kBytes = kFive ? 176 : 144;
  float sumf = 0;
  for (int64_t i = 0; i < nb; ++i, w += kBytes, a += kQ8KBytes) {
    const Q8K y(a);
    const uint8_t* scales = w + 4;
    const uint8_t* qh = w + 16;
    const uint8_t* q = w + (kFive ? 48 : 16);
    const int8_t* q8 = y.qs;
    int isum = 0, msum = 0;
    for (int c = 0; c < 4; ++c, q += 32) {
      for (int h = 0; h < 2; ++h, q8 += 32) {
        int sc, m;
        ScaleMinK4(2 * c + h, scales, &sc, &m);
        int s = 0;
        for (int l = 0; l < 32; ++l) {
          int v = h == 0 ? (q[l] & 0xF) : (q[l] >> 4);
          if (kFive) v += ((qh[l] >> (2 * c + h)) & 1) << 4;
          s += q8[l] * v;
        }
        isum += sc * s;
        msum += m * (y.bsums[2 * (2 * c + h)] + y.bsums[2 * (2 * c + h) + 1]);
      }
    }
    sumf += (LoadHalf(w) * y.d) * isum - (LoadHalf(w + 2) * y.d) * msum;
  }
  return sumf;
}

float DotQ6K(const uint8_t* w, const uint8_t* a, int64_t nb) {
  float sumf = 0;
  for (int64_t i = 0; i < nb; ++i, w += 210, a += kQ8KBytes) {
    const Q8K y(a);
    const uint8_t* ql = w;
    const uint8_t* qh = w + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(w + 192);
    const int8_t* q8 = y.qs;
    int isum = 0;
    for (int half = 0; half < 2; ++half, ql += 64, qh += 32, sc += 8, q8 += 128) {
      int s[8] = {};
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        s[is + 0] += q8[l] * q1;
        s[is + 2] += q8[l + 32] * q2;
        s[is + 4] += q8[l + 64] * q3;
        s[is + 6] += q8[l + 96] * q4;
      }
      for (int k = 0; k < 8; ++k) isum += sc[k] * s[k];
    }
    sumf += (LoadHalf(w + 208) * y.d) * isum;
  }
  return sumf;
}

inline int SignedGridDot(const uint8_t* grid, uint8_t signs, const int8_t* q8, int n) {
  int s = 0;
  for (int j = 0; j < n; ++j) s += ((signs >> j) & 1 ? -grid[j] : grid[j]) * q8[j];
  return s;
}

float DotIq2Xxs(const uint8_t* w, const uint8_t* a, int64_t nb) {
  float sumf = 0;
  for (int64_t i = 0; i < nb; ++i, w += 66, a += kQ8KBytes) {
    const Q8K y(a);
    const int8_t* q8 = y.qs;
    int bsum = 0;
    for (int ib = 0; ib < 8; ++ib) {
      const uint32_t a0 = LoadU32(w + 2 + 8 * ib), a1 = LoadU32(w + 6 + 8 * ib);
      const int ls = 2 * static_cast<int>(a1 >> 28) + 1;
      int sumi = 0;
      for (int l = 0; l < 4; ++l, q8 += 8) {
        const uint8_t* g = reinterpret_cast<const uint8_t*>(&tables::kIq2xxsGrid[(a0 >> (8 * l)) & 0xFF]);
        sumi += SignedGridDot(g, tables::kKsignsIq2xs[(a1 >> (7 * l)) & 127], q8, 8);
      }
      bsum += sumi * ls;
    }
    sumf += (LoadHalf(w) * y.d) * bsum;
  }
  return 0.125f * sumf;
}

float DotIq2Xs(const uint8_t* w, const uint8_t* a, int64_t nb) {
  float sumf = 0;
  for (int64_t i = 0; i < nb; ++i, w += 74, a += kQ8KBytes) {
    const Q8K y(a);
    const int8_t* q8 = y.qs;
    int bsum = 0;
    for (int ib = 0; ib < 8; ++ib) {
      const int ls1 = 2 * (w[66 + ib] & 0xF) + 1, ls2 = 2 * (w[66 + ib] >> 4) + 1;
      int s1 = 0, s2 = 0;
      for (int l = 0; l < 4; ++l, q8 += 8) {
        const uint16_t v = LoadU16(w + 2 + 2 * (4 * ib + l));
        const uint8_t* g = reinterpret_cast<const uint8_t*>(&tables::kIq2xsGrid[v & 511]);
        (l < 2 ? s1 : s2) += SignedGridDot(g, tables::kKsignsIq2xs[v >> 9], q8, 8);
      }
      bsum += s1 * ls1 + s2 * ls2;
    }
    sumf += (LoadHalf(w) * y.d) * bsum;
  }
  return 0.125f * sumf;
}

float DotIq3Xxs(const uint8_t* w, const uint8_t* a, int64_t nb) {
  float sumf = 0;
  for (int64_t i = 0; i < nb; ++i, w += 98, a += kQ8KBytes) {
    const Q8K y(a);
    const int8_t* q8 = y.qs;
    const uint8_t* qs = w + 2;
    int bsum = 0;
    for (int ib = 0; ib < 8; ++ib, qs += 8) {
      const uint32_t aux = LoadU32(w + 66 + 4 * ib);
      const int ls = 2 * static_cast<int>(aux >> 28) + 1;
      int sumi = 0;
      for (int l = 0; l < 4; ++l, q8 += 8) {
        const uint8_t signs = tables::kKsignsIq2xs[(aux >> (7 * l)) & 127];
        const uint8_t* g1 = reinterpret_cast<const uint8_t*>(&tables::kIq3xxsGrid[qs[2 * l]]);
        const uint8_t* g2 = reinterpret_cast<const uint8_t*>(&tables::kIq3xxsGrid[qs[2 * l + 1]]);
        sumi += SignedGridDot(g1, signs & 0xF, q8, 4) + SignedGridDot(g2, signs >> 4, q8 + 4, 4);
      }
      bsum += sumi * ls;
    }
    sumf += (LoadHalf(w) * y.d) * bsum;
  }
  return 0.25f * sumf;
}

}  // namespace

IntDotFn IntegerDotFor(GgmlType weight) {
  switch (weight) {
    case GgmlType::Q8_0: return DotQ8_0;
    case GgmlType::Q4_0: return DotQ4_0;
    case GgmlType::IQ4_NL: return DotIq4Nl;
    case GgmlType::MXFP4: return DotMxfp4;
    case GgmlType::Q2_K: return DotQ2K;
    case GgmlType::Q3_K: return DotQ3K;
    case GgmlType::Q4_K: return DotQ45K<false>;
    case GgmlType::Q5_K: return DotQ45K<true>;
    case GgmlType::Q6_K: return DotQ6K;
    case GgmlType::IQ2_XXS: return DotIq2Xxs;
    case GgmlType::IQ2_XS: return DotIq2Xs;
    case GgmlType::IQ3_XXS: return DotIq3Xxs;
    default: return nullptr;
  }
}

}  // namespace k3pack::quant::internal
