// Faults from a full-scale audit of the long runs (docs/RELIABILITY.md,
// "session 43"): what a run of minutes or hours says while it runs, when it
// stops, and before it fills a disk.
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_fixture.h"

namespace k3cli {
namespace {

// The JSON objects of a run's stderr (--progress json) that `keep` takes.
template <typename Keep>
std::vector<nlohmann::json> JsonLines(const std::string& out, Keep keep) {
  std::vector<nlohmann::json> found;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("{\"", 0) != 0) continue;
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded() && keep(j)) found.push_back(std::move(j));
  }
  return found;
}

// `load --dump` wrote until the disk was full (55 GB of a full-scale model's
// 62 GB of non-routed tensors), then failed with ENOSPC. The size is known
// from a walk of the stream that reads nothing: a dump that cannot fit is
// refused before DIR is made.
TEST(LongRuns, ADumpThatCannotFitIsRefusedBeforeItsFirstFile) {
  const std::string& m = BuiltTinyModel();
  const std::string dir = Root() + "/dump-no-room";
  fs::remove_all(dir);
  CliRun r = CliVia("env K3PACK_FAKE_FREE_BYTES=4096", "load --progress none --dump " + Q(dir) + " " + Q(m));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "--dump " + dir + ": the dump needs ")) << r.out;
  EXPECT_TRUE(Contains(r.out, " more (every emitted tensor as .npy) and the filesystem of " + Root() +
                                  " has 4.00 KiB free"))
      << r.out;
  EXPECT_TRUE(Contains(r.out, "No space left on device")) << r.out;
  EXPECT_FALSE(fs::exists(dir)) << r.out;
  // With room, the same dump is written.
  r = Cli("load --progress none --dump " + Q(dir) + " " + Q(m));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_FALSE(fs::is_empty(dir));
  // Its rerun compares and writes nothing: no room is needed.
  r = CliVia("env K3PACK_FAKE_FREE_BYTES=4096", "load --progress none --dump " + Q(dir) + " " + Q(m));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(Contains(r.out, "already built")) << r.out;
  // --force over it replaces files of the same size: no more room is needed.
  r = CliVia("env K3PACK_FAKE_FREE_BYTES=4096", "load --progress none --force --dump " + Q(dir) + " " + Q(m));
  EXPECT_EQ(r.code, 0) << r.out;
}

// A build stopped mid-copy told the holes of a sparse checkpoint as its
// copy rate in its last progress record ("367.81 GB/s"), where every record
// before it gave the rate of the bytes read.
TEST(LongRuns, AStoppedBuildsLastRateIsOfTheBytesItRead) {
  const std::string m = Root() + "/sparse-stopped";
  fs::remove_all(m);
  ASSERT_EQ(Cli("synth --preset k3-structure --layers 3 --experts 32 --out " + Q(m)).code, 0);
  CliRun r = CliVia("env K3PACK_TEST_BAD_ALLOC_AFTER_OBJECTS=40",
                    "pack --progress json --safety-margin-gib 0 --threads 1 " + Q(m));
  ASSERT_NE(r.code, 0) << r.out;
  auto stopped = JsonLines(r.out, [](const nlohmann::json& j) { return j.value("stopped", false); });
  ASSERT_EQ(stopped.size(), 1u) << r.out;
  const nlohmann::json& last = stopped[0];
  ASSERT_GT(last["done_bytes"].get<double>(), 0) << last.dump();
  ASSERT_GT(last["elapsed_s"].get<double>(), 0) << last.dump();
  // Nearly every byte is a hole: the rate of what was read is far below
  // done_bytes over the time taken.
  EXPECT_LT(last["bytes_per_s"].get<double>(),
            0.5 * last["done_bytes"].get<double>() / last["elapsed_s"].get<double>())
      << last.dump();
}

// A rerun of `build` (whole-shard hashes on, the default) over a build made
// with --no-full-source-hashes said "already built" and nothing else: the
// manifest it kept has no whole-shard hashes, which the run asked for.
TEST(LongRuns, ARerunAskingForShardHashesTheManifestLacksSaysSo) {
  const std::string m = FreshModel("no-shard-hashes");
  ASSERT_EQ(Cli("build --progress none --safety-margin-gib 0 --no-full-source-hashes " + Q(m)).code, 0);
  CliRun r = Cli("build --progress none --safety-margin-gib 0 " + Q(m));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(Contains(r.out, "already built")) << r.out;
  EXPECT_TRUE(Contains(r.out, "was written without whole-shard SHA-256 of the shards (--no-full-source-hashes) and "
                              "is kept as it is; `k3pack manifest "))
      << r.out;
  EXPECT_TRUE(Contains(r.out, "--force` writes it with them")) << r.out;
  const size_t from = r.out.find("`k3pack manifest "), to = r.out.find("` writes it with them");
  ASSERT_TRUE(from != std::string::npos && to != std::string::npos && to > from) << r.out;
  const std::string given = r.out.substr(from + 8, to - from - 8);  // after "`k3pack "
  r = Cli("build --progress none --safety-margin-gib 0 --no-full-source-hashes " + Q(m));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_FALSE(Contains(r.out, "whole-shard")) << r.out;
  // The command the note gives adds them, and says first what it reads
  // (its one long step; a log showed nothing for its first 10 s).
  r = Cli(given + " --progress json");
  EXPECT_EQ(r.code, 0) << given << "\n" << r.out;
  auto told = JsonLines(r.out, [](const nlohmann::json& j) {
    return j.value("note", "").starts_with("hashing every shard whole (");
  });
  ASSERT_EQ(told.size(), 1u) << r.out;
  EXPECT_TRUE(Contains(told[0]["note"].get<std::string>(), " MiB) for the manifest's whole-shard SHA-256; "
                                                           "--no-full-source-hashes skips it"))
      << r.out;
  r = Cli("build --progress none --safety-margin-gib 0 " + Q(m));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(Contains(r.out, "already built")) << r.out;
  EXPECT_FALSE(Contains(r.out, "whole-shard")) << r.out;
}

}  // namespace
}  // namespace k3cli
