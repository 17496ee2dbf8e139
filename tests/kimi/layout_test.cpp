// The Kimi-K3 tensor table read back from kimi-k3.* metadata, checked
// against llama.cpp's loader shapes (docs/CONFORMANCE.md, "Kimi-K3 layout").
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

#include "../scratch_dir.h"
#include "k3pack/gguf.h"
#include "kimi/tensors.h"

namespace k3pack::kimi {
namespace {

namespace fs = std::filesystem;

std::map<std::string, std::vector<int64_t>> Shapes(const std::vector<ExpectedTensor>& table) {
  std::map<std::string, std::vector<int64_t>> m;
  for (const auto& t : table) m[t.name] = t.ne;
  return m;
}

// The kimi-k3.* keys every test model here shares: `kv` is
// attention.head_count_kv per layer (0: KDA), the first `dense` layers dense.
void SmallKimiMetadata(gguf::MetadataBuilder& m, const std::vector<int32_t>& kv, uint32_t dense) {
  const std::string a = "kimi-k3.";
  m.Str("general.architecture", "kimi-k3");
  m.U32(a + "block_count", static_cast<uint32_t>(kv.size()));
  m.I32Array(a + "attention.head_count_kv", kv);
  m.U32(a + "leading_dense_block_count", dense);
  const std::pair<const char*, uint32_t> sizes[] = {
      {"embedding_length", 512},       {"vocab_size", 512},          {"attention.head_count", 4},
      {"attention.q_lora_rank", 256},  {"attention.kv_lora_rank", 256}, {"rope.dimension_count", 32},
      {"ssm.conv_kernel", 4},          {"kda.head_dim", 64},         {"expert_count", 8},
      {"expert_used_count", 2},        {"expert_feed_forward_length", 256}, {"expert_shared_count", 1},
      {"expert_latent_length", 256},   {"attn_res.block_size", 2}};
  for (const auto& [key, value] : sizes) m.U32(a + key, value);
}

// The dimensions DimsFromGguf reads from a file holding `m` (written as
// `name` in the test process's scratch directory).
Result<synth::SynthDims> DimsOf(const gguf::MetadataBuilder& m, const std::string& name) {
  const fs::path dir = fs::path(testing_scratch::ProcessScratchDir("k3pack-test")) / "kimi-layout";
  fs::create_directories(dir);
  const std::string path = (dir / name).string();
  K3_RETURN_IF_ERROR(gguf::WriteGguf(path, m, {}));
  K3_ASSIGN_OR_RETURN(auto f, gguf::GgufFile::Open(path));
  return DimsFromGguf(*f);
}

// Two layers: 0 KDA + dense FFN, 1 MLA + MoE. The MLA head sizes come from
// attention.key_length_mla (dk = dn + dr) and value_length_mla (dv), not
// from kda.head_dim: llama.cpp builds attn_q_b {qr, H*dk}, attn_k_b
// {dn, kr, H}, attn_v_b {kr, dv, H}, attn_gate {E, H*dv} and the MLA
// attn_output {H*dv, E} from them. In Kimi-K3 all three sizes are 128,
// which hides the difference; here they are 64 (KDA), 96 (nope), 48 (v).
TEST(KimiLayout, MlaHeadSizesComeFromTheMlaKeys) {
  const std::string a = "kimi-k3.";
  gguf::MetadataBuilder m;
  SmallKimiMetadata(m, {0, 1}, 1);
  m.U32(a + "feed_forward_length", 1024);
  m.U32(a + "attention.key_length_mla", 96 + 32);
  m.U32(a + "attention.value_length_mla", 48);
  auto dims = DimsOf(m, "mla.gguf");
  ASSERT_TRUE(dims.ok()) << dims.error().message();
  auto table = ExpectedTensors(*dims);
  ASSERT_TRUE(table.ok()) << table.error().message();
  auto s = Shapes(*table);
  using V = std::vector<int64_t>;
  EXPECT_EQ(s["blk.1.attn_q_b.weight"], (V{256, 4 * 128}));
  EXPECT_EQ(s["blk.1.attn_kv_a_mqa.weight"], (V{512, 256 + 32}));
  EXPECT_EQ(s["blk.1.attn_k_b.weight"], (V{96, 256, 4}));
  EXPECT_EQ(s["blk.1.attn_v_b.weight"], (V{256, 48, 4}));
  EXPECT_EQ(s["blk.1.attn_gate.weight"], (V{512, 4 * 48}));
  EXPECT_EQ(s["blk.1.attn_output.weight"], (V{4 * 48, 512}));
  // The KDA layer keeps kda.head_dim.
  EXPECT_EQ(s["blk.0.attn_output.weight"], (V{4 * 64, 512}));
  EXPECT_EQ(s["blk.0.ssm_f_b.weight"], (V{64, 4 * 64}));
  // Conv: the 3-D form, with the converter's 4-D form as the alternative.
  for (const auto& t : *table) {
    if (t.name != "blk.0.ssm_conv1d_q.weight") continue;
    EXPECT_EQ(t.ne, (V{4, 1, 256}));
    EXPECT_TRUE(t.ShapeMatches({4, 1, 256, 1}));
    EXPECT_FALSE(t.ShapeMatches({4, 256, 1, 1}));
  }

  // A key_length_mla not above the rope size leaves no nope part: refused.
  gguf::MetadataBuilder rebuilt;
  for (const auto& e : m.entries()) {
    if (e.key == a + "attention.key_length_mla") {
      rebuilt.U32(e.key, 32);
    } else {
      rebuilt.Raw(e.key, e.type, e.encoded);
    }
  }
  auto db = DimsOf(rebuilt, "mla-bad.gguf");
  ASSERT_FALSE(db.ok());
  EXPECT_NE(db.error().message().find("attention.key_length_mla"), std::string::npos) << db.error().message();
}

// llama.cpp reads feed_forward_length with get_key_or_arr: a per-layer array
// (length block_count) is as valid as a scalar. The dense layers' entry sizes
// ffn_gate/up/down; MoE layers' entries are not used by Kimi-K3.
TEST(KimiLayout, FeedForwardLengthMayBeAPerLayerArray) {
  const std::string a = "kimi-k3.";
  auto base = [&](gguf::MetadataBuilder& m) { SmallKimiMetadata(m, {0, 0, 1}, 2); };
  gguf::MetadataBuilder arr;
  base(arr);
  arr.I32Array(a + "feed_forward_length", {768, 768, 0});
  auto d = DimsOf(arr, "ff-array.gguf");
  ASSERT_TRUE(d.ok()) << d.error().message();
  EXPECT_EQ(d->dense_intermediate, 768u);
  auto table = ExpectedTensors(*d);
  ASSERT_TRUE(table.ok()) << table.error().message();
  auto s = Shapes(*table);
  EXPECT_EQ(s["blk.1.ffn_down.weight"], (std::vector<int64_t>{768, 512}));

  // Dense layers of different widths cannot be one table: refused by name.
  gguf::MetadataBuilder mixed;
  base(mixed);
  mixed.U32Array(a + "feed_forward_length", {768, 1024, 0});
  auto dm = DimsOf(mixed, "ff-mixed.gguf");
  ASSERT_FALSE(dm.ok());
  EXPECT_NE(dm.error().message().find("feed_forward_length"), std::string::npos) << dm.error().message();

  // An array whose length is not block_count is refused, as llama.cpp does.
  gguf::MetadataBuilder shortarr;
  base(shortarr);
  shortarr.I32Array(a + "feed_forward_length", {768, 768});
  auto ds = DimsOf(shortarr, "ff-short.gguf");
  ASSERT_FALSE(ds.ok());
  EXPECT_NE(ds.error().message().find("feed_forward_length"), std::string::npos) << ds.error().message();
}

// The table's extents are products of u32 metadata values (Di = H x Dk,
// H x dk, H x dv, Fe x shared), which a corrupt or hostile file can push past
// INT64_MAX: that was signed overflow (undefined; in practice a negative
// extent the doctor then printed as what "the metadata implies"). Refused by
// name instead.
TEST(KimiLayout, ExtentsThatOverflowInt64AreRefused) {
  const std::string a = "kimi-k3.";
  const std::pair<const char*, const char*> cases[] = {
      {"attention.head_count", "kda.head_dim"}, {"expert_feed_forward_length", "expert_shared_count"}};
  for (const auto& [k1, k2] : cases) {
    gguf::MetadataBuilder m;
    SmallKimiMetadata(m, {0, 1}, 1);
    m.U32(a + "feed_forward_length", 1024);
    m.U32(a + k1, UINT32_MAX).U32(a + k2, UINT32_MAX);
    auto dims = DimsOf(m, std::string(k1) + ".gguf");
    ASSERT_TRUE(dims.ok()) << dims.error().message();
    auto table = ExpectedTensors(*dims);
    if (table.ok()) {
      for (const auto& t : *table) {
        for (int64_t e : t.ne) ASSERT_GE(e, 0) << k1 << ": " << t.name;
      }
    }
    ASSERT_FALSE(table.ok()) << k1;
    EXPECT_NE(table.error().message().find("overflow"), std::string::npos) << table.error().message();
  }
}

}  // namespace
}  // namespace k3pack::kimi

namespace k3pack::synth {
namespace {

// split.count is UINT16: a synthetic set cannot have more than 65535 shards,
// and saying so beats any later error about the tensor count.
TEST(SynthLimits, ShardCountFitsSplitCount) {
  auto o = PresetOptions("tiny");
  ASSERT_TRUE(o.ok());
  o->out_dir = "/proc/k3pack-never-written";
  o->shards = 65536;
  auto r = WriteSynthModel(*o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("1..65535"), std::string::npos) << r.error().message();
}

}  // namespace
}  // namespace k3pack::synth
