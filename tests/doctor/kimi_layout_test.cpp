// Layout facts of llama.cpp's Kimi-K3 loader that the doctor must accept
// (docs/CONFORMANCE.md, Kimi-K3 layout): shapes written by the Python converter, which
// keeps trailing dimensions of size 1, and MLA head sizes that differ from
// the KDA head size.
#include "doctor_test_util.h"

namespace dtest {
namespace {

TensorEdit Reshaped(std::vector<int64_t> ne) {
  TensorEdit e;
  e.ne = std::move(ne);
  return e;
}

std::vector<const doctor::Finding*> ShapeFindings(const doctor::Report& r) {
  return r.With("tensor-shape-mismatch");
}

// The converter writes ssm_conv1d_{q,k,v} as numpy (1, Di, 1, C): GGUF ne
// {C, 1, Di, 1}. llama.cpp's loader tries that 4-D shape first, then the
// 3-D {C, 1, Di} llama-quantize writes; both are the same bytes.
TEST(KimiLayout, ConverterFourDimConvIsAccepted) {
  auto src = TempDir("conv4d-src");
  Synth(src);
  auto set = gguf::ShardSet::Open(src.string());
  ASSERT_TRUE(set.ok()) << set.error().message();
  std::map<std::string, TensorEdit> edits;
  for (const auto& loc : set->AllTensors()) {
    const std::string& n = loc.info->name;
    if (n.find(".ssm_conv1d_") == std::string::npos) continue;
    std::vector<int64_t> ne = loc.info->shape();
    ASSERT_EQ(ne.size(), 3u) << n;
    ne.push_back(1);
    edits.emplace(n, Reshaped(ne));
  }
  ASSERT_FALSE(edits.empty());
  auto dst = TempDir("conv4d");
  Rewrite(src, dst, edits);
  doctor::Report r = Scaled({dst.string()});
  EXPECT_TRUE(ShapeFindings(r).empty()) << Dump(r);
  EXPECT_EQ(r.ExitCode(), 0) << Dump(r);

  // Any other arrangement of the same elements is still a mismatch.
  const std::string name = edits.begin()->first;
  std::vector<int64_t> ne = *edits.begin()->second.ne;  // {C, 1, Di, 1}
  auto bad = TempDir("conv-bad");
  Rewrite(src, bad, {{name, Reshaped({ne[0], ne[2], 1, 1})}});
  doctor::Report rb = Scaled({bad.string()});
  ASSERT_EQ(ShapeFindings(rb).size(), 1u) << Dump(rb);
  EXPECT_EQ(ShapeFindings(rb)[0]->object, name);
}

}  // namespace
}  // namespace dtest

namespace dtest {
namespace {

// MLA head sizes other than kda.head_dim: the synthetic writer records them
// in attention.key_length_mla / value_length_mla, and the doctor's layout
// (read back from those keys) agrees with every tensor it wrote.
TEST(KimiLayout, MlaHeadSizesOtherThanTheKdaHeadDim) {
  auto o = synth::PresetOptions("tiny");
  ASSERT_TRUE(o.ok());
  auto dir = TempDir("mla-dims");
  o->out_dir = dir.string();
  o->dims.mla_qk_nope = 32;
  o->dims.mla_v_head = 96;
  auto res = synth::WriteSynthModel(*o);
  ASSERT_TRUE(res.ok()) << res.error().message();
  ASSERT_FALSE(res->mla_layers.empty());
  auto set = gguf::ShardSet::Open(dir.string());
  ASSERT_TRUE(set.ok()) << set.error().message();
  const std::string kb = "blk." + std::to_string(res->mla_layers.front()) + ".attn_k_b.weight";
  auto loc = set->FindTensor(kb);
  ASSERT_TRUE(loc.has_value());
  EXPECT_EQ(loc->info->shape(), (std::vector<int64_t>{32, o->dims.kv_lora_rank, o->dims.heads}));
  doctor::Report r = Scaled({dir.string()});
  EXPECT_TRUE(r.With("tensor-shape-mismatch").empty()) << Dump(r);
  EXPECT_EQ(r.ExitCode(), 0) << Dump(r);
}

}  // namespace
}  // namespace dtest
