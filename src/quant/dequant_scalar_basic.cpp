// Scalar reference decoders for plain element types, the 32-element legacy
// blocks, the FP4 formats and Q1_0/Q2_0 (spec §3.1-§3.2). Each expression
// keeps ggml's float operation order; this file is built with
// -ffp-contract=off so no multiply-add is fused.
#include <cstring>

#include "quant/fp.h"
#include "quant/iq_tables.h"
#include "quant/kernels.h"

namespace k3pack::quant::internal {
namespace {

void DqF32(const uint8_t* s, float* y, int64_t n) { std::memcpy(y, s, static_cast<size_t>(n) * 4); }
void DqF16(const uint8_t* s, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = LoadHalf(s + 2 * i);
}
void DqBf16(const uint8_t* s, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = Bf16ToFp32(LoadU16(s + 2 * i));
}
void DqF64(const uint8_t* s, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    double v;
    std::memcpy(&v, s + 8 * i, 8);
    y[i] = static_cast<float>(v);
  }
}
template <typename T>
void DqInt(const uint8_t* s, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, s + sizeof(T) * i, sizeof(T));
    y[i] = static_cast<float>(v);
  }
}

void DqQ4_0(const uint8_t* s, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, s += 18, y += 32) {
    const float d = LoadHalf(s);
    const uint8_t* qs = s + 2;
    for (int j = 0; j < 16; ++j) {
      const int x0 = (qs[j] & 0x0F) - 8;
      const int x1 = (qs[j] >> 4) - 8;
      y[j] = x0 * d;
      y[j + 16] = x1 * d;
    }
  }
}

void DqQ4_1(const uint8_t* s, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, s += 20, y += 32) {
    const float d = LoadHalf(s);
    const float m = LoadHalf(s + 2);
    const uint8_t* qs = s + 4;
    for (int j = 0; j < 16; ++j) {
      const int x0 = qs[j] & 0x0F;
      const int x1 = qs[j] >> 4;
      y[j] = x0 * d + m;
      y[j + 16] = x1 * d + m;
    }
  }
}

void DqQ5_0(const uint8_t* s, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, s += 22, y += 32) {
    const float d = LoadHalf(s);
    const uint32_t qh = LoadU32(s + 2);
    const uint8_t* qs = s + 6;
    for (int j = 0; j < 16; ++j) {
      const uint8_t xh0 = static_cast<uint8_t>(((qh >> j) << 4) & 0x10);
      const uint8_t xh1 = static_cast<uint8_t>((qh >> (j + 12)) & 0x10);
      const int x0 = ((qs[j] & 0x0F) | xh0) - 16;
      const int x1 = ((qs[j] >> 4) | xh1) - 16;
      y[j] = x0 * d;
      y[j + 16] = x1 * d;
    }
  }
}

void DqQ5_1(const uint8_t* s, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, s += 24, y += 32) {
    const float d = LoadHalf(s);
    const float m = LoadHalf(s + 2);
    const uint32_t qh = LoadU32(s + 4);
    const uint8_t* qs = s + 8;
    for (int j = 0; j < 16; ++j) {
      const uint8_t xh0 = static_cast<uint8_t>(((qh >> j) << 4) & 0x10);
      const uint8_t xh1 = static_cast<uint8_t>((qh >> (j + 12)) & 0x10);
      const int x0 = (qs[j] & 0x0F) | xh0;
      const int x1 = (qs[j] >> 4) | xh1;
      y[j] = x0 * d + m;
      y[j + 16] = x1 * d + m;
    }
  }
}

void DqQ8_0(const uint8_t* s, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, s += 34, y += 32) {
    const float d = LoadHalf(s);
    for (int j = 0; j < 32; ++j) y[j] = static_cast<int8_t>(s[2 + j]) * d;
  }
}

void DqIq4Nl(const uint8_t* s, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, s += 18, y += 32) {
    const float d = LoadHalf(s);
    const uint8_t* qs = s + 2;
    for (int j = 0; j < 16; ++j) {
      y[j] = d * tables::kValuesIq4nl[qs[j] & 0xF];
      y[j + 16] = d * tables::kValuesIq4nl[qs[j] >> 4];
    }
  }
}

void DqMxfp4(const uint8_t* s, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, s += 17, y += 32) {
    const float d = E8m0ToFp32Half(s[0]);
    const uint8_t* qs = s + 1;
    for (int j = 0; j < 16; ++j) {
      const int8_t x0 = tables::kValuesFp4[qs[j] & 0x0F];
      const int8_t x1 = tables::kValuesFp4[qs[j] >> 4];
      y[j] = x0 * d;
      y[j + 16] = x1 * d;
    }
  }
}

void DqNvfp4(const uint8_t* s, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, s += 36, y += 64) {
    for (int sub = 0; sub < 4; ++sub) {
      const float d = Ue4m3ToFp32(s[sub]);
      const uint8_t* qs = s + 4 + 8 * sub;
      float* yb = y + 16 * sub;
      for (int j = 0; j < 8; ++j) {
        const int8_t x0 = tables::kValuesFp4[qs[j] & 0x0F];
        const int8_t x1 = tables::kValuesFp4[qs[j] >> 4];
        yb[j] = x0 * d;
        yb[j + 8] = x1 * d;
      }
    }
  }
}

void DqQ1_0(const uint8_t* s, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, s += 18, y += 128) {
    const float d = LoadHalf(s);
    // bit set: d, clear: -d (a sign flip, exactly ggml's `-d`), branch-free.
    const uint32_t db = FloatToBits(d);
    for (int j = 0; j < 128; ++j) {
      const uint32_t clear = ~(static_cast<uint32_t>(s[2 + j / 8]) >> (j % 8)) & 1u;
      y[j] = BitsToFloat(db ^ (clear << 31));
    }
  }
}

void DqQ2_0(const uint8_t* s, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, s += 18, y += 64) {
    const float d = LoadHalf(s);
    for (int j = 0; j < 64; ++j) {
      const int q = (s[2 + j / 4] >> (2 * (j % 4))) & 3;
      y[j] = (q - 1) * d;
    }
  }
}

}  // namespace

void RegisterScalarBasic(DequantTable& t) {
  auto set = [&](GgmlType type, DequantFn f) { t.fn[static_cast<uint32_t>(type)] = f; };
  set(GgmlType::F32, DqF32);
  set(GgmlType::F16, DqF16);
  set(GgmlType::BF16, DqBf16);
  set(GgmlType::F64, DqF64);
  set(GgmlType::I8, DqInt<int8_t>);
  set(GgmlType::I16, DqInt<int16_t>);
  set(GgmlType::I32, DqInt<int32_t>);
  set(GgmlType::I64, DqInt<int64_t>);
  set(GgmlType::Q4_0, DqQ4_0);
  set(GgmlType::Q4_1, DqQ4_1);
  set(GgmlType::Q5_0, DqQ5_0);
  set(GgmlType::Q5_1, DqQ5_1);
  set(GgmlType::Q8_0, DqQ8_0);
  set(GgmlType::IQ4_NL, DqIq4Nl);
  set(GgmlType::MXFP4, DqMxfp4);
  set(GgmlType::NVFP4, DqNvfp4);
  set(GgmlType::Q1_0, DqQ1_0);
  set(GgmlType::Q2_0, DqQ2_0);
}

}  // namespace k3pack::quant::internal
