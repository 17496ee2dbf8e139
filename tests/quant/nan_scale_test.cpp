// Invalid blocks whose fp16 scale is a NaN. ggml's IQ decoders read
// `db * grid[j] * (sign bit ? -1.f : 1.f)`, which GCC -O3 compiles into a
// flip of the product's sign bit, so ggml's output NaN has the scale NaN's
// payload with its sign flipped wherever the element's sign bit is set (a
// plain multiply would keep the sign). The expected bits here are worked out
// from that rule and the block layout, independently of the decoders.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "k3pack/quant.h"
#include "quant_test_util.h"
#include "quant/fp.h"

namespace k3pack::quant {
namespace {

// ksigns_iq2xs[i]: the 7 bits of i plus an 8th bit making the parity even.
uint8_t Ksigns(uint32_t i) { return static_cast<uint8_t>(i | ((__builtin_popcount(i) & 1u) << 7)); }

// fp16 NaNs: quiet positive with a payload, signaling negative. Widened to
// float they keep sign and payload and come out quiet.
constexpr uint16_t kNanScales[] = {0x7E01, 0xFC05, 0x7C01, 0xFFFF};
uint32_t WidenedNan(uint16_t h) {
  return (static_cast<uint32_t>(h & 0x8000u) << 16) | 0x7FC00000u | (static_cast<uint32_t>(h & 0x3FFu) << 13);
}

void ExpectBits(GgmlType t, const std::vector<uint8_t>& blk, const std::vector<uint32_t>& want) {
  for (Isa isa : Paths()) {
    std::vector<float> y(256, 0.0f);
    ASSERT_TRUE(DequantizeRow(t, blk, y, isa).ok());
    size_t bad = 0;
    for (size_t i = 0; i < 256; ++i) {
      if (FloatToBits(y[i]) != want[i] && bad++ < 3) {
        ADD_FAILURE() << GgmlTypeName(t) << " on " << IsaName(isa) << " [" << i << "]: got " << std::hex
                      << FloatToBits(y[i]) << ", want " << want[i];
      }
    }
    EXPECT_EQ(bad, 0u) << GgmlTypeName(t) << " on " << IsaName(isa);
  }
}

TEST(QuantNanScale, Iq2XsFlipsTheNanSignLikeGgml) {
  std::mt19937 rng(11);
  for (uint16_t h : kNanScales) {
    std::vector<uint8_t> blk(74);
    for (auto& b : blk) b = static_cast<uint8_t>(rng());
    std::memcpy(blk.data(), &h, 2);
    std::vector<uint32_t> want(256);
    for (int g = 0; g < 32; ++g) {  // 32 groups of 8, one uint16 qs word each
      uint16_t w;
      std::memcpy(&w, &blk[2 + 2 * g], 2);
      const uint8_t signs = Ksigns(w >> 9);
      for (int j = 0; j < 8; ++j) want[8 * g + j] = WidenedNan(h) ^ (static_cast<uint32_t>(signs >> j & 1) << 31);
    }
    ExpectBits(GgmlType::IQ2_XS, blk, want);
  }
}

TEST(QuantNanScale, Iq3XxsFlipsTheNanSignLikeGgml) {
  std::mt19937 rng(12);
  for (uint16_t h : kNanScales) {
    std::vector<uint8_t> blk(98);
    for (auto& b : blk) b = static_cast<uint8_t>(rng());
    std::memcpy(blk.data(), &h, 2);
    std::vector<uint32_t> want(256);
    for (int ib = 0; ib < 8; ++ib) {
      uint32_t aux;
      std::memcpy(&aux, &blk[66 + 4 * ib], 4);
      for (int l = 0; l < 4; ++l) {
        const uint8_t signs = Ksigns((aux >> (7 * l)) & 127);
        for (int j = 0; j < 8; ++j) {
          want[32 * ib + 8 * l + j] = WidenedNan(h) ^ (static_cast<uint32_t>(signs >> j & 1) << 31);
        }
      }
    }
    ExpectBits(GgmlType::IQ3_XXS, blk, want);
  }
}

TEST(QuantNanScale, Iq2XxsFlipsTheNanSignLikeGgml) {
  std::mt19937 rng(13);
  for (uint16_t h : kNanScales) {
    std::vector<uint8_t> blk(66);
    for (auto& b : blk) b = static_cast<uint8_t>(rng());
    std::memcpy(blk.data(), &h, 2);
    std::vector<uint32_t> want(256);
    for (int ib = 0; ib < 8; ++ib) {
      uint32_t a1;
      std::memcpy(&a1, &blk[6 + 8 * ib], 4);
      for (int l = 0; l < 4; ++l) {
        const uint8_t signs = Ksigns((a1 >> (7 * l)) & 127);
        for (int j = 0; j < 8; ++j) {
          want[32 * ib + 8 * l + j] = WidenedNan(h) ^ (static_cast<uint32_t>(signs >> j & 1) << 31);
        }
      }
    }
    ExpectBits(GgmlType::IQ2_XXS, blk, want);
  }
}

// Finite scales: flipping the sign bit and multiplying by -1 are the same
// value, zeros included (-0.f where the sign bit is set).
TEST(QuantNanScale, ZeroScaleGivesSignedZeros) {
  std::vector<uint8_t> blk(74, 0);  // d = +0, qs = 0 (grid 0, ksigns[0] = 0)
  const uint16_t w = static_cast<uint16_t>(1u << 9);  // ksigns[1] = 0x81: elements 0 and 7 negative
  std::memcpy(&blk[2], &w, 2);
  std::vector<uint32_t> want(256, 0u);
  want[0] = want[7] = 0x80000000u;
  ExpectBits(GgmlType::IQ2_XS, blk, want);
}

}  // namespace
}  // namespace k3pack::quant
