// verify_metadata hashes every whole shard before the first tensor: minutes
// for a full checkpoint. LoadOptions::interrupt_check lets a caller stop it
// (Python's Ctrl-C, a close() from another thread) without losing the stream.
#include "loader_fixture.h"
#include "util/sha256.h"

namespace k3pack::loader {
namespace {

using namespace testing;  // NOLINT

// Two shards with each one's whole-file sha256 recorded, as a default
// `build` writes them, so verify_metadata hashes whole shards.
std::string ModelWithWholeShardDigests(const std::string& dir, std::vector<std::string>* shards) {
  std::vector<gguf::TensorSpec> t;
  t.push_back(F32Tensor("blk.0.attn_norm.weight", {4096}, std::vector<float>(4096, 1.0f)));
  t.push_back(F32Tensor("blk.0.ssm_a", {4}, std::vector<float>(4, -1.0f)));
  t.push_back(F32Tensor("blk.0.ffn_norm.weight", {4096}, std::vector<float>(4096, 2.0f)));
  t.push_back(F32Tensor("output_norm.weight", {4096}, std::vector<float>(4096, 3.0f)));
  json m;
  WriteModel(dir, t, {0, 0, 1, 1}, &m, shards);
  for (size_t i = 0; i < shards->size(); ++i) {
    auto sha = Sha256File((*shards)[i]);
    EXPECT_TRUE(sha.ok()) << sha.error().message();
    m["source"]["shards"][i]["sha256"] = *sha;
  }
  return WriteJson(dir + "/manifest.json", m);
}

TEST(VerifyInterrupt, AnInterruptStopsTheHashingAndTheNextCallHashesAgain) {
  TempDir dir("interrupt");
  std::vector<std::string> shards;
  const std::string manifest = ModelWithWholeShardDigests(dir.path, &shards);
  std::vector<NamedTensor> plain;
  {
    auto s = NonExpertStream::Open(manifest);
    ASSERT_TRUE(s.ok()) << s.error().message();
    plain = Drain(*s);
  }
  ASSERT_FALSE(plain.empty());

  int polls = 0;
  bool interrupt = true;
  LoadOptions o;
  o.verify_metadata = true;
  o.interrupt_check = [&]() -> Status {
    ++polls;
    if (interrupt) return Error("caller stopped it");
    return Status::OK();
  };
  auto s = NonExpertStream::Open(manifest, o);
  ASSERT_TRUE(s.ok()) << s.error().message();
  auto first = s->Next();
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(first.error().message(), "caller stopped it");
  EXPECT_EQ(polls, 1);  // stopped at the first chunk
  EXPECT_EQ(s->stats().shards_opened, 0u);

  // Not an answer about the files: the stream is not failed, and verifies
  // again (every shard hashed: one poll per 8 MiB chunk, at least one each).
  interrupt = false;
  polls = 0;
  std::optional<Error> err;
  std::vector<NamedTensor> verified = Drain(*s, &err);
  EXPECT_FALSE(err) << err->message();
  EXPECT_GE(polls, static_cast<int>(shards.size()));
  ASSERT_EQ(verified.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(verified[i].name, plain[i].name);
}

TEST(VerifyInterrupt, AChangedShardIsStillFoundAfterAnInterrupt) {
  TempDir dir("changed");
  std::vector<std::string> shards;
  const std::string manifest = ModelWithWholeShardDigests(dir.path, &shards);
  // Same size, same header: only the whole-file digest can tell.
  auto bytes = ReadFileToString(shards[1]);
  ASSERT_TRUE(bytes.ok());
  bytes->back() ^= 0x01;
  ASSERT_TRUE(WriteFileAtomic(shards[1], *bytes).ok());

  bool interrupt = true;
  LoadOptions o;
  o.verify_metadata = true;
  o.interrupt_check = [&]() -> Status { return interrupt ? Status(Error("stop")) : Status::OK(); };
  auto s = NonExpertStream::Open(manifest, o);
  ASSERT_TRUE(s.ok()) << s.error().message();
  EXPECT_EQ(s->Next().error().message(), "stop");
  interrupt = false;
  std::optional<Error> err;
  EXPECT_TRUE(Drain(*s, &err).empty());
  ASSERT_TRUE(err);
  EXPECT_EQ(err->message().substr(0, err->message().find('\n')), "Kimi-K3 GGUF shard is missing or changed: " + shards[1]);
  // A real difference fails the stream for good, as before.
  auto again = s->Next();
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().message(), err->message());
}

}  // namespace
}  // namespace k3pack::loader
