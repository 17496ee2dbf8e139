// The writer refuses what ggml's reader would refuse, before it writes
// anything (docs/CONFORMANCE.md, GGUF reader).
#include <gtest/gtest.h>

#include <filesystem>

#include "gguf_test_util.h"
#include "k3pack/gguf.h"

using namespace k3pack;
using namespace k3pack::gguf;
namespace fs = std::filesystem;

namespace {

TensorSpec F32Tensor(const std::string& name, int64_t n) {
  return {name, GgmlType::F32, {n}, [](uint64_t, std::span<uint8_t> out) { std::fill(out.begin(), out.end(), 0); }};
}

}  // namespace

// gguf.cpp: "duplicate tensor name"; llama.cpp's split loader: "tensor '%s'
// is duplicated". A writer must not produce either.
TEST(GgufWriterConformance, DuplicateTensorNamesAreRefused) {
  auto dir = k3test::TempDir("writer-dup");
  MetadataBuilder m;
  m.Str("general.architecture", "kimi-k3");
  const std::string path = (dir / "dup.gguf").string();
  auto st = WriteGguf(path, m, {F32Tensor("t", 8), F32Tensor("u", 8), F32Tensor("t", 8)});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("duplicate tensor name 't'"), std::string::npos) << st.message();
  EXPECT_FALSE(fs::exists(path));

  // Across the shards of a split set too (each shard alone would be valid).
  auto split = WriteGgufSplit(dir.string(), "DUP", m, {}, {F32Tensor("t", 8), F32Tensor("t", 8)}, {0, 1});
  ASSERT_FALSE(split.ok());
  EXPECT_NE(split.error().message().find("duplicate tensor name 't'"), std::string::npos) << split.error().message();
  EXPECT_FALSE(fs::exists(dir / "DUP-00001-of-00002.gguf"));
}

// split.count and split.no are UINT16: 65536 shards would be recorded as 0.
// The check comes before anything is created (the directory here cannot be).
TEST(GgufWriterConformance, ShardCountMustFitSplitCountsUint16) {
  MetadataBuilder m;
  m.Str("general.architecture", "kimi-k3");
  auto r = WriteGgufSplit("/proc/k3pack-cannot-create-this", "X", m, {}, {F32Tensor("t", 8)}, {65535});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("65535"), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().message().find("UINT16"), std::string::npos) << r.error().message();
}

// The element count overflows int64 (ggml's guard), so no byte size exists.
TEST(GgufWriterConformance, ElementCountOverflowIsRefused) {
  auto dir = k3test::TempDir("writer-overflow");
  MetadataBuilder m;
  TensorSpec t{"huge", GgmlType::F32, {int64_t{1} << 32, int64_t{1} << 32}, nullptr};
  auto st = WriteGguf((dir / "o.gguf").string(), m, {t});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("element count overflows"), std::string::npos) << st.message();
}
