// `build` killed after its pack was finished and before its manifest, then a
// routed expert payload of a shard edited, then `build` again: the rerun
// reused the stale pack (six sampled payloads agreed) and wrote a manifest
// recording the edited shards, which `verify --full` passed. The pack now
// records its shards' size and modification time (`<pack>.inputs`); shards
// that differ from the record are compared in full before reuse.
#include <fstream>

#include "pack_fixture.h"
#include "pack/sidecars.h"
#include "spawn.h"
#include "util/file.h"

namespace k3pack::pack {
namespace {

TEST(StalePack, APackOfEditedShardsIsNotReusedButACopiedOneIs) {
  const std::string root = testing::TempDir("stale-pack");
  testing::Model model = testing::MakeModel(root + "/model", 9);
  const std::string pack = root + "/p.pack", manifest = root + "/m.json";
  const std::vector<std::string> common = {"--gguf-dir", model.dir, "--model-config", model.config, "--profile",
                                           "scaled", "--pack", pack, "--safety-margin-gib", "0", "--progress", "none"};
  std::vector<std::string> pack_args = {"pack"}, build_args = {"build", "--tokenizer-dir", model.dir + "/tokenizer",
                                                               "--manifest", manifest};
  pack_args.insert(pack_args.end(), common.begin(), common.end());
  build_args.insert(build_args.end(), common.begin(), common.end());
  // `pack` finishes the pack as `build` does before its manifest.
  ASSERT_EQ(RunCli(pack_args).first, 0);
  ASSERT_TRUE(PathExists(InputsRecordPathFor(pack)));
  // Touched only (a copy without its times): compared in full, with a note
  // saying why the whole pack is read and progress while it is, and reused.
  const ExpertTensor& up = model.experts.by_layer[0][1];
  const std::string shard = model.experts.shard_paths[up.tensor.shard_index];
  ASSERT_EQ(std::system(("touch -d '2001-01-01' '" + shard + "'").c_str()), 0);
  std::vector<std::string> json_progress = pack_args;
  json_progress.back() = "json";  // --progress
  auto [rc0, err0] = RunCli(json_progress);
  EXPECT_EQ(rc0, 0) << err0;
  // A note object: its key says it is a note (the text no longer repeats "note:").
  EXPECT_NE(err0.find("{\"note\":\"source shard " + shard + " changed since the pack was built from it"),
            std::string::npos)
      << err0;
  EXPECT_NE(err0.find("comparing every payload of " + pack + " with the shards"), std::string::npos) << err0;
  EXPECT_NE(err0.find("\"phase\":\"compare\""), std::string::npos) << err0;
  // Expert 1's up payload (entry 4; the six samples are entries 0, 28, 57, ...).
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    const auto at = static_cast<std::streamoff>(up.tensor.data_offset + up.expert_bytes + 100);
    f.seekg(at);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(at);
    f.write(&c, 1);
  }
  auto [rc, err] = RunCli(build_args);
  EXPECT_EQ(rc, 1) << err;
  EXPECT_NE(err.find("changed since the pack was built from it"), std::string::npos) << err;
  EXPECT_NE(err.find("does not match GGUF source"), std::string::npos) << err;
  EXPECT_FALSE(PathExists(manifest));
  build_args.push_back("--force");
  auto [rc2, err2] = RunCli(build_args);
  EXPECT_EQ(rc2, 0) << err2;
  build_args.pop_back();
  auto [rc3, err3] = RunCli({"verify", "--manifest", manifest, "--full", "--against-source", "--progress", "none"});
  EXPECT_EQ(rc3, 0) << err3;
  std::filesystem::remove_all(root);
}

// A reuse after a full comparison left the old record, so every later run
// read the whole pack again; a damaged record (a number where a shard's entry
// belongs, a size that is a string) made json's value() throw: std::terminate.
TEST(StalePack, AFullComparisonRecordsTheShardsAndADamagedRecordIsNotACrash) {
  const std::string root = testing::TempDir("stale-record");
  testing::Model model = testing::MakeModel(root + "/model", 9);
  const std::string pack = root + "/p.pack";
  const std::vector<std::string> args = {"pack", "--gguf-dir", model.dir, "--model-config", model.config,
                                         "--profile", "scaled", "--pack", pack, "--safety-margin-gib", "0",
                                         "--progress", "none"};
  ASSERT_EQ(RunCli(args).first, 0);
  const std::string record = InputsRecordPathFor(pack);
  const std::string shard = model.experts.shard_paths.front();
  ASSERT_EQ(std::system(("touch -d '2001-01-01' '" + shard + "'").c_str()), 0);
  auto [rc, err] = RunCli(args);
  ASSERT_EQ(rc, 0) << err;
  auto stamp = StampFile(shard);
  ASSERT_TRUE(stamp.ok());
  auto text = ReadFileToString(record);
  ASSERT_TRUE(text.ok());
  EXPECT_NE(text->find(std::to_string(stamp->mtime_ns)), std::string::npos) << *text;
  for (const std::string& damaged : {std::string("{\"format\": \"K3PACK-PACK-INPUTS-v1\", \"shards\": [1, 2, 3]}"),
                                    std::string("{\"format\": \"K3PACK-PACK-INPUTS-v1\", \"shards\": [{\"name\": "
                                                "\"x\", \"size\": \"big\", \"mtime_ns\": 1}]}")}) {
    SCOPED_TRACE(damaged);
    std::ofstream(record, std::ios::trunc) << damaged << "\n";
    auto [rc2, err2] = RunCli(args);
    EXPECT_EQ(rc2, 0) << err2;  // compared in full, reused, recorded again
    auto again = ReadFileToString(record);
    ASSERT_TRUE(again.ok());
    EXPECT_NE(again->find(std::to_string(stamp->mtime_ns)), std::string::npos) << *again;
  }
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace k3pack::pack
