// ssm_a classification rules, float decode/encode, and the diagnoses only
// crafted files can trigger (wrong dtype, norm weights or another tensor
// mapped into the ssm_a slot, misspelled names, residual score shapes).
#include <cmath>
#include <cstring>
#include <fstream>

#include "doctor_test_util.h"

namespace dtest {
namespace {

using doctor::ClassifySsmA;
using doctor::SsmAForm;

SsmAForm Form(std::vector<float> v) { return ClassifySsmA(v).form; }

TEST(SsmA, ClassificationRules) {
  EXPECT_EQ(Form({-1.0f, -16.0f, -3.5f, -2.0f}), SsmAForm::kNegExp);
  EXPECT_EQ(Form({-1.0f, -0.0005f, -3.5f}), SsmAForm::kTinyNegative);
  EXPECT_EQ(Form({0.3f, -0.4f, 0.1f, 0.0f}), SsmAForm::kRawALog);   // mixed signs, small
  EXPECT_EQ(Form({0.1f, 2.7f, 1.3f, 0.02f}), SsmAForm::kRawALog);   // log(U(1,16)): all positive, spread out
  EXPECT_EQ(Form({-1.0f, -0.99f, 0.5f}), SsmAForm::kRawALog);       // -1 is still A_log territory
  EXPECT_EQ(Form({-4.0f, -9.0f, 0.5f, 1.2f}), SsmAForm::kMixedForms);
  EXPECT_EQ(Form({0.0f, 0.0f, 0.0f}), SsmAForm::kAllZero);
  // Zeros among negative values, nothing positive: lost elements, whether
  // the rest is below -1 or within [-1, 0) (that used to read as raw A_log).
  EXPECT_EQ(Form({-3.0f, 0.0f, -12.0f, -2.5f}), SsmAForm::kZeroedElements);
  EXPECT_EQ(Form({-0.5f, -0.2f, 0.0f, -0.9f}), SsmAForm::kZeroedElements);
  EXPECT_EQ(Form({-3.0f, -0.0f, -12.0f, -2.5f}), SsmAForm::kZeroedElements);
  EXPECT_EQ(Form({-1.0f, NAN, -2.0f}), SsmAForm::kNonFinite);
  EXPECT_EQ(Form({-1.0f, INFINITY}), SsmAForm::kNonFinite);
  EXPECT_EQ(Form({1.02f, 0.97f, 1.05f, 0.99f}), SsmAForm::kNormLike);
  EXPECT_EQ(Form({0.5f, 40.0f, 3.0f}), SsmAForm::kImplausible);
  EXPECT_TRUE(ClassifySsmA(std::vector<float>{0.2f, -0.1f}).repairable());
  EXPECT_FALSE(ClassifySsmA(std::vector<float>{-4.0f, 0.2f}).repairable());
  const auto s = ClassifySsmA(std::vector<float>{0.5f, -0.25f, 0.0f, NAN});
  EXPECT_EQ(s.count, 4u);
  EXPECT_EQ(s.positive, 1u);
  EXPECT_EQ(s.negative, 1u);
  EXPECT_EQ(s.zero, 1u);
  EXPECT_EQ(s.nonfinite, 1u);
  EXPECT_FLOAT_EQ(s.min, -0.25);
  EXPECT_FLOAT_EQ(s.max, 0.5);
}

TEST(SsmA, FloatDecodeEncodeRoundTrip) {
  const std::vector<float> v = {-1.0f, -16.0f, 0.5f, -0.125f};
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16}) {
    auto enc = doctor::EncodeFloatTensor(t, v);
    ASSERT_TRUE(enc.ok());
    EXPECT_EQ(enc->size(), v.size() * (t == GgmlType::F32 ? 4 : 2));
    auto dec = doctor::DecodeFloatTensor(t, *enc);
    ASSERT_TRUE(dec.has_value());
    EXPECT_EQ(*dec, v);  // exactly representable in all three
  }
  EXPECT_FALSE(doctor::DecodeFloatTensor(GgmlType::Q8_0, std::vector<uint8_t>(34)).has_value());
  EXPECT_FALSE(doctor::EncodeFloatTensor(GgmlType::Q8_0, v).ok());
}

// A clean tiny model, rewritten with `edits`, diagnosed under --profile scaled.
doctor::Report Crafted(const std::string& tag, const std::map<std::string, TensorEdit>& edits) {
  auto src = TempDir(tag + "-src");
  Synth(src);
  auto dst = TempDir(tag);
  Rewrite(src, dst, edits);
  return Scaled({dst.string()});
}

TEST(SsmA, NormWeightsInTheSsmASlot) {
  // tiny: 4 heads. Values like an RMSNorm weight.
  auto r = Crafted("norm", {{"blk.1.ssm_a", WithBytes(F32Bytes({1.01f, 0.98f, 1.04f, 0.99f}))}});
  EXPECT_EQ(ErrorCodes(r), std::set<std::string>{"ssm-a-looks-like-norm"}) << Dump(r);
  EXPECT_EQ(r.With("ssm-a-looks-like-norm")[0]->sglang_error, "Kimi-K3 GGUF ssm_a must contain only -exp(A_log) values");
}

// SGLang's `\d` takes an Arabic-Indic one, so its iterator reads
// "blk.\u0661.ssm_a" as an ssm_a and refuses these values; the doctor's own
// ASCII pattern left the tensor's values unchecked.
TEST(SsmA, AnSsmANamedWithOtherDecimalDigitsIsStillChecked) {
  TensorEdit e = WithBytes(F32Bytes({1.01f, 0.98f, 1.04f, 0.99f}));
  e.rename = "blk.\u0661.ssm_a";
  auto r = Crafted("unicode-digit", {{"blk.1.ssm_a", e}});
  auto f = r.With("ssm-a-looks-like-norm");
  ASSERT_EQ(f.size(), 1u) << Dump(r);
  EXPECT_EQ(f[0]->object, "blk.\u0661.ssm_a");
}

TEST(SsmA, MixedFormsAreReportedAsAmbiguous) {
  auto r = Crafted("mixed", {{"blk.1.ssm_a", WithBytes(F32Bytes({-3.0f, -12.0f, 0.4f, 0.2f}))}});
  EXPECT_EQ(ErrorCodes(r), std::set<std::string>{"ssm-a-mixed-forms"}) << Dump(r);
}

TEST(SsmA, QuantizedOrBf16SsmAIsNotFloating) {
  // Q8_0 needs ne0 % 32 == 0: give the slot a {32} shape too, which also
  // trips the shape check (a weight mapped into ssm_a).
  std::vector<uint8_t> q8(34, 0);
  auto r = Crafted("q8", {{"blk.1.ssm_a", WithType(GgmlType::Q8_0, q8, std::vector<int64_t>{32})}});
  EXPECT_TRUE(r.Has("ssm-a-not-float")) << Dump(r);
  EXPECT_TRUE(r.Has("ssm-a-shape")) << Dump(r);
  EXPECT_EQ(r.With("ssm-a-not-float")[0]->sglang_error, "Kimi-K3 GGUF ssm_a must contain finite floating values");

  auto bf = doctor::EncodeFloatTensor(GgmlType::BF16, std::vector<float>{-1.0f, -2.0f, -3.0f, -4.0f});
  auto r2 = Crafted("bf16", {{"blk.1.ssm_a", WithType(GgmlType::BF16, *bf)}});
  EXPECT_EQ(ErrorCodes(r2), std::set<std::string>{"ssm-a-not-float"}) << Dump(r2);

  // F16 is a floating type for gguf-py and SGLang: fine.
  auto f16 = doctor::EncodeFloatTensor(GgmlType::F16, std::vector<float>{-1.0f, -2.0f, -3.0f, -4.0f});
  auto r3 = Crafted("f16", {{"blk.1.ssm_a", WithType(GgmlType::F16, *f16)}});
  EXPECT_EQ(ErrorCodes(r3), std::set<std::string>{}) << Dump(r3);
}

// The doctor (and the build gate that asks it) took an ssm_a of ne {1, H},
// numpy (H, 1), which SGLang's A_log loader and `load` refuse, and refused an
// F64 one, which gguf-py hands out as float64 and SGLang takes.
TEST(SsmA, TheShapesAndTypesSglangsALogLoaderTakes) {
  const std::vector<float> v = {-1.0f, -2.0f, -3.0f, -4.0f};  // tiny: 4 heads
  auto four_d = Crafted("ne-1h11", {{"blk.1.ssm_a", WithShape(std::vector<int64_t>{1, 4, 1, 1}, F32Bytes(v))}});
  EXPECT_EQ(ErrorCodes(four_d), std::set<std::string>{}) << Dump(four_d);
  auto two_d = Crafted("ne-1h", {{"blk.1.ssm_a", WithShape(std::vector<int64_t>{1, 4}, F32Bytes(v))}});
  EXPECT_EQ(ErrorCodes(two_d), std::set<std::string>{"ssm-a-shape"}) << Dump(two_d);
  EXPECT_EQ(kimi::SsmAHeadsOf(std::vector<int64_t>{1, 4}), -1);
  EXPECT_EQ(kimi::SsmAHeadsOf(std::vector<int64_t>{4}), 4);
  EXPECT_EQ(kimi::SsmAHeadsOf(std::vector<int64_t>{1, 4, 1, 1}), 4);

  std::vector<uint8_t> f64(v.size() * 8);
  for (size_t i = 0; i < v.size(); ++i) {
    const double d = v[i];
    std::memcpy(f64.data() + 8 * i, &d, 8);
  }
  auto r = Crafted("f64", {{"blk.1.ssm_a", WithType(GgmlType::F64, f64)}});
  EXPECT_EQ(ErrorCodes(r), std::set<std::string>{}) << Dump(r);
  std::vector<uint8_t> raw_a_log(f64.size());  // a raw A_log in F64 is still diagnosed as one
  for (size_t i = 0; i < v.size(); ++i) {
    const double d = 0.1 * static_cast<double>(i) - 0.15;
    std::memcpy(raw_a_log.data() + 8 * i, &d, 8);
  }
  auto raw = Crafted("f64-raw", {{"blk.1.ssm_a", WithType(GgmlType::F64, raw_a_log)}});
  EXPECT_EQ(ErrorCodes(raw), std::set<std::string>{"ssm-a-raw-a-log"}) << Dump(raw);
  // Values far outside float's range are still negative and finite to
  // SGLang's float64 log(-raw); rounded to float they read as a zero and a
  // -inf.
  std::vector<uint8_t> extreme(f64.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const double d = i == 0 ? -1e-50 : i == 1 ? -1e300 : v[i];
    std::memcpy(extreme.data() + 8 * i, &d, 8);
  }
  auto far = Crafted("f64-far", {{"blk.1.ssm_a", WithType(GgmlType::F64, extreme)}});
  EXPECT_EQ(ErrorCodes(far), std::set<std::string>{}) << Dump(far);
}

// An F64 raw A_log was refused by the repair ("not F32/F16; SGLang refuses
// it"); it is rewritten in its own type, computed in double.
TEST(SsmA, AnF64RawALogIsRepairedInDouble) {
  const std::vector<double> a_log = {0.25, -0.15, 1.7, 0.05};
  std::vector<uint8_t> bytes(a_log.size() * 8);
  std::memcpy(bytes.data(), a_log.data(), bytes.size());
  auto src = TempDir("f64-repair-src");
  Synth(src);
  auto in = TempDir("f64-repair");
  Rewrite(src, in, {{"blk.1.ssm_a", WithType(GgmlType::F64, bytes)}});
  const fs::path out = TempDir("f64-repair-out") / "o";
  doctor::RepairOptions options;
  options.profile = kimi::Profile::kScaled;
  auto rep = doctor::Repair(in.string(), out.string(), options);
  ASSERT_TRUE(rep.ok()) << rep.error().message();
  ASSERT_EQ(rep->repaired.size(), 1u);
  const doctor::RepairedTensor& t = rep->repaired[0];
  EXPECT_EQ(t.name, "blk.1.ssm_a");
  ASSERT_EQ(t.nbytes, bytes.size());
  std::ifstream f(t.file, std::ios::binary);
  f.seekg(static_cast<std::streamoff>(t.data_offset));
  std::vector<double> got(a_log.size());
  f.read(reinterpret_cast<char*>(got.data()), static_cast<std::streamsize>(bytes.size()));
  for (size_t i = 0; i < a_log.size(); ++i) EXPECT_EQ(got[i], -std::exp(a_log[i])) << i;
  EXPECT_TRUE(rep->remaining_problems.empty());
}

TEST(SsmA, ShapeOfAnotherTensorIsNamed) {
  // tiny: kda.head_dim 64 -> ssm_norm.weight is {64}; put a {64} vector in ssm_a.
  std::vector<float> v(64, -2.0f);
  auto r = Crafted("shape", {{"blk.1.ssm_a", WithShape(std::vector<int64_t>{64}, F32Bytes(v))}});
  EXPECT_EQ(ErrorCodes(r), std::set<std::string>{"ssm-a-shape"}) << Dump(r);
  EXPECT_NE(r.With("ssm-a-shape")[0]->message.find("blk.1.ssm_norm.weight"), std::string::npos) << Dump(r);
}

TEST(Names, MisspelledTensorGetsASuggestion) {
  auto r = Crafted("misspelled", {{"blk.2.ssm_a", Renamed("blk.2.ssm_A")},
                                  {"blk.1.ffn_up_shexp.weight", Renamed("blk.1.ffn_up_shexps.weight")}});
  EXPECT_EQ(ErrorCodes(r), std::set<std::string>{"tensor-name-misspelled"}) << Dump(r);
  auto fs = r.With("tensor-name-misspelled");
  ASSERT_EQ(fs.size(), 2u) << Dump(r);
  std::set<std::string> suggestions;
  for (const auto* f : fs) {
    suggestions.insert(f->details["suggestion"].get<std::string>());
    EXPECT_EQ(f->sglang_error, "unsupported Kimi-K3 GGUF tensor name: " + f->object);
  }
  EXPECT_EQ(suggestions, (std::set<std::string>{"blk.2.ssm_a", "blk.1.ffn_up_shexp.weight"}));
  EXPECT_FALSE(r.Has("tensor-missing")) << Dump(r);  // covered by the misspelling
}

// Field audit (session 11): converters that add, drop or swap the
// parameter suffix are many edits away from the right name, but the rename
// is obvious; doctor suggests it instead of an unknown + a missing tensor.
TEST(Names, SuffixOnlyRenameGetsASuggestion) {
  auto r = Crafted("suffix", {{"blk.0.ssm_a", Renamed("blk.0.ssm_a.weight")},
                              {"blk.2.ssm_dt.bias", Renamed("blk.2.ssm_dt.weight")},
                              {"blk.1.ffn_gate_inp.weight", Renamed("blk.1.ffn_gate_inp.bias")}});
  EXPECT_EQ(ErrorCodes(r), std::set<std::string>{"tensor-name-misspelled"}) << Dump(r);
  std::map<std::string, std::string> suggestion;
  for (const auto* f : r.With("tensor-name-misspelled")) {
    suggestion[f->object] = f->details["suggestion"].get<std::string>();
    EXPECT_NE(f->message.find("suffix"), std::string::npos) << f->message;
  }
  EXPECT_EQ(suggestion, (std::map<std::string, std::string>{{"blk.0.ssm_a.weight", "blk.0.ssm_a"},
                                                            {"blk.2.ssm_dt.weight", "blk.2.ssm_dt.bias"},
                                                            {"blk.1.ffn_gate_inp.bias", "blk.1.ffn_gate_inp.weight"}}));
  EXPECT_FALSE(r.Has("tensor-missing")) << Dump(r);
}

TEST(Names, DroppedTensorIsMissing) {
  auto r = Crafted("dropped", {{"blk.2.ssm_dt.bias", Dropped()}});
  EXPECT_EQ(ErrorCodes(r), std::set<std::string>{"tensor-missing"}) << Dump(r);
  EXPECT_EQ(r.With("tensor-missing")[0]->object, "blk.2.ssm_dt.bias");
}

TEST(Values, ResidualScoreMustBeAVector) {
  std::vector<float> v(512, 0.01f);
  auto r = Crafted("res", {{"blk.1.attn_res_score.weight", WithShape(std::vector<int64_t>{512, 1}, F32Bytes(v))}});
  EXPECT_EQ(ErrorCodes(r), std::set<std::string>{"res-score-not-vector"}) << Dump(r);
  EXPECT_EQ(r.With("res-score-not-vector")[0]->sglang_error,
            "Kimi-K3 attention-residual score must be a vector, got (1, 512)");
}

// The build gate reads no values but ssm_a's, and this check went with the
// value pass: `build` wrote a pack of a checkpoint SGLang's stream refuses.
// A vector of the wrong length passed the doctor too; SGLang loads it as a
// [1, d] projection into a [1, E] weight, which its loader refuses.
TEST(Values, TheBuildGateRefusesTheResidualScoresSglangRefuses) {
  auto src = TempDir("res-gate-src");
  Synth(src);
  auto dst = TempDir("res-gate");
  const std::vector<float> score(512, 0.01f);
  const auto paths =
      Rewrite(src, dst, {{"blk.1.attn_res_score.weight", WithShape(std::vector<int64_t>{512, 1}, F32Bytes(score))}});
  Status gate = doctor::CheckSglangCanLoad(paths.front(), kimi::Profile::kScaled, "", "", false);
  ASSERT_FALSE(gate.ok());
  EXPECT_NE(gate.error().message().find("[res-score-not-vector]"), std::string::npos) << gate.error().message();

  auto r = Crafted("res-len", {{"blk.1.attn_res_score.weight",
                                WithShape(std::vector<int64_t>{256}, F32Bytes(std::vector<float>(256, 0.01f)))}});
  EXPECT_EQ(ErrorCodes(r), std::set<std::string>{"tensor-shape-mismatch"}) << Dump(r);
}

TEST(Values, NanInANormIsReported) {
  std::vector<float> v(512, 1.0f);
  v[7] = NAN;
  auto r = Crafted("nannorm", {{"blk.1.ffn_norm.weight", WithBytes(F32Bytes(v))}});
  EXPECT_EQ(ErrorCodes(r), std::set<std::string>{"tensor-nonfinite"}) << Dump(r);
}

TEST(Types, MlaKbMustStayQ4_0AndNormsMustStayFloat) {
  // tiny: MLA layer 3; attn_k_b {64, 256, 4} -> store it as Q8_0 (same block size 32).
  const uint64_t kb_bytes = 64 * 256 * 4 / 32 * 34;
  const uint64_t norm_bytes = 512 / 32 * 34;
  auto r = Crafted("types", {{"blk.3.attn_k_b.weight", WithType(GgmlType::Q8_0, std::vector<uint8_t>(kb_bytes))},
                             {"blk.1.ffn_norm.weight", WithType(GgmlType::Q8_0, std::vector<uint8_t>(norm_bytes))}});
  EXPECT_EQ(ErrorCodes(r), (std::set<std::string>{"mla-k-b-dtype", "tensor-must-be-float"})) << Dump(r);
  EXPECT_EQ(r.With("mla-k-b-dtype")[0]->sglang_error, "Kimi-K3 MLA K projection must remain GGUF Q4_0");
}

}  // namespace
}  // namespace dtest

namespace dtest {
namespace {

TEST(Types, FloatMatrixBf16VectorAndMlaVbAreEachReported) {
  // ffn_routed_down {512, 512} feeds a GGUF linear: F32 is refused.
  // ffn_norm {512} as BF16: gguf-py hands out raw bytes. attn_v_b {256, 64, 4} must be Q2_K.
  auto r = Crafted("types2", {{"blk.1.ffn_routed_down.weight", WithType(GgmlType::F32, std::vector<uint8_t>(512 * 512 * 4))},
                              {"blk.2.ffn_norm.weight", WithType(GgmlType::BF16, std::vector<uint8_t>(512 * 2))},
                              {"blk.3.attn_v_b.weight", WithType(GgmlType::Q4_0, std::vector<uint8_t>(256 * 64 * 4 / 32 * 18))}});
  EXPECT_EQ(ErrorCodes(r), (std::set<std::string>{"tensor-must-be-quantized", "tensor-bf16", "mla-v-b-dtype"})) << Dump(r);
  EXPECT_EQ(r.With("mla-v-b-dtype")[0]->sglang_error, "Kimi-K3 MLA V projection must remain GGUF Q2_K");
}

TEST(Types, CoverageFaultsShareSglangsOneCoverageError) {
  // SGLang fails these only in its coverage check, once, naming every
  // parameter left unloaded (sorted): a GGUF linear's qweight and
  // qweight_type, a plain module's weight.
  const uint64_t norm_bytes = 512 / 32 * 34;
  auto r = Crafted("coverage", {{"blk.1.ffn_routed_down.weight", WithType(GgmlType::F32, std::vector<uint8_t>(512 * 512 * 4))},
                                {"blk.1.ffn_norm.weight", WithType(GgmlType::Q8_0, std::vector<uint8_t>(norm_bytes))},
                                {"blk.2.ssm_dt.bias", Dropped()}});
  EXPECT_EQ(ErrorCodes(r), (std::set<std::string>{"tensor-must-be-quantized", "tensor-must-be-float", "tensor-missing"}))
      << Dump(r);
  const std::string want =
      "Kimi-K3 GGUF did not initialize all model parameters: missing=4 [model.layers.1.mlp.routed_expert_down_proj.qweight, "
      "model.layers.1.mlp.routed_expert_down_proj.qweight_type, model.layers.1.post_attention_layernorm.weight, "
      "model.layers.2.self_attn.dt_bias]";
  for (const char* code : {"tensor-must-be-quantized", "tensor-must-be-float", "tensor-missing"}) {
    ASSERT_EQ(r.With(code).size(), 1u) << code;
    EXPECT_EQ(r.With(code)[0]->sglang_error, want) << code;
    EXPECT_EQ(r.With(code)[0]->sglang_exception, "RuntimeError") << code;
  }
}

// SGLang's stream counts every type but F32/F16/BF16 as quantized: an F64 or
// integer norm is yielded as .qweight, which the norm lacks (the coverage
// check fails), and the doctor called it healthy. A target that keeps its
// name (a bias) loads, converted.
TEST(Types, F64AndIntegerNormsAreQuantizedToSglang) {
  auto r = Crafted("f64-norm", {{"blk.1.attn_norm.weight", WithType(GgmlType::F64, std::vector<uint8_t>(512 * 8))},
                                {"blk.2.attn_norm.weight", WithType(GgmlType::I32, std::vector<uint8_t>(512 * 4))}});
  EXPECT_EQ(ErrorCodes(r), std::set<std::string>{"tensor-must-be-float"}) << Dump(r);
  EXPECT_EQ(r.With("tensor-must-be-float").size(), 2u) << Dump(r);
  EXPECT_NE(r.With("tensor-must-be-float")[0]->sglang_error.find("model.layers.1.input_layernorm.weight"),
            std::string::npos)
      << Dump(r);
  auto bias = Crafted("f64-bias", {{"blk.2.ssm_dt.bias", WithType(GgmlType::F64, std::vector<uint8_t>(256 * 8))}});
  EXPECT_EQ(ErrorCodes(bias), std::set<std::string>{}) << Dump(bias);
}

TEST(SsmA, TinyNegativeValuesAreOnlyAWarning) {
  auto r = Crafted("tiny", {{"blk.1.ssm_a", WithBytes(F32Bytes({-0.0001f, -2.0f, -3.0f, -4.0f}))}});
  EXPECT_EQ(r.ExitCode(), 0) << Dump(r);
  ASSERT_EQ(r.With("ssm-a-tiny").size(), 1u) << Dump(r);
  EXPECT_EQ(r.With("ssm-a-tiny")[0]->severity, doctor::Severity::kWarning);
}

TEST(Spec, ConfigThatDisagreesWithTheGgufIsNamedKeyByKey) {
  auto dir = TempDir("cfg");
  Synth(dir);
  auto j = nlohmann::json::parse(ReadAll(dir / "config.json"));
  nlohmann::json& t = j.contains("text_config") ? j["text_config"] : j;
  t["num_experts_per_token"] = 2;
  t["moe_intermediate_size"] = 2048;
  std::ofstream(dir / "config.json", std::ios::trunc) << j.dump(2);
  doctor::Report r = Scaled({dir.string()});
  EXPECT_TRUE(r.Has("config-gguf-mismatch")) << Dump(r);
  std::set<std::string> keys;
  for (const auto* f : r.With("config-gguf-mismatch")) keys.insert(f->details["config_key"].get<std::string>());
  EXPECT_EQ(keys, (std::set<std::string>{"num_experts_per_token", "moe_intermediate_size"})) << Dump(r);
}

}  // namespace
}  // namespace dtest
