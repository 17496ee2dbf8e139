// A shard cut short while a zero-copy stream is in it, and what a failed
// stream keeps (session 12's lifetime audit). Reading a mapped page past the
// end of a truncated file is a SIGBUS: before the size check, this test
// process died in the stream's own A_log read.
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

#include "loader_fixture.h"
#include "util/file.h"

namespace k3pack::loader {
namespace {

using namespace testing;  // NOLINT

bool Mapped(const std::string& path) {
  auto real = ResolvePath(path);
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.size() >= real->size() && line.compare(line.size() - real->size(), real->size(), *real) == 0) return true;
  }
  return false;
}

std::vector<gguf::TensorSpec> Model(float ssm_a) {
  std::vector<gguf::TensorSpec> t;
  t.push_back(F32Tensor("blk.0.attn_norm.weight", {4096}, std::vector<float>(4096, 1.0f)));
  t.push_back(F32Tensor("blk.0.ffn_norm.weight", {4096}, std::vector<float>(4096, 2.0f)));
  t.push_back(F32Tensor("blk.0.ssm_a", {4}, std::vector<float>(4, ssm_a)));
  t.push_back(F32Tensor("output_norm.weight", {4096}, std::vector<float>(4096, 3.0f)));
  return t;
}

TEST(StreamShardChange, ShardCutShortMidStreamIsSglangsErrorNotSigbus) {
  TempDir dir("cut");
  std::vector<std::string> shards;
  const std::string manifest = WriteModel(dir.path, Model(-1.0f), {0, 0, 0, 0}, nullptr, &shards);
  auto s = NonExpertStream::Open(manifest);
  ASSERT_TRUE(s.ok()) << s.error().message();
  std::optional<NamedTensor> first;
  {
    auto r = s->Next();
    ASSERT_TRUE(r.ok() && *r) << (r.ok() ? "end" : r.error().message());
    first = std::move(*r);
  }
  struct stat st {};
  ASSERT_EQ(::stat(shards[0].c_str(), &st), 0);
  ASSERT_EQ(::truncate(shards[0].c_str(), st.st_size / 2), 0);
  std::optional<Error> err;
  Drain(*s, &err);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->kind(), ErrorKind::kFileNotFound);
  const std::string msg = err->message();
  EXPECT_EQ(msg.substr(0, msg.find('\n')), "Kimi-K3 GGUF shard is missing or changed: " + *ResolvePath(shards[0]));
  EXPECT_NE(err->hint().find("cut short"), std::string::npos) << msg;
  EXPECT_NE(err->hint().find(std::to_string(st.st_size)), std::string::npos) << msg;
  // The stream freed the shard with its error; the one view kept holds it.
  first.reset();
  EXPECT_FALSE(Mapped(shards[0]));
}

TEST(StreamShardChange, FailedStreamFreesTheShardAndRepeatsItsError) {
  TempDir dir("fail");
  std::vector<std::string> shards;
  const std::string manifest = WriteModel(dir.path, Model(1.0f), {0, 0, 0, 0}, nullptr, &shards);
  auto s = NonExpertStream::Open(manifest);
  ASSERT_TRUE(s.ok());
  std::optional<Error> err;
  auto got = Drain(*s, &err);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->message().substr(0, err->message().find('\n')),
            "Kimi-K3 GGUF ssm_a must contain only -exp(A_log) values");
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(Mapped(shards[0]));  // the two views handed out hold the mapping, as they must
  EXPECT_EQ(F32At(got[1], 4095), 2.0f);
  got.clear();
  EXPECT_FALSE(Mapped(shards[0])) << "the failed stream still holds the shard";
  auto again = s->Next();
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().message(), err->message());
}

}  // namespace
}  // namespace k3pack::loader
