// `k3pack synth` argument guards: bad values are usage errors naming the
// option (checked before --out is looked at), "already built" compares the
// effective options, and an interrupted synth is started over by a rerun.
#include "cli_fixture.h"

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace k3cli {
namespace {

bool HasTempFiles(const std::string& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().extension() == ".tmp") return true;
  return false;
}

TEST(SynthGuardCli, BadValuesAreUsageErrorsNamingTheOption) {
  const std::string d = Root() + "/sg-bad";
  fs::remove_all(d);
  for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{
           {"--layers", "1"}, {"--top-k", "99"}, {"--shards", "500"}, {"--seed", "-5"}, {"--shards", "100000"}}) {
    CliRun r = Cli("synth --preset tiny --progress none --out " + Q(d) + " " + flag + " " + value);
    EXPECT_EQ(r.code, 2) << flag << " " << value << ": " << r.out;
    EXPECT_TRUE(Contains(r.out, flag)) << flag << ": " << r.out;
    EXPECT_FALSE(fs::exists(d)) << flag;
  }
}

TEST(SynthGuardCli, FlagsAreCheckedBeforeTheOverwriteRule) {
  const std::string d = Root() + "/sg-flags";
  fs::remove_all(d);
  fs::create_directories(d);
  std::ofstream(d + "/notes.txt") << "keep me";
  CliRun r = Cli("synth --preset tiny --progress foo --out " + Q(d));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(Contains(r.out, "--progress")) << r.out;
  EXPECT_FALSE(Contains(r.out, "refusing to overwrite")) << r.out;
  EXPECT_EQ(Snapshot(d).size(), 1u);
}

TEST(SynthGuardCli, AlreadyBuiltComparesTheEffectiveOptions) {
  const std::string d = Root() + "/sg-same";
  fs::remove_all(d);
  ASSERT_EQ(Cli("synth --out " + Q(d)).code, 0);
  const auto first = Snapshot(d);
  const std::string rel = fs::relative(d).string();
  for (const std::string& same :
       {"synth --out " + Q("./" + rel), "synth --out " + Q(d + "/"), "synth --out " + Q(rel) + " --seed 0",
        "synth --progress none --out " + Q(d), "synth --preset tiny --shards 3 --out " + Q(d),
        "synth --expert-types Q2_K,Q2_K,Q3_K --out " + Q(d) + " --json"}) {
    CliRun r = Cli(same);
    EXPECT_EQ(r.code, 0) << same << ": " << r.out;
    EXPECT_TRUE(Contains(r.out, "already built")) << same << ": " << r.out;
  }
  EXPECT_EQ(Snapshot(d), first);
  CliRun r = Cli("synth --seed 1 --out " + Q(d));  // another model: refused
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "refusing to overwrite")) << r.out;
  EXPECT_EQ(Snapshot(d), first);
}

// A model whose sidecar an earlier k3pack wrote (the arguments as given) is
// still recognized by the same arguments.
TEST(SynthGuardCli, SidecarOfAnEarlierVersionStillCounts) {
  const std::string d = Root() + "/sg-legacy";
  fs::remove_all(d);
  ASSERT_EQ(Cli("synth --seed 2 --out " + Q(d)).code, 0);
  std::ofstream(d + "/k3pack-profile.json")
      << R"({"profile": "scaled", "written_by": "k3pack synth", "synth_args": ["--seed", "2", "--out", )"
      << nlohmann::json(d).dump() << "]}\n";
  CliRun r = Cli("synth --seed 2 --out " + Q(d));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(Contains(r.out, "already built")) << r.out;
  r = Cli("synth --seed 3 --out " + Q(d));
  EXPECT_EQ(r.code, 1) << r.out;
}

TEST(SynthGuardCli, RerunAfterAnInterruptStartsOver) {
  const std::string d = Root() + "/sg-int";
  fs::remove_all(d);
  // The shell starts a background job with SIGINT ignored (and k3pack
  // leaves an ignored SIGINT ignored): perl restores the default first, as
  // for a command run in the foreground.
  const std::string cmd = "perl -e '$SIG{INT} = q(DEFAULT); exec @ARGV or die' -- " + std::string(K3PACK_BIN) +
                          " synth --out " + Q(d) + " --experts 256 --all-data --progress none";
  // SIGINT once the in-progress marker is there (mid-write).
  CliRun r = Cli("--version >/dev/null; ( " + cmd + " & pid=$!; i=0; "
                 "while ! [ -e " + Q(d + "/.k3pack-synth.partial") + " ] && kill -0 $pid 2>/dev/null && [ $i -lt 3000 ]; "
                 "do sleep 0.01; i=$((i+1)); done; kill -INT $pid; wait $pid; echo rc=$? )");
  ASSERT_TRUE(Contains(r.out, "rc=130")) << r.out;
  ASSERT_TRUE(fs::exists(d + "/.k3pack-synth.partial")) << "the interrupt came too late to leave a partial write";
  // The interrupted file was an unnamed temporary: nothing of it is left.
  EXPECT_FALSE(HasTempFiles(d));
  r = Cli("synth --out " + Q(d) + " --experts 256 --all-data --progress none");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(Contains(r.out, "starting over")) << r.out;
  EXPECT_FALSE(HasTempFiles(d));
  EXPECT_FALSE(fs::exists(d + "/.k3pack-synth.partial"));
  r = Cli("synth --out " + Q(d) + " --experts 256 --all-data --progress none");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(Contains(r.out, "already built")) << r.out;
}

}  // namespace
}  // namespace k3cli
