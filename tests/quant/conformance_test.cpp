// Hand-checked vectors for the edges of ggml's scalar conversions that the
// known-answer blocks do not reach: signed zeros, NaN payloads, subnormals,
// the extremes of the E8M0 and UE4M3 scales (docs/CONFORMANCE.md, Quant).
// Every code path the CPU has must give the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "k3pack/quant.h"
#include "quant_test_util.h"

namespace k3pack::quant {
namespace {

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// Decodes one block of `t` on every path; checks the float bits of y[i].
void ExpectBits(GgmlType t, const std::vector<uint8_t>& block, std::vector<std::pair<int, uint32_t>> want) {
  const size_t n = GgmlTypeInfoFor(t)->block_size;
  for (Isa isa : Paths()) {
    std::vector<float> y(n);
    ASSERT_TRUE(DequantizeRow(t, block, y, isa).ok());
    for (auto [i, bits] : want) {
      EXPECT_EQ(Bits(y[i]), bits) << GgmlTypeName(t) << " [" << i << "] on " << IsaName(isa) << " got " << y[i];
    }
  }
}

std::vector<uint8_t> U16s(std::initializer_list<uint16_t> v) {
  std::vector<uint8_t> b(v.size() * 2);
  size_t i = 0;
  for (uint16_t x : v) std::memcpy(&b[2 * i++], &x, 2);
  return b;
}

TEST(QuantConformance, F16AndBf16EdgeBits) {
  // F16: -0, smallest subnormal, largest subnormal, signaling NaN (quieted,
  // payload kept: vcvtph2ps and ggml's bit trick agree), -Inf.
  std::vector<float> y(5);
  for (Isa isa : Paths()) {
    ASSERT_TRUE(DequantizeRow(GgmlType::F16, U16s({0x8000, 0x0001, 0x03FF, 0x7C01, 0xFC00}), y, isa).ok());
    EXPECT_EQ(Bits(y[0]), 0x80000000u);
    EXPECT_EQ(Bits(y[1]), 0x33800000u);  // 2^-24
    EXPECT_EQ(Bits(y[2]), 0x387FC000u);  // 1023 * 2^-24
    EXPECT_EQ(Bits(y[3]), 0x7FC02000u);
    EXPECT_EQ(Bits(y[4]), 0xFF800000u);
    // BF16 is the top half of the float: a signaling NaN stays signaling,
    // a subnormal stays subnormal, -0 stays -0.
    ASSERT_TRUE(DequantizeRow(GgmlType::BF16, U16s({0x8000, 0x0001, 0x7F81, 0xFF80, 0x0080}), y, isa).ok());
    EXPECT_EQ(Bits(y[0]), 0x80000000u);
    EXPECT_EQ(Bits(y[1]), 0x00010000u);
    EXPECT_EQ(Bits(y[2]), 0x7F810000u);
    EXPECT_EQ(Bits(y[3]), 0xFF800000u);
    EXPECT_EQ(Bits(y[4]), 0x00800000u);  // FLT_MIN
  }
}

TEST(QuantConformance, SignedZerosFollowTheScaleSign) {
  // Q4_0, d = -1: code 8 -> (8-8) * -1 = -0.
  std::vector<uint8_t> q40(18, 0x88);
  std::memcpy(q40.data(), U16s({0xBC00}).data(), 2);
  ExpectBits(GgmlType::Q4_0, q40, {{0, 0x80000000u}, {31, 0x80000000u}});
  // Q4_1, d = 1, m = -0: 0 * 1 + (-0) = +0 (IEEE sum of opposite zeros).
  std::vector<uint8_t> q41(20, 0);
  std::memcpy(q41.data(), U16s({0x3C00, 0x8000}).data(), 4);
  ExpectBits(GgmlType::Q4_1, q41, {{0, 0x00000000u}});
  // Q8_0, d = -0: 5 * -0 = -0, -3 * -0 = +0.
  std::vector<uint8_t> q80(34, 0);
  std::memcpy(q80.data(), U16s({0x8000}).data(), 2);
  q80[2] = 5;
  q80[3] = 0xFD;
  ExpectBits(GgmlType::Q8_0, q80, {{0, 0x80000000u}, {1, 0x00000000u}});
  // Q2_K, d = 1, dmin = 1, scale byte 0x10: dl = 0, ml = 1 -> 0*q - 1 = -1,
  // and with dmin = -0: 0*q - (-0 * 1) = +0 - (-0) = +0.
  std::vector<uint8_t> q2(84, 0);
  q2[0] = 0x10;
  std::memcpy(&q2[80], U16s({0x3C00, 0x3C00}).data(), 4);
  ExpectBits(GgmlType::Q2_K, q2, {{0, 0xBF800000u}, {16, 0x00000000u}});
  std::memcpy(&q2[80], U16s({0x3C00, 0x8000}).data(), 4);
  ExpectBits(GgmlType::Q2_K, q2, {{0, 0x00000000u}});
}

TEST(QuantConformance, Mxfp4ScaleExtremes) {
  // e = 255 is 2^127 after the halving (finite); x 12 overflows to +Inf,
  // x -1 is -2^127. e = 1 is 2^-127 (a subnormal), e = 254 is 2^126.
  std::vector<uint8_t> b(17, 0);
  b[0] = 255;
  b[1] = 0x97;  // low 7 -> 12, high 9 -> -1
  b[2] = 0x02;  // low 2 -> 2 (2^128: +Inf), high 0 -> +0
  ExpectBits(GgmlType::MXFP4, b, {{0, 0x7F800000u}, {16, 0xFF000000u}, {1, 0x7F800000u}, {17, 0x00000000u}});
  b[0] = 1;
  b[1] = 0x12;  // low 2 -> 2: 2^-126; high 1 -> 1: 2^-127
  ExpectBits(GgmlType::MXFP4, b, {{0, 0x00800000u}, {16, 0x00400000u}});
  b[0] = 254;
  b[1] = 0x01;
  ExpectBits(GgmlType::MXFP4, b, {{0, 0x7E800000u}});
  // Code 8 is -0 in the table: 0 * d keeps +0 (the table holds int 0).
  b[0] = 127;
  b[1] = 0x08;
  ExpectBits(GgmlType::MXFP4, b, {{0, 0x00000000u}, {16, 0x00000000u}});
}

TEST(QuantConformance, Nvfp4ScaleExtremes) {
  // 0xFF: bit 7 ignored -> exp 15, man 7: 1.875 * 2^8 * 0.5 = 240.
  // 0x80: exp 0, man 0 -> 0. 0x07: subnormal 7 * 2^-9 * 0.5. 0x7F -> 0.
  std::vector<uint8_t> b(36, 0);
  b[0] = 0xFF;
  b[1] = 0x80;
  b[2] = 0x07;
  b[3] = 0x7F;
  b[4] = 0x02;       // sub-block 0, element 0: code 2 -> value 2
  b[4 + 8] = 0x09;   // sub-block 1, element 16: code 9 -> -1
  b[4 + 16] = 0x01;  // sub-block 2, element 32: code 1 -> 1
  b[4 + 24] = 0x07;  // sub-block 3, element 48: code 7 -> 12
  const float sub = 7.0f * std::ldexp(1.0f, -9) * 0.5f;
  ExpectBits(GgmlType::NVFP4, b, {{0, Bits(480.0f)}, {16, 0x80000000u}, {32, Bits(sub)}, {48, 0x00000000u}});
}

}  // namespace
}  // namespace k3pack::quant
