// Helpers shared by the quant tests.
#pragma once

#include <cstring>
#include <random>
#include <vector>

#include "k3pack/ggml_types.h"
#include "k3pack/quant.h"
#include "quant/fp.h"

namespace k3pack::quant {

// Every decode path this CPU can run: scalar, then AVX2 and AVX-512 where present.
inline std::vector<Isa> Paths() {
  std::vector<Isa> p = {Isa::kScalar};
  if (static_cast<int>(DetectedIsa()) >= 1) p.push_back(Isa::kAvx2);
  if (static_cast<int>(DetectedIsa()) >= 2) p.push_back(Isa::kAvx512);
  return p;
}

// Clears bit 14 of the fp16 at `off` so it is finite (|x| < 2).
inline void FiniteHalf(std::vector<uint8_t>& b, size_t off) { b[off + 1] &= 0xBF; }

// Byte offsets of a block type's fp16 scale fields (IQ1_M's is split over
// four nibbles and not listed; MXFP4/NVFP4 and Q8_K have no fp16 scale).
inline std::vector<size_t> HalfScaleOffsets(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_0: case GgmlType::Q5_0: case GgmlType::Q8_0: case GgmlType::IQ4_NL:
    case GgmlType::Q1_0: case GgmlType::Q2_0: case GgmlType::IQ2_XXS: case GgmlType::IQ2_XS:
    case GgmlType::IQ2_S: case GgmlType::IQ3_XXS: case GgmlType::IQ3_S: case GgmlType::IQ1_S:
    case GgmlType::IQ4_XS:
      return {0};
    case GgmlType::Q4_1: case GgmlType::Q5_1: case GgmlType::Q4_K: case GgmlType::Q5_K:
      return {0, 2};
    case GgmlType::Q2_K: return {80, 82};
    case GgmlType::Q3_K: return {108};
    case GgmlType::Q6_K: return {208};
    case GgmlType::TQ1_0: return {52};
    case GgmlType::TQ2_0: return {64};
    default: return {};
  }
}

// Random block bytes with every fp16/fp32 scale field made finite.
inline void Sanitize(GgmlType t, uint8_t* p, std::mt19937& rng) {
  const size_t sz = GgmlTypeInfoFor(t)->type_size;
  std::vector<uint8_t> b(p, p + sz);
  for (size_t o : HalfScaleOffsets(t)) FiniteHalf(b, o);
  switch (t) {
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

// Random weights of type t, n elements: blocks as RandomBlocks, plain float
// types N(0, 1) values.
inline std::vector<uint8_t> RandomWeights(GgmlType t, size_t n, std::mt19937& rng) {
  const GgmlTypeInfo* info = GgmlTypeInfoFor(t);
  if (info->block_size > 1) return RandomBlocks(t, n / info->block_size, rng);
  std::normal_distribution<float> g(0, 1);
  std::vector<uint8_t> out(n * info->type_size);
  for (size_t i = 0; i < n; ++i) {
    const float v = g(rng);
    if (t == GgmlType::F32) std::memcpy(&out[4 * i], &v, 4);
    if (t == GgmlType::F16) { const uint16_t h = Fp32ToFp16(v); std::memcpy(&out[2 * i], &h, 2); }
    if (t == GgmlType::BF16) { const uint16_t h = static_cast<uint16_t>(FloatToBits(v) >> 16); std::memcpy(&out[2 * i], &h, 2); }
  }
  return out;
}

}  // namespace k3pack::quant
