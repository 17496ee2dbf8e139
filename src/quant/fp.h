// Scalar number-format conversions used by the block decoders, written to give
// exactly ggml's results (ggml-impl.h): fp16 and bf16 widen exactly, E8M0 and
// UE4M3 scales map onto the float values ggml computes.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace k3pack::quant {

inline float BitsToFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline uint32_t FloatToBits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// IEEE binary16 -> binary32, exact for every number (subnormals, Inf). NaNs
// keep their payload and come out quiet, as from vcvtph2ps and from ggml's
// bit trick (whose float multiply quiets a signaling NaN).
inline float Fp16ToFp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t man = h & 0x3FFu;
  if (exp == 0x1F) return BitsToFloat(sign | 0x7F800000u | (man << 13) | (man ? 0x00400000u : 0u));
  if (exp != 0) return BitsToFloat(sign | ((exp + 112u) << 23) | (man << 13));
  if (man == 0) return BitsToFloat(sign);
  // Subnormal: shift the mantissa up until its leading one is the implicit bit.
  const uint32_t k = 10u - (31u - static_cast<uint32_t>(__builtin_clz(man)));
  man <<= k;
  return BitsToFloat(sign | ((113u - k) << 23) | ((man & 0x3FFu) << 13));
}

// binary32 -> binary16, round to nearest even (what F16C's vcvtps2ph and a
// _Float16 cast do); used only for the Q8_0 activation scale.
inline uint16_t Fp32ToFp16(float f) {
  const uint32_t x = FloatToBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7FFFFFFFu;
  if (absx > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((absx >> 13) & 0x3FFu));  // NaN
  if (absx >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to >= 65520: Inf
  if (absx < 0x38800000u) {  // result is subnormal (or zero) in fp16
    if (absx < 0x33000000u) return static_cast<uint16_t>(sign);  // < 2^-25 rounds to 0
    const uint32_t e = absx >> 23;
    const uint32_t m = (absx & 0x7FFFFFu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14 - (e - 127) + 13 - 1 ... number of bits dropped
    const uint32_t kept = m >> (shift);
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    uint32_t r = kept + ((rem > half || (rem == half && (kept & 1u))) ? 1u : 0u);
    return static_cast<uint16_t>(sign | r);
  }
  const uint32_t rem = absx & 0x1FFFu;
  uint32_t r = ((absx >> 13) - (112u << 10));
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return static_cast<uint16_t>(sign | r);
}

inline float Bf16ToFp32(uint16_t h) { return BitsToFloat(static_cast<uint32_t>(h) << 16); }

// ggml_e8m0_to_fp32_half: 2^(x-128) as float bits (x < 2 gives subnormals).
inline float E8m0ToFp32Half(uint8_t x) {
  const uint32_t bits = x < 2 ? (0x00200000u << x) : (static_cast<uint32_t>(x - 1) << 23);
  return BitsToFloat(bits);
}

// ggml_ue4m3_to_fp32 (NVFP4 sub-block scales), which already includes the
// factor 0.5 that pairs with the doubled FP4 value table. 0x00 and 0x7F
// (the NaN code) decode to 0; bit 7 is ignored otherwise.
inline float Ue4m3ToFp32(uint8_t x) {
  if (x == 0 || x == 0x7F) return 0.0f;
  const int exp = (x >> 3) & 0xF;
  const int man = x & 0x7;
  const float raw = exp == 0 ? std::ldexp(static_cast<float>(man), -9)
                             : std::ldexp(1.0f + static_cast<float>(man) / 8.0f, exp - 7);
  return raw * 0.5f;
}

inline uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline float LoadHalf(const uint8_t* p) { return Fp16ToFp32(LoadU16(p)); }

}  // namespace k3pack::quant
