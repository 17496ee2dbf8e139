// The GGUF -> SGLang name table (spec §5.1) and skip rule (§5.2). Expected
// names are written out here independently of the table in src/kimi.
#include <gtest/gtest.h>

#include "k3pack/names.h"

namespace k3pack::kimi {
namespace {

std::vector<std::string> Names(const Mapping& m) {
  std::vector<std::string> out;
  for (const auto& t : m.targets) out.push_back(t.name);
  return out;
}

std::vector<std::string> MapOk(const std::string& name) {
  auto r = MapTensorName(name);
  EXPECT_TRUE(r.ok()) << name << ": " << r.error().message();
  return r.ok() ? Names(*r) : std::vector<std::string>{};
}

TEST(Names, TopLevelAndResidual) {
  EXPECT_EQ(MapOk("token_embd.weight"), std::vector<std::string>{"model.embed_tokens.weight"});
  EXPECT_EQ(MapOk("output.weight"), std::vector<std::string>{"lm_head.weight"});
  EXPECT_EQ(MapOk("output_norm.weight"), std::vector<std::string>{"model.norm.weight"});
  EXPECT_EQ(MapOk("output_res_score.weight"),
            (std::vector<std::string>{"model.output_attn_res_proj.weight", "model.output_attn_res_norm.weight"}));
  EXPECT_EQ(MapOk("blk.2.attn_res_score.weight"),
            (std::vector<std::string>{"model.layers.2.self_attention_res_proj.weight",
                                      "model.layers.2.self_attention_res_norm.weight"}));
  EXPECT_EQ(MapOk("blk.0.ffn_res_score.weight"),
            (std::vector<std::string>{"model.layers.0.mlp_res_proj.weight", "model.layers.0.mlp_res_norm.weight"}));
  auto r = MapTensorName("blk.2.attn_res_score.weight");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->targets[0].transform, TargetTransform::kResidualProjection);
  EXPECT_EQ(r->targets[1].transform, TargetTransform::kResidualNorm);
  EXPECT_EQ(r->layer, 2u);
}

TEST(Names, EveryLayerRow) {
  const std::vector<std::pair<std::string, std::string>> rows = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"attn_output.weight", "self_attn.o_proj.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},
      {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"},
      {"exp_probs_b.bias", "mlp.gate.e_score_correction_bias"},
      {"ffn_gate_inp.weight", "mlp.gate.weight"},
      {"ffn_routed_down.weight", "mlp.routed_expert_down_proj.weight"},
      {"ffn_routed_norm.weight", "mlp.routed_expert_norm.weight"},
      {"ffn_routed_up.weight", "mlp.routed_expert_up_proj.weight"},
      {"ffn_gate_shexp.weight", "mlp.shared_experts.gate_proj.weight"},
      {"ffn_up_shexp.weight", "mlp.shared_experts.up_proj.weight"},
      {"ffn_down_shexp.weight", "mlp.shared_experts.down_proj.weight"},
      {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_v.weight", "self_attn.v_proj.weight"},
      {"ssm_g.weight", "self_attn.g_proj.weight"},
      {"ssm_beta.weight", "self_attn.b_proj.weight"},
      {"ssm_f_a.weight", "self_attn.f_a_proj.weight"},
      {"ssm_f_b.weight", "self_attn.f_b_proj.weight"},
      {"ssm_conv1d_q.weight", "self_attn.q_conv1d.weight"},
      {"ssm_conv1d_k.weight", "self_attn.k_conv1d.weight"},
      {"ssm_conv1d_v.weight", "self_attn.v_conv1d.weight"},
      {"ssm_a", "self_attn.A_log"},
      {"ssm_dt.bias", "self_attn.dt_bias"},
      {"ssm_norm.weight", "self_attn.o_norm.weight"},
      {"attn_q_a.weight", "self_attn.q_a_proj.weight"},
      {"attn_q_a_norm.weight", "self_attn.q_a_layernorm.weight"},
      {"attn_q_b.weight", "self_attn.q_b_proj.weight"},
      {"attn_kv_a_mqa.weight", "self_attn.kv_a_proj_with_mqa.weight"},
      {"attn_kv_a_norm.weight", "self_attn.kv_a_layernorm.weight"},
      {"attn_gate.weight", "self_attn.g_proj.weight"},
      {"attn_k_b.weight", "self_attn.k_b_qweight"},
      {"attn_v_b.weight", "self_attn.v_b_qweight"},
  };
  EXPECT_EQ(rows.size(), LayerTableRows().size());
  for (const auto& [g, s] : rows) {
    for (const char* layer : {"0", "17", "92"}) {
      const std::string name = std::string("blk.") + layer + "." + g;
      EXPECT_EQ(MapOk(name), std::vector<std::string>{std::string("model.layers.") + layer + "." + s}) << name;
    }
  }
  auto a = MapTensorName("blk.5.ssm_a");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->targets[0].transform, TargetTransform::kALog);
  EXPECT_EQ(a->table, NameTable::kKda);
  EXPECT_EQ(MapTensorName("blk.5.attn_gate.weight")->table, NameTable::kMla);
  EXPECT_EQ(MapTensorName("blk.5.attn_norm.weight")->table, NameTable::kCommon);
}

TEST(Names, UnknownNamesAreKeyErrors) {
  for (const char* name : {"blk.1.ffn_mystery.weight", "blk.1.ssm_a.weight", "blk.x.attn_norm.weight",
                           "blk..attn_norm.weight", "blk.1.", "blk.1", "token_embd", "output_res_score",
                           "model.embed_tokens.weight", "blk.-1.attn_norm.weight", "Blk.1.attn_norm.weight",
                           "blk.1.ffn_gate_exps.weight", ""}) {
    auto r = MapTensorName(name);
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_EQ(r.error().kind(), ErrorKind::kKey);
    EXPECT_EQ(r.error().message(), std::string("unsupported Kimi-K3 GGUF tensor name: ") + name);
  }
}

TEST(Names, RoutedSkipRule) {
  EXPECT_TRUE(IsRoutedExpertAggregate("blk.92.ffn_up_exps.weight"));
  EXPECT_TRUE(IsRoutedExpertAggregate("blk.1.ffn_down_exps.weight"));
  EXPECT_TRUE(IsRoutedExpertAggregate("blk.3.ffn_gate_exps.weight"));
  EXPECT_FALSE(IsRoutedExpertAggregate("blk.1.ffn_up_shexp.weight"));
  EXPECT_FALSE(IsRoutedExpertAggregate("blk.1.ffn_routed_up.weight"));
  EXPECT_FALSE(IsRoutedExpertAggregate("blk.1.ffn_up_exps.bias"));
  EXPECT_FALSE(IsRoutedExpertAggregate("blk.a.ffn_up_exps.weight"));
  EXPECT_FALSE(IsRoutedExpertAggregate("ffn_up_exps.weight"));
  EXPECT_FALSE(IsRoutedExpertAggregate("blk.1.ffn_up_exps.weight.x"));
}

// SGLang's `(?P<layer>\d+)` is a str pattern: any Unicode decimal digit
// matches, and its prefix is f"model.layers.{int(layer)}.". These names were
// "unsupported" here, and "blk.01" kept its zero ("model.layers.01."), where
// SGLang maps both to the layer's own parameter.
TEST(Names, LayerDigitsAreWhatPythonsBackslashDTakes) {
  struct Case {
    const char* digits;  // UTF-8
    uint32_t value;
  };
  const Case cases[] = {
      {"\u0663", 3},                  // ARABIC-INDIC DIGIT THREE
      {"1\u0662", 12},                // ASCII and Arabic-Indic in one number
      {"\uff19\uff12", 92},          // FULLWIDTH DIGIT NINE, TWO
      {"\U0001D7D1", 3},              // MATHEMATICAL BOLD DIGIT THREE (4 bytes)
      {"\u0967\u0966", 10},          // DEVANAGARI ONE, ZERO
      {"\U0001E4F5", 5},              // NAG MUNDARI DIGIT FIVE (Unicode 15.0)
      {"07", 7},                      // int() drops leading zeros
      {"0\u0660", 0},                 // all zeros: 0
  };
  for (const Case& c : cases) {
    const std::string name = std::string("blk.") + c.digits + ".attn_norm.weight";
    const std::string layer = std::to_string(c.value);
    auto r = MapTensorName(name);
    ASSERT_TRUE(r.ok()) << name << ": " << r.error().message();
    EXPECT_EQ(Names(*r), std::vector<std::string>{"model.layers." + layer + ".input_layernorm.weight"});
    EXPECT_EQ(r->layer, c.value) << name;
    const std::string score = std::string("blk.") + c.digits + ".ffn_res_score.weight";
    EXPECT_EQ(MapOk(score), (std::vector<std::string>{"model.layers." + layer + ".mlp_res_proj.weight",
                                                      "model.layers." + layer + ".mlp_res_norm.weight"}));
    EXPECT_TRUE(IsRoutedExpertAggregate(std::string("blk.") + c.digits + ".ffn_up_exps.weight")) << c.digits;
  }
  // Digit-like characters that are not Nd (superscript two, circled one,
  // roman numeral one, a Chinese numeral), the character after Arabic-Indic
  // nine (U+066A), and bytes that are not UTF-8 stay unknown: `\d` does not
  // take them.
  for (const char* digits : {"\u00b2", "\u2460", "\u2160", "\u4e09", "\u066a", "\xd9", "\xd9\xa3\xa3"}) {
    const std::string name = std::string("blk.") + digits + ".attn_norm.weight";
    auto r = MapTensorName(name);
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_EQ(r.error().message(), "unsupported Kimi-K3 GGUF tensor name: " + name);
    EXPECT_FALSE(IsRoutedExpertAggregate(std::string("blk.") + digits + ".ffn_up_exps.weight")) << digits;
  }
  // Past uint32 the name still maps (the regex has no bound), past 64 bits
  // written in full as Python's int prints it; no layer value.
  auto big = MapTensorName("blk.\u0664294967296.attn_norm.weight");
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(Names(*big), std::vector<std::string>{"model.layers.4294967296.input_layernorm.weight"});
  EXPECT_FALSE(big->layer.has_value());
  EXPECT_EQ(MapOk("blk.00099999999999999999999.ssm_a"),
            std::vector<std::string>{"model.layers.99999999999999999999.self_attn.A_log"});
}

TEST(Names, RuntimeNames) {
  EXPECT_EQ(RuntimeName("model.layers.1.self_attn.q_b_proj.weight", true), "model.layers.1.self_attn.q_b_proj.qweight");
  EXPECT_EQ(RuntimeName("model.layers.1.self_attn.q_b_proj.weight", false), "model.layers.1.self_attn.q_b_proj.weight");
  EXPECT_EQ(RuntimeName("model.layers.3.self_attn.k_b_qweight", true), "model.layers.3.self_attn.k_b_qweight");
  EXPECT_EQ(QweightTypeName("model.layers.1.self_attn.q_b_proj.qweight"), "model.layers.1.self_attn.q_b_proj.qweight_type");
  EXPECT_EQ(QweightTypeName("model.layers.3.self_attn.k_b_qweight"), "model.layers.3.self_attn.k_b_qweight_type");
  // SGLang's quirk (spec §11.4): a quantized name without ".weight".
  EXPECT_EQ(QweightTypeName("model.layers.0.self_attn.A_log"), "model.layers.0.self_attn.A_logqweight_type");
  EXPECT_FALSE(IsSglangQuantized(GgmlType::F32));
  EXPECT_FALSE(IsSglangQuantized(GgmlType::F16));
  EXPECT_FALSE(IsSglangQuantized(GgmlType::BF16));
  EXPECT_TRUE(IsSglangQuantized(GgmlType::Q8_0));
  EXPECT_TRUE(IsSglangQuantized(GgmlType::I32));
  EXPECT_TRUE(IsSglangQuantized(GgmlType::F64));
}

}  // namespace
}  // namespace k3pack::kimi
