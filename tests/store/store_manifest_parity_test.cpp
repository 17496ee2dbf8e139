// ExpertStore::Open holds the manifest's expert_pack.roles / object_bytes to
// the pack under both profiles, compares hard_constraints as SGLang does (the
// literal dict, Python equality), and words the active-layer check as SGLang
// would for the layers the pack was built for.
#include <gtest/gtest.h>

#include <string>

#include "k3pack/store.h"
#include "open_ok.h"
#include "store/synthetic_pack.h"

namespace k3pack::store {
namespace {

using testing::TinyPack;
using testing::TinySpec;


std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

using testing::OpenError;

// Each edit of expert_pack's role records that SGLang's store refuses; `p`
// is reset to the writer's manifest before each.
void ExpectRoleRecordsChecked(TinyPack& p) {
  auto edit = [&](auto change) {
    p.json = p.MakeManifest();
    change(p.json["expert_pack"]);
    p.Save();
    return FirstLine(OpenError(p));
  };
  EXPECT_EQ(edit([](nlohmann::json& ep) { ep["roles"]["up"]["dtype"] = "Q4_K"; }),
            "Kimi expert-pack up quant type is unsupported");
  EXPECT_EQ(edit([](nlohmann::json& ep) { ep["roles"]["down"]["dtype_id"] = 12; }),
            "Kimi expert-pack down quant type is unsupported");
  EXPECT_EQ(edit([](nlohmann::json& ep) { ep["object_bytes"] = ep["object_bytes"].get<uint64_t>() + 4096; }),
            "Kimi expert-pack role sizes do not match object bytes");
  // Bytes moved between two roles: the sum still matches object_bytes, the
  // first entry of the moved role does not.
  auto shift = [](const char* from, const char* to) {
    return [=](nlohmann::json& ep) {
      ep["roles"][from]["expert_bytes"] = ep["roles"][from]["expert_bytes"].get<uint64_t>() + 4096;
      ep["roles"][to]["expert_bytes"] = ep["roles"][to]["expert_bytes"].get<uint64_t>() - 4096;
    };
  };
  EXPECT_EQ(edit(shift("up", "gate")), "Kimi expert-pack range mismatch at index 0");
  EXPECT_EQ(edit(shift("gate", "down")), "Kimi expert-pack range mismatch at index 1");
  p.json = p.MakeManifest();
  p.Save();
  EXPECT_EQ(OpenError(p), "OK");
}

TEST(StoreManifestParity, ScaledProfileChecksTheRoleRecords) {
  TinySpec spec;
  spec.role_bytes = {{8192, 8192, 12288}, {8192, 8192, 12288}};
  TinyPack p(spec);
  ExpectRoleRecordsChecked(p);
  // The hint says which record disagrees with the pack.
  p.json = p.MakeManifest();
  p.json["expert_pack"]["roles"]["up"]["expert_bytes"] = 12288;
  p.json["expert_pack"]["roles"]["gate"]["expert_bytes"] = 4096;
  p.Save();
  const std::string e = OpenError(p);
  EXPECT_NE(e.find("hint: entry 0 (blk.1.ffn_up_exps.weight expert 0) holds 8192 bytes; the manifest's "
                   "expert_pack.roles records 12288 per up expert"),
            std::string::npos)
      << e;
}

TEST(StoreManifestParity, KimiK3ProfileChecksTheRoleRecords) {
  // Full K3 geometry (92 layers x 896 experts), payloads as holes.
  TinySpec spec;
  spec.kimi_profile = true;
  spec.sparse = true;
  spec.num_hidden_layers = 93;
  spec.experts = 896;
  spec.top_k = 16;
  spec.layers.clear();
  for (uint32_t l = 1; l <= 92; ++l) spec.layers.push_back(l);
  spec.role_bytes.assign(92, {8192, 8192, 12288});
  TinyPack p(spec, "k3roles");
  EXPECT_EQ(OpenError(p), "OK");
  ExpectRoleRecordsChecked(p);
}

TEST(StoreManifestParity, HardConstraintsAreSglangsLiteralDictUnderEveryProfile) {
  TinyPack p(TinySpec{});  // scaled, top-2
  EXPECT_EQ(p.json["hard_constraints"]["top_k"], 16);
  EXPECT_EQ(OpenError(p), "OK");
  // What k3pack wrote before: the model's top-k. Refused, as SGLang refuses it, with a hint.
  p.json["hard_constraints"]["top_k"] = 2;
  p.Save();
  const std::string e = OpenError(p);
  EXPECT_EQ(FirstLine(e), "Kimi manifest hard constraints do not match runtime policy");
  EXPECT_NE(e.find("regenerate the manifest"), std::string::npos) << e;
  // Python equality: 16.0 == 16 and 1 == True; key order does not matter.
  p.json["hard_constraints"]["top_k"] = 16.0;
  p.json["hard_constraints"]["top_k_is_immutable"] = 1;
  p.json["hard_constraints"]["requantization_allowed"] = 0;
  p.Save();
  EXPECT_EQ(OpenError(p), "OK");
  p.json["hard_constraints"]["requantization_allowed"] = nullptr;  // None != False
  p.Save();
  EXPECT_EQ(OpenError(p), "Kimi manifest hard constraints do not match runtime policy");
  // The runtime top-k is the model's, repeated by the pack record.
  p.json = p.MakeManifest();
  p.json["expert_pack"]["top_k"] = 3;
  p.Save();
  EXPECT_EQ(FirstLine(OpenError(p)),
            "scaled manifest expert_pack.top_k is 3, model.num_experts_per_token is 2: the manifest was edited");
}

TEST(StoreManifestParity, ActiveLayersWordedAsSglangForThePacksLayers) {
  TinySpec spec;
  spec.layers = {1, 2, 3};
  spec.num_hidden_layers = 4;
  TinyPack p(spec);
  p.json["model"]["active_moe_layer_ids"] = {1, 2};
  p.Save();
  const std::string e = OpenError(p);
  EXPECT_EQ(FirstLine(e), "Kimi active routed MoE layers must be exactly 1..3");
  EXPECT_NE(e.find("hint: model.active_moe_layer_ids has 2 layers (1..2), but k3pack.layer_roles records 3"),
            std::string::npos)
      << e;
  p.json["model"]["active_moe_layer_ids"] = {0, 1, 2, 3};
  p.Save();
  EXPECT_EQ(FirstLine(OpenError(p)), "Kimi active routed MoE layers must be exactly 1..3");
  p.json["model"]["active_moe_layer_ids"] = {3, 2, 1};
  p.Save();
  EXPECT_EQ(FirstLine(OpenError(p)), "Kimi active routed MoE layers must be exactly 1..3");
}

}  // namespace
}  // namespace k3pack::store
