// §6.1 routed-expert validation: every error provoked, exact SGLang texts.
#include <gtest/gtest.h>

#include "k3_model_spec.h"
#include "k3pack/pack.h"

namespace k3pack::pack {
namespace {

using k3test_spec::K3Spec;

std::vector<SourceTensor> K3Tensors() {
  std::vector<SourceTensor> v;
  uint64_t off = 0;
  for (uint32_t l = 1; l < 93; ++l) {
    v.push_back({"blk." + std::to_string(l) + ".ffn_gate_exps.weight", {3584, 3072, 896}, 10, 0, off, 3612672ull * 896});
    v.push_back({"blk." + std::to_string(l) + ".ffn_up_exps.weight", {3584, 3072, 896}, 10, 0, off, 3612672ull * 896});
    v.push_back({"blk." + std::to_string(l) + ".ffn_down_exps.weight", {3072, 3584, 896}, 11, 0, off, 4730880ull * 896});
  }
  v.push_back({"blk.1.ffn_up_shexp.weight", {7168, 1024}, 8, 0, 0, 100});  // ignored: not routed
  return v;
}

std::string Err(const std::vector<SourceTensor>& t, const kimi::ModelSpec& s, CollectOptions o = {}) {
  return k3test_spec::CollectError(t, s, "/x/shard-00001-of-00001.gguf", o);
}

TEST(PackExperts, K3Accepted) {
  auto r = CollectExperts(K3Tensors(), {"/x/a.gguf"}, K3Spec());
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ(r->layers.size(), 92u);
  EXPECT_EQ(r->by_layer[0][0].tensor.name, "blk.1.ffn_up_exps.weight");
  EXPECT_EQ(r->by_layer[0][2].expert_bytes, 4730880u);
  EXPECT_FALSE(r->mixed);
  EXPECT_EQ(r->EstimatedPackBytes(), 985613049856ull);
}

TEST(PackExperts, Duplicate) {
  auto t = K3Tensors();
  t.push_back(t[0]);
  t.back().name = "blk.01.ffn_gate_exps.weight";
  EXPECT_EQ(Err(t, K3Spec()), "duplicate routed expert tensor (1, 'gate')");
}

TEST(PackExperts, Coverage) {
  auto t = K3Tensors();
  t.erase(t.begin() + 2);  // blk.1 down
  t.erase(t.begin());      // blk.1 gate
  t.push_back({"blk.93.ffn_up_exps.weight", {3584, 3072, 896}, 10, 0, 0, 3612672ull * 896});
  t.push_back({"blk.0.ffn_down_exps.weight", {3072, 3584, 896}, 11, 0, 0, 4730880ull * 896});
  EXPECT_EQ(Err(t, K3Spec()),
            "routed expert tensor coverage mismatch: missing=[(1, 'down'), (1, 'gate')], "
            "extra=[(0, 'down'), (93, 'up')]");
  // Only the first 8 are listed.
  auto t2 = K3Tensors();
  t2.resize(3 * 10);  // layers 1..10 only
  std::string e = Err(t2, K3Spec());
  EXPECT_EQ(e,
            "routed expert tensor coverage mismatch: missing=[(11, 'down'), (11, 'gate'), (11, 'up'), (12, 'down'), "
            "(12, 'gate'), (12, 'up'), (13, 'down'), (13, 'gate')], extra=[]");
}

TEST(PackExperts, ShapeDtypeSliceable) {
  auto t = K3Tensors();
  t[1].shape = {3584, 3072, 895};
  EXPECT_EQ(Err(t, K3Spec()), "unexpected expert shape for (1, 'up'): (3584, 3072, 895)");
  t = K3Tensors();
  t[0].shape = {3584};
  EXPECT_EQ(Err(t, K3Spec()), "unexpected expert shape for (1, 'gate'): (3584,)");
  t = K3Tensors();
  t[5].dtype_id = 12;
  EXPECT_EQ(Err(t, K3Spec()), "unexpected expert dtype for (2, 'down'): Q4_K");
  t = K3Tensors();
  t[4].nbytes += 1;
  EXPECT_EQ(Err(t, K3Spec()), "expert tensor is not evenly sliceable: blk.2.ffn_up_exps.weight");
}

kimi::ModelSpec SmallSpec() {
  kimi::ModelSpec s;
  s.num_hidden_layers = 3;
  s.first_k_dense_replace = 1;
  s.num_experts = 4;
  s.top_k = 2;
  s.routed_expert_hidden_size = 256;
  s.moe_intermediate_size = 512;
  s.active_moe_layer_ids = {1, 2};
  s.profile = kimi::Profile::kScaled;
  return s;
}

std::vector<SourceTensor> SmallTensors(uint32_t layer2_down_type = 11) {
  std::vector<SourceTensor> v;
  for (uint32_t l = 1; l <= 2; ++l) {
    uint32_t dt = l == 2 ? layer2_down_type : 11;
    uint64_t down_bytes = dt == 11 ? 512ull * 256 / 256 * 110 : 512ull * 256 / 256 * 144;
    v.push_back({"blk." + std::to_string(l) + ".ffn_up_exps.weight", {256, 512, 4}, 10, 0, 0, 256 * 512 / 256 * 84 * 4});
    v.push_back({"blk." + std::to_string(l) + ".ffn_gate_exps.weight", {256, 512, 4}, 10, 0, 0, 256 * 512 / 256 * 84 * 4});
    v.push_back({"blk." + std::to_string(l) + ".ffn_down_exps.weight", {512, 256, 4}, dt, 0, 0, down_bytes * 4});
  }
  return v;
}

TEST(PackExperts, ScaledProfileAndMixedTypes) {
  EXPECT_EQ(Err(SmallTensors(), SmallSpec()), "OK");
  // Any consistent quant types are fine under scaled; K3's shapes are not required.
  EXPECT_EQ(Err(SmallTensors(12), SmallSpec()).substr(0, 51), "unexpected expert dtype for (2, 'down'): Q4_K\nhint:");
  CollectOptions mixed;
  mixed.allow_mixed_types = true;
  auto r = CollectExperts(SmallTensors(12), {"/x/a.gguf"}, SmallSpec(), mixed);
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_TRUE(r->mixed);
  EXPECT_EQ(r->by_layer[1][2].expert_bytes, 512u * 144);
  auto roles = LayerRolesJson(*r);
  ASSERT_EQ(roles.size(), 2u);
  EXPECT_EQ(roles[1]["down"]["dtype"], "Q4_K");
  EXPECT_EQ(roles[1]["layer"], 2);
  // The flag is refused under kimi-k3.
  EXPECT_NE(Err(K3Tensors(), K3Spec(), mixed).find("--allow-mixed-types requires --profile scaled"),
            std::string::npos);
}

TEST(PackExperts, DefaultPackPath) {
  EXPECT_EQ(*DefaultPackPath("/m/KIMI-K3-00001-of-00003.gguf"), "/m/KIMI-K3.expert-major.pack");
  auto bad = DefaultPackPath("/m/model.gguf");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message(), "Kimi GGUF name is not a numbered shard: /m/model.gguf");
}

}  // namespace
}  // namespace k3pack::pack
