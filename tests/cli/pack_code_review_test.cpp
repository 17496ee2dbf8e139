// Faults from a code-reading audit of the pack, manifest and CLI code
// (docs/RELIABILITY.md, "session 45").
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <vector>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_fixture.h"
#include "../scratch_mount.h"

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

// Flips a byte in the middle of the first routed-expert tensor of the model's
// first shard (an edit in place: same size, same header).
void EditFirstShardsExperts(const std::string& m) {
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
    EditFirstShardsExperts(m);
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
    EXPECT_EQ(Contains(rerun.out, "the pack was brought to the shards as they are now after it was written"),
              how == "pack --repair-damaged")
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

// A repair whose rewrite hit a full disk said "write failed at offset N: No
// space left on device": no pack, no payload, no hint.
TEST(PackCodeReview, ARepairOnAFullDiskNamesThePackAndWhatToDo) {
  const std::string m = FreshModel("repair-enospc");
  k3pack::testing_scratch::ScratchMount disk(Root() + "/repair-enospc-disk", "tmpfs", "size=40m");
  if (!disk.ok) GTEST_SKIP() << "mounting a tmpfs needs root";
  const std::string pack = disk.dir + "/p.pack";
  ASSERT_EQ(Cli("pack --progress none --safety-margin-gib 0 " + Q(m) + " --pack " + Q(pack)).code, 0);
  const std::string intact = FileBytes(pack);
  // A hole in the last payload (damage the rewrite needs new blocks for),
  // then a full disk.
  const std::string punch = "fallocate -p -o " + std::to_string(intact.size() - 8192) + " -l 4096 " + Q(pack);
  ASSERT_EQ(std::system(punch.c_str()), 0);
  (void)std::system(("dd if=/dev/zero of=" + Q(disk.dir + "/filler") + " bs=64k >/dev/null 2>&1").c_str());
  CliRun full = Cli("pack --repair-damaged --progress none " + Q(m) + " --pack " + Q(pack));
  EXPECT_EQ(full.code, 1) << full.out;
  EXPECT_TRUE(Contains(full.out, "error: cannot rewrite ")) << full.out;
  EXPECT_TRUE(Contains(full.out, " in " + pack + ": ")) << full.out;
  EXPECT_TRUE(Contains(full.out, "hint: free space on the filesystem of " + pack)) << full.out;
  std::filesystem::remove(disk.dir + "/filler");
  CliRun rerun = Cli("pack --repair-damaged --progress none " + Q(m) + " --pack " + Q(pack));
  EXPECT_EQ(rerun.code, 0) << rerun.out;
  EXPECT_EQ(FileBytes(pack), intact) << "the rerun did not finish the repair";
}

// `load --dump DIR`, killed after its marker's temporary got its name and
// before the rename: the rerun read no list of the files DIR held before
// (the marker's final name was not there) and deleted every .npy file in
// it, the user's own among them.
TEST(PackCodeReview, AnInterruptedDumpKeepsTheFilesItsMarkersTemporaryLists) {
  const std::string m = FreshModel("dump-marker-temp");
  ASSERT_EQ(Cli("build --progress none --safety-margin-gib 0 " + Q(m)).code, 0);
  const std::string out = Root() + "/dump-marker-temp-out";
  std::filesystem::remove_all(out);
  std::filesystem::create_directories(out);
  const std::string own = "the user's own results";
  std::ofstream(out + "/users_own_results.npy", std::ios::binary) << own;
  // The temporary a dead writer left, whole: the marker it was to become.
  std::ofstream(out + "/.k3pack-dump.partial.999999.0.tmp")
      << R"({"k3pack_dump_in_progress":{"manifest":")" << m + "/" + kManifestName
      << R"(","found":["users_own_results.npy"]}})" << "\n";
  CliRun rerun = Cli("load --progress none " + Q(m + "/" + kManifestName) + " --dump " + Q(out));
  EXPECT_EQ(rerun.code, 0) << rerun.out;
  EXPECT_TRUE(Contains(rerun.out, "holds an interrupted dump; starting over")) << rerun.out;
  EXPECT_EQ(FileBytes(out + "/users_own_results.npy"), own) << "the user's own file was deleted";
  EXPECT_FALSE(std::filesystem::exists(out + "/.k3pack-dump.partial.999999.0.tmp"));
}

// `build` on a finished model said "already built" and kept a manifest
// without what its options asked for: another tokenizer directory, more
// payload samples, the whole pack's SHA-256. `k3pack manifest` refused the
// same options; build writes the manifest anew (the pack is kept).
TEST(PackCodeReview, ARerunOfBuildWritesTheManifestItsOptionsAskFor) {
  const std::string m = FreshModel("build-options");
  ASSERT_EQ(Cli("build --progress none --safety-margin-gib 0 " + Q(m)).code, 0);
  const std::string manifest = m + "/" + kManifestName, pack = m + "/" + kPackName;
  const std::string tok2 = Root() + "/build-options-tok2";
  std::filesystem::remove_all(tok2);
  std::filesystem::copy(m + "/tokenizer", tok2, std::filesystem::copy_options::recursive);
  std::ofstream(tok2 + "/special.json") << "{}";
  const auto pack_before = FileBytes(pack);
  auto recorded = [&] { return nlohmann::json::parse(FileBytes(manifest)); };
  struct Case {
    std::string flags, note;
    std::function<bool(const nlohmann::json&)> holds;
  };
  for (const Case& c : std::vector<Case>{
           {" --full-pack-hash", "it records no SHA-256 of the whole pack",
            [](const nlohmann::json& j) { return j["expert_pack"]["full_pack_hash"] == true; }},
           {" --payload-samples 50", "payload sample(s) verified, not 50",
            [](const nlohmann::json& j) { return j["expert_pack"]["payload_samples_verified"] == 50; }},
           {" --tokenizer-dir " + Q(tok2), "it records the tokenizer directory ",
            [&](const nlohmann::json& j) { return j["tokenizer"]["path"] == tok2; }}}) {
    SCOPED_TRACE(c.flags);
    CliRun run = Cli("build --progress none --safety-margin-gib 0 " + Q(m) + c.flags);
    EXPECT_EQ(run.code, 0) << run.out;
    EXPECT_TRUE(Contains(run.out, c.note)) << run.out;
    EXPECT_TRUE(Contains(run.out, "writing a new manifest as asked")) << run.out;
    EXPECT_TRUE(c.holds(recorded())) << run.out;
    CliRun again = Cli("build --progress none --safety-margin-gib 0 " + Q(m) + c.flags);
    EXPECT_EQ(again.code, 0) << again.out;
    EXPECT_TRUE(Contains(again.out, "already built")) << again.out;
  }
  EXPECT_EQ(FileBytes(pack), pack_before) << "the pack was rewritten";
}

// `pack`'s rate divided the whole pack's size (other ranks' holes, what a
// resumed build copied before) by this run's time.
TEST(PackCodeReview, PacksRateIsWhatThisRunCopied) {
  const std::string m = FreshModel("pack-rate");
  CliRun run = Cli("pack --progress none --safety-margin-gib 0 --json --ep-size 2 --ep-rank 1 " + Q(m));
  ASSERT_EQ(run.code, 0) << run.out;
  const auto j = nlohmann::json::parse(run.out.substr(run.out.find('{')), nullptr, false);
  ASSERT_TRUE(j.is_object()) << run.out;
  const double seconds = j["seconds"].get<double>();
  ASSERT_GT(seconds, 0);
  EXPECT_NEAR(j["bytes_per_second"].get<double>(), j["copied_bytes"].get<double>() / seconds,
              j["copied_bytes"].get<double>() / seconds * 1e-9)
      << run.out;
  EXPECT_LT(j["copied_bytes"].get<uint64_t>(), j["size"].get<uint64_t>()) << "a rank pack copies part of the pack";
}

// A finished pack beside a stray `<pack>.partial` with no checkpoint (an
// older k3pack's leftover, a user's copy): the plan took it for a rebuild to
// resume, which drops --force, and the build refused the pack with a hint to
// pass --force, whatever the flags.
TEST(PackCodeReview, AStrayPartialBesideAFinishedPackIsNoRebuildUnderWay) {
  const std::string m = FreshModel("stray-partial");
  ASSERT_EQ(Cli("pack --progress none --safety-margin-gib 0 " + Q(m)).code, 0);
  const std::string pack = m + "/" + kPackName;
  const std::string intact = FileBytes(pack);
  std::ofstream(pack + ".partial", std::ios::binary) << intact.substr(0, 4096);
  CliRun again = Cli("pack --progress none --safety-margin-gib 0 " + Q(m));
  EXPECT_EQ(again.code, 0) << again.out;
  EXPECT_TRUE(Contains(again.out, "already built")) << again.out;
  // A forced rebuild starts over: the partial file goes, as --restart's.
  CliRun forced = Cli("pack --progress none --safety-margin-gib 0 --force " + Q(m));
  EXPECT_EQ(forced.code, 0) << forced.out;
  EXPECT_EQ(FileBytes(pack), intact);
  EXPECT_FALSE(std::filesystem::exists(pack + ".partial")) << forced.out;
}

// From a review of the fixes above. A repair to edited shards killed after
// it rewrote the payloads and before it wrote their new record: the rerun
// found the pack to be the shards' and recorded them beside the old record,
// which verify --full and every store then refused, and no repair mended.
// The record now goes first; the two states a kill can leave are mended by
// the rerun.
TEST(PackCodeReview, ARepairToEditedShardsKilledMidwayIsFinishedByTheRerun) {
  const std::string m = FreshModel("repair-killed");
  ASSERT_EQ(Cli("build --progress none --safety-margin-gib 0 " + Q(m)).code, 0);
  const std::string pack = m + "/" + kPackName, inputs = pack + ".inputs";
  const std::string old_pack = FileBytes(pack), old_inputs = FileBytes(inputs);
  EditFirstShardsExperts(m);
  ASSERT_EQ(Cli("build --restart --progress none --safety-margin-gib 0 " + Q(m)).code, 0);
  const std::string new_pack = FileBytes(pack), new_sidecar = FileBytes(pack + ".digests");
  ASSERT_NE(new_pack, old_pack);
  // Killed after the new record, before the payloads: the old payload, the
  // old record of the inputs.
  std::ofstream(pack, std::ios::binary | std::ios::trunc) << old_pack;
  std::ofstream(inputs, std::ios::binary | std::ios::trunc) << old_inputs;
  CliRun plain = Cli("build --progress none --safety-margin-gib 0 " + Q(m));
  EXPECT_EQ(plain.code, 1) << "a pack of the old shards was taken as built: " << plain.out;
  CliRun again = Cli("build --restart --progress none --safety-margin-gib 0 " + Q(m));
  EXPECT_EQ(again.code, 0) << again.out;
  EXPECT_EQ(FileBytes(pack), new_pack);
  // Killed after the payloads, before the record of the inputs.
  std::ofstream(inputs, std::ios::binary | std::ios::trunc) << old_inputs;
  plain = Cli("build --progress none --safety-margin-gib 0 " + Q(m));
  EXPECT_EQ(plain.code, 0) << plain.out;
  EXPECT_EQ(FileBytes(pack + ".digests"), new_sidecar);
  CliRun full = Cli("verify --progress none --full --against-source " + Q(m + "/" + kManifestName));
  EXPECT_EQ(full.code, 0) << full.out;
}

// From the same review: a shard whose time is ahead of this machine's clock
// made every rerun of build rewrite the manifest (an hour of hashing at full
// scale); the default --payload-samples counted as asked (a manifest built
// with 10 was rewritten with 6 by a plain rerun); `build --restart` of a
// moved model directory refused its own manifest.
TEST(PackCodeReview, AFinishedManifestIsRewrittenOnlyForWhatWasAsked) {
  const std::string m = FreshModel("manifest-settles");
  ASSERT_EQ(Cli("build --progress none --safety-margin-gib 0 --payload-samples 10 " + Q(m)).code, 0);
  CliRun plain = Cli("build --progress none --safety-margin-gib 0 " + Q(m));
  EXPECT_TRUE(Contains(plain.out, "already built")) << plain.out;
  EXPECT_EQ(nlohmann::json::parse(FileBytes(m + "/" + kManifestName))["expert_pack"]["payload_samples_verified"], 10);
  ASSERT_EQ(std::system(("touch -d '+2 hours' " + Q(m + "/KIMI-K3-SYNTH-00002-of-00003.gguf")).c_str()), 0);
  // The touch changed the shard's time: the pack is compared with the
  // shards and recorded once, and the manifest written anew; from then on
  // both are finished.
  (void)Cli("build --progress none --safety-margin-gib 0 " + Q(m));
  for (int run = 0; run < 2; ++run) {
    CliRun again = Cli("build --progress none --safety-margin-gib 0 " + Q(m));
    EXPECT_EQ(again.code, 0) << again.out;
    EXPECT_TRUE(Contains(again.out, "already built")) << again.out;
    EXPECT_FALSE(Contains(again.out, "writing a new manifest")) << again.out;
  }

  const std::string moved = m + "-moved";
  std::filesystem::remove_all(moved);
  std::filesystem::rename(m, moved);
  CliRun restart = Cli("build --restart --progress none --safety-margin-gib 0 " + Q(moved));
  std::filesystem::rename(moved, m);
  EXPECT_EQ(restart.code, 0) << restart.out;
  EXPECT_TRUE(Contains(restart.out, "(the model was moved): writing a new manifest")) << restart.out;
}

// From the same review: a rank pack whose sidecar was another rank's kept
// that rank's experts as data after its repair (the pack differed from a
// fresh rank build, at twice its size on disk).
TEST(PackCodeReview, ARankPackRepairedFromAnotherRanksSidecarHasOnlyItsOwnExperts) {
  const std::string m = FreshModel("rank-overlap");
  const std::string base = m + "/KIMI-K3-SYNTH.expert-major";
  ASSERT_EQ(Cli("pack --progress none --safety-margin-gib 0 --ep-size 4 --ep-rank 0 " + Q(m)).code, 0);
  const std::string fresh = FileBytes(base + ".ep0-of-4.pack");
  ASSERT_EQ(Cli("pack --progress none --safety-margin-gib 0 --ep-size 2 --ep-rank 0 " + Q(m)).code, 0);
  std::filesystem::copy_file(base + ".ep0-of-2.pack", base + ".ep0-of-4.pack",
                             std::filesystem::copy_options::overwrite_existing);
  std::filesystem::copy_file(base + ".ep0-of-2.pack.digests", base + ".ep0-of-4.pack.digests",
                             std::filesystem::copy_options::overwrite_existing);
  CliRun repair = Cli("pack --repair-damaged --progress none --ep-size 4 --ep-rank 0 " + Q(m));
  EXPECT_EQ(repair.code, 0) << repair.out;
  EXPECT_EQ(FileBytes(base + ".ep0-of-4.pack"), fresh) << repair.out;

  // A full pack at a rank pack's path is no rank pack to punch holes into.
  ASSERT_EQ(Cli("pack --progress none --safety-margin-gib 0 " + Q(m)).code, 0);
  std::filesystem::copy_file(base + ".pack", base + ".ep0-of-4.pack", std::filesystem::copy_options::overwrite_existing);
  std::filesystem::copy_file(base + ".pack.digests", base + ".ep0-of-4.pack.digests",
                             std::filesystem::copy_options::overwrite_existing);
  const std::string full = FileBytes(base + ".ep0-of-4.pack");
  CliRun refused = Cli("pack --repair-damaged --progress none --ep-size 4 --ep-rank 0 " + Q(m));
  EXPECT_EQ(refused.code, 1) << refused.out;
  EXPECT_TRUE(Contains(refused.out, "is a full pack (its digest sidecar")) << refused.out;
  EXPECT_EQ(FileBytes(base + ".ep0-of-4.pack"), full);
}

}  // namespace
}  // namespace k3cli
