// Repeated and contradicting options (the argument parser, src/cli/command.h):
// an option given twice with two values is refused naming both values, the
// same value twice is accepted, a flag twice is harmless, an old and a new
// spelling together are refused, and options a command declares Exclusive()
// are refused together, naming both; all before any file is read or written.
#include "cli_fixture.h"

namespace k3cli {
namespace {

TEST(RepeatedOptions, TwoValuesAreAUsageErrorNamingBoth) {
  const std::string d = Root() + "/repeat-two";
  fs::create_directories(d);
  const std::string a = d + "/a.k3t", b = d + "/b.k3t";
  for (const std::string& args : {TraceGenArgs("--trace " + Q(a) + " --trace " + Q(b)),
                                  TraceGenArgs("--trace=" + Q(a) + " --trace " + Q(b))}) {
    SCOPED_TRACE(args);
    CliRun r = Cli(args);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_TRUE(Contains(r.out, "error: --trace given twice, as '" + a + "' and '" + b + "'; give it once")) << r.out;
    EXPECT_FALSE(fs::exists(a));
    EXPECT_FALSE(fs::exists(b));
  }
  // A value option of another command, and a numeric one.
  CliRun r = Cli("synth --out " + Q(d + "/x") + " --out " + Q(d + "/y"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(Contains(r.out, "--out given twice, as '" + d + "/x' and '" + d + "/y'")) << r.out;
  EXPECT_FALSE(fs::exists(d + "/x"));
  EXPECT_FALSE(fs::exists(d + "/y"));
  r = Cli(TraceGenArgs("--seed 3 --seed 4 --trace " + Q(a)));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(Contains(r.out, "--seed given twice, as '3' and '4'")) << r.out;
  EXPECT_FALSE(fs::exists(a));
}

TEST(RepeatedOptions, SameValueTwiceAndFlagTwiceAreAccepted) {
  const std::string d = Root() + "/repeat-same";
  fs::create_directories(d);
  const std::string t = d + "/t.k3t";
  CliRun r = Cli(TraceGenArgs("--trace " + Q(t) + " --trace=" + Q(t) + " --json --json"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(t));
  EXPECT_TRUE(Contains(r.out, "{")) << r.out;  // --json took effect once
}

// As any option given twice (the top-level help's rule): one value is
// fine, two are refused naming both spellings.
TEST(RepeatedOptions, OldAndNewSpellingTogetherNeedOneValue) {
  const std::string d = Root() + "/repeat-old";
  fs::create_directories(d);
  const std::string t = d + "/t.k3t", u = d + "/u.k3t";
  for (const std::string& args : {TraceGenArgs("--out " + Q(t) + " --trace " + Q(u)),
                                  TraceGenArgs("--trace " + Q(u) + " --out " + Q(t))}) {
    SCOPED_TRACE(args);
    CliRun r = Cli(args);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_TRUE(Contains(r.out, "error: --out and --trace are the same option, given as '")) << r.out;
    EXPECT_FALSE(fs::exists(t));
    EXPECT_FALSE(fs::exists(u));
  }
  CliRun r = Cli(TraceGenArgs("--out " + Q(t) + " --trace " + Q(t)));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(t));
}

TEST(ExclusiveOptions, ContradictingOptionsAreRefusedNamingBoth) {
  const std::string m = FreshModel("exclusive");
  const std::string manifest = m + "/none.manifest.json";  // never read: the parser refuses first
  const auto before = Snapshot(m);
  struct Case {
    std::string args, first, second;
  };
  const std::vector<Case> cases = {
      {"load --manifest " + Q(manifest) + " --no-read --copy", "--no-read", "--copy"},
      {"load --manifest " + Q(manifest) + " --copy --no-read", "--no-read", "--copy"},
      {"load --manifest " + Q(manifest) + " --no-read --populate", "--no-read", "--populate"},
      {"load --manifest " + Q(manifest) + " --copy --populate", "--copy", "--populate"},
      {"load --manifest " + Q(manifest) + " --no-read --dump " + Q(m + "/dump"), "--no-read", "--dump"},
      {"load --manifest " + Q(manifest) + " --json --summary", "--summary", "--json"},
      {"load --manifest " + Q(manifest) + " --quiet --progress bar", "--quiet", "--progress"},
      {"build " + Q(m) + " --model-config " + Q(m + "/config.json") + " --tokenizer-dir " + Q(m + "/tokenizer") +
           " --full-source-hashes --no-full-source-hashes",
       "--full-source-hashes", "--no-full-source-hashes"},
      {"manifest --gguf-dir " + Q(m) + " --no-full-source-hashes --full-source-hashes", "--full-source-hashes",
       "--no-full-source-hashes"},
      {"pack " + Q(m) + " --model-config " + Q(m + "/config.json") + " --force --repair-damaged", "--force",
       "--repair-damaged"},
      {"verify --manifest " + Q(manifest) + " --samples 3 --full", "--samples", "--full"},
      {"run-experts --manifest " + Q(manifest) + " --layer 1 --all-layers", "--layer", "--all-layers"},
      {"trace replay --trace t.k3t --cache-mib 1 --simulate --direct", "--simulate", "--direct"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    CliRun r = Cli(c.args);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_TRUE(Contains(r.out, "error: " + c.first + " and " + c.second + " cannot be used together")) << r.out;
  }
  EXPECT_EQ(Snapshot(m), before) << "a refused command changed the model directory";
  // The help lists what cannot go together.
  CliRun help = Cli("load --help");
  EXPECT_EQ(help.code, 0);
  EXPECT_TRUE(Contains(help.out, "not together:")) << help.out;
  EXPECT_TRUE(Contains(help.out, "--no-read and --copy")) << help.out;
}

// The sweep's timed and expert-parallel modes write no plot and the timed
// one always computes its optimum: the options they would ignore are
// refused, before any trace is generated or plot path created.
TEST(ExclusiveOptions, SweepModesRefuseThePlotOptions) {
  const std::string d = Root() + "/sweep-modes";
  fs::remove_all(d);
  fs::create_directories(d);
  const std::string svg = d + "/p.svg";
  struct Case {
    std::string args, first, second;
  };
  const std::vector<Case> cases = {
      {"--timing --svg " + Q(svg), "--timing", "--svg"},
      {"--ep-size 2 --svg " + Q(svg), "--ep-size", "--svg"},
      {"--timing --force", "--timing", "--force"},
      {"--ep-size 2 --force", "--ep-size", "--force"},
      {"--timing --no-belady", "--timing", "--no-belady"},
      {"--timing --ep-size 2", "--timing", "--ep-size"},
      {"--learner --ep-size 2", "--learner", "--ep-size"},
      {"--learner --timing", "--learner", "--timing"},
      {"--informed-next --timing", "--informed-next", "--timing"},
      {"--informed-next --no-belady", "--informed-next", "--no-belady"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args);
    CliRun r = Cli("trace sweep --family kimi --layers 2 --experts 8 --top-k 2 --sizes 4 " + c.args);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_TRUE(Contains(r.out, "error: " + c.first + " and " + c.second + " cannot be used together")) << r.out;
  }
  CliRun r = Cli("trace replay --trace t.k3t --cache-mib 1 --simulate --prefetch oracle-lookahead");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(Contains(r.out, "error: --simulate and --prefetch cannot be used together")) << r.out;
  EXPECT_TRUE(fs::is_empty(d)) << "a refused sweep wrote something";
}

}  // namespace
}  // namespace k3cli
