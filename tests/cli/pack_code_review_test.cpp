// Faults from a code-reading audit of the pack, manifest and CLI code
// (docs/RELIABILITY.md, "session 45").
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_fixture.h"

namespace k3cli {
namespace {

// Flips one byte of `path` at `offset` (a shard edited in place: same size).
void FlipByte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  const char c = static_cast<char>(f.get());
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(static_cast<char>(c ^ 0x5a));
}

// A shard edited in place after the build: the plain rerun saw the change
// and pointed to --restart "to rewrite only what differs from the shards",
// which compared the payloads with the sidecar (the old shards' record),
// rewrote nothing, and recorded the new shards beside the old payload.
TEST(PackCodeReview, ARepairAfterTheShardsChangedComparesWithTheShards) {
  for (const std::string how : {"build --restart", "pack --repair-damaged"}) {
    SCOPED_TRACE(how);
    const std::string m = FreshModel("changed-shard");
    ASSERT_EQ(Cli("build --progress none --safety-margin-gib 0 " + Q(m)).code, 0);
    const std::string pack = m + "/" + kPackName;
    // A byte in the middle of the first shard's first routed-expert tensor.
    const std::string shard = m + "/KIMI-K3-SYNTH-00001-of-00003.gguf";
    const auto info = nlohmann::json::parse(Cli("inspect --json " + Q(shard)).out, nullptr, false);
    ASSERT_TRUE(info.is_object());
    uint64_t at = 0;
    for (const auto& t : info["tensors"]) {
      if (at == 0 && t["name"].get<std::string>().find("_exps.") != std::string::npos)
        at = t["data_offset"].get<uint64_t>() + t["nbytes"].get<uint64_t>() / 2 + 1000;
    }
    ASSERT_NE(at, 0u);
    FlipByte(shard, at);
    CliRun refused = Cli("build --progress none --safety-margin-gib 0 " + Q(m));
    ASSERT_EQ(refused.code, 1) << refused.out;
    ASSERT_TRUE(Contains(refused.out, "does not match GGUF source")) << refused.out;
    CliRun repair = Cli(how + " --progress none --safety-margin-gib 0 " + Q(m));
    EXPECT_EQ(repair.code, 0) << repair.out;
    EXPECT_TRUE(Contains(repair.out, "rewrote ")) << repair.out;
    EXPECT_TRUE(Contains(repair.out, "changed since the pack was built from it")) << repair.out;
    // build --restart writes the manifest of the new shards; after pack's
    // repair, the rerun of build finds the manifest older than the shard it
    // records (it called it "already built", and verify refused it).
    CliRun rerun = Cli("build --progress none --safety-margin-gib 0 " + Q(m));
    EXPECT_EQ(rerun.code, 0) << rerun.out;
    EXPECT_FALSE(Contains(rerun.out, "changed since")) << "the shards were not recorded: " << rerun.out;
    EXPECT_EQ(Contains(rerun.out, "was written to after it: writing a new manifest"), how == "pack --repair-damaged")
        << rerun.out;
    CliRun against = Cli("verify --progress none --full --against-source " + Q(m + "/" + kManifestName));
    EXPECT_EQ(against.code, 0) << against.out;
    CliRun full = Cli("verify --progress none --full " + Q(m + "/" + kManifestName));
    EXPECT_EQ(full.code, 0) << "the sidecar was not written anew: " << full.out;
  }
}

// `build --restart` took over any readable manifest at --manifest without
// --force (another model's, kept elsewhere), where the same build without
// --restart refused it.
TEST(PackCodeReview, ARepairTakesOverOnlyTheManifestOfItsPack) {
  const std::string a = FreshModel("restart-manifest-a");
  ASSERT_EQ(Cli("build --progress none --safety-margin-gib 0 " + Q(a)).code, 0);
  const std::string b = Root() + "/restart-manifest-b";
  std::filesystem::remove_all(b);
  ASSERT_EQ(Cli("synth --preset tiny --seed 7 --out " + Q(b)).code, 0);
  ASSERT_EQ(Cli("build --progress none --safety-margin-gib 0 " + Q(b)).code, 0);
  const std::string precious = Root() + "/restart-manifest-precious.json";
  std::filesystem::copy_file(b + "/" + kManifestName, precious, std::filesystem::copy_options::overwrite_existing);
  const std::string before = FileBytes(precious);
  for (const std::string flags : {"", " --restart"}) {
    SCOPED_TRACE(flags);
    CliRun run = Cli("build --progress none --safety-margin-gib 0 " + Q(a) + " --manifest " + Q(precious) + flags);
    EXPECT_EQ(run.code, 1) << run.out;
    EXPECT_TRUE(Contains(run.out, "it is not the manifest of this pack")) << run.out;
    EXPECT_EQ(FileBytes(precious), before);
  }
  // Its own pack's manifest is written anew by the repair.
  CliRun own = Cli("build --progress none --safety-margin-gib 0 --restart " + Q(a));
  EXPECT_EQ(own.code, 0) << own.out;
  EXPECT_TRUE(Contains(own.out, "MANIFEST_READY")) << own.out;
}

// A rank pack's digest sidecar copied over a full pack's: verify --full
// checked that rank's entries only and passed a damaged payload of another
// rank, and pack --repair-damaged rewrote nothing. verify refuses the
// sidecar, the repair compares every payload with the shards and writes the
// full pack's sidecar; a rank pack at the full pack's path is refused.
TEST(PackCodeReview, ARankSidecarBesideAFullPackIsNotItsRecord) {
  const std::string m = FreshModel("rank-sidecar-full-pack");
  ASSERT_EQ(Cli("build --progress none --safety-margin-gib 0 " + Q(m)).code, 0);
  const std::string pack = m + "/" + kPackName, sidecar = pack + ".digests";
  const std::string intact_pack = FileBytes(pack), intact_sidecar = FileBytes(sidecar);
  ASSERT_EQ(Cli("pack --progress none --safety-margin-gib 0 --ep-size 2 --ep-rank 0 " + Q(m)).code, 0);
  const std::string rank_pack = m + "/KIMI-K3-SYNTH.expert-major.ep0-of-2.pack";
  const std::string rank_sidecar = FileBytes(rank_pack + ".digests");
  std::ofstream(sidecar, std::ios::binary | std::ios::trunc) << rank_sidecar;
  std::string damaged = intact_pack;
  damaged[damaged.size() - 5000] ^= 0x40;  // the last payload: the last expert, rank 1's
  std::ofstream(pack, std::ios::binary | std::ios::trunc) << damaged;

  CliRun verify = Cli("verify --progress none --full " + Q(m + "/" + kManifestName));
  EXPECT_EQ(verify.code, 1) << verify.out;
  EXPECT_TRUE(Contains(verify.out, "is the sidecar of a pack of expert-parallel rank 0 of 2")) << verify.out;
  CliRun repair = Cli("pack --repair-damaged --progress none " + Q(m));
  EXPECT_EQ(repair.code, 0) << repair.out;
  EXPECT_TRUE(Contains(repair.out, "damaged=1 of ")) << repair.out;
  EXPECT_EQ(FileBytes(pack), intact_pack);
  EXPECT_EQ(FileBytes(sidecar), intact_sidecar) << "the full pack's sidecar was not written anew";
  CliRun full = Cli("verify --progress none --full " + Q(m + "/" + kManifestName));
  EXPECT_EQ(full.code, 0) << full.out;

  // The rank pack itself at the full pack's path: not filled in.
  std::filesystem::copy_file(rank_pack, pack, std::filesystem::copy_options::overwrite_existing);
  std::ofstream(sidecar, std::ios::binary | std::ios::trunc) << rank_sidecar;
  const std::string rank_bytes = FileBytes(pack);
  CliRun refused = Cli("pack --repair-damaged --progress none " + Q(m));
  EXPECT_EQ(refused.code, 1) << refused.out;
  EXPECT_TRUE(Contains(refused.out, "none of the other ranks' payloads is in it")) << refused.out;
  EXPECT_EQ(FileBytes(pack), rank_bytes);
}

}  // namespace
}  // namespace k3cli
