// ComputeStats reports its progress inside a tensor. `inspect --stats` on a
// full-size checkpoint decodes expert stacks of several GB each (3.5 minutes
// for one on the k3-structure model, at 17-38 MB/s on the shared machine) and
// used to say nothing until the tensor was done.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "k3pack/quant.h"

namespace k3pack::quant {
namespace {

TEST(StatsProgress, CallsBackEveryChunkOfRowsWithTheSameStatistics) {
  constexpr int64_t kNe0 = 64;
  constexpr uint64_t kRows = 1000;
  const uint64_t row_bytes = GgmlRowBytes(GgmlType::Q8_0, kNe0);
  ASSERT_EQ(row_bytes, 68u);
  std::vector<uint8_t> bytes(row_bytes * kRows);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 37 + 11);
  for (size_t b = 0; b < bytes.size(); b += 34) {  // every block's fp16 scale: 0.5
    bytes[b] = 0x00;
    bytes[b + 1] = 0x38;
  }
  auto plain = ComputeStats(GgmlType::Q8_0, bytes, kNe0, kRows);
  ASSERT_TRUE(plain.ok()) << plain.error().message();
  std::vector<uint64_t> calls;
  auto chunked = ComputeStats(GgmlType::Q8_0, bytes, kNe0, kRows, 10 * row_bytes,
                              [&](uint64_t rows_done) { calls.push_back(rows_done); });
  ASSERT_TRUE(chunked.ok()) << chunked.error().message();
  ASSERT_EQ(calls.size(), kRows / 10);
  for (size_t i = 0; i < calls.size(); ++i) EXPECT_EQ(calls[i], (i + 1) * 10);
  EXPECT_EQ(chunked->min, plain->min);
  EXPECT_EQ(chunked->max, plain->max);
  EXPECT_EQ(chunked->mean, plain->mean);
  EXPECT_EQ(chunked->count, plain->count);
  EXPECT_EQ(chunked->nan_count, plain->nan_count);
  EXPECT_NE(plain->min, plain->max);
}

// A [512, 0] tensor is valid GGUF (no bytes): before, decoding its zero rows
// failed with "512 F32 elements need 2048 bytes, got 0".
TEST(StatsProgress, ZeroRowsOfAnEmptyTensorDecodeToNothing) {
  for (GgmlType t : {GgmlType::F32, GgmlType::Q8_0}) {
    auto values = DequantizeRows(t, {}, 512, 0);
    ASSERT_TRUE(values.ok()) << values.error().message();
    EXPECT_TRUE(values->empty());
    auto stats = ComputeStats(t, {}, 512, 0);
    ASSERT_TRUE(stats.ok()) << stats.error().message();
    EXPECT_EQ(stats->count, 0u);
  }
  EXPECT_FALSE(DequantizeRows(GgmlType::Q8_0, {}, 100, 0).ok()) << "a row length off the block size stays refused";
}

}  // namespace
}  // namespace k3pack::quant
