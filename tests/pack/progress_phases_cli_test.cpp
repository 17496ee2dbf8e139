// Long steps outside the copy showed no progress: a resume's check of the
// checkpointed prefix, `build`'s wait for the shard digests, `manifest`'s
// whole-shard and whole-pack hashes (with --progress json it printed no JSON
// at all, only text lines). At full scale each is minutes.
#include <nlohmann/json.hpp>

#include <set>
#include <sstream>

#include "pack_fixture.h"
#include "spawn.h"

namespace k3pack::pack {
namespace {

// The phases of the JSON progress lines of `err`; every '{' line must parse.
std::set<std::string> JsonPhases(const std::string& err) {
  std::set<std::string> phases;
  std::istringstream in(err);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] != '{') continue;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    EXPECT_TRUE(j.is_object()) << line;
    if (j.is_object() && j.contains("phase")) phases.insert(j["phase"].get<std::string>());
  }
  return phases;
}

TEST(ProgressPhases, ResumeCheckShardHashesAndManifestHashesAreShown) {
  const std::string root = testing::TempDir("progress-phases");
  testing::Model model = testing::MakeModel(root + "/model", 9);
  const std::string pack = root + "/p.pack", manifest = root + "/m.json";
  const std::vector<std::string> build = {"build", "--gguf-dir", model.dir, "--model-config", model.config,
                                          "--tokenizer-dir", model.dir + "/tokenizer", "--profile", "scaled",
                                          "--pack", pack, "--manifest", manifest, "--safety-margin-gib", "0",
                                          "--progress", "json"};
  auto [crash_rc, crash_err] = RunCli(build, {"K3PACK_CRASH_AFTER_OBJECTS=4", "K3PACK_BATCH_BYTES=1",
                                              "K3PACK_CHECKPOINT_BYTES=1"});
  ASSERT_EQ(crash_rc, 86) << crash_err;
  auto [rc, err] = RunCli(build);
  ASSERT_EQ(rc, 0) << err;
  const std::set<std::string> phases = JsonPhases(err);
  EXPECT_TRUE(phases.count("resume check")) << err;
  EXPECT_TRUE(phases.count("hash shards")) << err;

  std::vector<std::string> again = {"manifest", "--gguf-dir", model.dir, "--pack", pack, "--model-config",
                                    model.config, "--tokenizer-dir", model.dir + "/tokenizer", "--profile", "scaled",
                                    "--manifest", manifest, "--full-pack-hash", "--force", "--progress", "json"};
  auto [mrc, merr] = RunCli(again);
  ASSERT_EQ(mrc, 0) << merr;
  const std::set<std::string> mphases = JsonPhases(merr);
  EXPECT_TRUE(mphases.count("hash shards")) << merr;
  EXPECT_TRUE(mphases.count("hash pack")) << merr;
  EXPECT_TRUE(mphases.count("manifest")) << merr;  // its steps, as JSON notes
  EXPECT_EQ(merr.find("k3pack manifest: scanning"), std::string::npos) << merr;
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace k3pack::pack
