// SGLang's KimiK3Spec.from_config reads every count through int() and
// hidden_act through str(): a non-numeric value is int()'s own ValueError
// text, "1_6" / " 16 " / 16.9 are 16, and a null hidden_act shows as 'None'
// in the invariants text. k3pack used to say "model config key ... is not an
// integer" and show null as 'null'.
#include <gtest/gtest.h>

#include "k3pack/kimi.h"

using k3pack::kimi::ModelSpecFromConfig;
using k3pack::kimi::Profile;
using nlohmann::json;

namespace {

json K3() {
  return {{"num_hidden_layers", 93}, {"first_k_dense_replace", 1}, {"num_experts", 896},
          {"num_experts_per_token", 16}, {"num_shared_experts", 2}, {"hidden_size", 7168},
          {"routed_expert_hidden_size", 3584}, {"moe_intermediate_size", 3072}, {"hidden_act", "situ"}};
}

std::string VerdictFirstLine(const json& cfg) {
  auto r = ModelSpecFromConfig(cfg, Profile::kKimiK3);
  if (r.ok()) return "OK";
  const std::string& m = r.error().message();
  return m.substr(0, m.find('\n'));
}

}  // namespace

TEST(SpecPythonInt, NonNumericCountIsIntsValueError) {
  json c = K3();
  c["num_experts"] = "abc";
  EXPECT_EQ(VerdictFirstLine(c), "invalid literal for int() with base 10: 'abc'");
  c["num_experts"] = nullptr;
  EXPECT_EQ(VerdictFirstLine(c),
            "int() argument must be a string, a bytes-like object or a real number, not 'NoneType'");
}

TEST(SpecPythonInt, IntAcceptsWhatPythonAccepts) {
  json c = K3();
  c["num_experts"] = "8_96";
  c["num_experts_per_token"] = " 16 ";
  c["hidden_size"] = 7168.9;
  EXPECT_EQ(VerdictFirstLine(c), "OK");
}

TEST(SpecPythonInt, HiddenActIsPythonStr) {
  json c = K3();
  c["hidden_act"] = nullptr;
  const std::string e = VerdictFirstLine(c);
  EXPECT_NE(e.find("actual={'num_hidden_layers': 93"), std::string::npos) << e;
  EXPECT_NE(e.find("'hidden_act': 'None'}"), std::string::npos) << e;
}
