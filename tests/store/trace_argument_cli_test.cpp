// The trace file as the argument of `k3pack trace gen|replay|sweep`, as
// `verify M` and `load M` take their manifest: `trace gen y.k3t` said
// "missing required option --trace" (session 40's audit).
#include <gtest/gtest.h>

#include <filesystem>

#include "store/synthetic_pack.h"
#include "../cli_run.h"

namespace k3pack::store {
namespace {

namespace fs = std::filesystem;
using testing_cli::Cli;
using testing_cli::CliRun;
using testing_cli::FileBytes;

constexpr const char* kShape = " --layers 2 --experts 8 --top-k 2 --requests 1 --decode-tokens 6";

TEST(TraceArgument, TheTraceMayBeGivenAsTheArgument) {
  const std::string dir = testing::TinyPack::TempDir("trace-arg");
  ASSERT_EQ(Cli("trace gen " + dir + "/a.k3t" + kShape).code, 0);
  ASSERT_EQ(Cli("trace gen --trace " + dir + "/b.k3t" + kShape).code, 0);
  EXPECT_EQ(FileBytes(dir + "/a.k3t"), FileBytes(dir + "/b.k3t"));
  ASSERT_FALSE(FileBytes(dir + "/a.k3t").empty());

  CliRun by_arg = Cli("trace replay --simulate --object-bytes 4096 --json " + dir + "/a.k3t");
  CliRun by_opt = Cli("trace replay --simulate --object-bytes 4096 --json --trace " + dir + "/a.k3t");
  EXPECT_EQ(by_arg.code, 0) << by_arg.out;
  EXPECT_EQ(by_arg.out, by_opt.out);

  const std::string sweep = "trace sweep --progress none --object-bytes 4096 --sizes 2,4 --policies lru --svg ";
  by_arg = Cli(sweep + dir + "/s1.svg " + dir + "/a.k3t");
  by_opt = Cli(sweep + dir + "/s2.svg --trace " + dir + "/a.k3t");
  EXPECT_EQ(by_arg.code, 0) << by_arg.out;
  EXPECT_EQ(by_arg.out.substr(0, by_arg.out.find("plot:")), by_opt.out.substr(0, by_opt.out.find("plot:")));
  EXPECT_TRUE(fs::exists(dir + "/s1.svg"));
}

TEST(TraceArgument, TheArgumentAndADifferentTraceOptionAreRefusedTogether) {
  const std::string dir = testing::TinyPack::TempDir("trace-arg-both");
  CliRun r = Cli("trace gen " + dir + "/a.k3t --trace " + dir + "/b.k3t" + kShape);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("both --trace " + dir + "/b.k3t and the argument " + dir + "/a.k3t given; give one"),
            std::string::npos)
      << r.out;
  EXPECT_FALSE(fs::exists(dir + "/a.k3t"));
  EXPECT_FALSE(fs::exists(dir + "/b.k3t"));
  // A second argument is one too many, named.
  r = Cli("trace replay --simulate " + dir + "/a.k3t " + dir + "/b.k3t");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("unexpected argument " + dir + "/b.k3t"), std::string::npos) << r.out;
  // A family's name as the argument is taken for a file; the hint says so.
  r = Cli("trace sweep --progress none " + dir + "/all");
  EXPECT_NE(r.out.find("error: --trace " + dir + "/all does not exist"), std::string::npos) << r.out;
  r = Cli("trace sweep --progress none all");
  EXPECT_NE(r.out.find("did you mean --family all? (the argument is a trace file)"), std::string::npos) << r.out;
  // The argument reads a trace, so a family is refused beside it as beside --trace.
  r = Cli("trace sweep --family kimi " + dir + "/a.k3t");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--family and --trace cannot be used together"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace k3pack::store
