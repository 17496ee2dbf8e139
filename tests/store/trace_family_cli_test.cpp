// `k3pack trace gen --family`, `trace sweep --family all` and `--timing`
// end to end through the built CLI, on small dimensions.
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "small_family.h"
#include "store/synthetic_pack.h"
#include "util/file.h"
#include "../cli_run.h"

namespace k3pack::store {
namespace {

using testing_cli::Cli;
using testing_cli::CliRun;
using testing_traces::kSmallFamilyArgs;

TEST(TraceFamilyCli, GenFamiliesAndBadFamily) {
  std::string dir = testing::TinyPack::TempDir("families");
  CliRun r = Cli("trace gen --family batched --predict --json --trace " + dir + "/b.k3trace" + kSmallFamilyArgs);
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["version"], 2);
  EXPECT_NEAR(j["measured_reuse"].get<double>(), 0.3, 0.1) << "interleaved rows are matched by request";
  CliRun bad = Cli("trace gen --family nope --trace " + dir + "/x.k3trace");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("unknown trace family 'nope'"), std::string::npos) << bad.out;
  std::filesystem::remove_all(dir);
}

// With one token per request no row follows another: the measured reuse
// was printed as 0.0%, a figure nothing measured. --predict on one routed
// layer wrote a v2 trace without any prediction and said nothing.
TEST(TraceFamilyCli, NothingToMeasureOrPredictIsSaidSo) {
  std::string dir = testing::TinyPack::TempDir("nothing-measured");
  const std::string dims = " --family kimi --layers 4 --experts 32 --top-k 4 --requests 2 --concurrent 1"
                           " --prompt-tokens 0";
  const std::string one_token = dims + " --decode-tokens 1";
  CliRun j = Cli("trace gen --json --trace " + dir + "/one.k3trace" + one_token);
  ASSERT_EQ(j.code, 0) << j.out;
  EXPECT_TRUE(nlohmann::json::parse(j.out)["measured_reuse"].is_null()) << j.out;
  CliRun text = Cli("trace gen --force --trace " + dir + "/one.k3trace" + one_token);
  ASSERT_EQ(text.code, 0) << text.out;
  EXPECT_NE(text.out.find("measured reuse n/a"), std::string::npos) << text.out;
  CliRun two = Cli("trace gen --json --trace " + dir + "/two.k3trace" + dims + " --decode-tokens 2");
  ASSERT_EQ(two.code, 0) << two.out;
  EXPECT_TRUE(nlohmann::json::parse(two.out)["measured_reuse"].is_number()) << two.out;

  CliRun one_layer = Cli("trace gen --predict --trace " + dir + "/l.k3trace --layers 1 --experts 32 --top-k 4"
                         " --requests 1 --prompt-tokens 0 --decode-tokens 3");
  ASSERT_EQ(one_layer.code, 0) << one_layer.out;
  EXPECT_NE(one_layer.out.find("--predict recorded no predictions: the trace routes one layer"), std::string::npos)
      << one_layer.out;
  CliRun two_layers = Cli("trace gen --predict --trace " + dir + "/l2.k3trace --layers 2 --experts 32 --top-k 4"
                          " --requests 1 --prompt-tokens 0 --decode-tokens 3");
  ASSERT_EQ(two_layers.code, 0) << two_layers.out;
  EXPECT_EQ(two_layers.out.find("recorded no predictions"), std::string::npos) << two_layers.out;
  std::filesystem::remove_all(dir);
}

TEST(TraceFamilyCli, SweepAllFamiliesWithBounds) {
  std::string dir = testing::TinyPack::TempDir("sweep-all");
  CliRun r = Cli("trace sweep --family all --json --sizes 64,128 --svg " + dir + "/p.svg" + kSmallFamilyArgs);
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out)["families"];
  for (const char* f : {"kimi", "drift", "interleaved", "batched", "layer-local", "prefill-burst"}) {
    ASSERT_TRUE(j.contains(f)) << f;
    const auto& hr = j[f]["hit_rate"];
    for (const char* s : {"lru", "reuse-lfu-lru-v2", "decay-lfu", "quota-decay", "adaptive", "belady", "informed"})
      ASSERT_TRUE(hr.contains(s)) << f << " " << s;
    for (int i = 0; i < 2; ++i) {
      EXPECT_LE(hr["informed"][i].get<double>(), hr["belady"][i].get<double>() + 1e-12) << f;
      EXPECT_LE(hr["adaptive"][i].get<double>(), hr["belady"][i].get<double>() + 1e-12) << f;
    }
    EXPECT_TRUE(std::filesystem::exists(dir + "/p-" + std::string(f) + ".svg")) << f;
  }
  std::filesystem::remove_all(dir);
}

TEST(TraceFamilyCli, TimingReportsStallsAndPrefetch) {
  std::string dir = testing::TinyPack::TempDir("timing");
  CliRun r = Cli("trace sweep --timing --family kimi --policies lru --json --sizes 64 " + kSmallFamilyArgs);
  ASSERT_EQ(r.code, 0) << r.out;
  auto rows = nlohmann::json::parse(r.out)["timing"];
  ASSERT_EQ(rows.size(), 3u);  // lru without and with prefetch, Belady with perfect prefetch
  EXPECT_EQ(rows[0]["prefetch"], false);
  EXPECT_EQ(rows[0]["prefetch_useful_bytes"], 0);
  EXPECT_EQ(rows[1]["prefetch"], true);
  EXPECT_GT(rows[1]["prefetch_useful_bytes"].get<double>(), 0);
  EXPECT_EQ(rows[2]["policy"], "belady");
  // The exact counts stand beside the ratios made of them (the JSON once had the ratios only).
  for (const auto& row : rows) {
    const double tokens = row["tokens"].get<double>();
    ASSERT_GT(tokens, 0);
    ASSERT_GT(row["accesses"].get<uint64_t>(), 0u);
    EXPECT_LE(row["hits"].get<uint64_t>(), row["accesses"].get<uint64_t>());
    EXPECT_DOUBLE_EQ(row["hits"].get<double>() / row["accesses"].get<double>(), row["stall_free_fraction"].get<double>());
    EXPECT_DOUBLE_EQ(row["bytes_read"].get<double>() / tokens, row["bytes_per_token"].get<double>());
    EXPECT_DOUBLE_EQ(row["stall_s"].get<double>() / tokens, row["stall_per_token_s"].get<double>());
    EXPECT_EQ(row["prefetch_bytes"].get<uint64_t>() > 0, row["prefetch"].get<bool>()) << row.dump();
  }
  // Prefetch hides reads behind compute: fewer stalls than demand-only LRU.
  EXPECT_LT(rows[1]["stall_per_token_s"].get<double>(), rows[0]["stall_per_token_s"].get<double>());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace k3pack::store
