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

}  // namespace
}  // namespace k3cli
