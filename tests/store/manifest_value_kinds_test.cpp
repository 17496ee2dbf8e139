// SGLang's store compares manifest values with Python's == / != on whatever
// json.load returned, so an edited value of another kind is its mismatch
// text (with the value's repr where the text prints it), and an equal value
// of another numeric kind (93.0) passes. k3pack used to refuse such values
// with a message of its own ("must be a non-negative integer").
#include <gtest/gtest.h>

#include <vector>

#include "k3pack/store.h"
#include "store/synthetic_pack.h"

namespace k3pack::store {
namespace {

using testing::TinyPack;
using testing::TinySpec;

std::string FirstLine(const TinyPack& p) {
  StoreOptions o;
  o.cache_bytes = 1 << 20;
  o.queue_depth = 4;
  auto s = ExpertStore::Open(p.pack, p.manifest, o);
  if (s.ok()) return "OK";
  const std::string& m = s.error().message();
  return m.substr(0, m.find('\n'));
}

// A strict (kimi-k3 profile) manifest with K3's dimensions and layers, so
// the checks after step 5 are reached.
void K3Model(TinyPack& p) {
  p.json["model"]["num_hidden_layers"] = 93;
  p.json["model"]["num_experts"] = 896;
  p.json["model"]["num_experts_per_token"] = 16;
  std::vector<int> layers;
  for (int l = 1; l <= 92; ++l) layers.push_back(l);
  p.json["model"]["active_moe_layer_ids"] = layers;
}

TinySpec Strict() {
  TinySpec s;
  s.kimi_profile = true;
  return s;
}

}  // namespace

TEST(ManifestValueKinds, DimensionsPrintTheManifestValuesAsPythonDoes) {
  TinyPack p(Strict());
  K3Model(p);
  p.json["model"]["num_experts_per_token"] = -16;
  p.Save();
  EXPECT_EQ(FirstLine(p), "Kimi expert-pack dimensions (93, 896, -16) != (93, 896, 16); Top-K is immutable at 16");
  p.json["model"]["num_experts_per_token"] = 16;
  p.json["model"]["num_experts"] = "896";
  p.Save();
  EXPECT_EQ(FirstLine(p), "Kimi expert-pack dimensions (93, '896', 16) != (93, 896, 16); Top-K is immutable at 16");
  p.json["model"]["num_experts"] = 896.5;
  p.Save();
  EXPECT_EQ(FirstLine(p), "Kimi expert-pack dimensions (93, 896.5, 16) != (93, 896, 16); Top-K is immutable at 16");
}

TEST(ManifestValueKinds, EqualFloatsPassTheDimensionCheck) {
  TinyPack p(Strict());
  K3Model(p);
  p.json["model"]["num_hidden_layers"] = 93.0;
  p.json["model"]["num_experts"] = 896.0;
  p.json["model"]["num_experts_per_token"] = 16.0;
  p.json["model"]["active_moe_layer_ids"] = {1, 2};
  p.Save();
  // Past step 4: step 5's text.
  EXPECT_EQ(FirstLine(p), "Kimi active routed MoE layers must be exactly 1..92");
}

TEST(ManifestValueKinds, PackSizeOfAnotherKindIsTheSizeMismatch) {
  TinyPack p(TinySpec{});
  p.json["expert_pack"]["size"] = std::to_string(p.json["expert_pack"]["size"].get<uint64_t>());
  p.Save();
  EXPECT_EQ(FirstLine(p), "Kimi expert-pack size does not match its manifest");
  p.json["expert_pack"]["size"] = -1;
  p.Save();
  EXPECT_EQ(FirstLine(p), "Kimi expert-pack size does not match its manifest");
  p.json["expert_pack"]["size"] = static_cast<double>(p.MakeManifest()["expert_pack"]["size"].get<uint64_t>());
  p.Save();
  EXPECT_EQ(FirstLine(p), "OK");
}

TEST(ManifestValueKinds, RoleTypeOfAnotherKindIsUnsupported) {
  TinyPack p(Strict());
  K3Model(p);
  p.json["expert_pack"]["roles"]["up"]["dtype_id"] = 10.0;   // == 10: passes
  p.json["expert_pack"]["roles"]["gate"]["dtype_id"] = "10";  // != 10
  p.Save();
  EXPECT_EQ(FirstLine(p), "Kimi expert-pack gate quant type is unsupported");
  p.json["expert_pack"]["roles"]["gate"]["dtype_id"] = 10;
  p.json["expert_pack"]["roles"]["down"]["dtype"] = 11;
  p.Save();
  EXPECT_EQ(FirstLine(p), "Kimi expert-pack down quant type is unsupported");
}

TEST(ManifestValueKinds, ActiveLayersAreComparedAsAWholeList) {
  TinyPack p(Strict());
  K3Model(p);
  p.json["model"]["active_moe_layer_ids"].push_back("x");  // 1..92, then junk
  p.Save();
  EXPECT_EQ(FirstLine(p), "Kimi active routed MoE layers must be exactly 1..92");
  K3Model(p);
  p.json["model"]["active_moe_layer_ids"][0] = 1.0;  // == 1: passes step 5
  p.Save();
  EXPECT_NE(FirstLine(p), "Kimi active routed MoE layers must be exactly 1..92");
}
}  // namespace k3pack::store
