// Faults from an audit of damaged packs and manifests (docs/RELIABILITY.md,
// "session 42").
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "cli_fixture.h"

namespace k3cli {
namespace {

// A damaged digest sidecar made every store refuse the pack ("digest
// sidecar ... is invalid"), while a rerun of build or pack said "already
// built" and exited 0. The rerun now compares the pack with the shards and
// writes the sidecar anew.
TEST(DamagedArtifacts, ARerunWritesADamagedSidecarAnew) {
  const std::string m = FreshModel("damaged-sidecar");
  ASSERT_EQ(Cli("build --progress none --safety-margin-gib 0 " + Q(m)).code, 0);
  const std::string sidecar = m + "/" + kPackName + ".digests";
  const std::string intact = FileBytes(sidecar);
  const std::string manifest = Q(m + "/" + kManifestName);
  struct Damage {
    std::string name, bytes;
  };
  std::string flipped = intact;
  flipped[200] ^= 0x01;
  for (const Damage& d : {Damage{"a flipped record byte", flipped}, Damage{"cut short", intact.substr(0, 100)},
                          Damage{"emptied", ""}}) {
    for (const std::string command : {"build", "pack"}) {
      SCOPED_TRACE(d.name + ", " + command);
      std::ofstream(sidecar, std::ios::binary | std::ios::trunc) << d.bytes;
      CliRun refused = Cli("run-experts --progress none " + manifest + " --layer 1");
      EXPECT_NE(refused.code, 0) << "the damage did not show: " << refused.out;
      CliRun rerun = Cli(command + " --progress none --safety-margin-gib 0 " + Q(m));
      EXPECT_EQ(rerun.code, 0) << rerun.out;
      EXPECT_TRUE(Contains(rerun.out, "which every store refuses; writing it anew")) << rerun.out;
      EXPECT_EQ(FileBytes(sidecar), intact) << "the sidecar written anew differs from the build's";
      CliRun served = Cli("run-experts --progress none " + manifest + " --layer 1");
      EXPECT_EQ(served.code, 0) << served.out;
    }
  }
}

}  // namespace
}  // namespace k3cli
