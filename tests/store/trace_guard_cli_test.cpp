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
  EXPECT_NE(r.out.find("refusing to overwrite existing " + keep + " (--stats)"), std::string::npos) << r.out;
  EXPECT_EQ(Slurp(keep), "precious\n");

  // --force replaces it; the stats written are then ours, refreshed by a
  // later run without --force.
  r = Cli(f.Replay("--stats " + keep + " --force"));
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string first = Slurp(keep);
  EXPECT_NE(first.find("\"cache_policy\""), std::string::npos) << first;
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
  CliRun r = Cli(f.Replay("--force --stats " + f.p.manifest));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--stats"), std::string::npos) << r.out;
  r = Cli(f.Replay("--force --stats " + f.trace));
  EXPECT_EQ(r.code, 2) << r.out;
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

}  // namespace
}  // namespace k3pack::store
