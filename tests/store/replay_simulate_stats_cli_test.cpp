// `trace replay --simulate --stats F`: --stats is the expert store's stats
// snapshot, and a simulation opens no store, so the combination is a usage
// error naming both options, checked before the trace is read; F is never
// created or touched. Before, --stats was silently ignored (exit 0, no file).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "../cli_run.h"
#include "store/synthetic_pack.h"

namespace k3pack::store {
namespace {

namespace fs = std::filesystem;
using testing_cli::Cli;
using testing_cli::CliRun;

TEST(ReplaySimulateCli, StatsWithSimulateIsAUsageErrorNamingBothOptions) {
  testing::TinyPack p{testing::TinySpec{}, "simstats"};
  const std::string trace = p.dir + "/t.k3trace", stats = p.dir + "/s.json";
  CliRun g = Cli("trace gen --trace " + trace +
                 " --layers 2 --experts 8 --top-k 2 --requests 1 --prompt-tokens 2 --decode-tokens 8");
  ASSERT_EQ(g.code, 0) << g.out;
  const std::string sim = "trace replay --simulate --trace " + trace + " --object-bytes 1000 --cache-mib 1 ";

  CliRun r = Cli(sim + "--stats " + stats);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--simulate and --stats cannot be used together"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(stats));

  // Checked before the trace is read (a missing trace is not what is reported),
  // and an existing file is left as it was.
  std::ofstream(stats) << "precious\n";
  r = Cli("trace replay --simulate --trace " + p.dir + "/missing.k3trace --cache-mib 1 --stats " + stats + " --force");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--simulate and --stats cannot be used together"), std::string::npos) << r.out;
  std::stringstream kept;
  kept << std::ifstream(stats).rdbuf();
  EXPECT_EQ(kept.str(), "precious\n");

  // Without --stats the simulation runs as before; with a manifest and no
  // --simulate, --stats is written.
  r = Cli(sim);
  EXPECT_EQ(r.code, 0) << r.out;
  fs::remove(stats);
  r = Cli("trace replay --trace " + trace + " --manifest " + p.manifest + " --cache-mib 1 --stats " + stats);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(stats));
}

}  // namespace
}  // namespace k3pack::store
