// Faults from an audit of damaged packs and manifests (docs/RELIABILITY.md,
// "session 42").
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

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
      EXPECT_TRUE(Contains(rerun.out, "(every store refuses it); comparing every payload of ")) << rerun.out;
      EXPECT_TRUE(Contains(rerun.out, ", then writing the sidecar anew from the pack (reads it twice)")) << rerun.out;
      EXPECT_EQ(FileBytes(sidecar), intact) << "the sidecar written anew differs from the build's";
      CliRun served = Cli("run-experts --progress none " + manifest + " --layer 1");
      EXPECT_EQ(served.code, 0) << served.out;
    }
  }
  // The second read (the hashes; hours at full scale) showed no progress.
  std::ofstream(sidecar, std::ios::binary | std::ios::trunc) << flipped;
  CliRun rerun = Cli("pack --progress json --safety-margin-gib 0 " + Q(m));
  EXPECT_EQ(rerun.code, 0) << rerun.out;
  bool sidecar_done = false;
  std::istringstream lines(rerun.out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("{\"", 0) != 0) continue;
    auto j = nlohmann::json::parse(line);
    if (j.value("phase", "") == "sidecar" && j.value("done", false))
      sidecar_done = j["done_bytes"] == j["total_bytes"] && j["done_objects"] == j["total_objects"];
  }
  EXPECT_TRUE(sidecar_done) << rerun.out;
  EXPECT_EQ(FileBytes(sidecar), intact);
}

// doctor's reader check on a damaged full-pack sidecar: k3pack's own words
// (SGLang has no sidecar), and the fix that works: the build rerun.
TEST(DamagedArtifacts, DoctorTellsTheRerunForADamagedSidecar) {
  const std::string m = FreshModel("doctor-sidecar");
  ASSERT_EQ(Cli("build --progress none --safety-margin-gib 0 " + Q(m)).code, 0);
  const std::string sidecar = m + "/" + kPackName + ".digests";
  std::string bytes = FileBytes(sidecar);
  bytes[200] ^= 0x01;
  std::ofstream(sidecar, std::ios::binary | std::ios::trunc) << bytes;
  CliRun doctor = Cli("doctor --json " + Q(m + "/" + kManifestName));
  EXPECT_NE(doctor.code, 0) << doctor.out;
  auto j = nlohmann::json::parse(doctor.out.substr(doctor.out.find('{')), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << doctor.out;
  bool seen = false;
  for (const auto& f : j["findings"]) {
    if (f["code"] != "manifest-refused") continue;
    seen = true;
    EXPECT_EQ(f.value("sglang_error", std::string()), "") << f.dump();
    EXPECT_TRUE(Contains(f["fix"].get<std::string>(), "Rerun `k3pack build ")) << f.dump();
  }
  EXPECT_TRUE(seen) << doctor.out;
}

// A pack whose magic was damaged: doctor told `build --force`, which never
// replaces a file that does not start as a pack and so failed. It now tells
// the in-place repair, which rewrites the header from the shards' layout.
TEST(DamagedArtifacts, DoctorsFixForADamagedMagicIsOneThatWorks) {
  const std::string m = FreshModel("damaged-magic");
  ASSERT_EQ(Cli("build --progress none --safety-margin-gib 0 " + Q(m)).code, 0);
  const std::string pack = m + "/" + kPackName;
  {
    std::fstream f(pack, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(0);
    f.put('F');
  }
  CliRun doctor = Cli("doctor " + Q(m + "/" + kManifestName));
  EXPECT_NE(doctor.code, 0) << doctor.out;
  EXPECT_TRUE(Contains(doctor.out, "so `--force` will not replace it")) << doctor.out;
  const std::string repair = "pack --repair-damaged --gguf-dir " + Q(m) + " --model-config " + Q(m + "/config.json") +
                             " --pack " + Q(pack);
  EXPECT_TRUE(Contains(doctor.out, "`k3pack pack --repair-damaged --gguf-dir ")) << doctor.out;
  CliRun repaired = Cli(repair + " --progress none");
  EXPECT_EQ(repaired.code, 0) << repaired.out;
  CliRun verified = Cli("verify --progress none " + Q(m + "/" + kManifestName));
  EXPECT_EQ(verified.code, 0) << verified.out;
}

// A rerun over a manifest cut short (or empty, or not UTF-8) said only "it
// is not the manifest of this pack"; it now says why it cannot be read.
TEST(DamagedArtifacts, AManifestThatDoesNotParseIsSaidToNotParse) {
  const std::string m = FreshModel("manifest-cut-short");
  ASSERT_EQ(Cli("build --progress none --safety-margin-gib 0 " + Q(m)).code, 0);
  const std::string manifest = m + "/" + kManifestName;
  const std::string text = FileBytes(manifest);
  std::ofstream(manifest, std::ios::binary | std::ios::trunc) << text.substr(0, text.size() / 2);
  CliRun r = Cli("build --progress none --safety-margin-gib 0 " + Q(m));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "it is not the manifest of this pack (it cannot be read as a manifest: ")) << r.out;
  EXPECT_TRUE(Contains(r.out, "--force")) << r.out;
}

// A pack without its digest sidecar (SGLang's writer makes none; a copy may
// leave it behind) was "already built" without a word although every store
// served it unchecked, its repair (`--restart`, `--repair-damaged`) was
// refused ("the damaged payloads cannot be told apart"), and a rank pack's
// refusal said its sidecar did not record its rank. The repair compares
// every payload with the shards, rewrites those that differ and writes the
// sidecar (the same bytes as the build's); one none of whose payloads are
// these shards' is refused, untouched.
TEST(DamagedArtifacts, APackWithoutItsSidecarIsRepairedAgainstTheShards) {
  const std::string m = FreshModel("missing-sidecar");
  ASSERT_EQ(Cli("build --progress none --safety-margin-gib 0 " + Q(m)).code, 0);
  const std::string pack = m + "/" + kPackName, sidecar = pack + ".digests";
  const std::string intact_sidecar = FileBytes(sidecar), intact_pack = FileBytes(pack);
  fs::remove(sidecar);
  CliRun rerun = Cli("build --progress none --safety-margin-gib 0 " + Q(m));
  EXPECT_EQ(rerun.code, 0) << rerun.out;
  EXPECT_TRUE(Contains(rerun.out, "has no digest sidecar (" + sidecar + "), so k3pack's stores serve it without "
                                  "checking its reads (CRC32C); --restart compares every payload"))
      << rerun.out;
  EXPECT_FALSE(fs::exists(sidecar)) << "already built writes nothing";

  for (const std::string how : {"build --restart", "pack --repair-damaged"}) {
    SCOPED_TRACE(how);
    fs::remove(sidecar);
    const uint64_t damaged_at = intact_pack.size() - 5000;  // inside the last payload
    std::string damaged = intact_pack;
    damaged[damaged_at] ^= 0x40;
    std::ofstream(pack, std::ios::binary | std::ios::trunc) << damaged;
    CliRun repair = Cli(how + " --progress none --safety-margin-gib 0 " + Q(m));
    EXPECT_EQ(repair.code, 0) << repair.out;
    EXPECT_TRUE(Contains(repair.out, "rewrote ")) << repair.out;
    EXPECT_EQ(FileBytes(pack), intact_pack) << repair.out;
    EXPECT_EQ(FileBytes(sidecar), intact_sidecar) << "the sidecar written from the shards differs from the build's";
  }
  CliRun full = Cli("verify --progress none --full " + Q(m));
  EXPECT_EQ(full.code, 0) << full.out;

  // A rank pack: the refusal names the missing sidecar, and --restart writes it.
  CliRun rank = Cli("build --progress none --safety-margin-gib 0 --ep-size 2 --ep-rank 1 " + Q(m));
  ASSERT_EQ(rank.code, 0) << rank.out;
  const std::string rank_sidecar = m + "/KIMI-K3-SYNTH.expert-major.ep1-of-2.pack.digests";
  const std::string intact_rank_sidecar = FileBytes(rank_sidecar);
  fs::remove(rank_sidecar);
  CliRun refused = Cli("build --progress none --safety-margin-gib 0 --ep-size 2 --ep-rank 1 " + Q(m));
  EXPECT_EQ(refused.code, 1) << refused.out;
  EXPECT_TRUE(Contains(refused.out, "it has no digest sidecar (" + rank_sidecar + ") to record it as the pack of "
                                    "expert-parallel rank 1 of 2"))
      << refused.out;
  CliRun restarted = Cli("build --progress none --safety-margin-gib 0 --ep-size 2 --ep-rank 1 --restart " + Q(m));
  EXPECT_EQ(restarted.code, 0) << restarted.out;
  EXPECT_EQ(FileBytes(rank_sidecar), intact_rank_sidecar);

  // The pack of another model with the same layout, without a sidecar.
  const std::string other = Root() + "/missing-sidecar-other";
  fs::remove_all(other);
  ASSERT_EQ(Cli("synth --preset tiny --seed 7 --out " + Q(other)).code, 0);
  ASSERT_EQ(Cli("pack --progress none --safety-margin-gib 0 " + Q(other)).code, 0);
  fs::copy_file(other + "/" + kPackName, pack, fs::copy_options::overwrite_existing);
  fs::remove(sidecar);
  const auto before = Snapshot(m);
  CliRun foreign = Cli("pack --repair-damaged --progress none " + Q(m));
  EXPECT_EQ(foreign.code, 1) << foreign.out;
  EXPECT_TRUE(Contains(foreign.out, "was not built from these shards: none of its ")) << foreign.out;
  EXPECT_EQ(Snapshot(m), before) << foreign.out;
}

}  // namespace
}  // namespace k3cli
