// Conformance of the GGUF reader with ggml's gguf.cpp on files llama.cpp
// accepts but that sit at the edges of the format (docs/CONFORMANCE.md).
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "gguf_test_util.h"
#include "k3pack/gguf.h"
#include "util/file.h"

using namespace k3pack;
using k3test::Bytes;
using k3test::Header;
using k3test::ParseBytes;

// gguf.cpp accepts n_dims == 0 (every ne is 1: a one-element tensor). Such a
// tensor info is 24 bytes plus its name, so with general.alignment = 1 and
// I8 data a valid file holds more tensors than (bytes left) / 32: the count
// bound used before reserving memory must not assume at least one dimension.
TEST(GgufConformance, ManyZeroDimTensorsAtAlignmentOne) {
  constexpr int kTensors = 40;
  Bytes x = Header(3, kTensors, 1);
  x.str("general.alignment").put<uint32_t>(4).put<uint32_t>(1);
  for (int i = 0; i < kTensors; ++i) {
    x.str(std::string(1, static_cast<char>('A' + i)));
    x.put<uint32_t>(0);                       // n_dims = 0
    x.put<uint32_t>(24);                      // I8
    x.put<uint64_t>(static_cast<uint64_t>(i));  // packed, 1-byte padded
  }
  for (int i = 0; i < kTensors; ++i) x.put<int8_t>(static_cast<int8_t>(i - 20));
  auto r = ParseBytes(x.b);
  ASSERT_TRUE(r.ok()) << r.error().message();
  ASSERT_EQ((*r)->tensors().size(), static_cast<size_t>(kTensors));
  const gguf::TensorInfo& t = (*r)->tensors()[7];
  EXPECT_EQ(t.n_dims, 0u);
  EXPECT_EQ(t.n_elements(), 1);
  EXPECT_EQ(t.nbytes, 1u);
  EXPECT_EQ(static_cast<int8_t>((*r)->TensorData(t)[0]), -13);
}

// Version 0 is "bad GGUF version 0" in gguf.cpp, checked before the
// byte-order test; it is not a big-endian file.
TEST(GgufConformance, VersionZeroIsNotReportedAsByteSwapped) {
  Bytes x = Header(0, 0, 0);
  auto r = ParseBytes(x.b);
  ASSERT_FALSE(r.ok());
  const std::string m = r.error().message();
  EXPECT_NE(m.find("crafted.gguf: offset 4: "), std::string::npos) << m;
  EXPECT_NE(m.find("bad GGUF version 0"), std::string::npos) << m;
  EXPECT_EQ(m.find("byte-swapped"), std::string::npos) << m;
}

// The doc's ggml type table (ids 0..42): block size, type size and the
// gguf-py name for every id, removed ids with block size 0.
TEST(GgufConformance, TypeTableMatchesTheDocForEveryId) {
  struct Row { const char* name; uint32_t block, size; };
  const Row kDoc[43] = {
      {"F32", 1, 4},        {"F16", 1, 2},       {"Q4_0", 32, 18},    {"Q4_1", 32, 20},   {"", 0, 0},
      {"", 0, 0},           {"Q5_0", 32, 22},    {"Q5_1", 32, 24},    {"Q8_0", 32, 34},   {"Q8_1", 32, 36},
      {"Q2_K", 256, 84},    {"Q3_K", 256, 110},  {"Q4_K", 256, 144},  {"Q5_K", 256, 176}, {"Q6_K", 256, 210},
      {"Q8_K", 256, 292},   {"IQ2_XXS", 256, 66}, {"IQ2_XS", 256, 74}, {"IQ3_XXS", 256, 98}, {"IQ1_S", 256, 50},
      {"IQ4_NL", 32, 18},   {"IQ3_S", 256, 110}, {"IQ2_S", 256, 82},  {"IQ4_XS", 256, 136}, {"I8", 1, 1},
      {"I16", 1, 2},        {"I32", 1, 4},       {"I64", 1, 8},       {"F64", 1, 8},      {"IQ1_M", 256, 56},
      {"BF16", 1, 2},       {"", 0, 0},          {"", 0, 0},          {"", 0, 0},         {"TQ1_0", 256, 54},
      {"TQ2_0", 256, 66},   {"", 0, 0},          {"", 0, 0},          {"", 0, 0},         {"MXFP4", 32, 17},
      {"NVFP4", 64, 36},    {"Q1_0", 128, 18},   {"Q2_0", 64, 18},
  };
  ASSERT_EQ(kGgmlTypeCount, 43u);
  for (uint32_t id = 0; id < 43; ++id) {
    const GgmlTypeInfo* info = GgmlTypeInfoFor(id);
    ASSERT_NE(info, nullptr) << id;
    EXPECT_EQ(info->block_size, kDoc[id].block) << id;
    EXPECT_EQ(info->block_size == 0 ? 0u : info->type_size, kDoc[id].size) << id;
    EXPECT_STREQ(info->name, kDoc[id].name) << id;
    EXPECT_EQ(IsValidGgmlType(id), kDoc[id].block != 0) << id;
    if (kDoc[id].block != 0) {
      EXPECT_EQ(GgmlTypeFromName(kDoc[id].name), static_cast<GgmlType>(id)) << id;
      EXPECT_EQ(GgmlRowBytes(static_cast<GgmlType>(id), 2 * uint64_t{kDoc[id].block}), 2 * uint64_t{kDoc[id].size});
    }
  }
}
