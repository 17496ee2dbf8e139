// Faults from an option-combination fuzz of the CLI (docs/RELIABILITY.md,
// "session 44").
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_fixture.h"

namespace k3cli {
namespace {

// `build --force --restart` over a finished pack ran the repair (it found
// nothing to rewrite) and dropped --force without a word; `pack` rebuilt.
TEST(OptionCombinations, BuildForceWithRestartRebuilds) {
  const std::string m = FreshModel("force-restart");
  ASSERT_EQ(Cli("build --progress none --safety-margin-gib 0 " + Q(m)).code, 0);
  CliRun r = Cli("build --progress none --safety-margin-gib 0 --force --restart " + Q(m));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(Contains(r.out, "EXPERT_PACK_BUILD_START output=")) << r.out;
  EXPECT_FALSE(Contains(r.out, "EXPERT_PACK_CHECKED")) << r.out;
  // Without --force, --restart still repairs the finished pack in place.
  CliRun repair = Cli("build --progress none --safety-margin-gib 0 --restart " + Q(m));
  EXPECT_EQ(repair.code, 0) << repair.out;
  EXPECT_TRUE(Contains(repair.out, "EXPERT_PACK_CHECKED")) << repair.out;
}

// A manifest path the rule refuses was refused only after the long work:
// `manifest` hashed every shard whole first (18 minutes at full scale), and
// `build` compared every payload of a pack whose shards looked touched, and
// rewrote the record of them beside the pack, before saying its --manifest
// was an input.
TEST(OptionCombinations, AManifestPathIsRefusedBeforeAnythingIsRead) {
  const std::string m = FreshModel("manifest-refused-first");
  ASSERT_EQ(Cli("build --progress none --safety-margin-gib 0 " + Q(m)).code, 0);
  std::ofstream(m + "/user.txt") << "hello\n";
  for (const std::string force : {"", " --force"}) {
    CliRun r = Cli("manifest --progress auto " + Q(m) + " --manifest " + Q(m + "/user.txt") + force);
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_TRUE(Contains(r.out, "not an adapter manifest")) << r.out;
    EXPECT_FALSE(Contains(r.out, "hashing every shard whole")) << r.out;
  }
  fs::last_write_time(Shard(m, 1), fs::last_write_time(Shard(m, 1)) + std::chrono::seconds(5));
  const auto before = Snapshot(m);
  CliRun r = Cli("build --progress none --safety-margin-gib 0 " + Q(m) + " --manifest " + Q(m + "/config.json"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "is an input (--model-config)")) << r.out;
  EXPECT_FALSE(Contains(r.out, "comparing every payload")) << r.out;
  EXPECT_EQ(Snapshot(m), before) << r.out;
}

// `run-experts --threads 2000000` ran (one token took 34 s, against 0.06 s);
// build, pack and trace sweep bound their --threads at 256.
TEST(OptionCombinations, RunExpertsThreadsAreBoundedAsTheOtherCommands) {
  CliRun r = Cli("run-experts " + Q(BuiltTinyModel() + "/" + kManifestName) + " --threads 2000000");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(Contains(r.out, "--threads must be at most 256, got 2000000")) << r.out;
}

// `repair --no-sidecars` and then `repair` without it: the second said
// "already built" and OUT still had no config.json or tokenizer/.
TEST(OptionCombinations, ARepairWithoutSidecarsIsNotTheRepairWithThem) {
  const std::string raw = Root() + "/repair-sidecars-raw", out = Root() + "/repair-sidecars-out";
  fs::remove_all(raw);
  fs::remove_all(out);
  ASSERT_EQ(Cli("synth --preset tiny --fault raw-ssm-a --out " + Q(raw)).code, 0);
  ASSERT_EQ(Cli("repair " + Q(raw) + " " + Q(out) + " --fix ssm-a --no-sidecars").code, 0);
  EXPECT_FALSE(fs::exists(out + "/config.json"));
  CliRun again = Cli("repair " + Q(raw) + " " + Q(out) + " --fix ssm-a --no-sidecars");
  EXPECT_EQ(again.code, 0) << again.out;
  EXPECT_TRUE(Contains(again.out, "already built")) << again.out;
  CliRun with = Cli("repair " + Q(raw) + " " + Q(out) + " --fix ssm-a");
  EXPECT_EQ(with.code, 1) << with.out;
  EXPECT_TRUE(Contains(with.out, "it holds the output of a `k3pack repair` of another input or with other options"))
      << with.out;
  // A record an older k3pack wrote (no "sidecars" in its recipe) says by its
  // files that none were copied: the same command is still already built.
  {
    const std::string record = out + "/k3pack-repair.json";
    auto j = nlohmann::json::parse(FileBytes(record));
    j["recipe"].erase("sidecars");
    std::ofstream(record, std::ios::trunc) << j.dump(2) << "\n";
    CliRun old = Cli("repair " + Q(raw) + " " + Q(out) + " --fix ssm-a --no-sidecars");
    EXPECT_EQ(old.code, 0) << old.out;
    EXPECT_TRUE(Contains(old.out, "already built")) << old.out;
  }
  CliRun forced = Cli("repair " + Q(raw) + " " + Q(out) + " --fix ssm-a --force");
  EXPECT_EQ(forced.code, 0) << forced.out;
  EXPECT_TRUE(fs::exists(out + "/config.json")) << forced.out;
  EXPECT_TRUE(fs::is_directory(out + "/tokenizer")) << forced.out;
}

// `manifest --pack <a shard>` said only SGLang's "GGML expert-pack magic or
// version does not match", and `--pack <a directory>` Python's errno text:
// neither named the file nor what it was.
TEST(OptionCombinations, APackThatIsNotOneIsNamedForWhatItIs) {
  const std::string& m = BuiltTinyModel();
  const std::string out = " --manifest " + Q(Root() + "/not-a-pack.manifest.json");
  CliRun shard = Cli("manifest --progress none " + Q(m) + " --pack " + Q(Shard(m, 2)) + out);
  EXPECT_EQ(shard.code, 1) << shard.out;
  EXPECT_TRUE(Contains(shard.out, "error: GGML expert-pack magic or version does not match\nhint: " + Shard(m, 2) +
                                      " is a GGUF file, not an Expert Pack; pass the pack file"))
      << shard.out;
  CliRun dir = Cli("manifest --progress none " + Q(m) + " --pack " + Q(m + "/tokenizer") + out);
  EXPECT_EQ(dir.code, 1) << dir.out;
  EXPECT_TRUE(Contains(dir.out, "Is a directory: '" + m + "/tokenizer'\nhint: pass the pack file `k3pack build` writes"))
      << dir.out;
}

// The shards copied elsewhere: `run-experts --gguf-dir <the copy>` refused
// byte-identical shards as "another model's", although only the digest over
// the recorded paths differed. The headers cannot tell a copy from another
// checkpoint of the same layout: said so, with the ways on.
TEST(OptionCombinations, RunExpertsSaysWhatTheHeadersCannotTell) {
  const std::string& m = BuiltTinyModel();
  const std::string copy = Root() + "/copied-shards";
  fs::remove_all(copy);
  fs::create_directories(copy);
  for (int i = 1; i <= 3; ++i) fs::copy_file(Shard(m, i), copy + "/" + fs::path(Shard(m, i)).filename().string());
  CliRun r = Cli("run-experts --progress none " + Q(m + "/" + kManifestName) + " --gguf-dir " + Q(copy));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "holds shards whose headers and tensor records match the ones the manifest")) << r.out;
  EXPECT_TRUE(Contains(r.out, "but at other paths: a copy of them, or another checkpoint with the same layout"))
      << r.out;
  EXPECT_FALSE(Contains(r.out, "another model's would make every output differ")) << r.out;
  // The recorded shards run.
  EXPECT_EQ(Cli("run-experts --progress none " + Q(m + "/" + kManifestName)).code, 0);
}

// `verify --samples 0` printed EXPERT_PACK_VERIFIED over "0 entries" and
// nothing said that no payload had been looked at.
TEST(OptionCombinations, VerifyWithNoSamplesSaysNoPayloadWasCompared) {
  CliRun r = Cli("verify --progress none --samples 0 " + Q(BuiltTinyModel() + "/" + kManifestName));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(Contains(r.out, "no payload was compared (--samples 0)")) << r.out;
  CliRun sampled = Cli("verify --progress none " + Q(BuiltTinyModel() + "/" + kManifestName));
  EXPECT_FALSE(Contains(sampled.out, "no payload was compared")) << sampled.out;
}

// `synth --prefix <250 bytes>` failed at the first shard's rename ("File name
// too long") and left its output directory with a partial marker in it.
TEST(OptionCombinations, ASynthPrefixTooLongIsRefusedBeforeAnythingIsWritten) {
  const std::string out = Root() + "/long-prefix";
  fs::remove_all(out);
  CliRun r = Cli("synth --preset tiny --out " + Q(out) + " --prefix " + std::string(250, 'p'));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(Contains(r.out, "synth: prefix of 250 bytes makes shard names of 270 bytes")) << r.out;
  EXPECT_FALSE(fs::exists(out) && !fs::is_empty(out)) << r.out;
  EXPECT_EQ(Cli("synth --preset tiny --out " + Q(out) + " --prefix " + std::string(230, 'p')).code, 0);
}

}  // namespace
}  // namespace k3cli
