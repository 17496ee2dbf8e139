// SGLang's store reads the manifest's counts through Python's int() and
// compares them with == / != (layers/moe/expert_pack.py,
// KimiGGMLExpertPackStore.__init__): "16" and 16.0 are 16, -16 is printed
// as -16, a non-number is int()'s own ValueError. k3pack used to refuse any
// value that is not a JSON non-negative integer with a message of its own
// ("manifest key ... must be a non-negative integer"), accepted 1..92
// followed by extra layers, and took a missing physical_role_order for a
// KeyError (SGLang reads it with .get()).
#include <gtest/gtest.h>

#include <filesystem>
#include <vector>

#include "k3pack/store.h"
#include "open_ok.h"
#include "store/synthetic_pack.h"

namespace k3pack::store {
namespace {

using testing::K3Model;
using testing::TinyPack;
using testing::TinySpec;

StoreOptions Small() { return testing::SmallStore(); }

std::string FirstLine(const TinyPack& p, StoreOptions o = Small()) {
  const std::string m = testing::OpenError(p, o);
  return m.substr(0, m.find('\n'));
}

TinySpec Strict() {
  TinySpec s;
  s.kimi_profile = true;
  return s;
}

}  // namespace

TEST(ManifestValueKinds, DimensionsGoThroughPythonInt) {
  TinyPack p(Strict());
  K3Model(p);
  p.json["model"]["num_experts_per_token"] = -16;
  p.Save();
  EXPECT_EQ(FirstLine(p), "Kimi expert-pack dimensions (93, 896, -16) != (93, 896, 16); Top-K is immutable at 16");
  p.json["model"]["num_experts_per_token"] = 16;
  p.json["model"]["num_experts"] = "x96";
  p.Save();
  EXPECT_EQ(FirstLine(p), "invalid literal for int() with base 10: 'x96'");
  // int("896"), int(896.9), int(93.0): equal, so step 5 is next.
  p.json["model"]["num_experts"] = "896";
  p.json["model"]["num_hidden_layers"] = 93.0;
  p.json["model"]["num_experts_per_token"] = 16.9;
  p.json["model"]["active_moe_layer_ids"] = {1, 2};
  p.Save();
  EXPECT_EQ(FirstLine(p), "Kimi active routed MoE layers must be exactly 1..92");
}

// A scaled pack's manifest is held to its own counts: 2^32 layers wrapped to
// 0 in the store, which then crashed on its first acquire (SIGSEGV); 2^32 + 3
// opened as 3 layers; 2^31 asked for gigabytes of per-layer state.
TEST(ManifestValueKinds, ALayerCountPastTheLimitIsRefusedNotWrapped) {
  TinyPack p{TinySpec{}};
  for (const uint64_t layers : {uint64_t{1} << 32, (uint64_t{1} << 32) + 3, uint64_t{1} << 31, uint64_t{65537}}) {
    SCOPED_TRACE(layers);
    p.json["model"]["num_hidden_layers"] = layers;
    p.Save();
    EXPECT_EQ(FirstLine(p), "model.num_hidden_layers is " + std::to_string(layers) +
                                ", more than k3pack's limit of 65536 layers: the manifest is damaged");
  }
  // Equal tuples that k3pack cannot serve are named, not printed as "A != A".
  p.json["model"]["num_hidden_layers"] = 3;
  p.json["model"]["num_experts"] = (uint64_t{1} << 32) + 4;
  p.Save();
  EXPECT_EQ(FirstLine(p).substr(0, 37), "model.num_experts 4294967300 and num_") << FirstLine(p);
}

TEST(ManifestValueKinds, ActiveLayersAreComparedAsAWholeTupleOfInts) {
  TinyPack p(Strict());
  K3Model(p);
  p.json["model"]["active_moe_layer_ids"].push_back(93);  // 1..92, then one more
  p.Save();
  EXPECT_EQ(FirstLine(p), "Kimi active routed MoE layers must be exactly 1..92");
  K3Model(p);
  p.json["model"]["active_moe_layer_ids"][0] = "1";  // int("1") == 1: passes step 5
  p.json["model"]["active_moe_layer_ids"][1] = 2.0;
  p.Save();
  EXPECT_NE(FirstLine(p), "Kimi active routed MoE layers must be exactly 1..92");
}

TEST(ManifestValueKinds, PackSizeGoesThroughPythonInt) {
  TinyPack p(TinySpec{});
  const uint64_t size = p.json["expert_pack"]["size"].get<uint64_t>();
  p.json["expert_pack"]["size"] = std::to_string(size);  // int("204800") == the size
  p.Save();
  EXPECT_EQ(FirstLine(p), "OK");
  p.json["expert_pack"]["size"] = static_cast<double>(size);
  p.Save();
  EXPECT_EQ(FirstLine(p), "OK");
  p.json["expert_pack"]["size"] = -1;
  p.Save();
  EXPECT_EQ(FirstLine(p), "Kimi expert-pack size does not match its manifest");
}

TEST(ManifestValueKinds, RoleTypesAsSglangComparesThem) {
  TinyPack p(Strict());
  K3Model(p);
  p.json["expert_pack"]["roles"]["up"]["dtype_id"] = "10";   // int("10") == 10
  p.json["expert_pack"]["roles"]["gate"]["dtype_id"] = 10.0;  // int(10.0) == 10
  p.json["expert_pack"]["roles"]["down"]["dtype"] = 11;       // 11 != "Q3_K"
  p.json["expert_pack"]["roles"]["down"].erase("dtype_id");   // never read: the dtype already differs
  p.Save();
  EXPECT_EQ(FirstLine(p), "Kimi expert-pack down quant type is unsupported");
}

TEST(ManifestValueKinds, MissingPhysicalRoleOrderIsTheOrderMismatch) {
  TinyPack p(TinySpec{});
  p.json["expert_pack"].erase("physical_role_order");
  p.Save();
  EXPECT_EQ(FirstLine(p), "Kimi expert-pack physical role order is unsupported");
}

TEST(ManifestValueKinds, EmptyFullDigestIsNoDigest) {
  TinyPack p(TinySpec{});
  p.json["expert_pack"]["sha256"] = "";
  p.Save();
  StoreOptions o = Small();
  o.verify_pack_sha256 = true;
  EXPECT_EQ(FirstLine(p, o), "full pack verification requested, but manifest has no full SHA-256");
}

TEST(ManifestValueKinds, EmptyStringCompleteIsIncomplete) {
  TinyPack p(TinySpec{});
  p.json["complete"] = "";  // falsy in Python
  p.Save();
  EXPECT_EQ(FirstLine(p), "Kimi expert-pack manifest is incomplete or unsupported");
}

TEST(ManifestValueKinds, DamagedNameIsPythonsUtf8DecodeError) {
  // SGLang's store decodes each index name strictly before matching it.
  TinyPack p(TinySpec{});
  p.Patch(p.EntryOffset(4) + 2, "\xe2\x28", 2);  // entry 4: "bl\xe2(..."
  EXPECT_EQ(FirstLine(p), "'utf-8' codec can't decode byte 0xe2 in position 2: invalid continuation byte");
  TinyPack q(TinySpec{});
  q.Patch(q.EntryOffset(1), "\xff", 1);
  EXPECT_EQ(FirstLine(q), "'utf-8' codec can't decode byte 0xff in position 0: invalid start byte");
}

TEST(ManifestValueKinds, StatsNameTheResolvedPackPath) {
  TinyPack p(TinySpec{});
  const std::string link = p.dir + "/link.pack";
  std::filesystem::create_symlink(p.pack, link);
  auto s = ExpertStore::Open(link, p.manifest, Small());
  ASSERT_TRUE(s.ok()) << s.error().message();
  EXPECT_EQ((*s)->Snapshot()["pack_path"], std::filesystem::canonical(p.pack).string());
}

TEST(ManifestValueKinds, LogicalShapeIsReadForTheEntryRecords) {
  // SGLang builds an entry record per index entry, reading the role's
  // logical_shape (and index_sha256 for the generation): a manifest without
  // it is a KeyError, not a store that opens.
  TinyPack p(TinySpec{});
  p.json["expert_pack"]["roles"]["gate"].erase("logical_shape");
  p.Save();
  EXPECT_EQ(FirstLine(p), "'logical_shape'");
}

TEST(ManifestValueKinds, MissingFilesAreNamedResolvedAndADirectoryIsMissing) {
  TinyPack p(TinySpec{});
  const std::string dir_as_pack = p.dir + "/sub";
  std::filesystem::create_directories(dir_as_pack);
  auto s = ExpertStore::Open(dir_as_pack, p.dir + "/./sub/../manifest.json", Small());
  ASSERT_FALSE(s.ok());
  const std::string canon_dir = std::filesystem::canonical(p.dir).string();
  EXPECT_EQ(s.error().message(), "Kimi expert-pack or manifest is missing: " + canon_dir + "/sub, " + canon_dir +
                                     "/manifest.json\nhint: the pack " + dir_as_pack + " is a directory, not a file");
  EXPECT_EQ(s.error().kind(), ErrorKind::kFileNotFound);
}

}  // namespace k3pack::store
