#include "kimi/synth_fill.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

namespace k3pack::synth {

uint64_t Mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t TensorSeed(uint64_t model_seed, std::string_view name) {
  uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001B3ull;
  }
  return Mix64(h ^ Mix64(model_seed));
}

namespace {

// Uniform in [-1, 1).
double Uniform(uint64_t seed, uint64_t i) {
  const uint64_t r = Mix64(seed ^ (i * 0xD6E8FEB86659FD93ull));
  return static_cast<double>(r >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7FFF + ((u >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

// A small positive fp16 scale with a random mantissa: 2^-10 .. 2^-5, or
// 2^-14 .. 2^-9 for types whose sub-scales multiply the quants by up to
// ~4000 (6-bit or int8 sub-scales), so decoded values stay weight-sized.
uint16_t SmallHalf(uint64_t r, bool wide) {
  const uint16_t exp = static_cast<uint16_t>((wide ? 1 : 5) + (r % 5));  // biased exponent
  const uint16_t man = static_cast<uint16_t>((r >> 8) & 0x3FF);
  return static_cast<uint16_t>((exp << 10) | man);
}

bool WideSubScales(GgmlType t) {
  switch (t) {
    case GgmlType::Q3_K: case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K:
    case GgmlType::IQ4_XS: case GgmlType::IQ3_S: case GgmlType::IQ3_XXS: case GgmlType::IQ2_S:
    case GgmlType::IQ2_XS: case GgmlType::IQ2_XXS:
      return true;
    default:
      return false;
  }
}

void PatchScales(GgmlType t, uint64_t r, uint8_t* block) {
  const bool wide = WideSubScales(t);
  for (const ScaleField& f : ScaleFields(t)) {
    r = Mix64(r + f.offset);
    switch (f.kind) {
      case ScaleKind::kF16: {
        const uint16_t h = SmallHalf(r, wide);
        std::memcpy(block + f.offset, &h, 2);
        break;
      }
      case ScaleKind::kF32: {
        const float v = std::ldexp(1.0f + static_cast<float>(r & 0xFF) / 256.0f, -10 + static_cast<int>((r >> 8) % 4));
        std::memcpy(block + f.offset, &v, 4);
        break;
      }
      case ScaleKind::kE8M0:
        block[f.offset] = static_cast<uint8_t>(117 + r % 8);  // 2^-11 .. 2^-4 after halving
        break;
      case ScaleKind::kUE4M3:
        for (int k = 0; k < 4; ++k) {  // NVFP4 has four sub-block scales
          const uint64_t rk = Mix64(r + k);
          block[f.offset + k] = static_cast<uint8_t>(((1 + rk % 6) << 3) | ((rk >> 8) & 7));
        }
        break;
      case ScaleKind::kIQ1MScattered: {
        // The fp16 super-scale is the top nibble of each of the 4 uint16 scales.
        const uint16_t h = SmallHalf(r, wide);
        for (int k = 0; k < 4; ++k) {
          uint16_t sc;
          std::memcpy(&sc, block + f.offset + 2 * k, 2);
          sc = static_cast<uint16_t>((sc & 0x0FFF) | (((h >> (4 * k)) & 0xF) << 12));
          std::memcpy(block + f.offset + 2 * k, &sc, 2);
        }
        break;
      }
    }
  }
}

// One element of a non-block type (8 bytes at most).
void EncodeElement(GgmlType type, const GgmlTypeInfo& info, float v, uint8_t* out) {
  switch (type) {
    case GgmlType::F32: std::memcpy(out, &v, 4); break;
    case GgmlType::F64: { const double d = v; std::memcpy(out, &d, 8); break; }
    case GgmlType::F16: { const uint16_t h = FloatToHalf(v); std::memcpy(out, &h, 2); break; }
    case GgmlType::BF16: { const uint16_t h = FloatToBf16(v); std::memcpy(out, &h, 2); break; }
    default: {  // integer element types: small values from the same stream
      const int64_t i = static_cast<int64_t>(std::lround(v * 100.0f));
      std::memcpy(out, &i, info.type_size);  // little-endian truncation of a small value
      break;
    }
  }
}

// One storage unit (an element, or a block of a block type).
void MakeUnit(const FillPlan& p, const GgmlTypeInfo& info, uint64_t unit, uint8_t* out) {
  if (info.quantized) {
    const uint64_t base = Mix64(p.seed ^ (unit * 0xA0761D6478BD642Full));
    for (uint32_t w = 0; w * 8 < info.type_size; ++w) {
      const uint64_t r = Mix64(base + w);
      std::memcpy(out + w * 8, &r, std::min<uint32_t>(8, info.type_size - w * 8));
    }
    PatchScales(p.type, base, out);
    return;
  }
  EncodeElement(p.type, info, ElementValue(p.kind, p.seed, unit), out);
}

}  // namespace

void EncodeFloats(GgmlType type, std::span<const float> values, uint64_t offset, std::span<uint8_t> out) {
  const GgmlTypeInfo* info = GgmlTypeInfoFor(type);
  if (info == nullptr || info->quantized || info->type_size == 0) return;
  const uint64_t size = info->type_size;
  uint8_t unit[8] = {};
  const uint64_t end = offset + out.size();
  for (uint64_t pos = offset; pos < end;) {
    const uint64_t i = pos / size;
    const uint64_t from = pos - i * size;
    const uint64_t n = std::min(size - from, end - pos);
    EncodeElement(type, *info, i < values.size() ? values[i] : 0.0f, unit);
    std::memcpy(out.data() + (pos - offset), unit + from, n);
    pos += n;
  }
}

float ElementValue(ValueKind kind, uint64_t seed, uint64_t i) {
  const double u = Uniform(seed, i);
  switch (kind) {
    case ValueKind::kWeight: return static_cast<float>(0.02 * u);
    case ValueKind::kNorm: return static_cast<float>(1.0 + 0.1 * u);
    case ValueKind::kResScore: return static_cast<float>(0.05 * u);
    case ValueKind::kSsmA: return static_cast<float>(-std::exp(std::log(16.0) * 0.5 * (u + 1.0)));
    case ValueKind::kRawALog: return static_cast<float>(0.5 * u);
    case ValueKind::kBias: return static_cast<float>(0.1 * u);
    case ValueKind::kConv: return static_cast<float>(0.25 * u);
  }
  return 0.0f;
}

void FillRange(const FillPlan& p, uint64_t offset, std::span<uint8_t> out) {
  const GgmlTypeInfo* info = GgmlTypeInfoFor(p.type);
  if (info == nullptr || info->block_size == 0 || out.empty()) return;
  const uint64_t unit_bytes = info->type_size;
  std::array<uint8_t, 512> tmp{};
  uint64_t pos = offset;
  const uint64_t end = offset + out.size();
  while (pos < end) {
    const uint64_t unit = pos / unit_bytes;
    const uint64_t unit_start = unit * unit_bytes;
    MakeUnit(p, *info, unit, tmp.data());
    const uint64_t from = pos - unit_start;
    const uint64_t n = std::min(unit_bytes - from, end - pos);
    std::memcpy(out.data() + (pos - offset), tmp.data() + from, n);
    pos += n;
  }
}

std::span<const ScaleField> ScaleFields(GgmlType t) {
  using K = ScaleKind;
  static constexpr ScaleField kD0[] = {{0, K::kF16}};
  static constexpr ScaleField kDM0[] = {{0, K::kF16}, {2, K::kF16}};
  static constexpr ScaleField kQ2K[] = {{80, K::kF16}, {82, K::kF16}};
  static constexpr ScaleField kQ3K[] = {{108, K::kF16}};
  static constexpr ScaleField kQ6K[] = {{208, K::kF16}};
  static constexpr ScaleField kQ8K[] = {{0, K::kF32}};
  static constexpr ScaleField kTQ1[] = {{52, K::kF16}};
  static constexpr ScaleField kTQ2[] = {{64, K::kF16}};
  static constexpr ScaleField kIQ1M[] = {{48, K::kIQ1MScattered}};
  static constexpr ScaleField kMX[] = {{0, K::kE8M0}};
  static constexpr ScaleField kNV[] = {{0, K::kUE4M3}};
  switch (t) {
    case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::Q8_0: case GgmlType::IQ4_NL:
    case GgmlType::IQ2_XXS: case GgmlType::IQ2_XS: case GgmlType::IQ2_S: case GgmlType::IQ3_XXS:
    case GgmlType::IQ3_S: case GgmlType::IQ1_S: case GgmlType::IQ4_XS: case GgmlType::Q1_0:
    case GgmlType::Q2_0:
      return kD0;
    case GgmlType::Q4_1: case GgmlType::Q5_1: case GgmlType::Q8_1: case GgmlType::Q4_K: case GgmlType::Q5_K:
      return kDM0;
    case GgmlType::Q2_K: return kQ2K;
    case GgmlType::Q3_K: return kQ3K;
    case GgmlType::Q6_K: return kQ6K;
    case GgmlType::Q8_K: return kQ8K;
    case GgmlType::TQ1_0: return kTQ1;
    case GgmlType::TQ2_0: return kTQ2;
    case GgmlType::IQ1_M: return kIQ1M;
    case GgmlType::MXFP4: return kMX;
    case GgmlType::NVFP4: return kNV;
    default: return {};
  }
}

float DecodeScale(const ScaleField& f, const uint8_t* block) {
  switch (f.kind) {
    case ScaleKind::kF16: {
      uint16_t h;
      std::memcpy(&h, block + f.offset, 2);
      return HalfToFloat(h);
    }
    case ScaleKind::kF32: {
      float v;
      std::memcpy(&v, block + f.offset, 4);
      return v;
    }
    case ScaleKind::kE8M0: {
      const uint8_t x = block[f.offset];
      return x == 0 ? std::ldexp(1.0f, -127) : std::ldexp(1.0f, static_cast<int>(x) - 127);
    }
    case ScaleKind::kUE4M3: {
      float worst = 0;
      for (int k = 0; k < 4; ++k) {
        const uint8_t x = block[f.offset + k];
        if (x == 0 || x == 0x7F) continue;
        const int exp = (x >> 3) & 0xF, man = x & 7;
        const float v = exp == 0 ? man * std::ldexp(1.0f, -9) * 0.5f
                                 : (1.0f + man / 8.0f) * std::ldexp(1.0f, exp - 7) * 0.5f;
        worst = std::max(worst, v);
      }
      return worst;
    }
    case ScaleKind::kIQ1MScattered: {
      uint16_t sc[4];
      std::memcpy(sc, block + f.offset, 8);
      const uint16_t h = static_cast<uint16_t>((sc[0] >> 12) | ((sc[1] >> 8) & 0xF0) | ((sc[2] >> 4) & 0xF00) |
                                               (sc[3] & 0xF000));
      return HalfToFloat(h);
    }
  }
  return 0.0f;
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(man), -24);
  } else if (exp == 31) {
    v = man == 0 ? INFINITY : NAN;
  } else {
    v = std::ldexp(static_cast<float>(man | 0x400), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

uint16_t FloatToHalf(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const float a = std::fabs(f);
  if (std::isnan(f)) return 0x7E00;
  if (a >= 65520.0f) return sign | 0x7C00;
  if (a < std::ldexp(1.0f, -24)) return sign;
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int exp = e - 1 + 15;
  if (exp <= 0) {  // subnormal: units of 2^-24
    return sign | static_cast<uint16_t>(std::lrint(std::ldexp(a, 24)));
  }
  // 10 mantissa bits, round to nearest even via lrint.
  long m = std::lrint(std::ldexp(a, 10 - (e - 1)));
  if (m == 2048) {
    m = 1024;
    ++exp;
  }
  if (exp >= 31) return sign | 0x7C00;
  return sign | static_cast<uint16_t>((exp << 10) | (m - 1024));
}

}  // namespace k3pack::synth
