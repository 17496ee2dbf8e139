#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "gguf_test_util.h"
#include "k3pack/gguf.h"

using namespace k3pack;
using namespace k3pack::gguf;
namespace fs = std::filesystem;

namespace {

// Writes one shard with explicit split keys (so tests can make them wrong).
void WriteShard(const fs::path& path, int no, int count, int tensors_total, const std::string& arch,
                std::vector<std::string> names) {
  MetadataBuilder m;
  if (!arch.empty()) m.Str("general.architecture", arch);
  if (no >= 0) m.U16("split.no", static_cast<uint16_t>(no));
  if (count >= 0) m.U16("split.count", static_cast<uint16_t>(count));
  if (tensors_total != -1) m.I32("split.tensors.count", tensors_total);  // -1: no key
  std::vector<TensorSpec> t;
  for (auto& n : names) t.push_back({n, GgmlType::F32, {4}, nullptr});
  ASSERT_TRUE(WriteGguf(path.string(), m, t).ok());
}

std::string OpenError(const fs::path& p, const std::string& arch = "kimi-k3") {
  ShardSetOptions o;
  o.expected_architecture = arch;
  auto r = ShardSet::Open(p.string(), o);
  return r.ok() ? std::string("OK") : r.error().message();
}

class ShardSetTest : public ::testing::Test {
 protected:
  void SetUp() override { dir = k3test::TempDir("shards"); }
  void TearDown() override { fs::remove_all(dir); }
  void Good(const std::string& prefix = "K") {
    WriteShard(dir / (prefix + "-00001-of-00002.gguf"), 0, 2, 3, "kimi-k3", {prefix + "a", prefix + "b"});
    WriteShard(dir / (prefix + "-00002-of-00002.gguf"), 1, 2, 3, "kimi-k3", {prefix + "c"});
  }
  fs::path dir;
};

}  // namespace

TEST(ShardName, Parses) {
  auto n = ParseShardName("Kimi-K3-UD-Q2_K_XL-00001-of-00019.gguf");
  ASSERT_TRUE(n);
  EXPECT_EQ(n->prefix, "Kimi-K3-UD-Q2_K_XL");
  EXPECT_EQ(n->number, 1u);
  EXPECT_EQ(n->count, 19u);
  EXPECT_FALSE(ParseShardName("mmproj-BF16.gguf"));
  EXPECT_FALSE(ParseShardName("x-0001-of-00002.gguf"));
  EXPECT_FALSE(ParseShardName("x-00001-of-00002.bin"));
}

TEST_F(ShardSetTest, GoodSetOpensFromDirOrShard) {
  Good();
  EXPECT_EQ(OpenError(dir), "OK");
  EXPECT_EQ(OpenError(dir / "K-00002-of-00002.gguf"), "OK");
}

TEST_F(ShardSetTest, StrayGgufFilesDoNotBreakDiscovery) {
  Good();
  WriteShard(dir / "mmproj-BF16.gguf", -1, -1, -1, "clip", {"v"});
  WriteShard(dir / "Other-00001-of-00003.gguf", 0, 3, 1, "llama", {"x"});  // incomplete other set
  EXPECT_EQ(OpenError(dir), "OK");
}

TEST_F(ShardSetTest, TwoCompleteSetsAreListed) {
  Good("A");
  Good("B");
  std::string e = OpenError(dir);
  EXPECT_NE(e.find("several complete GGUF shard sets"), std::string::npos) << e;
  EXPECT_NE(e.find("\n  A ("), std::string::npos) << e;
  EXPECT_NE(e.find("\n  B ("), std::string::npos) << e;
  EXPECT_EQ(OpenError(dir / "B-00001-of-00002.gguf"), "OK");
}

TEST_F(ShardSetTest, SglangTextsForBrokenSets) {
  EXPECT_NE(OpenError(dir).find("no GGUF files found in " + dir.string()), std::string::npos);

  WriteShard(dir / "K-00001-of-00003.gguf", 0, 3, 3, "kimi-k3", {"a"});
  WriteShard(dir / "K-00003-of-00003.gguf", 2, 3, 3, "kimi-k3", {"c"});
  EXPECT_EQ(OpenError(dir).substr(0, 54), "GGUF shard set is incomplete: count=3, numbers=[1, 3]\n");
  fs::remove(dir / "K-00003-of-00003.gguf");
  WriteShard(dir / "K-00002-of-00002.gguf", 1, 2, 3, "kimi-k3", {"c"});
  EXPECT_EQ(OpenError(dir / "K-00002-of-00002.gguf"), "GGUF shard filenames disagree on split count: {2, 3}");
}

TEST_F(ShardSetTest, SplitKeyChecks) {
  WriteShard(dir / "K-00001-of-00002.gguf", 0, 2, 3, "kimi-k3", {"a", "b"});
  WriteShard(dir / "K-00002-of-00002.gguf", 0, 2, 3, "kimi-k3", {"c"});
  EXPECT_EQ(OpenError(dir), "GGUF split.no mismatch for " + (dir / "K-00002-of-00002.gguf").string() + ": 0 != 1");

  // SGLang resolves the directory first: a relative one, or one reached
  // through "..", is printed absolute (the shard's own name as listed).
  {
    const fs::path cwd = fs::current_path();
    fs::current_path(dir.parent_path());
    const std::string via_dotdot = dir.filename().string() + "/../" + dir.filename().string();
    EXPECT_EQ(OpenError(via_dotdot),
              "GGUF split.no mismatch for " + (dir / "K-00002-of-00002.gguf").string() + ": 0 != 1");
    EXPECT_EQ(OpenError(via_dotdot + "/K-00001-of-00002.gguf"),
              "GGUF split.no mismatch for " + (dir / "K-00002-of-00002.gguf").string() + ": 0 != 1");
    fs::current_path(cwd);
  }

  WriteShard(dir / "K-00002-of-00002.gguf", 1, 2, 4, "kimi-k3", {"c"});
  EXPECT_EQ(OpenError(dir), "GGUF split metadata mismatch at " + (dir / "K-00002-of-00002.gguf").string());

  WriteShard(dir / "K-00002-of-00002.gguf", 1, 2, 3, "llama", {"c"});
  EXPECT_EQ(OpenError(dir), "GGUF split metadata mismatch at " + (dir / "K-00002-of-00002.gguf").string());

  // A later shard may omit the architecture (llama.cpp writes it in shard 0 only).
  WriteShard(dir / "K-00002-of-00002.gguf", 1, 2, 3, "", {"c"});
  EXPECT_EQ(OpenError(dir), "OK");

  WriteShard(dir / "K-00002-of-00002.gguf", 1, 2, 3, "kimi-k3", {"a"});
  EXPECT_EQ(OpenError(dir), "duplicate GGUF tensor across shards: a");

  WriteShard(dir / "K-00001-of-00002.gguf", 0, 2, 5, "kimi-k3", {"a", "b"});
  WriteShard(dir / "K-00002-of-00002.gguf", 1, 2, 5, "kimi-k3", {"c"});
  EXPECT_EQ(OpenError(dir), "GGUF split.tensors.count=5, found 3");

  // Before, a negative count was taken for "no key" and the set opened.
  WriteShard(dir / "K-00001-of-00002.gguf", 0, 2, -2, "kimi-k3", {"a", "b"});
  WriteShard(dir / "K-00002-of-00002.gguf", 1, 2, -2, "kimi-k3", {"c"});
  EXPECT_EQ(OpenError(dir), "GGUF split.tensors.count=-2, found 3");

  WriteShard(dir / "K-00001-of-00002.gguf", 0, 3, 3, "kimi-k3", {"a", "b"});
  WriteShard(dir / "K-00002-of-00002.gguf", 1, 3, 3, "kimi-k3", {"c"});
  EXPECT_EQ(OpenError(dir), "GGUF split.count=3, found 2 files");

  WriteShard(dir / "K-00001-of-00002.gguf", 0, 2, 3, "llama", {"a", "b"});
  WriteShard(dir / "K-00002-of-00002.gguf", 1, 2, 3, "llama", {"c"});
  EXPECT_EQ(OpenError(dir), "expected GGUF architecture 'kimi-k3', got 'llama'");

  WriteShard(dir / "K-00001-of-00002.gguf", -1, 2, 3, "kimi-k3", {"a", "b"});
  EXPECT_EQ(OpenError(dir).substr(0, 56), "GGUF metadata is missing required field 'split.no'\nhint:");
}
