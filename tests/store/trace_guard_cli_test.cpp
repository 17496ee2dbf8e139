// `k3pack trace` argument and output guards: the --stats overwrite rule, bad
// values as usage errors naming the option, and sweep sizes that fit the
// largest call.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "store/replay.h"
#include "store/synthetic_pack.h"
#include "../cli_run.h"

namespace k3pack::store {
namespace {

namespace fs = std::filesystem;
using testing_cli::Cli;
using testing_cli::CliRun;

std::string Slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void Spit(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// A pack, its manifest and a trace for it.
struct ReplayFixture {
  testing::TinyPack p{testing::TinySpec{}, "guard"};
  std::string trace = p.dir + "/t.k3trace";
  ReplayFixture() {
    CliRun g = Cli("trace gen --trace " + trace +
                   " --layers 2 --experts 8 --top-k 2 --requests 1 --prompt-tokens 2 --decode-tokens 8");
    EXPECT_EQ(g.code, 0) << g.out;
  }
  std::string Replay(const std::string& extra) const {
    return "trace replay --trace " + trace + " --manifest " + p.manifest + " --cache-mib 1 " + extra;
  }
};

TEST(TraceGuardCli, ReplayStatsNeverReplacesAnUnrelatedFile) {
  ReplayFixture f;
  const std::string keep = f.p.dir + "/keep.json";
  Spit(keep, "precious\n");
  CliRun r = Cli(f.Replay("--stats " + keep));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("over " + keep + " (--stats): it is a file that starts with"), std::string::npos) << r.out;
  // The hint offers no --force, which would be refused too.
  EXPECT_EQ(r.out.find("pass --force"), std::string::npos) << r.out;
  EXPECT_EQ(Slurp(keep), "precious\n");
  Spit(keep, "{\"model_type\": \"kimi\"}\n");  // a JSON document, not stats (a config given by a slip)
  r = Cli(f.Replay("--stats " + keep));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("it is a JSON document, not a stats file"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("pass --force"), std::string::npos) << r.out;
  Spit(keep, "precious\n");

  // Not even with --force: the store replaces only a stats file (a slip of
  // the path once wrote the counters over the pack being served).
  r = Cli(f.Replay("--stats " + keep + " --force"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("it is a file that starts with \"precious"), std::string::npos) << r.out;
  EXPECT_EQ(Slurp(keep), "precious\n");

  // A stats file (SGLang's keys, without k3pack's) is replaced with --force,
  // and the stats written are then ours, refreshed by a later run without it.
  Spit(keep, "{\"cache_policy\": \"reuse-lfu-lru-v2\"}\n");
  r = Cli(f.Replay("--stats " + keep));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("it is a stats file another store wrote"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("pass --force"), std::string::npos) << r.out;
  r = Cli(f.Replay("--stats " + keep + " --force"));
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string first = Slurp(keep);
  EXPECT_NE(first.find("\"k3pack\""), std::string::npos) << first;
  r = Cli(f.Replay("--stats " + keep));
  EXPECT_EQ(r.code, 0) << r.out;
  // The drop-in's stats (the device tier's k3pack section) are k3pack's too.
  Spit(keep, "{\"cache_policy\": \"reuse-lfu-lru-v2\", \"k3pack\": {\"io_backend\": \"auto\", \"slot_memory\": \"host\"}}\n");
  r = Cli(f.Replay("--stats " + keep));
  EXPECT_EQ(r.code, 0) << r.out;

  // A new path is simply written.
  r = Cli(f.Replay("--stats " + f.p.dir + "/new.json"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(f.p.dir + "/new.json"));
}

TEST(TraceGuardCli, ReplayStatsIsNeverAnInput) {
  ReplayFixture f;
  const std::string manifest_before = Slurp(f.p.manifest), trace_before = Slurp(f.trace);
  // A refusal (exit 1), as every writer's "is an input".
  CliRun r = Cli(f.Replay("--force --stats " + f.p.manifest));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("--stats"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("is an input"), std::string::npos) << r.out;
  r = Cli(f.Replay("--force --stats " + f.trace));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_EQ(Slurp(f.p.manifest), manifest_before);
  EXPECT_EQ(Slurp(f.trace), trace_before);
}

TEST(TraceGuardCli, ReplayBadValuesAreUsageErrorsNamingTheOption) {
  ReplayFixture f;
  for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{
           {"--policy", "foo"}, {"--io", "foo"}, {"--prefetch", "foo"}, {"--read-splits", "0"},
           {"--queue-depth", "0"}, {"--lookahead", "0 --prefetch oracle-lookahead"}}) {
    CliRun r = Cli(f.Replay(flag + " " + value));
    EXPECT_EQ(r.code, 2) << flag << ": " << r.out;
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag << ": " << r.out;
  }
  // Before: --read-splits 10000000 was taken, and the replay ran for minutes
  // building ranges; a value past 2^31 was "must be a positive integer".
  for (const auto& [value, said] : std::vector<std::pair<std::string, std::string>>{
           {"--read-splits 10000000", "--read-splits must be an integer in 1..1024, got 10000000"},
           {"--read-splits 4294967295", "--read-splits must be an integer in 1..1024, got 4294967295"},
           {"--lookahead 4294967295 --prefetch oracle-lookahead",
            "--lookahead must be an integer in 1..2147483647, got 4294967295"}}) {
    CliRun r = Cli(f.Replay(value));
    EXPECT_EQ(r.code, 2) << value << ": " << r.out;
    EXPECT_NE(r.out.find(said), std::string::npos) << value << ": " << r.out;
  }
}

TEST(TraceGuardCli, GenAndSweepRefuseZeroLayers) {
  const std::string dir = testing::TinyPack::TempDir("guard-layers");
  const std::string out = dir + "/lz.k3trace";
  CliRun r = Cli("trace gen --trace " + out + " --layers 0 --experts 16 --top-k 4 --requests 1 --decode-tokens 1");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--layers"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(out));
  r = Cli("trace sweep --layers 0 --experts 16 --top-k 4 --requests 1 --decode-tokens 1 --svg " + dir + "/p.svg");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--layers"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir + "/p.svg"));
}

// Before: a directory, a JSON file or a trace that does not read as one was
// refused only after the whole trace was generated (14 s for 2,000 tokens).
// The progress lines show whether generation started.
TEST(TraceGuardCli, GenRefusesItsOutputBeforeGenerating) {
  const std::string dir = testing::TinyPack::TempDir("guard-gen-out");
  fs::create_directory(dir + "/adir");
  { std::ofstream(dir + "/m.json") << "{\"format\": 1}\n"; }
  { std::ofstream(dir + "/bad.k3t") << "K3TRACE"; }
  const std::string gen = "trace gen --requests 1 --decode-tokens 3 --layers 2 --progress json --trace ";
  for (const auto& [path, said] : std::vector<std::pair<std::string, std::string>>{
           {dir + "/adir", "is a directory"},
           {dir + "/m.json", "m.json"},
           {dir + "/bad.k3t", "it is not a k3pack trace"}}) {
    CliRun r = Cli(gen + path);
    EXPECT_EQ(r.code, 1) << path << ": " << r.out;
    EXPECT_NE(r.out.find(said), std::string::npos) << path << ": " << r.out;
    EXPECT_EQ(r.out.find("\"phase\":\"gen\""), std::string::npos) << "generated before refusing: " << r.out;
  }
  EXPECT_EQ(Slurp(dir + "/m.json"), "{\"format\": 1}\n");
  // A trace already there is still compared after generating: the same
  // one is reported, another refused without --force and replaced with it.
  const std::string t = dir + "/t.k3t";
  ASSERT_EQ(Cli(gen + t).code, 0);
  CliRun same = Cli(gen + t);
  EXPECT_EQ(same.code, 0) << same.out;
  CliRun other = Cli(gen + t + " --seed 2");
  EXPECT_EQ(other.code, 1) << other.out;
  EXPECT_NE(other.out.find("it is not this trace"), std::string::npos) << other.out;
  EXPECT_EQ(Cli(gen + t + " --seed 2 --force").code, 0);
}

TEST(TraceGuardCli, GenValuesOutOfRangeAreUsageErrorsNamingTheOption) {
  const std::string dir = testing::TinyPack::TempDir("guard-gen");
  const std::string base = "trace gen --trace " + dir + "/x.k3trace --layers 2 --experts 16 --top-k 4 ";
  for (const std::string bad : {"--reuse 1.5", "--reuse -0.1", "--drift 2", "--predict-accuracy 1.1 --predict",
                                 "--predict-surprise 1 --predict", "--top-k 17", "--requests 0"}) {
    CliRun r = Cli(base + bad);
    EXPECT_EQ(r.code, 2) << bad << ": " << r.out;
    EXPECT_NE(r.out.find(bad.substr(0, bad.find(' '))), std::string::npos) << bad << ": " << r.out;
  }
  EXPECT_FALSE(fs::exists(dir + "/x.k3trace"));
}

TEST(TraceGuardCli, SweepDefaultSizesFitTheLargestCall) {
  const std::string dir = testing::TinyPack::TempDir("guard-sweep");
  for (const std::string family : {"batched", "prefill-burst"}) {
    const std::string svg = dir + "/" + family + ".svg";
    CliRun r = Cli("trace sweep --family " + family + " --layers 3 --experts 16 --top-k 4 --svg " + svg + " --json");
    ASSERT_EQ(r.code, 0) << family << ": " << r.out;
    EXPECT_TRUE(fs::exists(svg)) << family;
  }
  CliRun r = Cli("trace sweep --family all --layers 3 --experts 16 --top-k 4 --svg " + dir + "/all.svg");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(dir + "/all-batched.svg"));
}

TEST(TraceGuardCli, SweepRefusesSizesBelowTheLargestCallUpFront) {
  const std::string dir = testing::TinyPack::TempDir("guard-sizes");
  CliRun r = Cli("trace sweep --family batched --layers 3 --experts 16 --top-k 4 --sizes 4,8 --svg " + dir + "/b.svg");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--sizes 4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("family batched"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("pass --sizes of at least"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir + "/b.svg"));
  // --family all: the families before batched fit size 4, yet no plot of
  // the refused run is left behind.
  r = Cli("trace sweep --family all --layers 3 --experts 16 --top-k 4 --sizes 4,8 --svg " + dir + "/a.svg");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(fs::is_empty(dir)) << r.out;
  r = Cli("trace sweep --family kimi --layers 3 --experts 16 --top-k 4 --sizes 0,8 --svg " + dir + "/z.svg");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--sizes"), std::string::npos) << r.out;
}

TEST(TraceGuardCli, DefaultSweepSizesNeverBelowTheLeastCache) {
  ObjectSpace s;
  s.active_layer_ids.resize(3);
  s.num_experts = 16;
  s.top_k = 4;
  std::string note;
  const auto sizes = DefaultSweepSizes(s, &note, "the model", 16);
  ASSERT_FALSE(sizes.empty());
  EXPECT_EQ(sizes.front(), 16u);
  for (uint64_t v : sizes) EXPECT_GE(v, 16u);
  EXPECT_NE(note.find("largest call"), std::string::npos) << note;
}

// Session 14's trace audit. A sweep of --trace took the generator's options
// and ignored them (its table looked like the one they asked for); an empty
// trace printed 0% for every policy and Belady; a trace whose layers the
// manifest lacks was refused without naming the trace.
TEST(TraceGuardCli, SweepOfATraceFileRefusesGeneratorOptions) {
  ReplayFixture f;
  const std::string svg = f.p.dir + "/g.svg";
  for (const std::string opt : {"--reuse 0.9", "--layers 7", "--family drift", "--seed 3", "--predict",
                                "--predict-accuracy 0.5 --timing"}) {
    const bool timed = opt.find("--timing") != std::string::npos;  // it writes no plot
    CliRun r = Cli("trace sweep --trace " + f.trace + " --sizes 4 " + (timed ? "" : "--svg " + svg + " ") + opt);
    EXPECT_EQ(r.code, 2) << opt << ": " << r.out;
    EXPECT_NE(r.out.find(opt.substr(0, opt.find(' ')) + " and --trace cannot be used together"), std::string::npos)
        << opt << ": " << r.out;
  }
  EXPECT_FALSE(fs::exists(svg));
  CliRun ok = Cli("trace sweep --trace " + f.trace + " --sizes 4 --svg " + svg + " --manifest " + f.p.manifest);
  EXPECT_EQ(ok.code, 0) << ok.out;
  // A policy named twice ran twice, and the JSON (keyed by policy) kept one.
  CliRun twice = Cli("trace sweep --trace " + f.trace + " --sizes 4 --svg " + svg + " --policies lru,lru --json");
  EXPECT_EQ(twice.code, 2) << twice.out;
  EXPECT_NE(twice.out.find("--policies names lru twice"), std::string::npos) << twice.out;
  // Empty fields and signs: "lru," ran lru alone and "--sizes -1" wrapped to 2^64 - 1 objects.
  CliRun trailing = Cli("trace sweep --trace " + f.trace + " --sizes 4 --policies lru, --json");
  EXPECT_EQ(trailing.code, 2) << trailing.out;
  EXPECT_NE(trailing.out.find("unknown cache policy ''"), std::string::npos) << trailing.out;
  for (const std::string sizes : {"4,", ",4", "4,,8", "-1", " 4", "+4", ""}) {
    CliRun bad = Cli("trace sweep --trace " + f.trace + " --policies lru --json --sizes '" + sizes + "'");
    EXPECT_EQ(bad.code, 2) << "'" << sizes << "': " << bad.out;
    EXPECT_NE(bad.out.find("--sizes"), std::string::npos) << "'" << sizes << "': " << bad.out;
  }
}

TEST(TraceGuardCli, AnEmptyTraceIsRefusedNamingTheFile) {
  ReplayFixture f;
  trace::Trace empty;
  empty.num_experts = 8;
  empty.top_k = 2;
  empty.layer_ids = {1, 2};
  const std::string path = f.p.dir + "/empty.k3trace", svg = f.p.dir + "/e.svg";
  ASSERT_TRUE(trace::WriteTrace(path, empty).ok());
  for (const std::string& cmd : {"trace sweep --sizes 4 --svg " + svg + " --trace " + path,
                                "trace replay --simulate --cache-mib 1 --trace " + path,
                                "trace replay --manifest " + f.p.manifest + " --cache-mib 1 --trace " + path}) {
    CliRun r = Cli(cmd);
    EXPECT_EQ(r.code, 1) << cmd << ": " << r.out;
    EXPECT_NE(r.out.find(path + ": the trace has no records"), std::string::npos) << cmd << ": " << r.out;
  }
  EXPECT_FALSE(fs::exists(svg));
}

// Session 14: a trace of layer 2 only replayed on a layers-1-2 pack counted
// the store's tokens (at layer 1): 0, and 0 bytes per token.
TEST(TraceGuardCli, ReplayOfSomeLayersCountsTheTracesTokens) {
  ReplayFixture f;
  const std::string two = f.p.dir + "/layer2.k3trace";
  ASSERT_EQ(Cli("trace gen --trace " + two + " --first-layer 2 --layers 1 --experts 8 --top-k 2 --requests 1 "
                "--prompt-tokens 1 --decode-tokens 4").code, 0);
  for (const std::string mode : {"", " --simulate"}) {
    CliRun r = Cli("trace replay --json --cache-mib 1 --trace " + two + " --manifest " + f.p.manifest + mode);
    ASSERT_EQ(r.code, 0) << mode << ": " << r.out;
    auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["tokens"], 5) << mode;
    EXPECT_DOUBLE_EQ(j["bytes_per_token"].get<double>(), j["bytes_read"].get<double>() / 5) << mode;
  }
}

TEST(TraceGuardCli, ATraceLayerTheManifestLacksNamesTheTrace) {
  ReplayFixture f;
  const std::string other = f.p.dir + "/layers23.k3trace";
  ASSERT_EQ(Cli("trace gen --trace " + other + " --first-layer 2 --layers 2 --experts 8 --top-k 2 --requests 1 "
                "--prompt-tokens 1 --decode-tokens 2").code, 0);
  for (const std::string& cmd : {"trace sweep --sizes 4 --svg " + f.p.dir + "/l.svg --manifest " + f.p.manifest,
                                "trace replay --simulate --cache-mib 1 --manifest " + f.p.manifest}) {
    CliRun r = Cli(cmd + " --trace " + other);
    EXPECT_EQ(r.code, 1) << cmd << ": " << r.out;
    EXPECT_NE(r.out.find(other + ": trace record 1: layer 3 is not an active routed MoE layer"), std::string::npos)
        << cmd << ": " << r.out;
  }
}

// Session 14: a MiB count of 2^44 or more wrapped to a few bytes when
// shifted: --cache-mib 17592186044416 was a 0-byte cache ("cannot evict the
// active top-k working set"), --device-mib the same silently no device tier.
TEST(TraceGuardCli, MibCountsBeyond64BitBytesAreUsageErrors) {
  ReplayFixture f;
  const std::string wrap = "17592186044416";  // 2^44 MiB = 2^64 bytes
  for (const std::string& cmd :
       {"trace replay --simulate --trace " + f.trace + " --cache-mib " + wrap,
        "trace replay --manifest " + f.p.manifest + " --trace " + f.trace + " --cache-mib " + wrap,
        "trace sweep --timing --sizes 4 --trace " + f.trace + " --device-mib " + wrap,
        "trace sweep --timing --sizes 4 --trace " + f.trace + " --prefetch-budget-mib " + wrap,
        "run-experts " + f.p.manifest + " --cache-mib " + wrap}) {
    CliRun r = Cli(cmd);
    EXPECT_EQ(r.code, 2) << cmd << ": " << r.out;
    // The option and its largest value (run-experts words its bounds its own way).
    EXPECT_NE(r.out.find("-mib must be "), std::string::npos) << cmd << ": " << r.out;
    EXPECT_NE(r.out.find("17592186044415"), std::string::npos) << cmd << ": " << r.out;
  }
  CliRun most = Cli("trace replay --simulate --json --trace " + f.trace + " --cache-mib 17592186044415");
  EXPECT_EQ(most.code, 0) << most.out;
  EXPECT_NE(most.out.find("\"evictions\": 0"), std::string::npos) << most.out;
}

}  // namespace
}  // namespace k3pack::store
