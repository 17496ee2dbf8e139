// Of two faults in a shard set, the one SGLang's scan_gguf_shards meets first
// is reported: it checks shard by shard (open, the four required keys,
// split.no, agreement with shard 0, the shard's tensor names), and only then
// the set (split.count vs files, split.tensors.count, architecture).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "gguf_test_util.h"
#include "k3pack/gguf.h"

using namespace k3pack;
using namespace k3pack::gguf;
namespace fs = std::filesystem;

namespace {

void Shard(const fs::path& path, int no, int count, int tensors_total, const std::string& arch,
           const std::vector<std::string>& names) {
  MetadataBuilder m;
  if (!arch.empty()) m.Str("general.architecture", arch);
  m.U16("split.no", static_cast<uint16_t>(no));
  m.U16("split.count", static_cast<uint16_t>(count));
  m.I32("split.tensors.count", tensors_total);
  std::vector<TensorSpec> t;
  for (const auto& n : names) t.push_back({n, GgmlType::F32, {4}, nullptr});
  ASSERT_TRUE(WriteGguf(path.string(), m, t).ok());
}

std::string FirstLine(const fs::path& dir) {
  auto r = ShardSet::Open(dir.string());
  if (r.ok()) return "OK";
  const std::string& m = r.error().message();
  return m.substr(0, m.find('\n'));
}

}  // namespace

TEST(ScanOrder, MissingArchitectureInShardZeroComesBeforeItsSplitNo) {
  const fs::path dir = k3test::TempDir("scan-order");
  Shard(dir / "K-00001-of-00002.gguf", 1, 2, 2, "", {"a"});  // no architecture, and split.no 1
  Shard(dir / "K-00002-of-00002.gguf", 1, 2, 2, "kimi-k3", {"b"});
  EXPECT_EQ(FirstLine(dir), "GGUF metadata is missing required field 'general.architecture'");
}

TEST(ScanOrder, DuplicateInShardOneComesBeforeSplitNoOfShardTwo) {
  const fs::path dir = k3test::TempDir("scan-order");
  Shard(dir / "K-00001-of-00003.gguf", 0, 3, 3, "kimi-k3", {"a"});
  Shard(dir / "K-00002-of-00003.gguf", 1, 3, 3, "kimi-k3", {"a"});
  Shard(dir / "K-00003-of-00003.gguf", 7, 3, 3, "kimi-k3", {"c"});
  EXPECT_EQ(FirstLine(dir), "duplicate GGUF tensor across shards: a");
}

TEST(ScanOrder, SplitNoOfShardOneComesBeforeADamagedShardTwo) {
  const fs::path dir = k3test::TempDir("scan-order");
  Shard(dir / "K-00001-of-00003.gguf", 0, 3, 3, "kimi-k3", {"a"});
  Shard(dir / "K-00002-of-00003.gguf", 5, 3, 3, "kimi-k3", {"b"});
  std::ofstream(dir / "K-00003-of-00003.gguf") << "not a gguf file at all";
  const std::string path1 = (dir / "K-00002-of-00003.gguf").string();
  EXPECT_EQ(FirstLine(dir), "GGUF split.no mismatch for " + path1 + ": 5 != 1");
}

TEST(ScanOrder, SetLevelChecksComeAfterEveryShard) {
  const fs::path dir = k3test::TempDir("scan-order");
  // split.tensors.count is wrong (a set-level check) and shard 1 disagrees
  // with shard 0 on the architecture (a per-shard check): the latter first.
  Shard(dir / "K-00001-of-00002.gguf", 0, 2, 9, "kimi-k3", {"a"});
  Shard(dir / "K-00002-of-00002.gguf", 1, 2, 9, "llama", {"b"});
  EXPECT_EQ(FirstLine(dir), "GGUF split metadata mismatch at " + (dir / "K-00002-of-00002.gguf").string());
}
