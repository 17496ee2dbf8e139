// Issue 17 item 9: with a default `build`, same-size edits of a source shard
// anywhere (metadata, padding, non-routed and routed tensor bytes, the last
// byte) are reported by `verify --full` and `load --verify-metadata`, because
// the manifest now records every shard's whole-file SHA-256 by default,
// computed beside the pack copy (the manifest step does not read the shards
// a second time).
#include <algorithm>
#include <optional>

#include <nlohmann/json.hpp>

#include "pack_fixture.h"
#include "spawn.h"
#include "util/file.h"
#include "util/sha256.h"

namespace k3pack::pack {
namespace {

using testing::ReadAll;
using testing::WriteAll;

TEST(SourceEdits, ThirteenSameSizeEditsAreCaughtWithADefaultBuild) {
  const std::string root = testing::TempDir("src-edits");
  testing::Model model = testing::MakeModel(root + "/model", 3);
  const std::string pack = root + "/e.pack", manifest = root + "/e.json";
  auto [rc, err] = RunCli({"build", "--gguf-dir", model.dir, "--model-config", model.config, "--tokenizer-dir",
                           model.dir + "/tokenizer", "--profile", "scaled", "--out", pack, "--manifest", manifest,
                           "--safety-margin-gib", "0", "--progress", "json"});
  ASSERT_EQ(rc, 0) << err;
  // The manifest step took the digests computed beside the copy.
  EXPECT_EQ(err.find("hashed shard"), std::string::npos) << err;
  const auto m = nlohmann::json::parse(ReadAll(manifest));
  ASSERT_TRUE(m["source"]["summary"]["full_source_hashes"].get<bool>());
  ASSERT_TRUE(m["verification"]["full_source_hashes"].get<bool>());
  std::vector<std::string> shards;
  std::vector<uint64_t> meta_bytes;
  for (const auto& sh : m["source"]["shards"]) {
    shards.push_back(sh["path"].get<std::string>());
    meta_bytes.push_back(sh["metadata_nbytes"].get<uint64_t>());
    ASSERT_TRUE(sh.contains("sha256")) << sh.dump();
    EXPECT_EQ(sh["sha256"], *Sha256File(shards.back())) << shards.back();
  }
  ASSERT_EQ(shards.size(), 3u);

  // Where to edit: tensors by shard, in file order.
  struct T {
    std::string name;
    uint64_t offset, nbytes;
  };
  std::vector<std::vector<T>> by_shard(3);
  for (const auto& t : m["source"]["tensors"]) {
    by_shard[t["shard_index"].get<size_t>()].push_back(
        {t["name"].get<std::string>(), t["data_offset"].get<uint64_t>(), t["nbytes"].get<uint64_t>()});
  }
  for (auto& v : by_shard) std::sort(v.begin(), v.end(), [](const T& a, const T& b) { return a.offset < b.offset; });
  auto find_tensor = [&](bool routed, size_t skip_shard = 99) -> std::pair<size_t, T> {
    for (size_t s = 0; s < 3; ++s) {
      if (s == skip_shard) continue;
      for (const T& t : by_shard[s]) {
        if ((t.name.find("_exps") != std::string::npos) == routed && t.nbytes >= 64) return {s, t};
      }
    }
    ADD_FAILURE() << "no " << (routed ? "routed" : "non-routed") << " tensor";
    return {0, {}};
  };
  const auto [nr_shard, nr] = find_tensor(false);
  const auto [nr2_shard, nr2] = find_tensor(false, nr_shard);
  const auto [r_shard, routed] = find_tensor(true);
  // The last routed tensor of the set (its last byte is the last expert's).
  size_t lr_shard = 0;
  T last_routed{};
  for (size_t s = 0; s < 3; ++s) {
    for (const T& t : by_shard[s]) {
      if (t.name.find("_exps") != std::string::npos) {
        lr_shard = s;
        last_routed = t;
      }
    }
  }
  // Padding between two tensors of a shard's data section (alignment), if any.
  std::optional<std::pair<size_t, uint64_t>> gap;
  for (size_t s = 0; s < 3 && !gap; ++s) {
    for (size_t i = 0; i + 1 < by_shard[s].size(); ++i) {
      if (by_shard[s][i].offset + by_shard[s][i].nbytes < by_shard[s][i + 1].offset) {
        gap = {s, by_shard[s][i].offset + by_shard[s][i].nbytes};
        break;
      }
    }
  }
  const std::string shard0 = ReadAll(shards[0]);
  const size_t key = shard0.find("head_count");
  ASSERT_LT(key, meta_bytes[0]);
  const std::string shard1 = ReadAll(shards[1]);
  ASSERT_FALSE(by_shard[1].empty());
  const size_t name_at = shard1.find(by_shard[1].front().name);
  ASSERT_LT(name_at, meta_bytes[1]);
  const size_t arch = ReadAll(shards[2]).find("general.architecture");
  ASSERT_LT(arch, meta_bytes[2]);

  struct Edit {
    std::string what;
    size_t shard;
    uint64_t at;
    uint8_t mask;
  };
  std::vector<Edit> edits = {
      {"metadata: a key renamed in place", 0, key + 5, 0x20},
      {"metadata: a tensor name's last character", 1, name_at + by_shard[1].front().name.size() - 1, 0x01},
      {"metadata: the architecture key's first character", 2, arch, 0x20},
      {"metadata: the last byte before the data section (alignment padding)", 0, meta_bytes[0] - 1, 0x01},
      {"data section: its first byte", 1, meta_bytes[1], 0x01},
      {"non-routed tensor: its first byte", nr_shard, nr.offset, 0x01},
      {"non-routed tensor: a middle byte", nr2_shard, nr2.offset + nr2.nbytes / 2, 0x10},
      {"non-routed tensor: its last byte", nr_shard, nr.offset + nr.nbytes - 1, 0x80},
      {"routed expert tensor: a middle byte (inside a pack payload)", r_shard, routed.offset + routed.nbytes / 2, 0x04},
      {"routed expert tensor: the last expert's last byte", lr_shard, last_routed.offset + last_routed.nbytes - 1,
       0x02},
      {"routed expert tensor: the first expert's first byte", r_shard, routed.offset, 0x40},
      {"the shard's last byte", 2, std::filesystem::file_size(shards[2]) - 1, 0x01},
      {"padding between two tensors", gap ? gap->first : 2, gap ? gap->second : 0, 0x01},
  };
  // Without inter-tensor padding in this layout, edit the middle of the last
  // shard's metadata instead (still a distinct place).
  if (!gap) edits.back() = {"metadata: a middle byte of the last shard's", 2, meta_bytes[2] / 2, 0x01};
  ASSERT_EQ(edits.size(), 13u);

  const std::vector<std::string> verify_full{"verify", "--manifest", manifest, "--full"};
  const std::vector<std::string> load{"load", "--manifest", manifest, "--verify-metadata", "--summary"};
  auto [v0, e0] = RunCli(verify_full);
  ASSERT_EQ(v0, 0) << e0;
  auto [l0, le0] = RunCli(load);
  ASSERT_EQ(l0, 0) << le0;
  for (const Edit& e : edits) {
    SCOPED_TRACE(e.what + " (shard " + std::to_string(e.shard) + ", byte " + std::to_string(e.at) + ")");
    const std::string& path = shards[e.shard];
    const std::string original = ReadAll(path);
    ASSERT_LT(e.at, original.size());
    std::string changed = original;
    changed[e.at] = static_cast<char>(changed[e.at] ^ e.mask);
    ASSERT_NE(changed, original);
    WriteAll(path, changed);
    auto [v, ve] = RunCli(verify_full);
    EXPECT_EQ(v, 1) << ve;
    EXPECT_NE(ve.find("GGUF shard " + path + " changed since the manifest was written"), std::string::npos) << ve;
    auto [l, lo] = RunCli(load);
    EXPECT_NE(l, 0) << lo;
    EXPECT_NE(lo.find(path), std::string::npos) << lo;
    WriteAll(path, original);
  }
  auto [v9, e9] = RunCli(verify_full);
  EXPECT_EQ(v9, 0) << e9;
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace k3pack::pack
