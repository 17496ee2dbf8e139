// `k3pack trace gen/replay/sweep` limits end to end (session audit): hangs,
// hostile traces, values that wrapped or aborted, sizes and object bytes
// out of range, refusals after simulations had run, --manifest against
// explicit dimensions, timed rows without predictions, and --svg naming.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "store/synthetic_pack.h"
#include "../cli_run.h"

namespace k3pack::store {
namespace {

namespace fs = std::filesystem;
using testing_cli::Cli;
using testing_cli::CliRun;
using testing_cli::CliVia;

// A hang is a failure (exit 124), not a stalled test run.
CliRun Timed(const std::string& args) { return CliVia("timeout -k 5 60", args); }

bool Has(const CliRun& r, const std::string& text) { return r.out.find(text) != std::string::npos; }

// A small trace for the sweep and replay options (2 layers x 8 experts).
std::string SmallTrace(const std::string& dir, const std::string& extra = "") {
  const std::string t = dir + (extra.empty() ? "/small.k3t" : "/small-extra.k3t");
  CliRun g = Cli("trace gen --trace " + t + " --layers 2 --experts 8 --top-k 2 --requests 1 --prompt-tokens 2 " +
                 "--decode-tokens 8 " + extra);
  EXPECT_EQ(g.code, 0) << g.out;
  return t;
}

// Before: these never ended (ZipfWeights' tail weights could not be drawn).
TEST(TraceLimitsCli, SteepSkewsFinish) {
  const std::string dir = testing::TinyPack::TempDir("limits-skew");
  int i = 0;
  for (const std::string opt : {"--request-skew 8", "--request-skew 2000", "--skew 2000", "--skew 1e300"}) {
    CliRun r = Timed("trace gen --trace " + dir + "/s" + std::to_string(i++) +
                     ".k3t --layers 2 --experts 896 --top-k 16 --requests 2 --prompt-tokens 2 --decode-tokens 4 " +
                     opt);
    EXPECT_EQ(r.code, 0) << opt << ": " << r.out;
  }
  CliRun s = Timed("trace sweep --family kimi --request-skew 30 --layers 2 --requests 1 --decode-tokens 8 "
                   "--policies lru --sizes 64 --json --svg " + dir + "/s.svg");
  EXPECT_EQ(s.code, 0) << s.out;
}

// Before: 850 bytes made replay and sweep allocate GBs (std::bad_alloc at
// 2,000 layers).
TEST(TraceLimitsCli, HostileObjectCountIsRefusedNamingTheFile) {
  const std::string dir = testing::TinyPack::TempDir("limits-hostile");
  const std::string t = dir + "/t.k3t";
  {
    std::ofstream f(t, std::ios::binary);
    auto put = [&](auto v) { f.write(reinterpret_cast<const char*>(&v), sizeof v); };
    f.write("K3TRACE\0", 8);
    put(uint32_t{1}), put(uint32_t{65536}), put(uint32_t{1}), put(uint32_t{2000}), put(uint64_t{1});
    for (uint32_t l = 1; l <= 2000; ++l) put(l);
    put(uint32_t{1}), put(uint32_t{1}), put(uint32_t{0}), put(uint32_t{0}), put(uint16_t{0});
  }
  for (const std::string& cmd : {"trace sweep --sizes 2 --svg " + dir + "/p.svg --trace " + t,
                                "trace replay --simulate --trace " + t}) {
    CliRun r = Timed(cmd);
    EXPECT_EQ(r.code, 1) << cmd << ": " << r.out;
    EXPECT_TRUE(Has(r, t + ": not a k3pack trace: 2000 layers x 65536 experts = 131072000 objects, more than a "
                           "trace may declare (1048576 = 2^20")) << cmd << ": " << r.out;
  }
  EXPECT_FALSE(fs::exists(dir + "/p.svg"));
}

// Before: bad_alloc, wrapped layer ids, "both 0", a silent 1 or a flat
// popularity, or a seed refused as negative.
TEST(TraceLimitsCli, GenValuesOutOfRangeAreUsageErrors) {
  const std::string dir = testing::TinyPack::TempDir("limits-gen");
  const std::string out = dir + "/x.k3t";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--domains 4294967295", "--domains 4294967295"},
      {"--domains 10000000", "--domains 10000000"},
      {"--layers 4294967295", "--layers 4294967295 x --experts 896"},
      {"--prompt-tokens 4294967295 --prefill-chunk 4294967295", "--prompt-tokens 4294967295"},
      {"--prompt-tokens 4294967295 --decode-tokens 1", "--prompt-tokens 4294967295"},
      {"--first-layer 4294967295 --layers 3", "--first-layer must be at most 4294967293"},
      {"--concurrent 0", "--concurrent must be an integer in 1..4294967295, got 0"},
      {"--skew -1", "--skew must be at least 0"},
      {"--experts 70000", "--experts must be an integer in 1..65536, got 70000"},
      {"--experts 4294967296", "--experts must be an integer in 1..65536, got 4294967296"},
      {"--experts 8 --top-k 9", "--top-k must be an integer in 1..--experts 8, got 9"},
      {"--top-k 0", "--top-k must be an integer in 1..--experts 896, got 0"},
      {"--seed 9223372036854775808", "--seed must be an integer in 0..9223372036854775807, got 9223372036854775808"},
      {"--requests 1 --prompt-tokens 0 --decode-tokens 536870912 --layers 2 --experts 64 --top-k 1",
       "--requests 1 x (--prompt-tokens 0 + --decode-tokens 536870912) x 2 layers is more than the 67108864 token "
       "passes (2^26) a generated trace may hold"},
      {"--request-skew -0.5", "--request-skew must be at least 0"},
      {"--requests 4294967296", "--requests must be an integer in 1..4294967295, got 4294967296"},
      {"--seed -1", "--seed must be an integer in 0..9223372036854775807, got -1"},
  };
  for (const auto& [opt, want] : cases) {
    CliRun r = Timed("trace gen --trace " + out + " " + opt);
    EXPECT_EQ(r.code, 2) << opt << ": " << r.out;
    EXPECT_TRUE(Has(r, want)) << opt << ": " << r.out;
  }
  EXPECT_FALSE(fs::exists(out));
  CliRun big_seed = Timed("trace gen --json --trace " + out + " --seed 99999999999 --layers 2 --experts 16 --top-k 2 "
                          "--requests 1 --decode-tokens 2");
  ASSERT_EQ(big_seed.code, 0) << big_seed.out;
  EXPECT_EQ(nlohmann::json::parse(big_seed.out)["seed"], 99999999999ll);
}

TEST(TraceLimitsCli, ObjectBytesAndSizesOutOfRangeAreUsageErrors) {
  const std::string dir = testing::TinyPack::TempDir("limits-sizes");
  const std::string t = SmallTrace(dir);  // 2 x 8 = 16 objects, largest call 2
  const std::string sweep = "trace sweep --policies lru --svg " + dir + "/p.svg --trace " + t + " ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {sweep + "--sizes 4 --object-bytes 0", "--object-bytes must be an integer in 1..68719476736, got 0"},
      {sweep + "--sizes 4 --object-bytes -1", "--object-bytes must be an integer in 1..68719476736, got -1"},
      {"trace replay --simulate --trace " + t + " --object-bytes 0", "--object-bytes must be an integer in 1.."},
      {sweep + "--sizes 4503599627370496", "--sizes 4503599627370496 is more than any trace's objects"},
      {sweep + "--sizes 4,17", "--sizes 17 is more than the 16 objects of --trace " + t},
      {sweep + "--sizes 4,4", "--sizes names 4 twice, got '4,4'"},
  };
  for (const auto& [cmd, want] : cases) {
    CliRun r = Timed(cmd);
    EXPECT_EQ(r.code, 2) << cmd << ": " << r.out;
    EXPECT_TRUE(Has(r, want)) << cmd << ": " << r.out;
  }
  // Per EP rank: 8 objects each.
  CliRun ep = Timed("trace sweep --policies lru --trace " + t + " --sizes 2,9 --ep-size 2");
  EXPECT_EQ(ep.code, 2) << ep.out;
  EXPECT_TRUE(Has(ep, "--sizes 9 is more than the 8 objects of each EP rank")) << ep.out;
  // Every object fits: still a valid size.
  CliRun all = Timed(sweep + "--sizes 2,16 --json");
  EXPECT_EQ(all.code, 0) << all.out;
}

// Before: kimi, drift and interleaved were simulated, then batched was
// refused ("at least 128").
TEST(TraceLimitsCli, FamilyAllChecksEveryFamilysSizesBeforeSimulating) {
  const std::string dir = testing::TinyPack::TempDir("limits-all");
  CliRun r = Timed("trace sweep --family all --layers 2 --experts 896 --top-k 16 --policies lru --sizes 100 "
                   "--progress json --svg " + dir + "/a.svg");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(Has(r, "--sizes 100 is below the largest call of family batched")) << r.out;
  EXPECT_FALSE(Has(r, "\"phase\"")) << "a simulation ran before the refusal: " << r.out;
  EXPECT_TRUE(fs::is_empty(dir));
}

TEST(TraceLimitsCli, QueueDepthIsRangeChecked) {
  testing::TinyPack p{testing::TinySpec{}, "limits-qd"};
  const std::string t = SmallTrace(p.dir);
  for (const std::string depth : {"4294967297", "4294967296", "2147483647", "1025", "0"}) {
    for (const std::string& cmd :
         {"trace replay --cache-mib 1 --manifest " + p.manifest + " --trace " + t + " --queue-depth " + depth,
          "trace sweep --timing --policies lru --sizes 4 --trace " + t + " --queue-depth " + depth}) {
      CliRun r = Timed(cmd);
      EXPECT_EQ(r.code, 2) << cmd << ": " << r.out;
      EXPECT_TRUE(Has(r, "--queue-depth must be an integer in 1..1024, got " + depth)) << cmd << ": " << r.out;
    }
  }
  CliRun most = Timed("trace sweep --timing --policies lru --sizes 4 --trace " + t + " --queue-depth 1024");
  EXPECT_EQ(most.code, 0) << most.out;
  EXPECT_TRUE(Has(most, "queue depth 1024")) << most.out;
}

// Before: the manifest's dimensions silently replaced the explicit ones.
TEST(TraceLimitsCli, ManifestAndDisagreeingDimensionsAreRefused) {
  testing::TinyPack p{testing::TinySpec{}, "limits-manifest"};  // layers 1-2, 8 experts, top-2
  const std::string out = p.dir + "/m.k3t";
  for (const auto& [opt, want] : std::vector<std::pair<std::string, std::string>>{
           {"--experts 32", "--experts 32 disagrees with --manifest " + p.manifest + ", which gives 8"},
           {"--top-k 8", "--top-k 8 disagrees with --manifest"},
           {"--layers 10", "--layers 10 disagrees with --manifest"},
           {"--first-layer 5", "--first-layer 5 disagrees with --manifest"}}) {
    CliRun r = Cli("trace gen --trace " + out + " --manifest " + p.manifest + " " + opt);
    EXPECT_EQ(r.code, 2) << opt << ": " << r.out;
    EXPECT_TRUE(Has(r, want)) << opt << ": " << r.out;
  }
  EXPECT_FALSE(fs::exists(out));
  CliRun same = Cli("trace gen --trace " + out + " --manifest " + p.manifest +
                    " --experts 8 --top-k 2 --layers 2 --first-layer 1 --requests 1 --decode-tokens 4");
  EXPECT_EQ(same.code, 0) << same.out;
}

// Before: the prefetch rows equalled the demand rows, with no word.
TEST(TraceLimitsCli, TimedSweepWithoutPredictionsSaysSo) {
  const std::string dir = testing::TinyPack::TempDir("limits-timing");
  const std::string plain = SmallTrace(dir), predicted = SmallTrace(dir, "--predict");
  const std::string cmd = "trace sweep --timing --policies lru --sizes 4 --trace ";
  CliRun text = Cli(cmd + plain);
  ASSERT_EQ(text.code, 0) << text.out;
  EXPECT_TRUE(Has(text, "note: the trace has no next-layer predictions")) << text.out;
  CliRun json = Cli(cmd + plain + " --json");
  ASSERT_EQ(json.code, 0) << json.out;
  EXPECT_NE(nlohmann::json::parse(json.out).value("note", ""), "");
  CliRun with = Cli(cmd + predicted + " --json");
  ASSERT_EQ(with.code, 0) << with.out;
  EXPECT_FALSE(nlohmann::json::parse(with.out).contains("note")) << with.out;
}

// Before: at --horizon both the note said the prefetch rows equal the demand
// rows, while their keep hints (next-token predictions) made them equal the
// keep rows.
TEST(TraceLimitsCli, TimedSweepAtHorizonBothNamesTheRowsItEquals) {
  const std::string dir = testing::TinyPack::TempDir("limits-timing-both");
  const std::string t = dir + "/next-token-only.k3t";
  CliRun g = Cli("trace gen --trace " + t + " --layers 3 --experts 8 --top-k 2 --requests 1 --prompt-tokens 2 "
                 "--decode-tokens 12 --predict-next-token");
  ASSERT_EQ(g.code, 0) << g.out;
  CliRun r = Cli("trace sweep --timing --policies lru --sizes 4 --horizon both --keep-predicted --json --trace " + t);
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.value("note", ""),
            "the trace has no next-layer predictions: the prefetch rows read nothing ahead and equal the keep rows "
            "(their hints are the next-token predictions) (write it with `k3pack trace gen --predict`)");
  // The claim itself: the prefetch-with-keep row's counts are the keep
  // row's, and here the hints matter (the demand row differs).
  std::map<std::pair<bool, bool>, nlohmann::json> rows;  // (prefetch, keep_predicted)
  for (const auto& row : j.at("timing"))
    if (row.value("policy", "") == "lru") rows[{row.at("prefetch"), row.at("keep_predicted")}] = row;
  ASSERT_EQ(rows.size(), 3u) << r.out;
  const auto &demand = rows[{false, false}], &keep = rows[{false, true}], &both = rows[{true, true}];
  for (const char* field : {"hits", "bytes_read", "stall_s", "prefetch_bytes"})
    EXPECT_EQ(keep.at(field), both.at(field)) << field << ": " << r.out;
  EXPECT_NE(keep.at("hits"), demand.at("hits")) << r.out;
}

TEST(TraceLimitsCli, SvgNamingWithFamilyAll) {
  const std::string dir = testing::TinyPack::TempDir("limits-svg");
  const std::string small = " --layers 3 --experts 16 --top-k 4 --policies lru --progress none";
  // A directory is refused (before: `adir/` became `adir/-kimi`).
  fs::create_directories(dir + "/adir");
  for (const std::string& svg : {dir + "/adir/", dir + "/adir", dir + "/nodir/"}) {
    for (const std::string family : {"all", "kimi"}) {
      CliRun r = Cli("trace sweep --family " + family + " --svg " + svg + small);
      EXPECT_EQ(r.code, 1) << svg << ": " << r.out;  // as every writer's output that is a directory
      // A trailing '/' on a path that does not exist names a directory too
      // (session 36: it was called one).
      const bool missing = svg == dir + "/nodir/";
      EXPECT_TRUE(Has(r, "--svg " + svg + (missing ? " ends in '/', so it names a directory" : " is a directory")))
          << svg << ": " << r.out;
    }
  }
  EXPECT_TRUE(fs::is_empty(dir + "/adir"));
  // A path without an extension gets one per family (before: `plot-kimi`).
  CliRun r = Cli("trace sweep --family all --svg " + dir + "/plot" + small);
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* f : {"kimi", "drift", "interleaved", "batched", "layer-local", "prefill-burst"})
    EXPECT_TRUE(fs::exists(dir + "/plot-" + f + ".svg")) << f;
  EXPECT_FALSE(fs::exists(dir + "/plot-kimi"));
}

// Before: "trace record 1: layer 3 is not an active routed MoE layer",
// without the trace (--simulate named it).
TEST(TraceLimitsCli, RealReplayRecordErrorNamesTheTrace) {
  testing::TinyPack p{testing::TinySpec{}, "limits-replay"};
  const std::string other = p.dir + "/layers23.k3t";
  ASSERT_EQ(Cli("trace gen --trace " + other + " --first-layer 2 --layers 2 --experts 8 --top-k 2 --requests 1 "
                "--prompt-tokens 1 --decode-tokens 2").code, 0);
  CliRun r = Cli("trace replay --cache-mib 1 --manifest " + p.manifest + " --trace " + other);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Has(r, other + ": trace record 1: layer 3 is not an active routed MoE layer")) << r.out;
}

}  // namespace
}  // namespace k3pack::store
