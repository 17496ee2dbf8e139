// Doctor names the user's files: a shard cut off inside its tensor data is
// parsed from a temporary copy of its header, and every message about that
// header must still name the shard, never /proc/self/fd/N.
#include <nlohmann/json.hpp>

#include "doctor_test_util.h"

namespace dtest {
namespace {

TEST(DoctorIoNames, CutOffShardIsNamedNeverProcSelfFd) {
  auto dir = TempDir("cut-names");
  auto synth = Synth(dir);
  ASSERT_FALSE(synth.shard_paths.empty());
  // The first shard (the one holding the model metadata) loses a required key
  // (renamed in place: same size) and is cut off inside its data, so doctor
  // parses its header from a temporary copy, and the model-dimension check
  // quotes the file in its message.
  const std::string first = synth.shard_paths.front();
  std::string bytes;
  {
    std::ifstream in(first, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t key = bytes.find("attention.head_count_kv");
  ASSERT_NE(key, std::string::npos);
  bytes[key + 10] = 'H';
  uint64_t data_offset = 0;
  {
    std::ofstream(first, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    auto f = gguf::GgufFile::Open(first);
    ASSERT_TRUE(f.ok());
    data_offset = (*f)->data_offset();
  }
  ASSERT_GT(bytes.size(), data_offset + 64);
  fs::resize_file(first, data_offset + (bytes.size() - data_offset) / 2);

  for (const std::string mode : {"--json ", ""}) {
    SCOPED_TRACE(mode.empty() ? "text" : "json");
    CliResult r = RunCli("doctor " + mode + "--profile scaled " + dir.string());
    EXPECT_EQ(r.exit_code, 1) << r.out;
    EXPECT_EQ(r.out.find("/proc/self/fd"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("gguf-truncated"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(first + ": missing metadata key"), std::string::npos) << r.out;
  }
}

}  // namespace
}  // namespace dtest
