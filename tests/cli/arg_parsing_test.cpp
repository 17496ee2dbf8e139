// The argument parser and the numeric options with what operators really type
// (session 15 paths-and-environment audit): `--` before a path that starts
// with "-", an option name where a value belongs, an empty value from an
// unset shell variable, a misspelled option, nan/inf, negative and
// out-of-range numbers, sample counts far above the entries. Each is a usage
// error (exit 2) naming the option, or works as asked, and never hangs:
// commands that hung before run under `timeout`.
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_fixture.h"

namespace k3cli {
namespace {

TEST(ArgParsing, DoubleDashEndsTheOptionsSoPathsMayStartWithADash) {
  const std::string root = Root() + "/dashes";
  fs::create_directories(root);
  fs::copy(BaseModel(), root + "/--model", fs::copy_options::recursive);
  fs::copy(BaseModel(), root + "/-model", fs::copy_options::recursive);
  // Before: `--` was taken as the PATH, then "unexpected argument -model" /
  // "unknown option --model".
  for (const std::string name : {"--model", "-model"}) {
    SCOPED_TRACE(name);
    CliRun r = CliVia("cd " + Q(root) + " &&", "inspect --summary -- " + name);
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_TRUE(Contains(r.out, "GGUF shard set: " + root + "/" + name + "/KIMI-K3-SYNTH")) << r.out;
  }
  // After `--` even --help is an argument (a path of that name).
  CliRun r = CliVia("cd " + Q(root) + " &&", "inspect -- --help");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "--help")) << r.out;
  EXPECT_FALSE(Contains(r.out, "usage:")) << r.out;
  // --json after `--` is an argument too: no JSON error is promised then.
  r = CliVia("cd " + Q(root) + " &&", "inspect -- --json");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_EQ(r.out.find('{'), std::string::npos) << r.out;
  // Before: "unexpected argument --full (did you mean --full?)".
  for (const std::string args : {"verify MODEL -- --full", "verify -- MODEL --full"}) {
    std::string cmd = args;
    cmd.replace(cmd.find("MODEL"), 5, Q(BuiltTinyModel()));
    r = Cli(cmd);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_TRUE(Contains(r.out, "error: unexpected argument --full (after `--` every word is an argument; give "
                                "options before `--`)")) << r.out;
  }
}

TEST(ArgParsing, AnOptionNameIsNeverTakenAsTheValueOfTheOptionBefore) {
  const std::string root = Root() + "/opt-as-value";
  fs::create_directories(root);
  // Before: a model was written into a directory named "--force".
  CliRun r = CliVia("cd " + Q(root) + " &&", "synth --out --force");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(Contains(r.out, "--out needs a value, but the next argument is the option --force "
                              "(write --out=--force if that is the value)"))
      << r.out;
  EXPECT_TRUE(fs::is_empty(root));
  r = Cli(TraceGen(root + "/t.k3t", "--seed --json"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(Contains(r.out, "--seed needs a value, but the next argument is the option --json")) << r.out;
  EXPECT_TRUE(fs::is_empty(root));
  // Attached, the value is taken as written.
  r = CliVia("cd " + Q(root) + " &&", "synth --out=--force");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(root + "/--force/config.json"));
}

TEST(ArgParsing, EmptyValuesAndArgumentsAreUsageErrors) {
  const std::string root = Root() + "/empty-values";
  fs::create_directories(root);
  // `k3pack build "$MODEL"` with MODEL unset: before, "--tokenizer-dir  does
  // not exist" (exit 1); `synth --out ""`: "cannot create directory : Invalid argument".
  CliRun r = CliVia("cd " + Q(root) + " &&", "build ''");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(Contains(r.out, "error: an argument is empty (an unset shell variable?)")) << r.out;
  for (const std::string& args : {std::string("synth --out ''"), std::string("synth --out=")}) {
    SCOPED_TRACE(args);
    r = CliVia("cd " + Q(root) + " &&", args);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_TRUE(Contains(r.out, "error: --out needs a value, but an empty one was given")) << r.out;
  }
  // The command itself, and a word after --version (once ignored, exit 0).
  r = Cli("''");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(Contains(r.out, "k3pack: the command is an empty argument (an unset shell variable?)")) << r.out;
  r = Cli("-V build");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(Contains(r.out, "k3pack: -V takes no arguments, got 'build'")) << r.out;
  r = Cli("verify " + Q(BuiltTinyModel()) + " --manifest ''");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(Contains(r.out, "--manifest needs a value, but an empty one was given")) << r.out;
  EXPECT_TRUE(fs::is_empty(root));
}

TEST(ArgParsing, AMisspelledOptionGetsTheNearestName) {
  CliRun r = Cli("verify " + Q(BuiltTinyModel()) + " --sampels 3");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(Contains(r.out, "error: unknown option --sampels (did you mean --samples?)")) << r.out;
  // A unique prefix.
  r = Cli("verify " + Q(BuiltTinyModel()) + " --again");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(Contains(r.out, "error: unknown option --again (did you mean --against-source?)")) << r.out;
  // A long option written with one dash.
  r = Cli("inspect " + Q(BaseModel()) + " -json");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(Contains(r.out, "error: unexpected argument -json (did you mean --json?)")) << r.out;
  // Nothing near: no guess.
  r = Cli("inspect " + Q(BaseModel()) + " --zzzzzzzz");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(Contains(r.out, "error: unknown option --zzzzzzzz\n")) << r.out;
}

TEST(ArgParsing, NanAndInfAreUsageErrorsNotHangsOrNanTables) {
  const std::string root = Root() + "/non-finite";
  fs::create_directories(root);
  // Before: --skew nan, --skew inf and --request-skew nan spun forever
  // drawing from a NaN Zipf distribution.
  for (const std::string opt : {"--skew nan", "--skew inf", "--request-skew nan", "--drift -inf"}) {
    SCOPED_TRACE(opt);
    CliRun r = Timed(TraceGen(root + "/t.k3t", opt));
    EXPECT_EQ(r.code, 2) << r.out;
    const std::string name = opt.substr(0, opt.find(' ')), value = opt.substr(opt.find(' ') + 1);
    EXPECT_TRUE(Contains(r.out, "error: " + name + " must be a finite number, got '" + value + "'")) << r.out;
  }
  EXPECT_TRUE(fs::is_empty(root));
  const std::string trace = root + "/ok.k3t";
  ASSERT_EQ(Cli(TraceGen(trace)).code, 0);
  // Before: a table of nan (or an infinitely fast SSD), exit 0.
  for (const std::string opt : {"--compute-us nan", "--ssd-gbps inf", "--ssd-gbps nan", "--ssd-latency-us nan"}) {
    SCOPED_TRACE(opt);
    CliRun r = Timed("trace sweep --progress none --sizes 8 --timing --trace " + Q(trace) + " " + opt);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_TRUE(Contains(r.out, "must be a finite number")) << r.out;
    EXPECT_FALSE(Contains(r.out, "nan us/layer")) << r.out;
  }
  // Before: finite but absurd values ran, printing 300-digit stalls.
  for (const auto& [opt, said] : std::vector<std::pair<std::string, std::string>>{
           {"--ssd-gbps 1e-300", "--ssd-gbps must be in 0.001..10000 (1 MB/s to 10 TB/s), got 1e-300"},
           {"--ssd-gbps 0", "--ssd-gbps must be in 0.001..10000 (1 MB/s to 10 TB/s), got 0"},
           {"--compute-us 1e300", "--compute-us must be in 0..1e9 (up to 1,000 s), got 1e300"},
           {"--ssd-latency-us -1", "--ssd-latency-us must be in 0..1e9 (up to 1,000 s), got -1"},
           {"--device-mib 64 --h2d-gbps 1e5", "--h2d-gbps must be in 0.001..10000 (1 MB/s to 10 TB/s), got 1e5"},
           {"--device-mib 64 --h2d-latency-us 2e9", "--h2d-latency-us must be in 0..1e9 (up to 1,000 s), got 2e9"}}) {
    SCOPED_TRACE(opt);
    CliRun r = Timed("trace sweep --progress none --sizes 8 --timing --trace " + Q(trace) + " " + opt);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_TRUE(Contains(r.out, "error: " + said)) << r.out;
  }
  // Before: inf passed "non-negative" and the build went ahead (its byte
  // conversion undefined); nan refused with required=9223372036882134208.
  const std::string m = FreshModel("non-finite-margin");
  const auto before = Snapshot(m);
  for (const std::string margin : {"inf", "nan", "1e300"}) {
    SCOPED_TRACE(margin);
    CliRun r = Cli("pack --progress none --safety-margin-gib " + margin + " " + Q(m));
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_TRUE(Contains(r.out, "error: --safety-margin-gib must be ")) << r.out;
    EXPECT_EQ(Snapshot(m), before);
  }
}

// Session 36: decimal options took "+0.5", "0x10" (as 16) and leading
// blanks, as strtod does, where the README says they are refused; integer
// options already refused them.
TEST(ArgParsing, DecimalsArePlainDecimalToo) {
  const std::string root = Root() + "/plain-decimals";
  fs::create_directories(root);
  for (const std::string value : {"+0.5", "0x10", "' 0.5'", "0.5x", "0x1p-1"}) {
    SCOPED_TRACE(value);
    CliRun r = Cli(TraceGen(root + "/t.k3t", "--reuse " + value));
    EXPECT_EQ(r.code, 2) << r.out;
    const std::string shown = value.front() == '\'' ? value.substr(1, value.size() - 2) : value;
    EXPECT_TRUE(Contains(r.out, "error: --reuse must be a number, got '" + shown + "'")) << r.out;
  }
  CliRun r = Cli(TraceGen(root + "/t.k3t", "--skew 1e999"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(Contains(r.out, "error: --skew is out of range, got '1e999'")) << r.out;
  EXPECT_TRUE(fs::is_empty(root));
  // Plain decimals still read: a leading dot, an exponent, a minus sign where allowed.
  for (const std::string ok : {"--reuse .5", "--reuse 5e-1", "--skew 0.", "--drift -0"}) {
    SCOPED_TRACE(ok);
    EXPECT_EQ(Cli(TraceGen(root + "/t.k3t", ok + " --force")).code, 0);
  }
}

TEST(ArgParsing, IntegerListsAndIntegersTakeDigitsOnlyAndSayWhenOutOfRange) {
  const std::string root = Root() + "/int-lists";
  fs::create_directories(root);
  const std::string trace = root + "/ok.k3t";
  ASSERT_EQ(Cli(TraceGen(trace)).code, 0);
  // Before: "-1" was read as 2^64-1 ("18446744073709551615 57646075230342348800.00%"),
  // " 8" and "+8" as 8, and the empty item of "8," was dropped; all exit 0.
  for (const std::string sizes : {"-1", "' 8'", "+8", "8,", "8,,9", "0x10"}) {
    SCOPED_TRACE(sizes);
    CliRun r = Cli("trace sweep --progress none --trace " + Q(trace) + " --svg " + Q(root + "/s.svg") +
                   " --sizes " + sizes);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_TRUE(Contains(r.out, "error: --sizes must be a comma-separated list of non-negative integers")) << r.out;
    EXPECT_FALSE(fs::exists(root + "/s.svg"));
  }
  // Before: "must be an integer", although it is one.
  CliRun r = Cli(TraceGen(root + "/t.k3t", "--seed 18446744073709551616"));
  EXPECT_EQ(r.code, 2) << r.out;
  // The range of the option, not of int64 (session 41: it said "from -2^63").
  EXPECT_TRUE(Contains(r.out, "error: --seed must be an integer in 0..9223372036854775807, got 18446744073709551616"))
      << r.out;
  for (const std::string seed : {"12abc", "+5", "1e3", "0x10"}) {
    r = Cli(TraceGen(root + "/t.k3t", "--seed " + seed));
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_TRUE(Contains(r.out, "error: --seed must be an integer, got '" + seed + "'")) << r.out;
  }
  EXPECT_FALSE(fs::exists(root + "/t.k3t"));
}

TEST(ArgParsing, SampleCountsFarAboveTheEntriesCheckEveryEntryAtOnce) {
  const std::string& m = BuiltTinyModel();
  // Before: the sampling loop ran 10^14 times before reading a byte (hours).
  CliRun r = Timed("verify " + Q(m) + " --samples 99999999999999");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(Contains(r.out, "is more than the 144 entries there are to sample: every one was checked")) << r.out;
  r = Timed("manifest --progress none --force --payload-samples 99999999999999 --gguf-dir " + Q(m));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(Contains(r.out, "payload_samples_verified=144")) << r.out;
}

// `dump-tensor DIR` said "missing FILE_OR_DIR NAME"; a help text's own line
// breaks started at column 0 in `run-experts --help` and the trace helps.
TEST(ArgParsing, TheMissingArgumentIsNamedAndHelpTextsKeepTheirIndent) {
  CliRun r = Timed("dump-tensor " + Q(Root()));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(Contains(r.out, "error: missing NAME (after FILE_OR_DIR " + Root() + ")")) << r.out;
  r = Timed("dump-tensor");
  EXPECT_TRUE(Contains(r.out, "error: missing FILE_OR_DIR NAME")) << r.out;
  for (const std::string command : {"run-experts", "trace gen", "trace sweep", "trace replay", "build", "verify"}) {
    SCOPED_TRACE(command);
    r = Timed(command + " --help");
    ASSERT_EQ(r.code, 0) << r.out;
    // From "options:" to the blank line after them, every line is indented.
    const size_t from = r.out.find("\noptions:\n");
    ASSERT_NE(from, std::string::npos) << r.out;
    const size_t to = r.out.find("\n\n", from + 1);
    std::istringstream lines(r.out.substr(from + 10, to == std::string::npos ? std::string::npos : to - from - 10));
    for (std::string line; std::getline(lines, line);) EXPECT_EQ(line.rfind("  ", 0), 0u) << line;
  }
}

}  // namespace
}  // namespace k3cli
