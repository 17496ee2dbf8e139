// Helpers shared by the quant tests.
#pragma once

#include <cstring>
#include <random>
#include <vector>

#include "k3pack/ggml_types.h"

namespace k3pack::quant {

// Clears bit 14 of the fp16 at `off` so it is finite (|x| < 2).
inline void FiniteHalf(std::vector<uint8_t>& b, size_t off) { b[off + 1] &= 0xBF; }

// Random block bytes with every fp16/fp32 scale field made finite.
inline void Sanitize(GgmlType t, uint8_t* p, std::mt19937& rng) {
  const size_t sz = GgmlTypeInfoFor(t)->type_size;
  std::vector<uint8_t> b(p, p + sz);
  auto half_at = [&](std::initializer_list<size_t> offs) {
    for (size_t o : offs) FiniteHalf(b, o);
  };
  switch (t) {
    case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::Q8_0: case GgmlType::IQ4_NL:
    case GgmlType::Q1_0: case GgmlType::Q2_0: case GgmlType::IQ2_XXS: case GgmlType::IQ2_XS:
    case GgmlType::IQ2_S: case GgmlType::IQ3_XXS: case GgmlType::IQ3_S: case GgmlType::IQ1_S:
    case GgmlType::IQ4_XS:
      half_at({0});
      break;
    case GgmlType::Q4_1: case GgmlType::Q5_1: case GgmlType::Q4_K: case GgmlType::Q5_K:
      half_at({0, 2});
      break;
    case GgmlType::Q2_K: half_at({80, 82}); break;
    case GgmlType::Q3_K: half_at({108}); break;
    case GgmlType::Q6_K: half_at({208}); break;
    case GgmlType::TQ1_0: half_at({52}); break;
    case GgmlType::TQ2_0: half_at({64}); break;
    case GgmlType::IQ1_M: b[55] &= 0xBF; break;  // bit 14 of the split fp16 scale
    case GgmlType::MXFP4: b[0] = static_cast<uint8_t>(116 + b[0] % 24); break;  // 2^-12 .. 2^11
    case GgmlType::Q8_K: {
      const float d = std::uniform_real_distribution<float>(-0.01f, 0.01f)(rng);
      std::memcpy(b.data(), &d, 4);
      break;
    }
    default: break;  // plain types keep random bits (NaN/Inf included)
  }
  std::memcpy(p, b.data(), sz);
}

// `nblocks` random blocks of type t with finite scales.
inline std::vector<uint8_t> RandomBlocks(GgmlType t, size_t nblocks, std::mt19937& rng) {
  const GgmlTypeInfo* info = GgmlTypeInfoFor(t);
  std::vector<uint8_t> src(nblocks * info->type_size);
  for (auto& x : src) x = static_cast<uint8_t>(rng());
  for (size_t i = 0; i < nblocks && info->block_size > 1; ++i) Sanitize(t, &src[i * info->type_size], rng);
  return src;
}

}  // namespace k3pack::quant
