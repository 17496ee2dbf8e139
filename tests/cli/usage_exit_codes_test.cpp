// The same mistake gets the same exit code in every command (session 41's
// JSON-contract audit): a bad --io, an --ep-size the model's experts refuse
// and an output that cannot be derived are usage errors (2), as in trace
// replay, trace sweep and for an implied --model-config. They were exit 1 in
// run-experts, pack/build (with the config implied) and ep-merge.
#include <gtest/gtest.h>

#include <fstream>

#include "cli_fixture.h"

namespace k3cli {
namespace {

constexpr const char* kRefusedSize =
    "error: --ep-size 3 does not divide the 16 routed experts per layer; SGLang's expert parallelism gives every "
    "rank the same number of experts, so the size must be a divisor of 16";

TEST(UsageExitCodes, AnEpSizeTheModelRefusesIsAUsageErrorEverywhere) {
  const std::string& m = BuiltTinyModel();
  const auto before = Snapshot(m);
  // The config implied by the model directory, as users run them.
  for (const std::string& cmd : {"pack --progress none " + Q(m) + " --ep-size 3 --ep-rank 0",
                                 "build --progress none " + Q(m) + " --ep-size 3 --ep-rank all",
                                 "run-experts --progress none " + Q(m) + " --ep-size 3"}) {
    SCOPED_TRACE(cmd);
    CliRun r = Cli(cmd);
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_TRUE(Contains(r.out, kRefusedSize)) << r.out;
    EXPECT_FALSE(Contains(r.out, "EP rank 0:")) << r.out;  // said once, not as a rank's store failing
  }
  EXPECT_EQ(Snapshot(m), before);
}

TEST(UsageExitCodes, AnUnknownIoBackendIsAUsageErrorInRunExpertsAsInReplay) {
  const std::string& m = BuiltTinyModel();
  CliRun r = Cli("run-experts --progress none " + Q(m) + " --io foo");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(Contains(r.out, "error: --io: unknown I/O backend 'foo' (known: pread, uring)")) << r.out;
}

TEST(UsageExitCodes, AnEpMergeOutputThatCannotBeDerivedIsAUsageError) {
  const std::string dir = Root() + "/merge-derive";
  fs::create_directories(dir);
  const std::string odd = dir + "/rank.bin";
  { std::ofstream(odd) << "not a pack"; }
  CliRun r = Cli("ep-merge --progress none " + Q(odd));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(Contains(r.out, "error: --pack is required: " + odd +
                                  " is not named <stem>.epR-of-N.pack, so the full pack's name cannot be derived "
                                  "from it"))
      << r.out;
}

}  // namespace
}  // namespace k3cli
