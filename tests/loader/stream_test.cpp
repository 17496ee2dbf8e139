// NonExpertStream on hand-made shard sets: SGLang's order and values, the
// k3pack differences (BF16, ssm_a shape), zero-copy, and every §6.4 error.
#include <sys/mman.h>

#include "loader/values.h"
#include "loader_fixture.h"
#include "util/file.h"

namespace k3pack::loader {
namespace {

using namespace testing;  // NOLINT

std::vector<float> Ramp(size_t n, float base, float step) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = base + step * static_cast<float>(i);
  return v;
}

std::vector<float> SsmA(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = -std::exp(0.25f * static_cast<float>(i) - 0.5f);
  return v;
}

std::vector<uint16_t> Bf16Values(size_t n) {
  std::vector<uint16_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = FloatToBFloatBits(0.5f + 0.125f * static_cast<float>(i % 13));
  return v;
}

std::vector<uint16_t> F16Values(size_t n) {
  std::vector<uint16_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = FloatToHalfBits(-1.0f + 0.0625f * static_cast<float>(i % 40));
  return v;
}

// The reference model: every transform and every view kind once.
std::vector<gguf::TensorSpec> ReferenceTensors() {
  std::vector<gguf::TensorSpec> t;
  t.push_back(Typed("token_embd.weight", GgmlType::Q8_0, {32, 8}, 1));
  t.push_back(F32Tensor("blk.0.attn_norm.weight", {32}, Ramp(32, 1.0f, 0.01f)));
  t.push_back(F32Tensor("blk.0.ssm_a", {4}, SsmA(4)));
  t.push_back(F32Tensor("blk.0.attn_res_score.weight", {32}, Ramp(32, -0.5f, 0.03f)));
  t.push_back(F32Tensor("blk.0.ssm_conv1d_q.weight", {4, 1, 16}, Ramp(64, 0.0f, 0.001f)));
  t.push_back({"blk.0.attn_q.weight", GgmlType::F16, {32, 16}, U16Fill(F16Values(32 * 16))});
  t.push_back({"blk.0.ffn_down.weight", GgmlType::BF16, {32, 8}, U16Fill(Bf16Values(32 * 8))});
  t.push_back(Typed("blk.1.attn_k_b.weight", GgmlType::Q4_0, {32, 8, 4}, 2));
  t.push_back(Typed("blk.1.ffn_gate_exps.weight", GgmlType::Q2_K, {256, 4, 4}, 3));
  t.push_back(F32Tensor("blk.1.exp_probs_b.bias", {4}, Ramp(4, 0.1f, 0.1f)));
  t.push_back(F32Tensor("output_res_score.weight", {32}, Ramp(32, 0.2f, 0.02f)));
  t.push_back(Typed("output.weight", GgmlType::Q8_0, {32, 8}, 4));
  return t;
}
const std::vector<uint32_t> kReferenceShards = {0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1};

struct Expect {
  std::string name;
  TensorKind kind;
  DType dtype;
  std::vector<int64_t> shape;
  std::string source;
};

TEST(Stream, SglangOrderNamesShapesAndKinds) {
  TempDir dir("order");
  const std::string manifest = WriteModel(dir.path, ReferenceTensors(), kReferenceShards);
  auto s = NonExpertStream::Open(manifest);
  ASSERT_TRUE(s.ok()) << s.error().message();
  std::optional<Error> err;
  auto out = Drain(*s, &err);
  ASSERT_FALSE(err) << err->message();
  const std::vector<Expect> want = {
      {"model.embed_tokens.qweight_type", TensorKind::kQweightType, DType::kUint8, {}, "token_embd.weight"},
      {"model.embed_tokens.qweight", TensorKind::kQweight, DType::kUint8, {8, 34}, "token_embd.weight"},
      {"model.layers.0.input_layernorm.weight", TensorKind::kPlain, DType::kFloat32, {32}, "blk.0.attn_norm.weight"},
      {"model.layers.0.self_attn.A_log", TensorKind::kALog, DType::kFloat32, {4}, "blk.0.ssm_a"},
      {"model.layers.0.self_attention_res_proj.weight", TensorKind::kResidualProjection, DType::kFloat32, {1, 32},
       "blk.0.attn_res_score.weight"},
      {"model.layers.0.self_attention_res_norm.weight", TensorKind::kResidualNorm, DType::kFloat32, {32},
       "blk.0.attn_res_score.weight"},
      {"model.layers.0.self_attn.q_conv1d.weight", TensorKind::kPlain, DType::kFloat32, {16, 1, 4},
       "blk.0.ssm_conv1d_q.weight"},
      {"model.layers.0.self_attn.q_proj.weight", TensorKind::kPlain, DType::kFloat16, {16, 32}, "blk.0.attn_q.weight"},
      {"model.layers.0.mlp.down_proj.weight", TensorKind::kPlain, DType::kBFloat16, {8, 32}, "blk.0.ffn_down.weight"},
      {"model.layers.1.self_attn.k_b_qweight_type", TensorKind::kQweightType, DType::kUint8, {},
       "blk.1.attn_k_b.weight"},
      {"model.layers.1.self_attn.k_b_qweight", TensorKind::kQweight, DType::kUint8, {4, 8, 18},
       "blk.1.attn_k_b.weight"},
      {"model.layers.1.mlp.gate.e_score_correction_bias", TensorKind::kPlain, DType::kFloat32, {4},
       "blk.1.exp_probs_b.bias"},
      {"model.output_attn_res_proj.weight", TensorKind::kResidualProjection, DType::kFloat32, {1, 32},
       "output_res_score.weight"},
      {"model.output_attn_res_norm.weight", TensorKind::kResidualNorm, DType::kFloat32, {32},
       "output_res_score.weight"},
      {"lm_head.qweight_type", TensorKind::kQweightType, DType::kUint8, {}, "output.weight"},
      {"lm_head.qweight", TensorKind::kQweight, DType::kUint8, {8, 34}, "output.weight"},
  };
  ASSERT_EQ(out.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(want[i].name);
    EXPECT_EQ(out[i].name, want[i].name);
    EXPECT_EQ(out[i].kind, want[i].kind);
    EXPECT_EQ(out[i].dtype, want[i].dtype);
    EXPECT_EQ(out[i].shape, want[i].shape);
    EXPECT_EQ(out[i].source_name, want[i].source);
    EXPECT_EQ(static_cast<int64_t>(out[i].data.size()), out[i].numel() * static_cast<int64_t>(DTypeSize(out[i].dtype)));
  }
  EXPECT_EQ(out[0].data[0], 8);  // Q8_0
  EXPECT_EQ(out[9].data[0], 2);  // Q4_0
  EXPECT_EQ(out[14].data[0], 8);
  const LoadStats& st = s->stats();
  EXPECT_EQ(st.shards_opened, 2u);
  EXPECT_EQ(st.source_tensors, 12u);
  EXPECT_EQ(st.routed_skipped, 1u);
  EXPECT_EQ(st.routed_skipped_bytes, 84u * 16);
  EXPECT_EQ(st.emitted, want.size());
  // The end is sticky.
  auto again = s->Next();
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(*again);
}

TEST(Stream, ValuesAndZeroCopyIdentity) {
  TempDir dir("values");
  std::vector<std::string> shards;
  const std::string manifest = WriteModel(dir.path, ReferenceTensors(), kReferenceShards, nullptr, &shards);
  auto s = NonExpertStream::Open(manifest);
  ASSERT_TRUE(s.ok());
  std::optional<Error> err;
  auto out = Drain(*s, &err);
  ASSERT_FALSE(err) << err->message();
  auto f0 = gguf::GgufFile::Open(shards[0]);
  auto f1 = gguf::GgufFile::Open(shards[1]);
  ASSERT_TRUE(f0.ok() && f1.ok());
  for (const NamedTensor& t : out) {
    SCOPED_TRACE(t.name);
    const auto& file = t.shard_index == 0 ? **f0 : **f1;
    const gguf::TensorInfo* info = file.FindTensor(t.source_name);
    ASSERT_NE(info, nullptr);
    if (t.zero_copy) {
      // The view is the mapping itself: base + data_offset, kept alive by owner.
      const auto* map = static_cast<const MappedFile*>(t.owner.get());
      ASSERT_NE(map, nullptr);
      EXPECT_EQ(t.data.data(), map->data() + info->data_offset);
      EXPECT_EQ(t.data.size(), info->nbytes);
      EXPECT_EQ(0, std::memcmp(t.data.data(), file.TensorData(*info).data(), info->nbytes));
    }
    switch (t.kind) {
      case TensorKind::kALog: {
        EXPECT_FALSE(t.zero_copy);
        const auto src = SsmA(4);
        for (size_t i = 0; i < 4; ++i) {
          EXPECT_EQ(F32At(t, i), static_cast<float>(std::log(-static_cast<double>(src[i]))));
          EXPECT_NEAR(F32At(t, i), 0.25f * static_cast<float>(i) - 0.5f, 1e-6);  // round trip
        }
        break;
      }
      case TensorKind::kResidualNorm:
        EXPECT_FALSE(t.zero_copy);
        for (size_t i = 0; i < 32; ++i) EXPECT_EQ(F32At(t, i), 1.0f);
        break;
      case TensorKind::kQweightType:
        EXPECT_TRUE(t.shape.empty());
        EXPECT_EQ(t.data.size(), 1u);
        EXPECT_EQ(t.data[0], static_cast<uint8_t>(info->type));
        break;
      case TensorKind::kResidualProjection:
      case TensorKind::kQweight:
      case TensorKind::kPlain:
        EXPECT_TRUE(t.zero_copy);
        break;
    }
  }
  // The views outlive the stream (owner holds the mapping).
  s = Result<NonExpertStream>(Error("stream destroyed"));
  const NamedTensor& bf16 = out[8];
  ASSERT_EQ(bf16.dtype, DType::kBFloat16);
  const auto want = Bf16Values(32 * 8);
  EXPECT_EQ(0, std::memcmp(bf16.data.data(), want.data(), want.size() * 2));
  const NamedTensor& f16 = out[7];
  const auto want16 = F16Values(32 * 16);
  EXPECT_EQ(0, std::memcmp(f16.data.data(), want16.data(), want16.size() * 2));
}

TEST(Stream, SglangCompatDeliversBf16AsBytes) {
  TempDir dir("compat");
  const std::string manifest = WriteModel(dir.path, ReferenceTensors(), kReferenceShards);
  LoadOptions o;
  o.sglang_compat = true;
  auto s = NonExpertStream::Open(manifest, o);
  ASSERT_TRUE(s.ok());
  auto out = Drain(*s);
  ASSERT_EQ(out.size(), 16u);
  EXPECT_EQ(out[8].name, "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(out[8].dtype, DType::kUint8);
  EXPECT_EQ(out[8].shape, (std::vector<int64_t>{8, 64}));
  EXPECT_EQ(out[7].dtype, DType::kFloat16);  // F16 stays float16 in both modes
}

// One-tensor models for the transform errors.
std::string OneTensorModel(const std::string& dir, gguf::TensorSpec t) {
  return WriteModel(dir, {Typed("token_embd.weight", GgmlType::Q8_0, {32, 2}), std::move(t)}, {0, 0});
}

Error StreamError(const std::string& manifest, const LoadOptions& o = {}, std::vector<NamedTensor>* before = nullptr) {
  auto s = NonExpertStream::Open(manifest, o);
  if (!s.ok()) return s.error();
  std::optional<Error> err;
  auto out = Drain(*s, &err);
  if (before) *before = std::move(out);
  if (!err) return Error("<no error>");
  // Sticky: the same error again.
  auto again = s->Next();
  EXPECT_FALSE(again.ok());
  if (!again.ok()) {
    EXPECT_EQ(again.error().message(), err->message());
  }
  return *err;
}

// The first line: SGLang's text (a k3pack hint line may follow).
std::string FirstLine(const Error& e) { return e.message().substr(0, e.message().find('\n')); }

TEST(StreamErrors, SsmAValues) {
  TempDir dir("ssma");
  auto nan = SsmA(4);
  nan[2] = std::nanf("");
  Error e = StreamError(OneTensorModel(dir.path, F32Tensor("blk.0.ssm_a", {4}, nan)));
  EXPECT_EQ(FirstLine(e), "Kimi-K3 GGUF ssm_a must contain finite floating values");
  EXPECT_EQ(e.kind(), ErrorKind::kValue);
  // SGLang's text first, then a hint naming the tensor and its file.
  EXPECT_NE(e.message().find("\nhint: tensor blk.0.ssm_a in "), std::string::npos) << e.message();
  EXPECT_NE(e.message().find(".gguf"), std::string::npos) << e.message();

  auto inf = SsmA(4);
  inf[0] = -INFINITY;
  EXPECT_EQ(FirstLine(StreamError(OneTensorModel(dir.path, F32Tensor("blk.0.ssm_a", {4}, inf)))),
            "Kimi-K3 GGUF ssm_a must contain finite floating values");

  auto zero = SsmA(4);
  zero[3] = 0.0f;
  EXPECT_EQ(FirstLine(StreamError(OneTensorModel(dir.path, F32Tensor("blk.0.ssm_a", {4}, zero)))),
            "Kimi-K3 GGUF ssm_a must contain only -exp(A_log) values");
  // Raw A_log (mixed signs) instead of -exp(A_log).
  EXPECT_EQ(FirstLine(StreamError(OneTensorModel(dir.path, F32Tensor("blk.0.ssm_a", {4}, {-0.3f, 0.2f, -1.0f, 0.7f})))),
            "Kimi-K3 GGUF ssm_a must contain only -exp(A_log) values");
  // A NaN is reported as "finite" even when a positive value comes first (torch checks isfinite first).
  EXPECT_EQ(FirstLine(StreamError(OneTensorModel(dir.path, F32Tensor("blk.0.ssm_a", {4}, {1.0f, -1.0f, -1.0f, NAN})))),
            "Kimi-K3 GGUF ssm_a must contain finite floating values");
  // A quantized ssm_a is not floating data.
  EXPECT_EQ(FirstLine(StreamError(OneTensorModel(dir.path, Typed("blk.0.ssm_a", GgmlType::Q8_0, {32})))),
            "Kimi-K3 GGUF ssm_a must contain finite floating values");
}

TEST(StreamErrors, SsmAShapeIsCheckedUnlessCompat) {
  TempDir dir("ssmashape");
  const std::string m = OneTensorModel(dir.path, F32Tensor("blk.0.ssm_a", {4, 1}, SsmA(4)));
  Error e = StreamError(m);
  EXPECT_NE(e.message().find("Kimi-K3 GGUF ssm_a must have shape (H,) or (1, 1, H, 1)"), std::string::npos)
      << e.message();
  EXPECT_NE(e.message().find("H = kimi-k3.attention.head_count = 4, got (1, 4): blk.0.ssm_a"), std::string::npos)
      << e.message();
  LoadOptions compat;
  compat.sglang_compat = true;
  auto s = NonExpertStream::Open(m, compat);
  ASSERT_TRUE(s.ok());
  std::optional<Error> err;
  auto out = Drain(*s, &err);
  ASSERT_FALSE(err) << err->message();
  EXPECT_EQ(out.back().name, "model.layers.0.self_attn.A_log");
  EXPECT_EQ(out.back().shape, (std::vector<int64_t>{1, 4}));
  // Wrong head count in a vector, and the accepted 4-D form.
  EXPECT_NE(StreamError(OneTensorModel(dir.path, F32Tensor("blk.0.ssm_a", {3}, SsmA(3)))).message().find("got (3,)"),
            std::string::npos);
  auto ok4 = NonExpertStream::Open(OneTensorModel(dir.path, F32Tensor("blk.0.ssm_a", {1, 4, 1, 1}, SsmA(4))));
  ASSERT_TRUE(ok4.ok());
  std::optional<Error> err4;
  auto out4 = Drain(*ok4, &err4);
  ASSERT_FALSE(err4) << err4->message();
  EXPECT_EQ(out4.back().shape, (std::vector<int64_t>{1, 1, 4, 1}));
}

TEST(StreamErrors, SsmAHalfAndBFloat) {
  TempDir dir("ssmahalf");
  const auto src = SsmA(4);
  std::vector<uint16_t> h(4), b(4);
  for (size_t i = 0; i < 4; ++i) {
    h[i] = FloatToHalfBits(src[i]);
    b[i] = FloatToBFloatBits(src[i]);
  }
  auto s = NonExpertStream::Open(OneTensorModel(dir.path, {"blk.0.ssm_a", GgmlType::F16, {4}, U16Fill(h)}));
  ASSERT_TRUE(s.ok());
  auto out = Drain(*s);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[2].dtype, DType::kFloat16);  // log keeps float16, as torch does
  for (size_t i = 0; i < 4; ++i) {
    uint16_t got;
    std::memcpy(&got, out[2].data.data() + 2 * i, 2);
    EXPECT_EQ(got, FloatToHalfBits(static_cast<float>(std::log(-static_cast<double>(HalfBitsToFloat(h[i]))))));
  }
  const std::string bm = OneTensorModel(dir.path, {"blk.0.ssm_a", GgmlType::BF16, {4}, U16Fill(b)});
  auto sb = NonExpertStream::Open(bm);
  ASSERT_TRUE(sb.ok());
  auto outb = Drain(*sb);
  ASSERT_EQ(outb.size(), 3u);
  EXPECT_EQ(outb[2].dtype, DType::kBFloat16);
  // SGLang sees BF16 as bytes and rejects it.
  LoadOptions compat;
  compat.sglang_compat = true;
  EXPECT_EQ(FirstLine(StreamError(bm, compat)), "Kimi-K3 GGUF ssm_a must contain finite floating values");
}

// The float16 A_log is log(-x) in double rounded once to float16 (what the
// oracle and docs/loader.md promise). Going through float first rounds twice:
// log(0.005340576171875) = -5.2324217344... rounds to the float -5.232421875,
// exactly halfway between two halves, and the tie then went to even
// (-5.234375, 0xc53c) instead of the nearer -5.23046875 (0xc53b).
TEST(Values, ALogOfEveryHalfIsRoundedOnce) {
  auto nearest_half = [](double v) {
    uint16_t best = 0;
    double best_err = INFINITY;
    for (uint32_t h = 0; h < 0x10000; ++h) {
      if ((h & 0x7c00) == 0x7c00) continue;  // Inf/NaN: no finite log of a half lands there
      const double err = std::fabs(static_cast<double>(HalfBitsToFloat(static_cast<uint16_t>(h))) - v);
      if (err < best_err || (err == best_err && (h & 1) == 0)) best = static_cast<uint16_t>(h), best_err = err;
    }
    return best;
  };
  const uint16_t tie_case = 0x9d78;  // -0.005340576171875
  auto one = ALogFromSsmA(DType::kFloat16, {reinterpret_cast<const uint8_t*>(&tie_case), 2});
  ASSERT_TRUE(one.ok()) << one.error().message();
  uint16_t got;
  std::memcpy(&got, one->data(), 2);
  EXPECT_EQ(got, 0xc53b);

  std::vector<uint16_t> all;  // every finite negative half
  for (uint32_t h = 0x8001; h < 0xfc00; ++h) all.push_back(static_cast<uint16_t>(h));
  auto out = ALogFromSsmA(DType::kFloat16, {reinterpret_cast<const uint8_t*>(all.data()), 2 * all.size()});
  ASSERT_TRUE(out.ok()) << out.error().message();
  // Against a brute-force nearest half, at a sample (the search is 64k steps a value).
  for (size_t i = 0; i < all.size(); i += 97) {
    std::memcpy(&got, out->data() + 2 * i, 2);
    ASSERT_EQ(got, nearest_half(std::log(-static_cast<double>(HalfBitsToFloat(all[i]))))) << std::hex << all[i];
  }
}

TEST(StreamErrors, ResidualScoreMustBeAVector) {
  TempDir dir("resid");
  Error e = StreamError(OneTensorModel(dir.path, F32Tensor("blk.3.ffn_res_score.weight", {32, 1}, Ramp(32, 0, 1))));
  EXPECT_EQ(e.message(), "Kimi-K3 attention-residual score must be a vector, got (1, 32)");
  EXPECT_EQ(StreamError(OneTensorModel(dir.path, F32Tensor("output_res_score.weight", {16, 2}, Ramp(32, 0, 1)))).message(),
            "Kimi-K3 attention-residual score must be a vector, got (2, 16)");
}

TEST(StreamErrors, UnknownTensorNameIsKeyError) {
  TempDir dir("unknown");
  Error e = StreamError(OneTensorModel(dir.path, F32Tensor("blk.1.ffn_mystery.weight", {4}, Ramp(4, 0, 1))));
  EXPECT_EQ(e.message(), "unsupported Kimi-K3 GGUF tensor name: blk.1.ffn_mystery.weight");
  EXPECT_EQ(e.kind(), ErrorKind::kKey);
}

TEST(StreamErrors, DuplicateTarget) {
  TempDir dir("dup");
  // ssm_g (KDA) and attn_gate (MLA) both map to self_attn.g_proj.weight.
  std::vector<NamedTensor> before;
  Error e = StreamError(WriteModel(dir.path,
                                   {F32Tensor("blk.1.ssm_g.weight", {4, 2}, Ramp(8, 0, 1)),
                                    F32Tensor("blk.1.attn_gate.weight", {4, 2}, Ramp(8, 0, 1))},
                                   {0, 1}),
                        {}, &before);
  EXPECT_EQ(e.message(), "duplicate Kimi-K3 target parameter: model.layers.1.self_attn.g_proj.weight");
  ASSERT_EQ(before.size(), 1u);  // the first one was yielded
  TempDir dir2("dupq");
  Error q = StreamError(WriteModel(dir2.path,
                                   {Typed("blk.1.ssm_g.weight", GgmlType::Q8_0, {32, 2}),
                                    Typed("blk.1.attn_gate.weight", GgmlType::Q8_0, {32, 2})},
                                   {0, 0}));
  // SGLang checks the runtime name before its qweight_type: the qweight is named.
  EXPECT_EQ(q.message(), "duplicate Kimi-K3 target parameter: model.layers.1.self_attn.g_proj.qweight");
}

class ManifestErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    manifest_path = WriteModel(dir.path, ReferenceTensors(), kReferenceShards, &manifest, &shards);
  }
  std::string Rewrite(const json& m) { return WriteJson(dir.path + "/edited.json", m); }
  TempDir dir{"manifest"};
  std::string manifest_path;
  json manifest;
  std::vector<std::string> shards;
};

TEST_F(ManifestErrors, FormatAndComplete) {
  // SGLang's texts on the first line; a hint naming the file follows.
  auto FirstLine = [](const std::string& text) { return text.substr(0, text.find('\n')); };
  json m = manifest;
  m["format"] = "SGLANG-KIMI-GGMLMOEPACK-ADAPTER-v2";
  EXPECT_EQ(FirstLine(StreamError(Rewrite(m)).message()), "Kimi-K3 manifest format is unsupported");
  m.erase("format");
  EXPECT_EQ(FirstLine(StreamError(Rewrite(m)).message()), "Kimi-K3 manifest format is unsupported");
  EXPECT_EQ(FirstLine(StreamError(Rewrite(json::array())).message()), "Kimi-K3 manifest format is unsupported");
  for (const json& falsy : {json(false), json(0), json(""), json(nullptr), json::array()}) {
    m = manifest;
    m["complete"] = falsy;
    EXPECT_EQ(FirstLine(StreamError(Rewrite(m)).message()), "Kimi-K3 manifest is incomplete") << falsy.dump();
  }
  m = manifest;
  m.erase("complete");
  EXPECT_EQ(FirstLine(StreamError(Rewrite(m)).message()), "Kimi-K3 manifest is incomplete");
  m = manifest;
  m["complete"] = 1;  // truthy, as in Python
  EXPECT_EQ(FirstLine(StreamError(Rewrite(m)).message()), "<no error>");
  m = manifest;
  m.erase("source");
  Error k = StreamError(Rewrite(m));
  EXPECT_EQ(k.kind(), ErrorKind::kKey);
  EXPECT_EQ(k.message(), "'source'");
  m = manifest;
  m["source"]["tensors"][0].erase("shard_index");
  EXPECT_EQ(FirstLine(StreamError(Rewrite(m)).message()), "'shard_index'");
  Error missing = StreamError(dir.path + "/nope.json");
  EXPECT_EQ(missing.kind(), ErrorKind::kFileNotFound);
}

TEST_F(ManifestErrors, ShardMissingOrResized) {
  json m = manifest;
  const uint64_t size = m["source"]["shards"][1]["size"].get<uint64_t>();
  m["source"]["shards"][1]["size"] = size + 1;
  std::vector<NamedTensor> before;
  Error e = StreamError(Rewrite(m), {}, &before);
  // SGLang's line, then what differs (it had no hint without the metadata check).
  EXPECT_EQ(e.message(), "Kimi-K3 GGUF shard is missing or changed: " + shards[1] + "\nhint: size " +
                             std::to_string(size) + " != " + std::to_string(size + 1) +
                             " (file != manifest); rebuild the manifest");
  EXPECT_EQ(e.kind(), ErrorKind::kFileNotFound);
  EXPECT_EQ(before.size(), 9u);  // all of shard 0 came first
  fs::remove(shards[0]);
  Error gone = StreamError(manifest_path);
  EXPECT_EQ(gone.message(), "Kimi-K3 GGUF shard is missing or changed: " + shards[0]);
  EXPECT_EQ(gone.kind(), ErrorKind::kFileNotFound);
}

TEST_F(ManifestErrors, ShardIsNamedByItsResolvedPath) {
  // SGLang names the shard Path(shard["path"]).resolve(): a manifest path
  // through a symlink (or with "..") is shown resolved.
  const std::string link = dir.path + "/shards-link";
  fs::create_symlink(fs::path(shards[1]).parent_path(), link);
  json m = manifest;
  m["source"]["shards"][1]["path"] = link + "/./" + fs::path(shards[1]).filename().string();
  m["source"]["shards"][1]["size"] = m["source"]["shards"][1]["size"].get<uint64_t>() + 1;
  EXPECT_EQ(FirstLine(StreamError(Rewrite(m))),
            "Kimi-K3 GGUF shard is missing or changed: " + fs::canonical(shards[1]).string());
}

TEST_F(ManifestErrors, IndexesAndSizesGoThroughPythonInt) {
  // SGLang: int(record["shard_index"]), int(shard["index"]), int(shard["size"]).
  json m = manifest;
  for (auto& t : m["source"]["tensors"]) t["shard_index"] = std::to_string(t["shard_index"].get<int>());
  m["source"]["shards"][0]["index"] = 0.0;
  m["source"]["shards"][1]["size"] = std::to_string(m["source"]["shards"][1]["size"].get<uint64_t>());
  EXPECT_EQ(StreamError(Rewrite(m)).message(), "<no error>");
  m["source"]["shards"][1]["size"] = "big";
  EXPECT_EQ(StreamError(Rewrite(m)).message(), "invalid literal for int() with base 10: 'big'");
}

TEST_F(ManifestErrors, InventoryChanged) {
  json m = manifest;
  json extra = m["source"]["tensors"][0];
  extra["name"] = "blk.0.attn_k.weight";
  m["source"]["tensors"].push_back(extra);
  Error e = StreamError(Rewrite(m));
  EXPECT_EQ(e.message(), "Kimi-K3 GGUF shard inventory changed: " + shards[0]);
  m = manifest;
  m["source"]["tensors"].erase(m["source"]["tensors"].end() - 1);  // drop output.weight (shard 1)
  EXPECT_EQ(StreamError(Rewrite(m)).message(), "Kimi-K3 GGUF shard inventory changed: " + shards[1]);
  m = manifest;
  m["source"]["tensors"][0]["shard_index"] = 1;
  EXPECT_EQ(StreamError(Rewrite(m)).message(), "Kimi-K3 GGUF shard inventory changed: " + shards[0]);
}

TEST_F(ManifestErrors, TensorTypeChanged) {
  json m = manifest;
  for (auto& t : m["source"]["tensors"]) {
    if (t["name"] == "blk.0.attn_q.weight") t["dtype"] = "BF16";
  }
  std::vector<NamedTensor> before;
  Error e = StreamError(Rewrite(m), {}, &before);
  EXPECT_EQ(e.message(), "Kimi-K3 GGUF tensor type changed: blk.0.attn_q.weight");
  EXPECT_EQ(before.size(), 7u);  // checked as the stream reaches it
  // Routed aggregates are type-checked too, before being skipped.
  m = manifest;
  for (auto& t : m["source"]["tensors"]) {
    if (t["name"] == "blk.1.ffn_gate_exps.weight") t["dtype"] = "Q3_K";
  }
  EXPECT_EQ(StreamError(Rewrite(m)).message(), "Kimi-K3 GGUF tensor type changed: blk.1.ffn_gate_exps.weight");
}

TEST_F(ManifestErrors, ARepeatedTensorRecordIsTheLastOne) {
  // SGLang builds {record["name"]: record} per shard: of two records of one
  // name the last is the one whose dtype it compares. The stream kept the
  // first, so it refused what SGLang loads and loaded what SGLang refuses.
  json m = manifest;
  json stale;
  for (const auto& t : m["source"]["tensors"]) {
    if (t["name"] == "blk.0.attn_q.weight") stale = t;
  }
  ASSERT_FALSE(stale.is_null());
  stale["dtype"] = "BF16";
  m["source"]["tensors"].insert(m["source"]["tensors"].begin(), stale);  // before the true one
  EXPECT_EQ(StreamError(Rewrite(m)).message(), "<no error>");
  m["source"]["tensors"].erase(m["source"]["tensors"].begin());
  m["source"]["tensors"].push_back(stale);  // after it
  EXPECT_EQ(StreamError(Rewrite(m)).message(), "Kimi-K3 GGUF tensor type changed: blk.0.attn_q.weight");
}

TEST_F(ManifestErrors, VerifyMetadataCatchesSameSizeHeaderChange) {
  // Rename a metadata key in place: same size, different header.
  auto bytes = ReadFileToString(shards[0]);
  ASSERT_TRUE(bytes.ok());
  const size_t at = bytes->find("head_count");
  ASSERT_NE(at, std::string::npos);
  (*bytes)[at + 5] = 'C';
  ASSERT_TRUE(WriteFileAtomic(shards[0], *bytes).ok());
  EXPECT_EQ(StreamError(manifest_path).message(), "<no error>");  // SGLang does not notice (§11.18)
  LoadOptions v;
  v.verify_metadata = true;
  Error e = StreamError(manifest_path, v);
  EXPECT_EQ(e.message().substr(0, e.message().find('\n')), "Kimi-K3 GGUF shard is missing or changed: " + shards[0]);
  EXPECT_NE(e.message().find("metadata_sha256"), std::string::npos);
  // Unmodified files pass verification.
  TempDir clean("clean");
  EXPECT_EQ(StreamError(WriteModel(clean.path, ReferenceTensors(), kReferenceShards), v).message(), "<no error>");
  // A recorded tensor offset that moved is caught as well.
  json m = manifest;
  m["source"]["shards"][0]["metadata_sha256"] =
      Sha256Hex(bytes->data(), gguf::GgufFile::Open(shards[0]).value()->data_offset());
  m["source"]["tensors"][1]["data_offset"] = m["source"]["tensors"][1]["data_offset"].get<uint64_t>() + 32;
  Error lay = StreamError(Rewrite(m), v);
  EXPECT_EQ(lay.message().substr(0, lay.message().find('\n')),
            "Kimi-K3 GGUF tensor layout changed: " + m["source"]["tensors"][1]["name"].get<std::string>());
}

TEST(Stream, ForEachStopsOnCallbackError) {
  TempDir dir("foreach");
  auto s = NonExpertStream::Open(WriteModel(dir.path, ReferenceTensors(), kReferenceShards));
  ASSERT_TRUE(s.ok());
  int n = 0;
  Status st = s->ForEach([&](NamedTensor&&) -> Status {
    if (++n == 3) return Error("stop here");
    return Status::OK();
  });
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.message(), "stop here");
  EXPECT_EQ(n, 3);
}

TEST(Stream, RoutedPayloadIsNeverRead) {
  TempDir dir("untouched");
  // An 8.6 MB routed stack written as a hole, between two small tensors.
  std::vector<gguf::TensorSpec> t;
  t.push_back(F32Tensor("blk.1.attn_norm.weight", {32}, Ramp(32, 1, 0)));
  t.push_back({"blk.1.ffn_up_exps.weight", GgmlType::Q2_K, {256, 1024, 100}, nullptr});
  t.push_back(F32Tensor("blk.1.ffn_norm.weight", {32}, Ramp(32, 1, 0)));
  std::vector<std::string> shards;
  const std::string m = WriteModel(dir.path, t, {0, 0, 0}, nullptr, &shards);
  auto f = gguf::GgufFile::Open(shards[0]);
  ASSERT_TRUE(f.ok());
  const gguf::TensorInfo* routed = (*f)->FindTensor("blk.1.ffn_up_exps.weight");
  ASSERT_NE(routed, nullptr);
  auto resident_pages = [&]() {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    // The middle 4 MiB, far from the neighbours' readahead.
    const uint64_t begin = (routed->data_offset + (2 << 20)) / page * page;
    const size_t len = 4 << 20;
    std::vector<unsigned char> vec(len / page);
    const uint8_t* base = (*f)->mapping()->data();
    EXPECT_EQ(0, ::mincore(const_cast<uint8_t*>(base) + begin, len, vec.data()));
    size_t n = 0;
    for (unsigned char c : vec) n += c & 1;
    return n;
  };
  ASSERT_EQ(resident_pages(), 0u);
  auto s = NonExpertStream::Open(m);
  ASSERT_TRUE(s.ok());
  uint64_t sum = 0;
  ASSERT_TRUE(s->ForEach([&](NamedTensor&& x) -> Status {
                 for (uint8_t b : x.data) sum += b;
                 return Status::OK();
               }).ok());
  EXPECT_GT(sum, 0u);
  EXPECT_EQ(s->stats().routed_skipped, 1u);
  EXPECT_EQ(resident_pages(), 0u);
}

TEST(Values, HalfAndBFloatConversions) {
  EXPECT_EQ(FloatToHalfBits(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalfBits(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalfBits(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalfBits(65520.0f), 0x7c00);
  EXPECT_EQ(FloatToHalfBits(5.9604645e-08f), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToHalfBits(2.9802322e-08f), 0x0000);  // exactly half of it: ties to even
  EXPECT_EQ(FloatToHalfBits(1.0009765625f), 0x3c01);
  EXPECT_EQ(FloatToHalfBits(1.00048828125f), 0x3c00);  // tie -> even
  EXPECT_EQ(FloatToHalfBits(1.00146484375f), 0x3c02);  // tie -> even (up)
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) continue;  // NaNs
    ASSERT_EQ(FloatToHalfBits(HalfBitsToFloat(static_cast<uint16_t>(h))), h) << h;
  }
  EXPECT_EQ(FloatToBFloatBits(1.0f), 0x3f80);
  EXPECT_EQ(BFloatBitsToFloat(0xbf80), -1.0f);
  EXPECT_EQ(PyTupleRepr({}), "()");
  EXPECT_EQ(PyTupleRepr({512}), "(512,)");
  EXPECT_EQ(PyTupleRepr({1, 512}), "(1, 512)");
}

}  // namespace
}  // namespace k3pack::loader
