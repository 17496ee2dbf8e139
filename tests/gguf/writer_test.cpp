#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "gguf_test_util.h"
#include "k3pack/gguf.h"

using namespace k3pack;
using namespace k3pack::gguf;
namespace fs = std::filesystem;

namespace {

std::vector<TensorSpec> SomeTensors() {
  std::vector<TensorSpec> t;
  auto fill_byte = [](uint8_t v) {
    return [v](uint64_t off, std::span<uint8_t> out) {
      for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(v + off + i);
    };
  };
  t.push_back({"a.weight", GgmlType::F32, {5, 3}, fill_byte(1)});
  t.push_back({"b.weight", GgmlType::Q2_K, {256, 2, 3}, fill_byte(7)});
  t.push_back({"hole.weight", GgmlType::Q8_0, {64, 4}, nullptr});
  t.push_back({"c.bias", GgmlType::F16, {9}, fill_byte(3)});
  return t;
}

MetadataBuilder SomeMeta() {
  MetadataBuilder m;
  m.Str("general.architecture", "kimi-k3").U32("kimi-k3.block_count", 4).F32("f", 1.5f).Bool("b", true);
  m.StrArray("tokens", {"a", "", "ünï"}).I32Array("ints", {1, -2, 3}).F32Array("floats", {0.5f});
  m.U64("big", 1ull << 40).U8("u8", 200).U16("u16", 60000);
  return m;
}

}  // namespace

TEST(GgufWriter, RoundTripIsExact) {
  auto dir = k3test::TempDir("writer");
  const std::string path = (dir / "m.gguf").string();
  auto tensors = SomeTensors();
  ASSERT_TRUE(WriteGguf(path, SomeMeta(), tensors).ok());
  auto r = GgufFile::Open(path);
  ASSERT_TRUE(r.ok()) << r.error().message();
  const GgufFile& f = **r;
  EXPECT_EQ(f.Find("general.architecture")->str, "kimi-k3");
  EXPECT_EQ(*f.Find("kimi-k3.block_count")->AsInt(), 4);
  EXPECT_EQ(f.Find("f")->f64, 1.5);
  EXPECT_EQ(f.Find("b")->u64, 1u);
  EXPECT_EQ(f.Find("tokens")->strings, (std::vector<std::string>{"a", "", "ünï"}));
  EXPECT_EQ(f.Find("ints")->ArrayInt(1), -2);
  EXPECT_EQ(f.Find("floats")->ArrayFloat(0), 0.5);
  EXPECT_EQ(f.Find("big")->u64, 1ull << 40);
  EXPECT_EQ(f.Find("u16")->type, ValueType::kUint16);
  ASSERT_EQ(f.tensors().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo& t = f.tensors()[i];
    EXPECT_EQ(t.name, tensors[i].name);
    EXPECT_EQ(t.type, tensors[i].type);
    EXPECT_EQ(t.shape(), tensors[i].ne);
    EXPECT_EQ(t.offset % 32, 0u);
    auto data = f.TensorData(t);
    std::vector<uint8_t> expect(data.size(), 0);
    if (tensors[i].fill) tensors[i].fill(0, expect);
    EXPECT_TRUE(std::equal(data.begin(), data.end(), expect.begin())) << t.name;
  }
  EXPECT_EQ(f.tensors()[1].nbytes, 6u * 84u);
  fs::remove_all(dir);
}

TEST(GgufWriter, SplitSetCarriesSplitKeysAndOpens) {
  auto dir = k3test::TempDir("split");
  MetadataBuilder per_shard;
  per_shard.Str("general.architecture", "kimi-k3");
  auto paths = WriteGgufSplit(dir.string(), "M", SomeMeta(), per_shard, SomeTensors(), {0, 0, 1, 2});
  ASSERT_TRUE(paths.ok()) << paths.error().message();
  ASSERT_EQ(paths->size(), 3u);
  EXPECT_EQ(fs::path((*paths)[2]).filename(), "M-00003-of-00003.gguf");
  auto set = ShardSet::Open(dir.string());
  ASSERT_TRUE(set.ok()) << set.error().message();
  EXPECT_EQ(set->shards().size(), 3u);
  EXPECT_EQ(set->tensor_count(), 4u);
  EXPECT_EQ(set->prefix(), "M");
  EXPECT_TRUE(set->first().Find("tokens") != nullptr);
  EXPECT_TRUE(set->shards()[1]->Find("tokens") == nullptr);  // only shard 0 has full metadata
  EXPECT_EQ(*set->shards()[2]->Find("split.no")->AsInt(), 2);
  EXPECT_EQ(set->FindTensor("c.bias")->shard_index, 2u);
  // Opening from any one shard finds the same set.
  auto again = ShardSet::Open((*paths)[1]);
  ASSERT_TRUE(again.ok()) << again.error().message();
  EXPECT_EQ(again->shards().size(), 3u);
  fs::remove_all(dir);
}

TEST(GgufWriter, HolesStaySparse) {
  auto dir = k3test::TempDir("sparse");
  const std::string path = (dir / "h.gguf").string();
  std::vector<TensorSpec> t{{"big", GgmlType::Q2_K, {256, 64 * 1024}, nullptr}};  // 5.5 MB of hole
  ASSERT_TRUE(WriteGguf(path, MetadataBuilder(), t).ok());
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_GT(st.st_size, 5'000'000);
  EXPECT_LT(st.st_blocks * 512, 1'000'000);
  fs::remove_all(dir);
}

// WriteOptions::alignment becomes the file's general.alignment, so ggml's rule
// for that key (nonzero, a power of two) holds for it too. 0 used to divide
// by zero (SIGFPE) while padding, and 24 wrote a file its own reader refuses.
TEST(GgufWriter, AlignmentMustBeANonzeroPowerOfTwo) {
  auto dir = k3test::TempDir("alignment");
  const std::string path = (dir / "a.gguf").string();
  MetadataBuilder per_shard;
  for (uint32_t a : {24u, 3u, 0u}) {
    WriteOptions o;
    o.alignment = a;
    Status s = WriteGguf(path, SomeMeta(), SomeTensors(), o);
    ASSERT_FALSE(s.ok()) << a;
    EXPECT_NE(s.error().message().find("alignment " + std::to_string(a) + " is not a nonzero power of two"),
              std::string::npos)
        << s.error().message();
    EXPECT_FALSE(fs::exists(path));
    auto split = WriteGgufSplit((dir / "split").string(), "S", SomeMeta(), per_shard, SomeTensors(), {0, 0, 1, 1}, o);
    ASSERT_FALSE(split.ok()) << a;
    EXPECT_FALSE(fs::exists(dir / "split"));
  }
  WriteOptions o;
  o.alignment = 64;
  ASSERT_TRUE(WriteGguf(path, SomeMeta(), SomeTensors(), o).ok());
  auto r = GgufFile::Open(path);
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ((*r)->alignment(), 64u);
  fs::remove_all(dir);
}
