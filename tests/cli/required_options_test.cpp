// Options that only mean something with another one (Args::Requires in
// src/cli/command.h): given alone they used to be silently ignored (`load
// --force` without --dump, `trace sweep --compute-us` without --timing); now
// they are usage errors naming both options, before any file is read or
// written. With the companion the option is accepted and takes effect, and
// each command's --help lists the rule under "needs:".
#include <fstream>

#include <nlohmann/json.hpp>

#include "cli_fixture.h"

namespace k3cli {
namespace {

const std::string kSweepModel = " --layers 2 --experts 8 --top-k 2 --requests 1 --prompt-tokens 0 --decode-tokens 8 "
                                "--object-bytes 4096 --sizes 4 --policies lru --progress none ";

// A built model (its directory and manifest) and an empty output directory.
struct Workspace {
  std::string model, manifest, out;
};
Workspace BuiltModel(const std::string& tag) {
  Workspace w{FreshModel(tag), "", Root() + "/" + tag + "-out"};
  EXPECT_EQ(Build(w.model).code, 0);
  w.manifest = w.model + "/" + kManifestName;
  fs::create_directories(w.out);
  return w;
}

TEST(RequiredOptions, LoneDependentOptionIsRefusedNamingBoth) {
  const Workspace w = BuiltModel("requires-alone");
  const std::string &m = w.model, &manifest = w.manifest, &d = w.out;
  const std::string trace = d + "/t.k3t";
  ASSERT_EQ(Cli(TraceGen(trace)).code, 0);
  const auto model_before = Snapshot(m);
  const auto out_before = Snapshot(d);
  struct Case {
    std::string args, message;
  };
  const std::vector<Case> cases = {
      // Most of these ran to exit 0 before, the option doing nothing.
      {"load --manifest " + Q(manifest) + " --progress none --force",
       "--force needs --dump (it only applies to the dump directory)"},
      {"run-experts --manifest " + Q(manifest) + " --predict-k 2", "--predict-k needs --trace-out"},
      {"run-experts --manifest " + Q(manifest) + " --predict-next-token", "--predict-next-token needs --trace-out"},
      {"run-experts --manifest " + Q(manifest) + " --force", "--force needs --trace-out"},
      {"run-experts --manifest " + Q(manifest) + " --rank-manifests " + Q(manifest), "--rank-manifests needs --ep-size"},
      {"inspect " + Q(Shard(m, 1)) + " --match blk", "--match needs --stats"},
      {"verify --manifest " + Q(manifest) + " --against-source",
       "--against-source needs --full (samples are always compared with the source)"},
      {"trace replay --trace " + Q(trace) + " --manifest " + Q(manifest) + " --cache-mib 1 --force",
       "--force needs --stats"},
      {"trace replay --trace " + Q(trace) + " --manifest " + Q(manifest) + " --cache-mib 1 --lookahead 2",
       "--lookahead needs --prefetch"},
      {"trace replay --trace " + Q(trace) + " --cache-mib 1 --object-bytes 4096", "--object-bytes needs --simulate"},
      // Session 36: beside --manifest it was ignored, and never checked ("5x" ran).
      {"trace replay --simulate --trace " + Q(trace) + " --manifest " + Q(manifest) + " --object-bytes 5x",
       "--object-bytes and --manifest cannot be used together: the manifest gives each object's size"},
      {"trace sweep --trace " + Q(trace) + " --manifest " + Q(manifest) + " --object-bytes 4096 --svg " +
           Q(d + "/s.svg"),
       "--object-bytes and --manifest cannot be used together"},
      {"trace sweep" + kSweepModel + "--compute-us 100 --svg " + Q(d + "/s.svg"), "--compute-us needs --timing"},
      {"trace sweep" + kSweepModel + "--horizon token --svg " + Q(d + "/s.svg"), "--horizon needs --timing"},
      {"trace sweep" + kSweepModel + "--staged --svg " + Q(d + "/s.svg"), "--staged needs --timing"},
      // Session 36: only the timed replay reads predictions; --predict (and
      // so --predict-accuracy with it) left the plain sweep's table unchanged.
      {"trace sweep" + kSweepModel + "--predict-surprise 0.1 --svg " + Q(d + "/s.svg"),
       "--predict-surprise needs --timing"},
      {"trace sweep" + kSweepModel + "--predict --predict-accuracy 0.1 --svg " + Q(d + "/s.svg"),
       "--predict needs --timing (only the timed replay reads predictions, and it generates its own)"},
      {TraceGen(d + "/p.k3t", "--predict-accuracy 0.5"), "--predict-accuracy needs --predict or --predict-next-token"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    CliRun r = Cli(c.args);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_TRUE(Contains(r.out, "error: " + c.message)) << r.out;
  }
  EXPECT_EQ(Snapshot(m), model_before) << "a refused command changed the model directory";
  EXPECT_EQ(Snapshot(d), out_before) << "a refused command wrote a file";
}

TEST(RequiredOptions, WithItsCompanionTheOptionIsAcceptedAndTakesEffect) {
  const std::string m = FreshModel("requires-with");
  ASSERT_EQ(Build(m).code, 0);
  const std::string manifest = m + "/" + kManifestName;
  const std::string d = Root() + "/requires-with-out";
  fs::create_directories(d + "/dump");
  {
    std::ofstream(d + "/dump/other.txt") << "kept\n";
  }
  // --force with --dump: the non-empty directory is written into.
  CliRun r = Cli("load --manifest " + Q(manifest) + " --progress none --dump " + Q(d + "/dump"));
  EXPECT_EQ(r.code, 1) << "a non-empty --dump directory needs --force: " << r.out;
  r = Cli("load --manifest " + Q(manifest) + " --progress none --dump " + Q(d + "/dump") + " --force");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_GT(Snapshot(d + "/dump").size(), 1u) << r.out;
  EXPECT_TRUE(fs::exists(d + "/dump/other.txt"));
  // --predict-accuracy with --predict (one of the companions is enough).
  const std::string trace = d + "/t.k3t";
  r = Cli(TraceGen(trace, "--predict --predict-accuracy 0.5 --json"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(trace));
  // --object-bytes with --simulate.
  r = Cli("trace replay --simulate --trace " + Q(trace) + " --object-bytes 4096 --cache-mib 1 --json --progress none");
  EXPECT_EQ(r.code, 0) << r.out;
  // --compute-us and --horizon with --timing.
  r = Cli("trace sweep --timing" + kSweepModel + "--compute-us 100 --horizon layer --json");
  EXPECT_EQ(r.code, 0) << r.out;
  // --match with --stats.
  r = Cli("inspect " + Q(Shard(m, 1)) + " --stats --match blk --json --progress none");
  EXPECT_EQ(r.code, 0) << r.out;
}

TEST(RequiredOptions, HelpListsWhatEachOptionNeeds) {
  CliRun help = Cli("load --help");
  EXPECT_EQ(help.code, 0);
  EXPECT_TRUE(Contains(help.out, "\nneeds: --force and --wait need --dump\n")) << help.out;
  // Options that need the same companion are listed together.
  help = Cli("trace sweep --help");
  EXPECT_EQ(help.code, 0);
  EXPECT_TRUE(Contains(help.out, "\nneeds: --compute-us, --ssd-gbps, --ssd-latency-us, --queue-depth, "
                                 "--prefetch-budget-mib, --staged, --horizon, --keep-predicted, --device-mib, --device-policy, "
                                 "--h2d-gbps, --h2d-latency-us, --predict, --predict-next-token, --predict-accuracy and "
                                 "--predict-surprise need --timing; "
                                 "--device-policy, --h2d-gbps and --h2d-latency-us need --device-mib other than 0\n"))
      << help.out;
  help = Cli("run-experts --help");
  EXPECT_EQ(help.code, 0);
  EXPECT_TRUE(Contains(help.out, "--predict-k, --predict-next-token and --force need --trace-out")) << help.out;
}

// A companion that is given (or defaulted) with the one value that makes the
// option do nothing: `trace replay --prefetch none --lookahead 2` was
// accepted and the look-ahead ignored. Declared with
// Args::RequiresValueOtherThan; refused naming both options and the value.
TEST(RequiredOptions, ACompanionsInertValueIsRefusedNamingBothAndTheValue) {
  const Workspace w = BuiltModel("requires-value");
  const std::string &manifest = w.manifest, &d = w.out;
  const std::string trace = d + "/t.k3t";
  ASSERT_EQ(Cli("trace gen --manifest " + Q(manifest) + " --requests 1 --decode-tokens 4 --seed 3 --trace " + Q(trace))
                .code,
            0);
  const auto out_before = Snapshot(d);
  const std::string replay = "trace replay --trace " + Q(trace) + " --manifest " + Q(manifest) + " --cache-mib 64 ";
  struct Case {
    std::string args, message;
  };
  const std::vector<Case> cases = {
      {replay + "--prefetch none --lookahead 2",
       "--lookahead needs --prefetch other than none (it is how far oracle-lookahead prefetches), but --prefetch "
       "none was given"},
      {replay + "--lookahead 2", "--lookahead needs --prefetch other than none (it is how far oracle-lookahead "
                                 "prefetches), but --prefetch is none by default"},
      {"run-experts --manifest " + Q(manifest) + " --ep-size 1 --rank-manifests " + Q(manifest),
       "--rank-manifests needs --ep-size other than 1 (they are the manifests of the --ep-size ranks), but "
       "--ep-size 1 was given"},
      {"run-experts --manifest " + Q(manifest) + " --rank-manifests " + Q(manifest),
       "--rank-manifests needs --ep-size other than 1 (they are the manifests of the --ep-size ranks), but "
       "--ep-size is 1 by default"},
      {"trace sweep --timing" + kSweepModel + "--device-policy lru",
       "--device-policy needs --device-mib other than 0 (there is no device tier without one), but --device-mib is 0 "
       "by default"},
      // The same number in another spelling is the same value.
      {"trace sweep --timing" + kSweepModel + "--device-mib 00 --h2d-gbps 10",
       "--h2d-gbps needs --device-mib other than 0 (there is no device tier without one), but --device-mib 00 was "
       "given"},
      {"trace sweep" + kSweepModel + "--keep-predicted", "--keep-predicted needs --timing"},
      // Without --timing the first rule still speaks first.
      {"trace sweep" + kSweepModel + "--h2d-latency-us 5 --svg " + Q(d + "/s.svg"), "--h2d-latency-us needs --timing"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    CliRun r = Cli(c.args);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_TRUE(Contains(r.out, "error: " + c.message + "\n")) << r.out;
  }
  EXPECT_EQ(Snapshot(d), out_before) << "a refused command wrote a file";
  // With a value that gives them meaning they are accepted and take effect.
  CliRun r = Cli(replay + "--prefetch oracle-lookahead --lookahead 2 --json --progress none");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto report = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  EXPECT_GT(report.value("prefetch_useful", 0) + report.value("prefetch_wasted", 0), 0) << r.out;
  r = Cli("trace sweep --timing" + kSweepModel + "--device-mib 1 --device-policy lru --h2d-gbps 10 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(Contains(r.out, "\"device_policy\"")) << r.out;
  // The help lists the value under "needs:".
  CliRun help = Cli("trace replay --help");
  EXPECT_TRUE(Contains(help.out, "--lookahead needs --prefetch other than none")) << help.out;
  help = Cli("run-experts --help");
  EXPECT_TRUE(Contains(help.out, "--rank-manifests needs --ep-size other than 1")) << help.out;
}

}  // namespace
}  // namespace k3cli
