// SGLang's manifest-only store rules (manifest/loader_rules.h), one function
// per rule, called by the store, verify, doctor and the non-expert stream.
// These pin the places where a restated copy had drifted from Python's
// reading of the manifest.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "k3pack/manifest.h"
#include "loader/manifest_view.h"
#include "manifest/loader_rules.h"

namespace k3pack::manifest {
namespace {

using nlohmann::json;

// A manifest-only document that passes steps 2-5 under the Kimi-K3 constants.
json K3Manifest() {
  json active = json::array();
  for (int l = 1; l <= 92; ++l) active.push_back(l);
  return {{"format", kManifestFormat},
          {"complete", true},
          {"hard_constraints", HardConstraintsJson()},
          {"model",
           {{"num_hidden_layers", 93}, {"num_experts", 896}, {"num_experts_per_token", 16},
            {"active_moe_layer_ids", active}}}};
}

TEST(LoaderRules, AK3ManifestPasses) {
  auto r = CheckLoaderManifestRules(K3Manifest());
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_TRUE(r->kimi);
  EXPECT_EQ(r->active.size(), 92u);
}

// `manifest.get("complete")` is taken by Python's truth value. The store's
// copy of the rule took an empty string for true (nlohmann's empty() is
// false for any string), so `"complete": ""` passed the store while the
// non-expert stream, and SGLang, refuse it.
TEST(LoaderRules, CompleteIsPythonsTruthValueInEveryReader) {
  for (const json& v : {json(true), json(1), json("yes"), json(2.5), json::array({0}), json{{"a", 1}}}) {
    json m = K3Manifest();
    m["complete"] = v;
    EXPECT_TRUE(MarkedComplete(m)) << v.dump();
    EXPECT_TRUE(CheckLoaderManifestRules(m).ok()) << v.dump();
    EXPECT_TRUE(loader::ParseStreamManifest(m).error().message() != "Kimi-K3 manifest is incomplete") << v.dump();
  }
  for (const json& v : {json(false), json(0), json(""), json(0.0), json(nullptr), json::array(), json::object()}) {
    json m = K3Manifest();
    m["complete"] = v;
    EXPECT_FALSE(MarkedComplete(m)) << v.dump();
    auto r = CheckLoaderManifestRules(m);
    ASSERT_FALSE(r.ok()) << v.dump();
    EXPECT_EQ(r.error().message(), "Kimi expert-pack manifest is incomplete or unsupported") << v.dump();
    EXPECT_EQ(loader::ParseStreamManifest(m).error().message(), "Kimi-K3 manifest is incomplete") << v.dump();
  }
  json m = K3Manifest();
  m.erase("complete");
  EXPECT_FALSE(MarkedComplete(m));
  m = K3Manifest();
  m["format"] = json(1);
  EXPECT_FALSE(FormatSupported(m));
  EXPECT_EQ(loader::ParseStreamManifest(m).error().message(), "Kimi-K3 manifest format is unsupported");
}

// SGLang compares the whole list with range(1, 93): an entry after 1..92
// breaks it. The store's copy stopped reading at the first entry out of
// order and then looked only at what it had read, so 1..92 followed by any
// smaller or too large id passed.
TEST(LoaderRules, K3ActiveLayersAreTheWholeList) {
  for (const json& extra : {json(5), json(200), json(93), json("x")}) {
    json m = K3Manifest();
    m["model"]["active_moe_layer_ids"].push_back(extra);
    auto r = CheckLoaderManifestRules(m);
    ASSERT_FALSE(r.ok()) << extra.dump();
    // Every element goes through int() before the tuples are compared, so
    // "x" is int()'s own error.
    EXPECT_EQ(r.error().message(), extra.is_string() ? "invalid literal for int() with base 10: 'x'"
                                                     : "Kimi active routed MoE layers must be exactly 1..92")
        << extra.dump();
  }
}

// A rank pack's manifest carries a constraint SGLang's exact-dict check
// refuses (SGLang runs its expert pack at EP 1 only and would serve the other
// ranks' experts as zeros); k3pack's readers accept it beside k3pack.ep, and
// rank manifests written before the key existed still open.
TEST(LoaderRules, TheRankPackConstraintIsAcceptedOnlyBesideK3packEp) {
  json rank = K3Manifest();
  rank["hard_constraints"] = RankPackHardConstraintsJson();
  EXPECT_FALSE(HardConstraintsMatch(rank["hard_constraints"]));  // SGLang's check 3 refuses it
  rank["k3pack"] = {{"profile", "kimi-k3"}, {"ep", {{"size", 2}, {"rank", 1}, {"first_expert", 448}, {"end_expert", 896}}}};
  auto ok = CheckLoaderManifestRules(rank);
  ASSERT_TRUE(ok.ok()) << ok.error().message();
  ASSERT_TRUE(ok->ext.has_value() && ok->ext->ep.has_value());
  rank["hard_constraints"][std::string(kRankPackConstraint)] = 1;  // Python equality: 1 == True
  EXPECT_TRUE(CheckLoaderManifestRules(rank).ok());
  json older = rank;
  older["hard_constraints"] = HardConstraintsJson();
  EXPECT_TRUE(CheckLoaderManifestRules(older).ok());
  // The key without k3pack.ep, or with another value, is refused in SGLang's words.
  json no_ep = rank;
  no_ep["k3pack"].erase("ep");
  auto r = CheckLoaderManifestRules(no_ep);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().headline(), "Kimi manifest hard constraints do not match runtime policy");
  EXPECT_NE(r.error().message().find("there is no k3pack.ep"), std::string::npos) << r.error().message();
  json no_ext = no_ep;
  no_ext.erase("k3pack");
  EXPECT_FALSE(CheckLoaderManifestRules(no_ext).ok());
  // doctor applies the rule to the raw JSON, before (or without) the
  // extension's parser: an ep that is no object does not say which experts.
  for (const json& not_an_object : {json(nullptr), json("1 of 2"), json::array({2, 1})}) {
    json bad_ep = rank;
    bad_ep["k3pack"]["ep"] = not_an_object;
    EXPECT_FALSE(CheckHardConstraints(bad_ep, true).ok()) << not_an_object.dump();
  }
  json other_value = rank;
  other_value["hard_constraints"][std::string(kRankPackConstraint)] = false;
  r = CheckLoaderManifestRules(other_value);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message(), "Kimi manifest hard constraints do not match runtime policy");
}

TEST(LoaderRules, EachRuleOnItsOwnKeepsTheStoresTexts) {
  json m = K3Manifest();
  m.erase("hard_constraints");
  EXPECT_EQ(CheckHardConstraints(m, true).message(), "Kimi manifest hard constraints do not match runtime policy");
  EXPECT_EQ(CheckLoaderManifestRules(m).error().message(),
            "Kimi manifest hard constraints do not match runtime policy");
  json model = K3Manifest()["model"];
  model["num_experts"] = 16;
  model["num_experts_per_token"] = 4;
  EXPECT_EQ(CheckDimensions(model, true).error().message(),
            "Kimi expert-pack dimensions (93, 16, 4) != (93, 896, 16); Top-K is immutable at 16");
  EXPECT_TRUE(CheckDimensions(model, false).ok());
  model["num_experts_per_token"] = 17;  // more than the experts: no profile allows it
  EXPECT_FALSE(CheckDimensions(model, false).ok());
  EXPECT_FALSE(DimensionsUsable(16, 17));
  EXPECT_FALSE(DimensionsUsable(0, 0));
  EXPECT_FALSE(DimensionsUsable(65537, 1));
  EXPECT_TRUE(DimensionsUsable(65536, 16));
  model.erase("num_experts");
  EXPECT_EQ(CheckDimensions(model, true).error().kind(), ErrorKind::kKey);
  // Scaled: the layers k3pack.layer_roles records.
  json scaled_model = {{"active_moe_layer_ids", {1, 2}}};
  std::vector<LayerRolesRecord> roles(3);
  for (uint32_t i = 0; i < 3; ++i) roles[i].layer = i + 1;
  EXPECT_EQ(CheckActiveLayers(scaled_model, false, 4, roles).error().message().substr(0, 50),
            "Kimi active routed MoE layers must be exactly 1..3");
  scaled_model["active_moe_layer_ids"] = {1, 2, 3};
  EXPECT_TRUE(CheckActiveLayers(scaled_model, false, 4, roles).ok());
  EXPECT_FALSE(CheckActiveLayers(scaled_model, false, 3, roles).ok());  // id 3 is not below 3 layers
}

}  // namespace
}  // namespace k3pack::manifest
