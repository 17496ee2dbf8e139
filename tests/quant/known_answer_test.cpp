// Known-answer vectors: small hand-built blocks whose expected values were
// worked out by hand from the block layouts (spec §3), not by running the
// decoder. Each block is decoded by every code path the CPU has.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "k3pack/quant.h"
#include "quant_test_util.h"

namespace k3pack::quant {
namespace {

struct Block {
  GgmlType type;
  std::vector<uint8_t> b;
  explicit Block(GgmlType t) : type(t), b(GgmlTypeInfoFor(t)->type_size, 0) {}
  void U16(size_t off, uint16_t v) { std::memcpy(&b[off], &v, 2); }
  void U32(size_t off, uint32_t v) { std::memcpy(&b[off], &v, 4); }
  void F32(size_t off, float v) { std::memcpy(&b[off], &v, 4); }
};

constexpr uint16_t kH1 = 0x3C00, kH05 = 0x3800, kH2 = 0x4000, kH025 = 0x3400, kHm1 = 0xBC00;

// Decodes `blk` on every path and checks y[index] == value for each pair.
void Expect(const Block& blk, std::vector<std::pair<int, float>> want) {
  const size_t n = GgmlTypeInfoFor(blk.type)->block_size;
  for (Isa isa : Paths()) {
    std::vector<float> y(n, NAN);
    ASSERT_TRUE(DequantizeRow(blk.type, blk.b, y, isa).ok());
    for (auto [i, v] : want) {
      EXPECT_EQ(y[i], v) << GgmlTypeName(blk.type) << " [" << i << "] on " << IsaName(isa);
    }
  }
}

TEST(QuantKnownAnswer, PlainTypes) {
  Block f16(GgmlType::F16);
  f16.b = {0x00, 0x3C, 0x00, 0xC0, 0x01, 0x00, 0x00, 0x7C};
  f16.type = GgmlType::F16;
  std::vector<float> y(4);
  ASSERT_TRUE(DequantizeRow(GgmlType::F16, f16.b, y).ok());
  EXPECT_EQ(y[0], 1.0f);
  EXPECT_EQ(y[1], -2.0f);
  EXPECT_EQ(y[2], std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(y[3]));

  const std::vector<uint8_t> bf = {0x80, 0x3F, 0x40, 0xC0};
  std::vector<float> yb(2);
  ASSERT_TRUE(DequantizeRow(GgmlType::BF16, bf, yb).ok());
  EXPECT_EQ(yb[0], 1.0f);
  EXPECT_EQ(yb[1], -3.0f);

  std::vector<uint8_t> raw(8);
  const double dv = 0.1;
  std::memcpy(raw.data(), &dv, 8);
  std::vector<float> one(1);
  ASSERT_TRUE(DequantizeRow(GgmlType::F64, raw, one).ok());
  EXPECT_EQ(one[0], 0.1f);
  const int64_t i64 = -(int64_t{1} << 40);
  std::memcpy(raw.data(), &i64, 8);
  ASSERT_TRUE(DequantizeRow(GgmlType::I64, raw, one).ok());
  EXPECT_EQ(one[0], -1099511627776.0f);
  const int32_t i32 = 123456;
  std::memcpy(raw.data(), &i32, 4);
  ASSERT_TRUE(DequantizeRow(GgmlType::I32, raw, one).ok());
  EXPECT_EQ(one[0], 123456.0f);
  const int16_t i16 = -300;
  std::memcpy(raw.data(), &i16, 2);
  ASSERT_TRUE(DequantizeRow(GgmlType::I16, raw, one).ok());
  EXPECT_EQ(one[0], -300.0f);
  raw[0] = 0xFB;
  ASSERT_TRUE(DequantizeRow(GgmlType::I8, raw, one).ok());
  EXPECT_EQ(one[0], -5.0f);
}

TEST(QuantKnownAnswer, LegacyBlocks) {
  Block q40(GgmlType::Q4_0);
  q40.U16(0, kH05);
  for (int j = 0; j < 16; ++j) q40.b[2 + j] = 0x88;
  q40.b[2] = 0x1F;  // low 15 -> (15-8)*0.5, high 1 -> (1-8)*0.5
  Expect(q40, {{0, 3.5f}, {16, -3.5f}, {1, 0.0f}, {31, 0.0f}});

  Block q41(GgmlType::Q4_1);
  q41.U16(0, kH05);
  q41.U16(2, kHm1);
  q41.b[4] = 0x3A;  // 10*0.5-1, 3*0.5-1
  Expect(q41, {{0, 4.0f}, {16, 0.5f}, {1, -1.0f}});

  Block q50(GgmlType::Q5_0);
  q50.U16(0, kH1);
  q50.U32(2, (1u << 0) | (1u << 16));  // 5th bit of elements 0 and 16
  q50.b[6] = 0x21;
  Expect(q50, {{0, 1.0f}, {16, 2.0f}, {1, -16.0f}, {17, -16.0f}});

  Block q51(GgmlType::Q5_1);
  q51.U16(0, kH2);
  q51.U16(2, kH05);
  q51.U32(4, 1u << 31);  // element 31 = high nibble of qs[15]
  q51.b[8 + 15] = 0x30;
  Expect(q51, {{31, 38.5f}, {15, 0.5f}});

  Block q80(GgmlType::Q8_0);
  q80.U16(0, kH025);
  q80.b[2] = 0x80;   // -128
  q80.b[33] = 0x7F;  // 127
  Expect(q80, {{0, -32.0f}, {31, 31.75f}, {5, 0.0f}});

  Block nl(GgmlType::IQ4_NL);
  nl.U16(0, kH1);
  nl.b[2] = 0xF0;
  Expect(nl, {{0, -127.0f}, {16, 113.0f}, {1, -127.0f}});
}

TEST(QuantKnownAnswer, Fp4AndBinaryBlocks) {
  Block mx(GgmlType::MXFP4);
  mx.b[0] = 130;  // 2^(130-128) = 4
  mx.b[1] = 0x9F; // low F -> -12, high 9 -> -1
  mx.b[2] = 0x25; // low 5 -> 6, high 2 -> 2
  Expect(mx, {{0, -48.0f}, {16, -4.0f}, {1, 24.0f}, {17, 8.0f}, {2, 0.0f}});
  Block mx0(GgmlType::MXFP4);
  mx0.b[0] = 0;  // 2^-128 (a subnormal)
  mx0.b[1] = 0x01;
  Expect(mx0, {{0, std::ldexp(1.0f, -128)}});

  Block nv(GgmlType::NVFP4);
  nv.b[0] = 0x38;  // exp 7, man 0: 1.0 * 0.5
  nv.b[1] = 0x7F;  // NaN code: 0
  nv.b[2] = 0x01;  // subnormal: 1 * 2^-9 * 0.5
  nv.b[3] = 0x3C;  // exp 7, man 4: 1.5 * 0.5
  nv.b[4] = 0x7E;  // sub 0, j 0: low E -> -8, high 7 -> 12
  nv.b[4 + 8] = 0x11;
  nv.b[4 + 16] = 0x02;
  nv.b[4 + 24] = 0x01;
  Expect(nv, {{0, -4.0f}, {8, 6.0f}, {16, 0.0f}, {32, 2 * std::ldexp(1.0f, -10)}, {48, 0.75f}, {56, 0.0f}});

  Block q10(GgmlType::Q1_0);
  q10.U16(0, kH05);
  q10.b[2] = 0x01;
  q10.b[2 + 15] = 0x80;
  Expect(q10, {{0, 0.5f}, {1, -0.5f}, {127, 0.5f}, {126, -0.5f}});

  Block q20(GgmlType::Q2_0);
  q20.U16(0, kH2);
  q20.b[2] = 0xE4;  // codes 0,1,2,3 -> -1,0,1,2
  Expect(q20, {{0, -2.0f}, {1, 0.0f}, {2, 2.0f}, {3, 4.0f}, {4, -2.0f}});
}

TEST(QuantKnownAnswer, KQuants) {
  Block q2(GgmlType::Q2_K);  // scales@0 qs@16 d@80 dmin@82
  q2.U16(80, kH1);
  q2.U16(82, kH05);
  q2.b[0] = 0x21;   // group 0: dl = 1, ml = 2*0.5
  q2.b[2] = 0x0F;   // group 2 (j=1, shift 2): dl = 15, ml = 0
  q2.b[8] = 0x13;   // group 8 (second half, j=0): dl = 3, ml = 0.5
  q2.b[16] = 0x07;  // q = 3 at shift 0, 1 at shift 2
  q2.b[16 + 32] = 0x02;
  Expect(q2, {{0, 2.0f}, {32, 15.0f}, {128, 5.5f}, {16, 0.0f}, {1, -1.0f}});

  Block q3(GgmlType::Q3_K);  // hmask@0 qs@32 scales@96 d@108
  q3.U16(108, kH1);
  q3.b[96 + 0] = 0x21;  // scale 0 low 1, scale 8 low 2
  q3.b[96 + 8] = 0x22;  // scale 0 high 2 (-> 33-32 = 1), scale 8 high 2 (-> 2)
  q3.b[32 + 0] = 0x03;
  q3.b[32 + 16] = 0x01;
  q3.b[32 + 32] = 0x02;
  q3.b[0] = 0x11;  // high bit set for element 0 (m=1) and element 128 (m=16)
  Expect(q3, {{0, 3.0f}, {1, -4.0f}, {16, 96.0f}, {128, 4.0f}});

  Block q4(GgmlType::Q4_K);  // d@0 dmin@2 scales@4 qs@16
  q4.U16(0, kH1);
  q4.U16(2, kH1);
  q4.b[4 + 0] = 0x43;  // sc0 = 3; top bits feed sc4
  q4.b[4 + 4] = 0x01;  // m0 = 1
  q4.b[4 + 1] = 0x02;  // sc1 = 2, m1 = 0
  q4.b[4 + 8] = 0x25;  // sc4 = 5 | 1<<4 = 21, m4 = 2
  q4.b[16 + 0] = 0x97;
  q4.b[16 + 64] = 0x02;
  Expect(q4, {{0, 20.0f}, {32, 18.0f}, {128, 40.0f}, {1, -1.0f}, {33, 0.0f}});

  Block q5(GgmlType::Q5_K);  // d@0 dmin@2 scales@4 qh@16 qs@48
  q5.b = std::vector<uint8_t>(176, 0);
  std::memcpy(q5.b.data(), q4.b.data(), 16);
  q5.b[16] = 0x03;  // 5th bit for element 0 (u1) and element 32 (u2)
  q5.b[48 + 0] = 0x97;
  q5.b[48 + 64] = 0x02;
  Expect(q5, {{0, 68.0f}, {32, 50.0f}, {128, 40.0f}, {1, -1.0f}});

  Block q6(GgmlType::Q6_K);  // ql@0 qh@128 scales@192 d@208
  q6.U16(208, kH05);
  const int8_t sc[8] = {2, 3, -1, 0, 4, 0, 1, 0};
  std::memcpy(&q6.b[192], sc, 8);
  q6.b[0] = 0x21;
  q6.b[128] = 0xE4;  // qh bits: 0, 1, 2, 3 for q1..q4
  Expect(q6, {{0, -31.0f}, {32, 8.0f}, {64, 4.0f}, {96, 8.0f}, {16, -48.0f}});

  Block q8(GgmlType::Q8_K);
  q8.F32(0, 0.5f);
  q8.b[4] = 0xFC;  // -4
  q8.b[4 + 255] = 100;
  Expect(q8, {{0, -2.0f}, {255, 50.0f}});

  Block xs(GgmlType::IQ4_XS);  // d@0 scales_h@2 scales_l@4 qs@8
  xs.U16(0, kH1);
  xs.U16(2, 0x0002);  // block 0 high bits 2, block 1 high bits 0
  xs.b[4] = 0x15;     // block 0 low 5 (ls 37 -> 5), block 1 low 1 (ls 1 -> -31)
  xs.b[8] = 0x80;
  xs.b[8 + 16] = 0x09;
  Expect(xs, {{0, -635.0f}, {16, 5.0f}, {32, -403.0f}, {48, 3937.0f}});
}

TEST(QuantKnownAnswer, Ternary) {
  // 81 in base-3 digits read by the ggml multiply trick: -1, +1, +1, 0, 0.
  Block t1(GgmlType::TQ1_0);  // qs@0 (48) qh@48 (4) d@52
  t1.U16(52, kH2);
  t1.b[0] = 81;
  t1.b[32] = 81;
  t1.b[48] = 81;
  Expect(t1, {{0, -2.0f}, {32, 2.0f}, {64, 2.0f}, {96, 0.0f}, {128, 0.0f},
              {160, -2.0f}, {176, 2.0f}, {192, 2.0f}, {208, 0.0f}, {224, 0.0f},
              {240, -2.0f}, {244, 2.0f}, {248, 2.0f}, {252, 0.0f}, {1, -2.0f}});

  Block t2(GgmlType::TQ2_0);  // qs@0 d@64
  t2.U16(64, kH1);
  t2.b[0] = 0x93;   // 2-bit codes 3,0,1,2 -> 2,-1,0,1
  t2.b[32] = 0x01;  // second 32-byte run: element 128
  Expect(t2, {{0, 2.0f}, {32, -1.0f}, {64, 0.0f}, {96, 1.0f}, {128, 0.0f}, {160, -1.0f}});
}

TEST(QuantKnownAnswer, IqGrids) {
  Block xxs(GgmlType::IQ2_XXS);  // d@0, 8 x (4 index bytes, u32 signs+scale)
  xxs.U16(0, kH1);
  xxs.b[2] = 1;                     // grid 1 = {0x2b, 8, 8, 8, 8, 8, 8, 8}
  xxs.U32(6, (3u << 28) | 1u);      // db = (0.5+3)*0.25; ksigns[1] = 0x81
  Expect(xxs, {{0, -37.625f}, {1, 7.0f}, {7, -7.0f}, {8, 7.0f}});

  Block xs(GgmlType::IQ2_XS);  // d@0 qs@2 (u16) scales@66
  xs.U16(0, kH1);
  xs.U16(2, static_cast<uint16_t>((2u << 9) | 2u));  // grid 2 = {0x19,0x19,8..}; ksigns[2] = 0x82
  xs.b[66] = 0x51;                                    // db0 = 1.5*0.25, db1 = 5.5*0.25
  Expect(xs, {{0, 9.375f}, {1, -9.375f}, {2, 3.0f}, {7, -3.0f}, {16, 11.0f}});

  Block s(GgmlType::IQ2_S);  // d@0 qs@2 signs@34 qh@66 scales@74
  s.U16(0, kH1);
  s.b[2] = 1;
  s.b[66] = 0x01;  // index 1 | 0x100 = 257 = {8,0x2b,0x19,0x19,0x19,8,0x19,8}
  s.b[34] = 0x03;  // negate elements 0 and 1
  s.b[74] = 0x02;  // db0 = 2.5*0.25
  Expect(s, {{0, -5.0f}, {1, -26.875f}, {2, 15.625f}, {5, 5.0f}});

  Block x3(GgmlType::IQ3_XXS);  // d@0 qs@2 (64) scales/signs@66
  x3.U16(0, kH1);
  x3.b[2] = 1;                   // grid 1 = {0x14, 4, 4, 4}
  x3.U32(66, (1u << 28) | 1u);   // db = 1.5*0.5; ksigns[1] = 0x81
  Expect(x3, {{0, -15.0f}, {1, 3.0f}, {4, 3.0f}, {7, -3.0f}});

  Block s3(GgmlType::IQ3_S);  // d@0 qs@2 qh@66 signs@74 scales@106
  s3.U16(0, kH1);
  s3.b[106] = 0x21;  // db1 = 3, db2 = 5
  s3.b[2] = 1;       // grid 1 = {3, 1, 1, 1}
  s3.b[74] = 0x10;   // negate element 4
  s3.b[67] = 0x01;   // block 1, l 0: index 0 | 256 -> {7, 5, 9, 5}
  Expect(s3, {{0, 9.0f}, {1, 3.0f}, {4, -3.0f}, {32, 35.0f}, {33, 25.0f}, {34, 45.0f}});

  Block i1(GgmlType::IQ1_S);  // d@0 qs@2 qh@34 (u16 x 8)
  i1.U16(0, kH1);
  i1.U16(34, static_cast<uint16_t>((2u << 12) | 1u));  // dl = 5, index 0 | 256, delta +1/8
  i1.U16(36, 0x8000);                                  // block 1: dl = 1, delta -1/8
  // grid 256 = {-1, 0, 1, 0, 1, -1, 0, -1}
  Expect(i1, {{0, -4.375f}, {1, 0.625f}, {2, 5.625f}, {5, -4.375f}, {8, -4.375f}, {32, -1.125f}});

  Block m(GgmlType::IQ1_M);  // qs@0 qh@32 scales@48 (d = 1.0 from the top nibbles)
  m.U16(48, 0x0011);  // block 0: dl1 = 3, dl2 = 5
  m.U16(52, 0xC000);
  m.U16(54, 0x3000);
  m.b[32] = 0x81;  // group 0: index | 256, delta +; group 1: delta -
  Expect(m, {{0, -2.625f}, {2, 3.375f}, {8, -3.375f}, {16, -4.375f}, {24, -4.375f}});
}

}  // namespace
}  // namespace k3pack::quant
