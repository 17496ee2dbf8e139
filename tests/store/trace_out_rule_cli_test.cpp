// `run-experts --trace-out FILE` under the shared overwrite rule
// (cli/output_rule.h): the trace is known only once the layers ran, so the
// rerun computes it and compares bytes. The same trace already there is
// reported "already built" and left untouched; another trace is refused
// naming --trace-out and --force; --force replaces it. Before, every rerun
// was refused.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "../cli_run.h"
#include "built_tiny_model.h"
#include "util/file.h"

namespace k3pack::store {
namespace {

namespace fs = std::filesystem;
using testing_cli::Cli;

class TraceOutRule : public testing_model::BuiltTinyModelTest {
 protected:
  static void SetUpTestSuite() { BuildModel("k3-trace-out-rule"); }
  static std::string Cmd(const std::string& out, const std::string& extra) {
    return "run-experts --manifest " + manifest_ + " --all-layers --tokens 3 --trace-out " + out + " " + extra;
  }
};

struct FileState {
  std::string bytes;
  ino_t ino = 0;
  int64_t mtime_ns = 0;
  bool operator==(const FileState&) const = default;
};

FileState State(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  auto bytes = ReadFileToString(path);
  return {bytes.ok() ? *bytes : "", st.st_ino, int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec};
}

// An hour ago, so that a rewrite shows even with coarse timestamps.
void Age(const std::string& path) { fs::last_write_time(path, fs::last_write_time(path) - std::chrono::hours(1)); }

TEST_F(TraceOutRule, SameRerunIsAlreadyBuiltAndLeavesTheTraceUntouched) {
  const std::string out = dir_ + "/same.trace";
  auto first = Cli(Cmd(out, "--seed 3"));
  ASSERT_EQ(first.code, 0) << first.out;
  EXPECT_NE(first.out.find("wrote " + out), std::string::npos) << first.out;
  Age(out);
  const FileState before = State(out);

  auto again = Cli(Cmd(out, "--seed 3"));
  EXPECT_EQ(again.code, 0) << again.out;
  EXPECT_NE(again.out.find("already built: " + out + " (use --force to rebuild)"), std::string::npos) << again.out;
  EXPECT_EQ(again.out.find("wrote " + out), std::string::npos) << again.out;
  EXPECT_TRUE(State(out) == before) << "an identical rerun rewrote the trace";

  // --json stays one JSON object on stdout and says so.
  auto json = Cli(Cmd(out, "--seed 3 --json"));
  EXPECT_EQ(json.code, 0) << json.out;
  const size_t brace = json.out.find('{');
  ASSERT_NE(brace, std::string::npos) << json.out;
  auto j = nlohmann::json::parse(json.out.substr(brace), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << json.out;
  EXPECT_EQ(j["prediction"]["trace_already_built"], true) << json.out;
  EXPECT_TRUE(State(out) == before);
}

TEST_F(TraceOutRule, AnotherRunsTraceIsRefusedNamingTheOptionAndForceReplacesIt) {
  const std::string out = dir_ + "/other.trace", ref = dir_ + "/ref.trace";
  ASSERT_EQ(Cli(Cmd(out, "--seed 3")).code, 0);
  Age(out);
  const FileState before = State(out);

  auto other = Cli(Cmd(out, "--seed 4"));
  EXPECT_EQ(other.code, 1) << other.out;
  EXPECT_NE(other.out.find("refusing to overwrite existing " + out + " (--trace-out): it is not the trace of this run"),
            std::string::npos)
      << other.out;
  EXPECT_NE(other.out.find("pass --force"), std::string::npos) << other.out;
  EXPECT_TRUE(State(out) == before);

  // A file that is no trace is refused before any layer runs.
  const std::string mine = dir_ + "/mine.txt";
  ASSERT_TRUE(WriteFileAtomic(mine, "precious").ok());
  auto foreign = Cli(Cmd(mine, "--seed 3"));
  EXPECT_EQ(foreign.code, 1) << foreign.out;
  EXPECT_NE(foreign.out.find("(--trace-out): it is a file that starts with \"precious\", not a routing trace"),
            std::string::npos)
      << foreign.out;
  EXPECT_EQ(foreign.out.find("layer "), std::string::npos) << "layers ran before the refusal:\n" << foreign.out;
  EXPECT_EQ(*ReadFileToString(mine), "precious");
  // --force replaces another run's trace (below), never a file that is no trace.
  EXPECT_EQ(Cli(Cmd(mine, "--seed 3 --force")).code, 1);
  EXPECT_EQ(*ReadFileToString(mine), "precious");

  auto forced = Cli(Cmd(out, "--seed 4 --force"));
  ASSERT_EQ(forced.code, 0) << forced.out;
  ASSERT_EQ(Cli(Cmd(ref, "--seed 4")).code, 0);
  EXPECT_EQ(*ReadFileToString(out), *ReadFileToString(ref));
  EXPECT_NE(*ReadFileToString(out), before.bytes) << "seeds 3 and 4 gave the same trace: the test proves nothing";
}

}  // namespace
}  // namespace k3pack::store
