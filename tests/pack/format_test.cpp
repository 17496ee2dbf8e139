// Byte layout of GGMLMOEPACKv1 checked against values computed by hand.
#include <gtest/gtest.h>

#include <cstring>

#include "k3pack/pack.h"
#include "pack/format.h"
#include "util/sha256.h"

namespace k3pack::pack {
namespace {

// Independent little-endian packer for the expectations (not format.cpp's).
void Le(std::vector<uint8_t>& out, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

TEST(PackFormat, HeaderBytes) {
  PackHeader h;
  h.index_count = 0x0102030405060708ull;
  h.data_start = 4096;
  auto b = EncodeHeader(h);
  const char* magic = "GGMLMOEPACKv1\0\0\0";
  EXPECT_EQ(0, std::memcmp(b.data(), magic, 16));
  std::vector<uint8_t> want(magic, magic + 16);
  Le(want, 1, 4);
  Le(want, 40, 4);
  Le(want, 0x0102030405060708ull, 8);
  Le(want, 4096, 8);
  EXPECT_EQ(std::vector<uint8_t>(b.begin(), b.end()), want);
  auto d = DecodeHeader(b);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->index_count, h.index_count);
  EXPECT_FALSE(DecodeHeader(std::span<const uint8_t>(b.data(), 39)).ok());
}

TEST(PackFormat, EntryBytesAndDecode) {
  PackEntry e{"blk.7.ffn_down_exps.weight", true, -2, 0, 8192, 12345};
  auto b = EncodeEntry(e);
  ASSERT_TRUE(b.ok());
  std::vector<uint8_t> want(128, 0);
  std::memcpy(want.data(), e.name.data(), e.name.size());
  Le(want, 0xFFFFFFFEu, 4);  // signed -2
  Le(want, 0, 4);
  Le(want, 8192, 8);
  Le(want, 12345, 8);
  EXPECT_EQ(std::vector<uint8_t>(b->begin(), b->end()), want);
  auto d = DecodeEntry(*b);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->name, e.name);
  EXPECT_EQ(d->expert, -2);
  // Bytes after the first NUL are ignored; invalid UTF-8 is flagged.
  (*b)[40] = 'x';
  EXPECT_EQ(DecodeEntry(*b)->name, e.name);
  (*b)[0] = 0xC3;
  (*b)[1] = 0x28;
  EXPECT_FALSE(DecodeEntry(*b)->name_utf8_ok);
  PackEntry longname{std::string(128, 'a'), true, 0, 0, 0, 0};
  EXPECT_FALSE(EncodeEntry(longname).ok());
  longname.name.pop_back();
  EXPECT_TRUE(EncodeEntry(longname).ok());
}

TEST(PackFormat, ExpertTensorNames) {
  auto p = ParseExpertTensorName("blk.12.ffn_gate_exps.weight");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->layer, 12u);
  EXPECT_EQ(p->role, Role::kGate);
  EXPECT_EQ(ParseExpertTensorName("blk.007.ffn_up_exps.weight")->layer, 7u);  // \d+ accepts leading zeros
  for (const char* bad : {"blk..ffn_up_exps.weight", "blk.1.ffn_up_exps.weight.x", "xblk.1.ffn_up_exps.weight",
                          "blk.1.ffn_up_shexp.weight", "blk.1.ffn_Up_exps.weight", "blk.-1.ffn_up_exps.weight"}) {
    EXPECT_FALSE(ParseExpertTensorName(bad)) << bad;
  }
  // Python's int() has no bound: SGLang's coverage check lists such a layer as extra.
  EXPECT_EQ(ParseExpertTensorName("blk.99999999999.ffn_up_exps.weight")->layer, 99999999999u);
  EXPECT_EQ(ParseExpertTensorName("blk.007.ffn_up_exps.weight")->layer_text, "7");
  // Past 64 bits the value saturates and the text keeps the int (it was no
  // match, so such a stack was no stack to `pack` and the doctor).
  auto huge = ParseExpertTensorName("blk.099999999999999999999.ffn_up_exps.weight");
  ASSERT_TRUE(huge);
  EXPECT_EQ(huge->layer, UINT64_MAX);
  EXPECT_EQ(huge->layer_text, "99999999999999999999");
  EXPECT_EQ(ParseExpertTensorName("blk.18446744073709551615.ffn_up_exps.weight")->layer_text, "18446744073709551615");
  EXPECT_TRUE(PyIntTextLess("18446744073709551615", "18446744073709551616"));
  EXPECT_TRUE(PyIntTextLess("9", "10"));
  EXPECT_FALSE(PyIntTextLess("10", "10"));
  EXPECT_EQ(ExpertTensorName(3, Role::kDown), "blk.3.ffn_down_exps.weight");
}

// SGLang's scanner keys routed stacks by int() of a Python `\d+` match: an
// Arabic-Indic "blk.\u0663" is layer 3 there (so it duplicates "blk.3"), and
// its pack index entry, which keeps the GGUF name, is layer 3 to its reader.
TEST(PackFormat, ExpertLayerDigitsAreWhatPythonsBackslashDTakes) {
  auto p = ParseExpertTensorName("blk.\u0663.ffn_up_exps.weight");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->layer, 3u);
  EXPECT_EQ(p->role, Role::kUp);
  auto q = ParseExpertTensorName("blk.\uff19\uff12.ffn_down_exps.weight");  // fullwidth 92
  ASSERT_TRUE(q);
  EXPECT_EQ(q->layer, 92u);
  EXPECT_FALSE(ParseExpertTensorName("blk.\u00b2.ffn_up_exps.weight"));  // superscript two is no \d
}

// Two layers, two experts, role sizes that need padding: hand-computed offsets.
TEST(PackFormat, SmallLayoutByHand) {
  auto l = PackLayout::MakeUniform({1, 2}, 2, {5000, 5000, 3000});
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->index_count(), 12u);
  // 40 + 12*152 = 1864 -> data_start 4096.
  EXPECT_EQ(l->data_start(), 4096u);
  // object: up @0 (5000) -> gate @8192 (5000) -> down @16384 (3000) -> end 19384, stride 20480.
  const uint64_t want[12] = {4096,         4096 + 8192,          4096 + 16384,
                             4096 + 20480, 4096 + 20480 + 8192,  4096 + 20480 + 16384,
                             4096 + 40960, 4096 + 40960 + 8192,  4096 + 40960 + 16384,
                             4096 + 61440, 4096 + 61440 + 8192,  4096 + 61440 + 16384};
  const char* names[3] = {"up", "gate", "down"};
  for (uint64_t i = 0; i < 12; ++i) {
    auto s = l->Entry(i);
    EXPECT_EQ(s.offset, want[i]) << i;
    EXPECT_EQ(s.layer, i < 6 ? 1u : 2u);
    EXPECT_EQ(s.expert, (i / 3) % 2);
    EXPECT_STREQ(RoleName(s.role), names[i % 3]);
    EXPECT_EQ(s.nbytes, i % 3 == 2 ? 3000u : 5000u);
  }
  EXPECT_EQ(l->final_size(), 4096u + 61440 + 16384 + 3000);  // no tail padding
  EXPECT_EQ(l->ObjectBytes(0), 19384u);
  EXPECT_FALSE(l->RolesContiguous());

  // Index digest over header + entries, built here independently.
  std::vector<uint8_t> bytes;
  const char* magic = "GGMLMOEPACKv1\0\0\0";
  bytes.insert(bytes.end(), magic, magic + 16);
  Le(bytes, 1, 4);
  Le(bytes, 40, 4);
  Le(bytes, 12, 8);
  Le(bytes, 4096, 8);
  for (uint64_t i = 0; i < 12; ++i) {
    std::string n = "blk." + std::to_string(i < 6 ? 1 : 2) + ".ffn_" + names[i % 3] + "_exps.weight";
    size_t start = bytes.size();
    bytes.insert(bytes.end(), n.begin(), n.end());
    bytes.resize(start + 128, 0);
    Le(bytes, (i / 3) % 2, 4);
    Le(bytes, 0, 4);
    Le(bytes, want[i], 8);
    Le(bytes, i % 3 == 2 ? 3000 : 5000, 8);
  }
  EXPECT_EQ(l->IndexSha256(), Sha256Hex(bytes.data(), bytes.size()));
  auto prefix = l->EncodePrefix();
  ASSERT_EQ(prefix.size(), 4096u);
  EXPECT_EQ(0, std::memcmp(prefix.data(), bytes.data(), bytes.size()));
  for (size_t i = bytes.size(); i < prefix.size(); ++i) ASSERT_EQ(prefix[i], 0) << i;
}

TEST(PackFormat, MixedLayerSizes) {
  auto l = PackLayout::Make({{1, {4096, 4096, 8192}}, {2, {100, 100, 100}}}, 3);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->data_start(), 4096u);
  EXPECT_EQ(l->ObjectBytes(0), 16384u);
  EXPECT_EQ(l->Entry(9).offset, 4096u + 3 * 16384);  // layer 2 expert 0 up
  EXPECT_EQ(l->Entry(10).offset, 4096u + 3 * 16384 + 4096);
  EXPECT_EQ(l->Entry(12).offset, 4096u + 3 * 16384 + 12288);  // layer 2 expert 1 up (stride 12288)
  EXPECT_EQ(l->final_size(), 4096u + 3 * 16384 + 2 * 12288 + 8192 + 100);
  EXPECT_FALSE(l->Uniform());
}

// Spec §1.2: the real Kimi-K3 numbers.
TEST(PackFormat, KimiK3Numbers) {
  std::vector<uint32_t> layers;
  for (uint32_t i = 1; i <= 92; ++i) layers.push_back(i);
  auto l = PackLayout::MakeUniform(layers, 896, {3612672, 3612672, 4730880});
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->index_count(), 247296u);
  EXPECT_EQ(l->index_end(), 37589032u);
  EXPECT_EQ(l->data_start(), 37593088u);
  EXPECT_EQ(l->final_size(), 985613049856ull);
  EXPECT_EQ(l->ObjectBytes(0), 11956224u);
  EXPECT_TRUE(l->RolesContiguous());
  auto last = l->Entry(247295);
  EXPECT_EQ(last.layer, 92u);
  EXPECT_EQ(last.expert, 895u);
  EXPECT_EQ(last.offset, 37593088ull + 82431ull * 11956224 + 7225344);
}

TEST(PackFormat, SampleSelection) {
  EXPECT_EQ(SampleIndices(247296, 6), (std::vector<uint64_t>{0, 49459, 98918, 148377, 197836, 247295}));
  EXPECT_TRUE(SampleIndices(10, 0).empty());
  EXPECT_TRUE(SampleIndices(10, -3).empty());
  EXPECT_EQ(SampleIndices(10, 1), (std::vector<uint64_t>{0}));
  // round-half-even: i*(5-1)/(3-1)... n=6,k=5 -> 0, 1.25->1, 2.5->2, 3.75->4, 5
  EXPECT_EQ(SampleIndices(6, 5), (std::vector<uint64_t>{0, 1, 2, 4, 5}));
  // duplicates collapse: n=2, k=4 -> 0, 0.33->0, 0.67->1, 1
  EXPECT_EQ(SampleIndices(2, 4), (std::vector<uint64_t>{0, 1}));
  // n=4,k=3: 0, 1.5->2, 3 ; n=2,k=3: 0, 0.5->0, 1
  EXPECT_EQ(SampleIndices(4, 3), (std::vector<uint64_t>{0, 2, 3}));
  EXPECT_EQ(SampleIndices(2, 3), (std::vector<uint64_t>{0, 1}));
}

// From k >= n on, SampleIndices returns every entry without running SGLang's
// k-step loop (a --samples of 10^14 looped for hours). The shortcut must be
// what the loop gives: SGLang's rule written out here, the duplicates
// collapsed, for every n up to 40 and k from n to 3n.
TEST(PackFormat, SampleSelectionOfAtLeastEveryEntryIsEveryEntryOnce) {
  auto sglang = [](uint64_t n, uint64_t k) {
    std::vector<uint64_t> out;
    for (uint64_t i = 0; i < k; ++i) {
      const uint64_t num = i * (n - 1), den = k - 1;
      uint64_t q = num / den;
      const uint64_t rem = num % den;
      if (2 * rem > den || (2 * rem == den && (q & 1))) ++q;  // round half to even
      if (out.empty() || out.back() != q) out.push_back(q);
    }
    return out;
  };
  for (uint64_t n = 2; n <= 40; ++n) {
    std::vector<uint64_t> all(n);
    for (uint64_t i = 0; i < n; ++i) all[i] = i;
    for (uint64_t k = n; k <= 3 * n; ++k) {
      ASSERT_EQ(sglang(n, k), all) << "n=" << n << " k=" << k;
      ASSERT_EQ(SampleIndices(n, static_cast<int64_t>(k)), all) << "n=" << n << " k=" << k;
    }
  }
  EXPECT_EQ(SampleIndices(144, INT64_MAX).size(), 144u);  // at once
}

}  // namespace
}  // namespace k3pack::pack
