// Shards renamed, not lost: the headers alone form a complete split that the
// file names contradict. Doctor must say to rename (with the commands), never
// to download a shard that does not exist; the name findings keep SGLang's
// texts. A set that really misses a shard must not get rename advice.
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "doctor_test_util.h"

namespace dtest {
namespace {

fs::path ShardPath(const fs::path& dir, int number, int count) {
  char name[64];
  std::snprintf(name, sizeof name, "KIMI-K3-SYNTH-%05d-of-%05d.gguf", number, count);
  return dir / name;
}

// The renames doctor proposes, as (from file name, to file name).
std::set<std::pair<std::string, std::string>> Renames(const doctor::Finding& f) {
  std::set<std::pair<std::string, std::string>> out;
  for (const auto& r : f.details.at("renames")) {
    out.emplace(fs::path(r.at("from").get<std::string>()).filename().string(),
                fs::path(r.at("to").get<std::string>()).filename().string());
  }
  return out;
}

int Sh(const std::string& cmd) { return std::system(cmd.c_str()); }

TEST(RenamedShards, NumberedWithAGapIsARenameNotAMissingShard) {
  auto dir = TempDir("renamed-gap");
  Synth(dir);
  // split.no 0, 1, 2 under the numbers 1, 3, 4 of 4.
  fs::rename(ShardPath(dir, 3, 3), ShardPath(dir, 4, 4));
  fs::rename(ShardPath(dir, 2, 3), ShardPath(dir, 3, 4));
  fs::rename(ShardPath(dir, 1, 3), ShardPath(dir, 1, 4));
  doctor::Report r = Scaled({dir.string()});

  auto renamed = r.With("shards-renamed");
  ASSERT_EQ(renamed.size(), 1u) << Dump(r);
  const std::set<std::pair<std::string, std::string>> want = {
      {"KIMI-K3-SYNTH-00001-of-00004.gguf", "KIMI-K3-SYNTH-00001-of-00003.gguf"},
      {"KIMI-K3-SYNTH-00003-of-00004.gguf", "KIMI-K3-SYNTH-00002-of-00003.gguf"},
      {"KIMI-K3-SYNTH-00004-of-00004.gguf", "KIMI-K3-SYNTH-00003-of-00003.gguf"}};
  EXPECT_EQ(Renames(*renamed.front()), want);

  // SGLang's discovery text stays, but the advice is to rename.
  auto incomplete = r.With("shard-set-incomplete");
  ASSERT_EQ(incomplete.size(), 1u) << Dump(r);
  EXPECT_EQ(incomplete.front()->sglang_error, "GGUF shard set is incomplete: count=4, numbers=[1, 3, 4]");
  EXPECT_EQ(incomplete.front()->fix.find("Download"), std::string::npos) << incomplete.front()->fix;
  EXPECT_NE(incomplete.front()->fix.find("rename"), std::string::npos) << incomplete.front()->fix;

  // The commands given do the job: afterwards the set is healthy.
  const std::string fix = renamed.front()->fix;
  const size_t colon = fix.find(": mv ");
  ASSERT_NE(colon, std::string::npos) << fix;
  ASSERT_EQ(Sh(fix.substr(colon + 2)), 0) << fix;
  doctor::Report after = Scaled({dir.string()});
  EXPECT_TRUE(ErrorCodes(after).empty()) << Dump(after);
}

TEST(RenamedShards, SwappedNamesGoThroughATemporaryName) {
  auto dir = TempDir("renamed-swap");
  Synth(dir);
  fs::rename(ShardPath(dir, 2, 3), dir / "tmp.bin");
  fs::rename(ShardPath(dir, 3, 3), ShardPath(dir, 2, 3));
  fs::rename(dir / "tmp.bin", ShardPath(dir, 3, 3));
  doctor::Report r = Scaled({dir.string()});
  EXPECT_EQ(r.With("split-no-mismatch").size(), 2u) << Dump(r);
  auto renamed = r.With("shards-renamed");
  ASSERT_EQ(renamed.size(), 1u) << Dump(r);
  const std::string fix = renamed.front()->fix;
  EXPECT_NE(fix.find(".renaming"), std::string::npos) << fix;
  ASSERT_EQ(Sh(fix.substr(fix.find(": mv ") + 2)), 0) << fix;
  doctor::Report after = Scaled({dir.string()});
  EXPECT_TRUE(ErrorCodes(after).empty()) << Dump(after);
}

TEST(RenamedShards, AReallyMissingShardStillAsksForTheDownload) {
  auto dir = TempDir("really-missing");
  Synth(dir);
  fs::remove(ShardPath(dir, 2, 3));
  doctor::Report r = Scaled({dir.string()});
  EXPECT_TRUE(r.With("shards-renamed").empty()) << Dump(r);
  auto incomplete = r.With("shard-set-incomplete");
  ASSERT_EQ(incomplete.size(), 1u) << Dump(r);
  EXPECT_NE(incomplete.front()->fix.find("Download"), std::string::npos) << incomplete.front()->fix;
}

TEST(RenamedShards, CliPrintsTheRenamesAndJsonCarriesThem) {
  auto dir = TempDir("renamed-cli");
  Synth(dir);
  fs::rename(ShardPath(dir, 3, 3), ShardPath(dir, 3, 4));
  CliResult text = RunCli("doctor --profile scaled " + dir.string());
  EXPECT_EQ(text.exit_code, 1);
  EXPECT_NE(text.out.find("[shards-renamed]"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("KIMI-K3-SYNTH-00003-of-00004.gguf -> KIMI-K3-SYNTH-00003-of-00003.gguf"), std::string::npos)
      << text.out;
  CliResult json = RunCli("doctor --profile scaled --json " + dir.string());
  auto j = nlohmann::json::parse(json.out);
  bool found = false;
  for (const auto& f : j.at("findings")) {
    if (f.at("code") == "shards-renamed") found = f.at("details").at("renames").size() == 1;
  }
  EXPECT_TRUE(found) << json.out;
}

}  // namespace
}  // namespace dtest
