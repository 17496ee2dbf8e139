// The expert-parallel options on the command line (issue 15, pack side):
// help texts, the ep-merge command, and preflight of rank outputs (an
// output that is an input is refused before a byte is written; the JSON
// result of --ep-rank all lists every rank pack).
#include <nlohmann/json.hpp>

#include "cli_fixture.h"

namespace k3cli {
namespace {

TEST(EpOptions, HelpTextsNameTheOptionsAndTheMergeCommand) {
  for (const char* cmd : {"pack", "build"}) {
    CliRun r = Cli(std::string(cmd) + " --help");
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_TRUE(Contains(r.out, "--ep-size")) << r.out;
    EXPECT_TRUE(Contains(r.out, "--ep-rank")) << r.out;
    EXPECT_TRUE(Contains(r.out, ".epR-of-N.pack")) << r.out;
  }
  CliRun top = Cli("--help");
  EXPECT_TRUE(Contains(top.out, "ep-merge")) << top.out;
  CliRun merge = Cli("ep-merge --help");
  EXPECT_EQ(merge.code, 0);
  EXPECT_TRUE(Contains(merge.out, "byte-identical")) << merge.out;
  CliRun none = Cli("ep-merge");
  EXPECT_EQ(none.code, 2) << none.out;
}

TEST(EpOptions, RankAllJsonListsEveryRankPack) {
  const std::string model = FreshModel("ep-json");
  CliRun r = Cli("pack " + Q(model) + " --model-config " + Q(model + "/config.json") +
                 " --safety-margin-gib 0 --progress none --json --ep-size 2 --ep-rank all 2>/dev/null");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["ep_size"], 2);
  ASSERT_EQ(j["rank_packs"].size(), 2u);
  for (int rank = 0; rank < 2; ++rank) {
    const auto& one = j["rank_packs"][rank];
    EXPECT_EQ(one["ep"]["rank"], rank);
    EXPECT_EQ(one["ep"]["first_expert"], rank * 8);
    EXPECT_TRUE(Contains(one["pack"].get<std::string>(), ".ep" + std::to_string(rank) + "-of-2.pack"));
    EXPECT_EQ(one["index_sha256"], j["rank_packs"][0]["index_sha256"]);
  }
  EXPECT_EQ(j["already_built"], false);
  // The rerun: every rank already built, said at the top as for one output,
  // each rank's path under "path" (session 42: neither was there).
  CliRun again = Cli("pack " + Q(model) + " --model-config " + Q(model + "/config.json") +
                     " --safety-margin-gib 0 --progress none --json --ep-size 2 --ep-rank all 2>/dev/null");
  ASSERT_EQ(again.code, 0) << again.out;
  auto k = nlohmann::json::parse(again.out, nullptr, false);
  ASSERT_FALSE(k.is_discarded()) << again.out;
  EXPECT_EQ(k["already_built"], true) << again.out;
  ASSERT_EQ(k["rank_packs"].size(), 2u);
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_EQ(k["rank_packs"][rank]["path"], j["rank_packs"][rank]["pack"]) << again.out;
}

TEST(EpOptions, RankPackThatIsAnInputIsRefused) {
  const std::string model = FreshModel("ep-overlap");
  // --pack named so that rank 0's pack would be the config file.
  fs::copy_file(model + "/config.json", model + "/c.ep0-of-2.pack");
  const auto before = Snapshot(model);
  CliRun r = Cli("pack " + Q(model) + " --model-config " + Q(model + "/c.ep0-of-2.pack") + " --pack " +
                 Q(model + "/c.pack") + " --safety-margin-gib 0 --progress none --ep-size 2 --ep-rank 0");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "c.ep0-of-2.pack is an input (--model-config)")) << r.out;
  EXPECT_EQ(Snapshot(model), before);
}

}  // namespace
}  // namespace k3cli
