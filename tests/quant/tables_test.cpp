// The IQ / FP4 tables against facts checked independently of the code that
// builds them: entries read from ggml-common.h, the structural rules every
// table follows, and SHA-256 digests pinned once the tables were verified.
#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "quant/iq_tables.h"
#include "util/sha256.h"

namespace k3pack::quant::tables {
namespace {

template <typename A>
std::string Digest(const A& a) {
  return Sha256Hex(a.data(), sizeof(a[0]) * a.size());
}

TEST(QuantTables, SpotEntriesFromGgmlCommonHeader) {
  // Consecutive entries as they appear in ggml/src/ggml-common.h.
  EXPECT_EQ(kIq2xxsGrid[0], 0x0808080808080808ULL);
  EXPECT_EQ(kIq2xxsGrid[1], 0x080808080808082bULL);
  EXPECT_EQ(kIq2xxsGrid[2], 0x0808080808081919ULL);
  EXPECT_EQ(kIq2xxsGrid[137], 0x19080808082b1908ULL);
  EXPECT_EQ(kIq2xxsGrid[138], 0x1908080819080808ULL);
  EXPECT_EQ(kIq2xsGrid[301], 0x1908190808192b19ULL);
  EXPECT_EQ(kIq2xsGrid[302], 0x19081908082b0808ULL);
  EXPECT_EQ(kIq2sGrid[256], 0x0819081919191919ULL);
  EXPECT_EQ(kIq2sGrid[257], 0x0819081919192b08ULL);
  EXPECT_EQ(kIq2sGrid[777], 0x192b081908082b08ULL);
  EXPECT_EQ(kIq2sGrid[778], 0x192b081908190819ULL);
  EXPECT_EQ(kIq3xxsGrid[0], 0x04040404u);
  EXPECT_EQ(kIq3xxsGrid[199], 0x2c04240cu);
  EXPECT_EQ(kIq3xxsGrid[200], 0x2c043e04u);
  EXPECT_EQ(kIq3xxsGrid[201], 0x2c0c0404u);
  EXPECT_EQ(kIq3sGrid[255], 0x05090501u);
  EXPECT_EQ(kIq3sGrid[256], 0x05090507u);
  EXPECT_EQ(kIq3sGrid[257], 0x05090705u);
  EXPECT_EQ(kIq3sGrid[411], 0x0b010f09u);
  EXPECT_EQ(kIq3sGrid[412], 0x0b030103u);
  EXPECT_EQ(kIq3sGrid[413], 0x0b030107u);
  EXPECT_EQ(kIq1sGrid[0], 0xffffffffffffffffULL);
  EXPECT_EQ(kIq1sGrid[255], 0xff00ff0100000101ULL);
  EXPECT_EQ(kIq1sGrid[256], 0xff00ff01000100ffULL);
  EXPECT_EQ(kIq1sGrid[257], 0xff00ff0100010001ULL);
  EXPECT_EQ(kIq1sGrid[999], 0x00000000ffffff01ULL);
  EXPECT_EQ(kIq1sGrid[1000], 0x00000000ffff00ffULL);
  EXPECT_EQ(kIq1sGrid[1500], 0x01ff00ff00ffff00ULL);
  EXPECT_EQ(kIq1sGrid[1501], 0x01ff00ff00ff00ffULL);
}

TEST(QuantTables, PinnedDigests) {
  EXPECT_EQ(Digest(kIq2xxsGrid), "05826b5d3e472a3a78f196be62ac78acf81df0f909626e12ab9fa2a5d490dd54");
  EXPECT_EQ(Digest(kIq2xsGrid), "06e47aaca60b4dc1d9b5a3f34540437058a6b142b4d7a59d5ded769b4d1bf1de");
  EXPECT_EQ(Digest(kIq2sGrid), "e1aa1473412b0552c2174c30ef22ab4073f6a181b85a17056e8249bd2932fd88");
  EXPECT_EQ(Digest(kIq3xxsGrid), "46e35f5a997efdee6c99ce57854c8a0d4f0ff8ca57e5e8a60c0793ea580acf5d");
  EXPECT_EQ(Digest(kIq3sGrid), "bd1af4945a1717c65610b0284e4628b9a1ba3b306fae3a06f6e5f597356e349f");
  EXPECT_EQ(Digest(kIq1sGrid), "07540ffc1aeaf6ad4d97e96b0fcc765aae39671d4ae4a27bbd0e796fde167c6a");
}

TEST(QuantTables, KsignsHaveEvenParityAndLow7Bits) {
  for (int i = 0; i < 128; ++i) {
    EXPECT_EQ(kKsignsIq2xs[i] & 0x7F, i);
    EXPECT_EQ(__builtin_popcount(kKsignsIq2xs[i]) % 2, 0) << i;
  }
  for (int j = 0; j < 8; ++j) EXPECT_EQ(kKmaskIq2xs[j], 1 << j);
}

// Grid bytes come from the documented value sets; entries are distinct and,
// read as their packed code words, strictly increasing (the grids are
// enumerated in order), which catches transposed or mistyped entries.
template <typename Word, size_t N>
void CheckGrid(const std::array<Word, N>& g, const std::set<int>& values, bool is_signed) {
  std::set<Word> seen;
  uint64_t prev_code = 0;
  for (size_t i = 0; i < N; ++i) {
    uint64_t code = 0;
    for (size_t k = 0; k < sizeof(Word); ++k) {
      const uint8_t b = static_cast<uint8_t>(g[i] >> (8 * k));
      const int v = is_signed ? static_cast<int8_t>(b) : b;
      ASSERT_TRUE(values.count(v)) << "entry " << i << " byte " << k << " = " << v;
      const int idx = static_cast<int>(std::distance(values.begin(), values.find(v)));
      code |= static_cast<uint64_t>(idx) << ((sizeof(Word) == 8 ? 2 : 4) * k);
    }
    if (i > 0) {
      EXPECT_GT(code, prev_code) << "entry " << i;
    }
    prev_code = code;
    seen.insert(g[i]);
  }
  EXPECT_EQ(seen.size(), N);
}

TEST(QuantTables, GridValueSetsOrderAndUniqueness) {
  CheckGrid(kIq2xxsGrid, {0x08, 0x19, 0x2b}, false);
  CheckGrid(kIq2xsGrid, {0x08, 0x19, 0x2b}, false);
  CheckGrid(kIq2sGrid, {0x08, 0x19, 0x2b}, false);
  CheckGrid(kIq3xxsGrid, {0x04, 0x0c, 0x14, 0x1c, 0x24, 0x2c, 0x34, 0x3e}, false);
  CheckGrid(kIq3sGrid, {0x01, 0x03, 0x05, 0x07, 0x09, 0x0b, 0x0d, 0x0f}, false);
  CheckGrid(kIq1sGrid, {-1, 0, 1}, true);
}

TEST(QuantTables, SmallValueTables) {
  const int8_t iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  EXPECT_EQ(std::memcmp(kValuesIq4nl, iq4nl, 16), 0);
  // FP4 (E2M1) doubled: sign bit 3, exponent bits 1-2, mantissa bit 0.
  for (int c = 0; c < 16; ++c) {
    const int e = (c >> 1) & 3, m = c & 1;
    const double mag = e == 0 ? m * 0.5 : (1 + m * 0.5) * (1 << (e - 1));
    EXPECT_EQ(kValuesFp4[c], static_cast<int>((c & 8 ? -2 : 2) * mag)) << c;
  }
}

}  // namespace
}  // namespace k3pack::quant::tables
