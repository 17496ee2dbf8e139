// Scalar reference decoders for the IQ lattice types (spec §3.4).
// Signs: ggml's source writes `db * grid[j] * (signs & kmask[j] ? -1.f : 1.f)`,
// and GCC -O3 (how ggml is built) compiles the multiply by +-1 into a flip of
// the sign bit of `db * grid[j]`. For every number that is the same value as
// the multiply; for a NaN (a NaN fp16 scale) only the flip reproduces ggml's
// bits (a multiply would keep the NaN's sign). So the sign bit is flipped
// here too (docs/quant.md). Built with -ffp-contract=off.
#include <cstring>

#include "quant/fp.h"
#include "quant/iq_tables.h"
#include "quant/kernels.h"

namespace k3pack::quant::internal {
namespace {

using tables::kKsignsIq2xs;

inline const uint8_t* GridBytes(const uint64_t* g) { return reinterpret_cast<const uint8_t*>(g); }
inline const uint8_t* GridBytes(const uint32_t* g) { return reinterpret_cast<const uint8_t*>(g); }
// `v` with its sign bit flipped when bit j of `signs` is set (kmask_iq2xs[j]
// = 1 << j), without a branch: random sign bits would mispredict.
inline float Signed(float v, uint8_t signs, int j) {
  return BitsToFloat(FloatToBits(v) ^ ((static_cast<uint32_t>(signs) >> j & 1u) << 31));
}

void DqIq2Xxs(const uint8_t* s, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, s += 66) {
    const float d = LoadHalf(s);
    for (int ib = 0; ib < 8; ++ib) {
      const uint32_t a0 = LoadU32(s + 2 + 8 * ib);
      const uint32_t a1 = LoadU32(s + 6 + 8 * ib);
      const float db = d * (0.5f + (a1 >> 28)) * 0.25f;
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint8_t* grid = GridBytes(&tables::kIq2xxsGrid[(a0 >> (8 * l)) & 0xFF]);
        const uint8_t signs = kKsignsIq2xs[(a1 >> (7 * l)) & 127];
        for (int j = 0; j < 8; ++j) y[j] = Signed(db * grid[j], signs, j);
      }
    }
  }
}

void DqIq2Xs(const uint8_t* s, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, s += 74) {
    const float d = LoadHalf(s);
    const uint8_t* scales = s + 66;
    for (int ib = 0; ib < 8; ++ib) {
      float db[2];
      db[0] = d * (0.5f + (scales[ib] & 0xf)) * 0.25f;
      db[1] = d * (0.5f + (scales[ib] >> 4)) * 0.25f;
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint16_t w = LoadU16(s + 2 + 2 * (4 * ib + l));
        const uint8_t* grid = GridBytes(&tables::kIq2xsGrid[w & 511]);
        const uint8_t signs = kKsignsIq2xs[w >> 9];
        for (int j = 0; j < 8; ++j) y[j] = Signed(db[l / 2] * grid[j], signs, j);
      }
    }
  }
}

void DqIq2S(const uint8_t* s, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, s += 82) {
    const float d = LoadHalf(s);
    const uint8_t* qs = s + 2;
    const uint8_t* signs = s + 2 + 32;
    const uint8_t* qh = s + 66;
    const uint8_t* scales = s + 74;
    for (int ib = 0; ib < 8; ++ib, qs += 4, signs += 4) {
      float db[2];
      db[0] = d * (0.5f + (scales[ib] & 0xf)) * 0.25f;
      db[1] = d * (0.5f + (scales[ib] >> 4)) * 0.25f;
      for (int l = 0; l < 4; ++l, y += 8) {
        const float dl = db[l / 2];
        const uint8_t* grid = GridBytes(&tables::kIq2sGrid[qs[l] | ((qh[ib] << (8 - 2 * l)) & 0x300)]);
        for (int j = 0; j < 8; ++j) y[j] = Signed(dl * grid[j], signs[l], j);
      }
    }
  }
}

void DqIq3Xxs(const uint8_t* s, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, s += 98) {
    const float d = LoadHalf(s);
    const uint8_t* qs = s + 2;
    const uint8_t* scales_and_signs = s + 2 + 64;
    for (int ib = 0; ib < 8; ++ib, qs += 8) {
      const uint32_t aux32 = LoadU32(scales_and_signs + 4 * ib);
      const float db = d * (0.5f + (aux32 >> 28)) * 0.5f;
      for (int l = 0; l < 4; ++l, y += 8) {
        const uint8_t signs = kKsignsIq2xs[(aux32 >> (7 * l)) & 127];
        const uint8_t* grid1 = GridBytes(&tables::kIq3xxsGrid[qs[2 * l + 0]]);
        const uint8_t* grid2 = GridBytes(&tables::kIq3xxsGrid[qs[2 * l + 1]]);
        for (int j = 0; j < 4; ++j) {
          y[j + 0] = Signed(db * grid1[j], signs, j + 0);
          y[j + 4] = Signed(db * grid2[j], signs, j + 4);
        }
      }
    }
  }
}

void DqIq3S(const uint8_t* s, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, s += 110) {
    const float d = LoadHalf(s);
    const uint8_t* qs = s + 2;
    const uint8_t* qh = s + 66;
    const uint8_t* signs = s + 74;
    const uint8_t* scales = s + 106;
    for (int ib = 0; ib < 8; ib += 2) {
      const float db1 = d * (1 + 2 * (scales[ib / 2] & 0xf));
      const float db2 = d * (1 + 2 * (scales[ib / 2] >> 4));
      for (int half = 0; half < 2; ++half, qs += 8, signs += 4) {
        const float db = half == 0 ? db1 : db2;
        const int h = qh[half];
        for (int l = 0; l < 4; ++l, y += 8) {
          const uint8_t* grid1 = GridBytes(&tables::kIq3sGrid[qs[2 * l + 0] | ((h << (8 - 2 * l)) & 256)]);
          const uint8_t* grid2 = GridBytes(&tables::kIq3sGrid[qs[2 * l + 1] | ((h << (7 - 2 * l)) & 256)]);
          for (int j = 0; j < 4; ++j) {
            y[j + 0] = Signed(db * grid1[j], signs[l], j + 0);
            y[j + 4] = Signed(db * grid2[j], signs[l], j + 4);
          }
        }
      }
      qh += 2;
    }
  }
}

constexpr float kIq1Delta = 0.125f;

void DqIq1S(const uint8_t* s, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, s += 50) {
    const float d = LoadHalf(s);
    const uint8_t* qs = s + 2;
    for (int ib = 0; ib < 8; ++ib, qs += 4) {
      const uint16_t qh = LoadU16(s + 34 + 2 * ib);
      const float dl = d * (2 * ((qh >> 12) & 7) + 1);
      const float delta = (qh & 0x8000) ? -kIq1Delta : kIq1Delta;
      for (int l = 0; l < 4; ++l, y += 8) {
        const int8_t* grid =
            reinterpret_cast<const int8_t*>(&tables::kIq1sGrid[qs[l] | (((qh >> (3 * l)) & 7) << 8)]);
        for (int j = 0; j < 8; ++j) y[j] = dl * (grid[j] + delta);
      }
    }
  }
}

void DqIq1M(const uint8_t* s, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, s += 56) {
    const uint8_t* qs = s;
    const uint8_t* qh = s + 32;
    uint16_t sc[4];
    for (int k = 0; k < 4; ++k) sc[k] = LoadU16(s + 48 + 2 * k);
    const uint16_t d16 = static_cast<uint16_t>((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) |
                                               (sc[3] & 0xf000));
    const float d = Fp16ToFp32(d16);
    for (int ib = 0; ib < 8; ++ib, qs += 4, qh += 2) {
      const float dl1 = d * (2 * ((sc[ib / 2] >> (6 * (ib % 2) + 0)) & 0x7) + 1);
      const float dl2 = d * (2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3)) & 0x7) + 1);
      uint16_t idx[4];
      idx[0] = static_cast<uint16_t>(qs[0] | ((qh[0] << 8) & 0x700));
      idx[1] = static_cast<uint16_t>(qs[1] | ((qh[0] << 4) & 0x700));
      idx[2] = static_cast<uint16_t>(qs[2] | ((qh[1] << 8) & 0x700));
      idx[3] = static_cast<uint16_t>(qs[3] | ((qh[1] << 4) & 0x700));
      float delta[4];
      delta[0] = (qh[0] & 0x08) ? -kIq1Delta : kIq1Delta;
      delta[1] = (qh[0] & 0x80) ? -kIq1Delta : kIq1Delta;
      delta[2] = (qh[1] & 0x08) ? -kIq1Delta : kIq1Delta;
      delta[3] = (qh[1] & 0x80) ? -kIq1Delta : kIq1Delta;
      for (int l = 0; l < 4; ++l, y += 8) {
        const float dl = l < 2 ? dl1 : dl2;
        const int8_t* grid = reinterpret_cast<const int8_t*>(&tables::kIq1sGrid[idx[l]]);
        for (int j = 0; j < 8; ++j) y[j] = dl * (grid[j] + delta[l]);
      }
    }
  }
}

}  // namespace

void RegisterScalarIq(DequantTable& t) {
  auto set = [&](GgmlType type, DequantFn f) { t.fn[static_cast<uint32_t>(type)] = f; };
  set(GgmlType::IQ2_XXS, DqIq2Xxs);
  set(GgmlType::IQ2_XS, DqIq2Xs);
  set(GgmlType::IQ2_S, DqIq2S);
  set(GgmlType::IQ3_XXS, DqIq3Xxs);
  set(GgmlType::IQ3_S, DqIq3S);
  set(GgmlType::IQ1_S, DqIq1S);
  set(GgmlType::IQ1_M, DqIq1M);
}

}  // namespace k3pack::quant::internal
