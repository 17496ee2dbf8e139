// Scalar reference decoders for the 256-element super-block types: the
// K-quants (spec §3.3), IQ4_XS and the ternary TQ1_0/TQ2_0. Op order follows
// ggml's dequantize_row_*; built with -ffp-contract=off.
#include <cstring>

#include "quant/fp.h"
#include "quant/iq_tables.h"
#include "quant/kernels.h"

namespace k3pack::quant::internal {
namespace {

void DqQ2K(const uint8_t* s, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, s += 84) {
    const uint8_t* scales = s;
    const uint8_t* q = s + 16;
    const float d = LoadHalf(s + 80);
    const float dmin = LoadHalf(s + 82);
    int is = 0;
    for (int half = 0; half < 2; ++half, q += 32) {
      for (int j = 0; j < 4; ++j) {
        const int shift = 2 * j;
        for (int g = 0; g < 2; ++g) {
          const uint8_t sc = scales[is++];
          const float dl = d * (sc & 0xF);
          const float ml = dmin * (sc >> 4);
          for (int l = 0; l < 16; ++l) *y++ = dl * static_cast<int8_t>((q[l + 16 * g] >> shift) & 3) - ml;
        }
      }
    }
  }
}

// The 16 six-bit Q3_K scales (as ints before the -32).
inline void UnpackQ3Scales(const uint8_t* b, int out[16]) {
  for (int i = 0; i < 16; ++i) {
    const int low4 = i < 8 ? (b[i] & 0xF) : (b[i - 8] >> 4);
    const int high2 = (b[8 + (i % 4)] >> (2 * (i / 4))) & 3;
    out[i] = low4 | (high2 << 4);
  }
}

void DqQ3K(const uint8_t* s, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, s += 110) {
    const uint8_t* hm = s;
    const uint8_t* q = s + 32;
    int scales[16];
    UnpackQ3Scales(s + 96, scales);
    const float d_all = LoadHalf(s + 108);
    int is = 0;
    uint8_t m = 1;
    for (int half = 0; half < 2; ++half, q += 32) {
      for (int j = 0; j < 4; ++j, m = static_cast<uint8_t>(m << 1)) {
        const int shift = 2 * j;
        for (int g = 0; g < 2; ++g) {
          const float dl = d_all * (scales[is++] - 32);
          for (int l = 0; l < 16; ++l) {
            const int ql = static_cast<int8_t>((q[l + 16 * g] >> shift) & 3);
            const int hi = (hm[l + 16 * g] & m) ? 0 : 4;
            *y++ = dl * (ql - hi);
          }
        }
      }
    }
  }
}

inline void ScaleMinK4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

void DqQ4K(const uint8_t* s, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, s += 144) {
    const float d = LoadHalf(s);
    const float dmin = LoadHalf(s + 2);
    const uint8_t* scales = s + 4;
    const uint8_t* q = s + 16;
    for (int c = 0; c < 4; ++c, q += 32) {
      uint8_t sc, m;
      ScaleMinK4(2 * c, scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      ScaleMinK4(2 * c + 1, scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
    }
  }
}

void DqQ5K(const uint8_t* s, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, s += 176) {
    const float d = LoadHalf(s);
    const float dmin = LoadHalf(s + 2);
    const uint8_t* scales = s + 4;
    const uint8_t* qh = s + 16;
    const uint8_t* ql = s + 48;
    uint8_t u1 = 1, u2 = 2;
    for (int c = 0; c < 4; ++c, ql += 32) {
      uint8_t sc, m;
      ScaleMinK4(2 * c, scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      ScaleMinK4(2 * c + 1, scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0xF) + ((qh[l] & u1) ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
      u1 = static_cast<uint8_t>(u1 << 2);
      u2 = static_cast<uint8_t>(u2 << 2);
    }
  }
}

void DqQ6K(const uint8_t* s, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, s += 210) {
    const float d = LoadHalf(s + 208);
    const uint8_t* ql = s;
    const uint8_t* qh = s + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(s + 192);
    for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = static_cast<int8_t>((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = static_cast<int8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = static_cast<int8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = static_cast<int8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * sc[is] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
    }
  }
}

void DqQ8K(const uint8_t* s, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, s += 292, y += 256) {
    float d;
    std::memcpy(&d, s, 4);
    for (int j = 0; j < 256; ++j) y[j] = d * static_cast<int8_t>(s[4 + j]);
  }
}

void DqIq4Xs(const uint8_t* s, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, s += 136) {
    const float d = LoadHalf(s);
    const uint16_t scales_h = LoadU16(s + 2);
    const uint8_t* scales_l = s + 4;
    const uint8_t* qs = s + 8;
    for (int ib = 0; ib < 8; ++ib, qs += 16, y += 32) {
      const int ls = ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4);
      const float dl = d * (ls - 32);
      for (int j = 0; j < 16; ++j) {
        y[j] = dl * tables::kValuesIq4nl[qs[j] & 0xF];
        y[j + 16] = dl * tables::kValuesIq4nl[qs[j] >> 4];
      }
    }
  }
}

void DqTq1_0(const uint8_t* s, float* y, int64_t nb) {
  static const uint8_t kPow3[6] = {1, 3, 9, 27, 81, 243};
  for (int64_t i = 0; i < nb; ++i, s += 54) {
    const float d = LoadHalf(s + 52);
    auto emit = [&](const uint8_t* bytes, int count, int n_digits) {
      for (int n = 0; n < n_digits; ++n) {
        for (int m = 0; m < count; ++m) {
          const uint8_t q = static_cast<uint8_t>(bytes[m] * kPow3[n]);
          const int16_t xi = static_cast<int16_t>((static_cast<uint16_t>(q) * 3) >> 8);
          *y++ = static_cast<float>(xi - 1) * d;
        }
      }
    };
    emit(s, 32, 5);
    emit(s + 32, 16, 5);
    emit(s + 48, 4, 4);
  }
}

void DqTq2_0(const uint8_t* s, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, s += 66) {
    const float d = LoadHalf(s + 64);
    for (int j = 0; j < 64; j += 32) {
      for (int l = 0; l < 4; ++l) {
        for (int m = 0; m < 32; ++m) {
          const int8_t q = static_cast<int8_t>((s[j + m] >> (l * 2)) & 3);
          *y++ = static_cast<float>(q - 1) * d;
        }
      }
    }
  }
}

}  // namespace

void RegisterScalarKQuants(DequantTable& t) {
  auto set = [&](GgmlType type, DequantFn f) { t.fn[static_cast<uint32_t>(type)] = f; };
  set(GgmlType::Q2_K, DqQ2K);
  set(GgmlType::Q3_K, DqQ3K);
  set(GgmlType::Q4_K, DqQ4K);
  set(GgmlType::Q5_K, DqQ5K);
  set(GgmlType::Q6_K, DqQ6K);
  set(GgmlType::Q8_K, DqQ8K);
  set(GgmlType::IQ4_XS, DqIq4Xs);
  set(GgmlType::TQ1_0, DqTq1_0);
  set(GgmlType::TQ2_0, DqTq2_0);
}

}  // namespace k3pack::quant::internal
