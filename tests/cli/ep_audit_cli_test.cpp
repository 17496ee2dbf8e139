// Faults from a user-journey audit of the expert-parallel commands (docs/
// RELIABILITY.md, "session 42").
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_fixture.h"

namespace k3cli {
namespace {

// `ep-merge --force` of another checkpoint's rank packs (same layout) over a
// built pack left a pack whose payloads all match its own digest sidecar but
// none of the shards the manifest beside it records: `verify --full` said
// EXPERT_PACK_VERIFIED where a sampled `verify` found every payload wrong.
TEST(EpAudit, VerifyFullComparesTheDefaultSampleWithTheSource) {
  const std::string& good = BuiltTinyModel();
  CliRun ok = Cli("verify --progress none --full --json " + Q(good + "/" + kManifestName));
  ASSERT_EQ(ok.code, 0) << ok.out;
  EXPECT_EQ(nlohmann::json::parse(ok.out)["source_samples_checked"], 6) << ok.out;

  const std::string m = FreshModel("full-of-another");
  ASSERT_EQ(Cli("build --progress none --safety-margin-gib 0 " + Q(m)).code, 0);
  const std::string other = Root() + "/full-other-seed";
  fs::remove_all(other);
  ASSERT_EQ(Cli("synth --preset tiny --seed 7 --out " + Q(other)).code, 0);
  ASSERT_EQ(Cli("pack --progress none --safety-margin-gib 0 " + Q(other)).code, 0);
  for (const std::string suffix : {"", ".digests"})
    fs::copy_file(other + "/" + kPackName + suffix, m + "/" + kPackName + suffix,
                  fs::copy_options::overwrite_existing);
  CliRun full = Cli("verify --progress none --full " + Q(m));
  EXPECT_EQ(full.code, 1) << full.out;
  EXPECT_TRUE(Contains(full.out, "expert-pack payload does not match GGUF source for")) << full.out;
  EXPECT_TRUE(Contains(full.out, "every payload matches the pack's digest sidecar, so the pack is whole"))
      << full.out;
  EXPECT_FALSE(Contains(full.out, "EXPERT_PACK_VERIFIED")) << full.out;
}

// `--ep-rank all` found an output it must refuse at rank 2 after ranks 0
// and 1 were built (at full scale, hours of writing) and exited with them
// unreported. Every rank's outputs are now checked before the first write.
TEST(EpAudit, EveryRanksOutputsAreCheckedBeforeTheFirstRankIsWritten) {
  const std::string m = FreshModel("ep-all-preflight");
  const std::string stem = m + "/KIMI-K3-SYNTH.expert-major";
  struct Case {
    std::string command, blocked_path, refusal;
    bool directory;
  };
  const std::vector<Case> cases = {
      {"build", stem + ".ep2-of-4.pack", "it is a file that starts with", false},
      {"pack", stem + ".ep3-of-4.pack", "is a directory", true},
      {"build", m + "/kimi-k3-expert-pack.ep3-of-4.manifest.json", "not an adapter manifest", false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.command + " with " + c.blocked_path);
    if (c.directory) {
      fs::create_directories(c.blocked_path);
    } else {
      std::ofstream(c.blocked_path) << (c.blocked_path.ends_with(".json") ? "{\"model\": \"mine\"}\n" : "user data\n");
    }
    const auto before = Snapshot(m);
    for (const std::string force : {"", " --force"}) {
      CliRun r = Cli(c.command + " --progress none --safety-margin-gib 0 " + Q(m) + " --ep-size 4 --ep-rank all" +
                     force);
      EXPECT_EQ(r.code, 1) << r.out;
      EXPECT_TRUE(Contains(r.out, c.blocked_path)) << r.out;
      EXPECT_TRUE(Contains(r.out, c.refusal)) << r.out;
      EXPECT_EQ(Snapshot(m), before) << "a rank was written before the refusal:\n" << r.out;
    }
    fs::remove_all(c.blocked_path);
  }
}

}  // namespace
}  // namespace k3cli
