// Faults a C++ integrator's audit of include/k3pack/gguf.h found
// (docs/RELIABILITY.md, "Faults from a C++ integrator's audit (session 15)").
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <vector>

#include "gguf_test_util.h"
#include "k3pack/gguf.h"

namespace k3pack::gguf {
namespace {

// ShardSet::FindTensor gives (info, shard_index); handing the info to the
// wrong shard's TensorData (set.first() is the easy mistake) gave a view at
// that offset of the wrong file: wrong bytes, or past the end of its mapping.
TEST(CppIntegratorAudit, TensorDataOfAnotherFilesTensorIsEmpty) {
  const auto dir = k3test::TempDir("capi");
  std::vector<float> big(16384, 1.0f);
  const std::vector<TensorSpec> tensors = {
      {"small", GgmlType::F32, {4}, nullptr},
      {"big", GgmlType::F32, {16384}, [&](uint64_t off, std::span<uint8_t> out) {
         std::memcpy(out.data(), reinterpret_cast<const uint8_t*>(big.data()) + off, out.size());
       }}};
  MetadataBuilder per_shard;
  per_shard.Str("general.architecture", "kimi-k3");
  auto paths = WriteGgufSplit(dir.string(), "K", MetadataBuilder(), per_shard, tensors, {0, 1});
  ASSERT_TRUE(paths.ok()) << paths.error().message();
  auto set = ShardSet::Open(dir.string());
  ASSERT_TRUE(set.ok()) << set.error().message();
  auto at = set->FindTensor("big");
  ASSERT_TRUE(at);
  ASSERT_EQ(at->shard_index, 1u);
  const GgufFile& right = *set->shards()[1];
  EXPECT_EQ(right.TensorData(*at->info).size(), 16384u * 4);
  const TensorInfo copy = *at->info;  // a copy of one of its own tensors still works
  EXPECT_EQ(right.TensorData(copy).data(), right.TensorData(*at->info).data());
  const GgufFile& wrong = set->first();
  ASSERT_LT(wrong.file_size(), at->info->data_offset + at->info->nbytes) << "the view would run past the end";
  EXPECT_TRUE(wrong.TensorData(*at->info).empty());
  // A null mapping is an error, not a null dereference.
  auto parsed = GgufFile::Parse(nullptr);
  ASSERT_FALSE(parsed.ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace k3pack::gguf

namespace k3pack {
namespace {

// GgmlTypeName's view of an unknown id pointed into one reused buffer, so a
// second unknown name changed the first: a message naming both showed the
// second twice.
TEST(CppIntegratorAudit, UnknownTypeNamesStayValid) {
  const std::string_view a = GgmlTypeName(static_cast<GgmlType>(4000));
  const std::string_view b = GgmlTypeName(static_cast<GgmlType>(4001));
  const std::string_view a_again = GgmlTypeName(static_cast<GgmlType>(4000));
  EXPECT_EQ(a, "type#4000");
  EXPECT_EQ(b, "type#4001");
  EXPECT_EQ(a_again.data(), a.data());
  EXPECT_EQ(GgmlTypeName(GgmlType::Q2_K), "Q2_K");
}

}  // namespace
}  // namespace k3pack
