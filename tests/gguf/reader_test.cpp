#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <limits>

#include "gguf_test_util.h"
#include "k3pack/gguf.h"
#include "util/file.h"

using namespace k3pack;
using k3test::Bytes;
using k3test::Header;
using k3test::ParseBytes;

namespace {

// Expects a parse failure whose message names the file and contains `rule`.
void ExpectReject(const std::string& b, const std::string& rule) {
  auto r = ParseBytes(b);
  ASSERT_FALSE(r.ok()) << "accepted a file that breaks: " << rule;
  EXPECT_NE(r.error().message().find("crafted.gguf: offset "), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().message().find(rule), std::string::npos) << r.error().message();
}

// One F32 tensor "t" of `ne0` elements, with one u32 key.
Bytes OneTensorFile(int64_t ne0 = 8, uint32_t type = 0, uint64_t offset = 0) {
  Bytes x = Header(3, 1, 1);
  x.str("general.architecture").put<uint32_t>(8).str("kimi-k3");
  x.str("t").put<uint32_t>(1).put<int64_t>(ne0).put<uint32_t>(type).put<uint64_t>(offset);
  x.pad(32);
  x.raw(std::string(static_cast<size_t>(ne0) * 4, '\x01'));
  return x;
}

}  // namespace

TEST(GgufReader, ParsesMinimalFile) {
  auto r = ParseBytes(OneTensorFile().b);
  ASSERT_TRUE(r.ok()) << r.error().message();
  const auto& f = **r;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.architecture(), "kimi-k3");
  ASSERT_EQ(f.tensors().size(), 1u);
  EXPECT_EQ(f.tensors()[0].nbytes, 32u);
  EXPECT_EQ(f.data_offset() % 32, 0u);
  EXPECT_EQ(f.TensorData(f.tensors()[0]).data(), f.mapping()->data() + f.data_offset());
}

TEST(GgufReader, RejectsBadMagicAndVersions) {
  Bytes x = OneTensorFile();
  std::string b = x.b;
  b[0] = 'X';
  ExpectReject(b, "not a GGUF file");
  for (uint32_t v : {0u, 4u}) {
    b = x.b;
    std::memcpy(&b[4], &v, 4);
    ExpectReject(b, v == 0 ? "bad GGUF version 0" : "unsupported GGUF version 4");
  }
  b = x.b;
  uint32_t one = 1;
  std::memcpy(&b[4], &one, 4);
  ExpectReject(b, "GGUF v1 is no longer supported");
  b = x.b;
  uint32_t big = 0x03000000;  // a v3 file written big-endian
  std::memcpy(&b[4], &big, 4);
  ExpectReject(b, "big-endian");
}

TEST(GgufReader, AcceptsVersion2) {
  std::string b = OneTensorFile().b;
  uint32_t two = 2;
  std::memcpy(&b[4], &two, 4);
  ASSERT_TRUE(ParseBytes(b).ok());
}

TEST(GgufReader, RejectsImpossibleCounts) {
  ExpectReject(Header(3, -1, 0).b, "tensor count -1");
  ExpectReject(Header(3, 0, 1ll << 40).b, "key/value count");
  ExpectReject(Header(3, 1ll << 40, 0).b, "tensor count");
}

TEST(GgufReader, RejectsBadKeys) {
  Bytes empty = Header(3, 0, 1);
  empty.str("").put<uint32_t>(4).put<uint32_t>(1);
  ExpectReject(empty.b, "is empty");

  Bytes dup = Header(3, 0, 2);
  dup.str("a").put<uint32_t>(4).put<uint32_t>(1).str("a").put<uint32_t>(4).put<uint32_t>(2);
  ExpectReject(dup.b, "duplicate metadata key 'a'");

  Bytes badtype = Header(3, 0, 1);
  badtype.str("a").put<uint32_t>(13).put<uint32_t>(1);
  ExpectReject(badtype.b, "invalid value type 13");
}

TEST(GgufReader, RejectsBadStringsAndArrays) {
  Bytes longstr = Header(3, 0, 1);
  longstr.str("a").put<uint32_t>(8).put<uint64_t>(1000).raw("short");
  ExpectReject(longstr.b, "exceeds the 5 bytes left");

  Bytes hugestr = Header(3, 0, 1);
  hugestr.str("a").put<uint32_t>(8).put<uint64_t>((1ull << 30) + 1);
  ExpectReject(hugestr.b, "1 GiB string limit");

  Bytes nested = Header(3, 0, 1);
  nested.str("a").put<uint32_t>(9).put<uint32_t>(9).put<uint64_t>(0);
  ExpectReject(nested.b, "nested arrays are not allowed");

  Bytes badelem = Header(3, 0, 1);
  badelem.str("a").put<uint32_t>(9).put<uint32_t>(13).put<uint64_t>(0);
  ExpectReject(badelem.b, "key 'a' has invalid array element type 13 (valid types are 0..12)");

  Bytes toomany = Header(3, 0, 1);
  toomany.str("a").put<uint32_t>(9).put<uint32_t>(0).put<uint64_t>((1ull << 30) + 1);
  ExpectReject(toomany.b, "above the limit");

  Bytes short_arr = Header(3, 0, 1);
  short_arr.str("a").put<uint32_t>(9).put<uint32_t>(6).put<uint64_t>(100).put<float>(1.f);
  ExpectReject(short_arr.b, "needs at least 400 bytes");

  Bytes strarr = Header(3, 0, 1);
  strarr.str("a").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(1000);
  ExpectReject(strarr.b, "needs at least 8000 bytes");
}

TEST(GgufReader, ChecksAlignmentKey) {
  Bytes wrongtype = Header(3, 0, 1);
  wrongtype.str("general.alignment").put<uint32_t>(10).put<uint64_t>(64);
  ExpectReject(wrongtype.b, "general.alignment must be UINT32");
  for (uint32_t a : {0u, 48u}) {
    Bytes x = Header(3, 0, 1);
    x.str("general.alignment").put<uint32_t>(4).put<uint32_t>(a);
    ExpectReject(x.b, "nonzero power of two");
  }
  Bytes ok = Header(3, 1, 1);
  ok.str("general.alignment").put<uint32_t>(4).put<uint32_t>(64);
  ok.str("t").put<uint32_t>(1).put<int64_t>(4).put<uint32_t>(0).put<uint64_t>(0).pad(64).raw(std::string(16, 'x'));
  auto r = ParseBytes(ok.b);
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ((*r)->alignment(), 64u);
  EXPECT_EQ((*r)->data_offset() % 64, 0u);
}

TEST(GgufReader, RejectsBadTensorInfos) {
  auto tensor_file = [](const std::string& name, uint32_t n_dims, std::vector<int64_t> ne, uint32_t type,
                        uint64_t offset = 0) {
    Bytes x = Header(3, 1, 0);
    x.str(name).put<uint32_t>(n_dims);
    for (int64_t d : ne) x.put<int64_t>(d);
    x.put<uint32_t>(type).put<uint64_t>(offset).pad(32).raw(std::string(4096, '\0'));
    return x.b;
  };
  ExpectReject(tensor_file(std::string(64, 'n'), 1, {4}, 0), "ggml allows at most 63");
  EXPECT_TRUE(ParseBytes(tensor_file(std::string(63, 'n'), 1, {4}, 0)).ok());
  ExpectReject(tensor_file("t", 5, {1, 1, 1, 1, 1}, 0), "5 dimensions; at most 4");
  ExpectReject(tensor_file("t", 1, {-4}, 0), "negative ne[0]");
  ExpectReject(tensor_file("t", 2, {1ll << 40, 1ll << 40}, 0), "overflows int64");
  ExpectReject(tensor_file("t", 1, {4}, 43), "unknown ggml type 43");
  for (uint32_t removed : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u}) {
    ExpectReject(tensor_file("t", 1, {32}, removed), "removed from the GGUF format");
  }
  ExpectReject(tensor_file("t", 1, {100}, 10), "not a multiple of the Q2_K block size 256");
  ExpectReject(tensor_file("t", 1, {4}, 0, 32), "has offset 32, expected 0");
  ExpectReject(tensor_file("t", 1, {2048}, 0), "is not within the file");
  // 4 x (2^62 - 7) bytes fit 64 bits; padded to the alignment they do not.
  ExpectReject(tensor_file("t", 1, {(1ll << 62) - 7}, 0), "tensor 't' data size overflows");

  Bytes dup = Header(3, 2, 0);
  dup.str("t").put<uint32_t>(1).put<int64_t>(8).put<uint32_t>(0).put<uint64_t>(0);
  dup.str("t").put<uint32_t>(1).put<int64_t>(8).put<uint32_t>(0).put<uint64_t>(32);
  dup.pad(32).raw(std::string(64, '\0'));
  ExpectReject(dup.b, "duplicate tensor name 't'");
}

TEST(GgufReader, EmptyTensorWithHugeExtentsDoesNotOverflow) {
  // Found by fuzz/gguf_reader_fuzz.cpp: a zero extent skips ggml's overflow
  // guard, so the other extents may be huge; the element count must be 0.
  Bytes x = Header(3, 1, 0);
  x.str("t").put<uint32_t>(4).put<int64_t>(1ll << 40).put<int64_t>(1ll << 40).put<int64_t>(1ll << 40).put<int64_t>(0);
  x.put<uint32_t>(0).put<uint64_t>(0).pad(32);
  auto r = ParseBytes(x.b);
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ((*r)->tensors()[0].n_elements(), 0);
  EXPECT_EQ((*r)->tensors()[0].n_rows(), 0u);
  EXPECT_EQ((*r)->tensors()[0].nbytes, 0u);
}

TEST(GgufReader, FloatArrayReadAsIntegersSaturates) {
  // Found by fuzz/gguf_reader_fuzz.cpp (UBSan, input
  // fuzz/corpus/gguf_reader/regression-float-array-to-int): casting an
  // out-of-range float to int64_t is undefined; ArrayInt saturates instead.
  Bytes x = Header(3, 0, 2);
  x.str("f32").put<uint32_t>(9).put<uint32_t>(6).put<uint64_t>(4);
  x.put<float>(1.5e25f).put<float>(-1.5e25f).put<float>(std::numeric_limits<float>::quiet_NaN()).put<float>(-2.9f);
  x.str("f64").put<uint32_t>(9).put<uint32_t>(12).put<uint64_t>(2).put<double>(9.3e18).put<double>(-4e18);
  auto r = ParseBytes(x.b);
  ASSERT_TRUE(r.ok()) << r.error().message();
  const gguf::Value* f = (*r)->Find("f32");
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->ArrayInt(0), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(f->ArrayInt(1), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(f->ArrayInt(2), 0);
  EXPECT_EQ(f->ArrayInt(3), -2);
  const gguf::Value* d = (*r)->Find("f64");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->ArrayInt(0), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(d->ArrayInt(1), -4000000000000000000ll);
}

TEST(GgufReader, Uint64ArrayElementsAboveInt64MaxKeepTheirValue) {
  // ArrayInt used to wrap 2^64-1 to -1 (and ArrayFloat with it), so
  // `inspect --json` showed a negative number where gguf-py shows the value.
  Bytes x = Header(3, 0, 1);
  x.str("u64").put<uint32_t>(9).put<uint32_t>(10).put<uint64_t>(3);
  x.put<uint64_t>(std::numeric_limits<uint64_t>::max()).put<uint64_t>(uint64_t{1} << 63).put<uint64_t>(7);
  auto r = ParseBytes(x.b);
  ASSERT_TRUE(r.ok()) << r.error().message();
  const gguf::Value* v = (*r)->Find("u64");
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->ArrayUint64(0), std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(v->ArrayUint64(1), uint64_t{1} << 63);
  EXPECT_EQ(v->ArrayInt(0), std::numeric_limits<int64_t>::max());  // saturated, never negative
  EXPECT_EQ(v->ArrayInt(1), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(v->ArrayInt(2), 7);
  EXPECT_DOUBLE_EQ(v->ArrayFloat(0), 18446744073709551615.0);
  EXPECT_DOUBLE_EQ(v->ArrayFloat(1), 9223372036854775808.0);
}

TEST(GgufReader, EveryTruncationIsRejectedWithoutCrash) {
  const std::string full = OneTensorFile(64).b;
  ASSERT_TRUE(ParseBytes(full).ok());
  for (size_t n = 0; n < full.size(); ++n) {
    auto r = ParseBytes(full.substr(0, n));
    EXPECT_FALSE(r.ok()) << "prefix of " << n << " bytes accepted";
  }
}

TEST(GgufTypes, TableMatchesGgml) {
  EXPECT_STREQ(GgmlTypeInfoFor(10)->name, "Q2_K");
  EXPECT_EQ(GgmlTypeInfoFor(10)->type_size, 84u);
  EXPECT_EQ(GgmlTypeInfoFor(11)->type_size, 110u);
  EXPECT_EQ(GgmlTypeInfoFor(17)->type_size, 74u);
  EXPECT_STREQ(GgmlTypeInfoFor(39)->name, "MXFP4");
  EXPECT_EQ(GgmlTypeInfoFor(39)->type_size, 17u);
  EXPECT_EQ(GgmlTypeInfoFor(40)->block_size, 64u);
  EXPECT_EQ(GgmlTypeInfoFor(43), nullptr);
  EXPECT_FALSE(IsValidGgmlType(4));
  EXPECT_EQ(GgmlTypeFromName("IQ2_XS"), GgmlType::IQ2_XS);
  EXPECT_FALSE(GgmlTypeFromName("q2_K").has_value());
  int valid = 0;
  for (uint32_t i = 0; i < kGgmlTypeCount; ++i) valid += IsValidGgmlType(i);
  EXPECT_EQ(valid, 35);
}
