// Scaled profile: each expert tensor is held to its role's expected type and
// checked in SGLang's order, so the message names the odd tensor (issue 11.4).
#include <gtest/gtest.h>

#include "k3pack/pack.h"
#include "pack/build_inputs.h"

namespace k3pack::pack {
namespace {

constexpr uint32_t kQ2K = 10, kQ3K = 11, kQ4K = 12;

kimi::ModelSpec Spec3() {
  kimi::ModelSpec s;
  s.num_hidden_layers = 4;
  s.first_k_dense_replace = 1;
  s.num_experts = 4;
  s.top_k = 2;
  s.routed_expert_hidden_size = 256;
  s.moe_intermediate_size = 512;
  s.active_moe_layer_ids = {1, 2, 3};
  s.profile = kimi::Profile::kScaled;
  return s;
}

uint64_t Bytes(uint32_t type) {
  const uint64_t blocks = 256ull * 512 / 256 * 4;
  return blocks * (type == kQ2K ? 84 : type == kQ3K ? 110 : 144);
}

// (up, gate, down) type of every layer, in layer order 1..3.
std::vector<SourceTensor> Tensors(const std::vector<std::array<uint32_t, 3>>& types) {
  std::vector<SourceTensor> v;
  for (uint32_t l = 1; l <= 3; ++l) {
    const auto& t = types[l - 1];
    const std::string p = "blk." + std::to_string(l) + ".ffn_";
    v.push_back({p + "up_exps.weight", {256, 512, 4}, t[0], 0, 0, Bytes(t[0])});
    v.push_back({p + "gate_exps.weight", {256, 512, 4}, t[1], 0, 0, Bytes(t[1])});
    v.push_back({p + "down_exps.weight", {512, 256, 4}, t[2], 0, 0, Bytes(t[2])});
  }
  return v;
}

std::string FirstLine(const std::vector<SourceTensor>& t) {
  auto r = CollectExperts(t, {"/x/a-00001-of-00001.gguf"}, Spec3());
  if (r.ok()) return "OK";
  const std::string& m = r.error().message();
  return m.substr(0, m.find('\n'));
}

TEST(PackExpertsParity, TheOddTensorIsNamed) {
  // Layer 1's up is the odd one; its gate is healthy.
  EXPECT_EQ(FirstLine(Tensors({{kQ4K, kQ2K, kQ3K}, {kQ2K, kQ2K, kQ3K}, {kQ2K, kQ2K, kQ3K}})),
            "unexpected expert dtype for (1, 'up'): Q4_K");
  EXPECT_EQ(FirstLine(Tensors({{kQ2K, kQ4K, kQ3K}, {kQ2K, kQ2K, kQ3K}, {kQ2K, kQ2K, kQ3K}})),
            "unexpected expert dtype for (1, 'gate'): Q4_K");
  EXPECT_EQ(FirstLine(Tensors({{kQ2K, kQ2K, kQ4K}, {kQ2K, kQ2K, kQ3K}, {kQ2K, kQ2K, kQ3K}})),
            "unexpected expert dtype for (1, 'down'): Q4_K");
  // Consistent non-K3 types are fine under scaled.
  EXPECT_EQ(FirstLine(Tensors({{kQ4K, kQ4K, kQ3K}, {kQ4K, kQ4K, kQ3K}, {kQ4K, kQ4K, kQ3K}})), "OK");
}

// SGLang's scanner keys routed stacks by Python's int() of `\d+`: a layer
// past uint32 is one more (extra) stack and an Arabic-Indic "\u0663" is layer 3.
// Both were dropped from the coverage check here (the pack built without a word).
TEST(PackExpertsParity, LayerNumbersAreReadAsPythonsInt) {
  const std::array<uint32_t, 3> k3 = {kQ2K, kQ2K, kQ3K};
  auto t = Tensors({k3, k3, k3});
  t.push_back({"blk.4294967296.ffn_up_exps.weight", {256, 512, 4}, kQ2K, 0, 0, Bytes(kQ2K)});
  EXPECT_EQ(FirstLine(t), "routed expert tensor coverage mismatch: missing=[], extra=[(4294967296, 'up')]");
  t.back().name = "blk.\u0663.ffn_up_exps.weight";
  EXPECT_EQ(FirstLine(t), "duplicate routed expert tensor (3, 'up')");
}

// Python's int has no bound: a layer of 2^64 - 1 or more is a key of
// SGLang's like any other, so it is an extra stack and two spellings of it are
// a duplicate. Here such a stack was no stack at all (the pack built).
TEST(PackExpertsParity, ALayerPastSixtyFourBitsIsStillAStack) {
  const std::array<uint32_t, 3> k3 = {kQ2K, kQ2K, kQ3K};
  auto t = Tensors({k3, k3, k3});
  t.push_back({"blk.18446744073709551615.ffn_up_exps.weight", {256, 512, 4}, kQ2K, 0, 0, Bytes(kQ2K)});
  EXPECT_EQ(FirstLine(t), "routed expert tensor coverage mismatch: missing=[], extra=[(18446744073709551615, 'up')]");
  t.back().name = "blk.018446744073709551616.ffn_gate_exps.weight";
  t.push_back({"blk.99999999999999999999.ffn_down_exps.weight", {512, 256, 4}, kQ3K, 0, 0, Bytes(kQ3K)});
  // Sorted as Python sorts the tuples: by the int, whatever its length.
  EXPECT_EQ(FirstLine(t), "routed expert tensor coverage mismatch: missing=[], extra=[(18446744073709551616, "
                          "'gate'), (99999999999999999999, 'down')]");
  t.push_back({"blk.\u0661\u0668446744073709551616.ffn_gate_exps.weight", {256, 512, 4}, kQ2K, 0, 0, Bytes(kQ2K)});
  EXPECT_EQ(FirstLine(t), "duplicate routed expert tensor (18446744073709551616, 'gate')");
}

// SGLang's writer puts each GGUF tensor's own name in the index
// (PackEntryRecord(tensor.name, ...)), so "blk.01" stays "blk.01" and the
// index digest is that of SGLang's pack; k3pack wrote "blk.1". A name of 128
// bytes or more is its writer's ValueError, before anything is written here.
TEST(PackExpertsParity, TheIndexKeepsTheGgufSpellingOfALayer) {
  const std::array<uint32_t, 3> k3 = {kQ2K, kQ2K, kQ3K};
  auto t = Tensors({k3, k3, k3});
  t[0].name = "blk.01.ffn_up_exps.weight";
  t[4].name = "blk.\u0662.ffn_gate_exps.weight";
  auto ex = CollectExperts(t, {"/x/a-00001-of-00001.gguf"}, Spec3());
  ASSERT_TRUE(ex.ok()) << ex.error().message();
  auto layout = LayoutOf(*ex);
  ASSERT_TRUE(layout.ok()) << layout.error().message();
  EXPECT_EQ(layout->EntryRecord(0).name, "blk.01.ffn_up_exps.weight");
  EXPECT_EQ(layout->EntryRecord(1).name, "blk.1.ffn_gate_exps.weight");
  EXPECT_EQ(layout->EntryRecord(4 * 3 + 1).name, "blk.\u0662.ffn_gate_exps.weight");  // layer 2, expert 0
  EXPECT_EQ(layout->EntryRecord(4 * 3 + 4).name, "blk.\u0662.ffn_gate_exps.weight");  // expert 1
  const std::vector<uint8_t> prefix = layout->EncodePrefix();
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(prefix.data()) + kHeaderBytes), "blk.01.ffn_up_exps.weight");

  const std::string long_name = "blk." + std::string(110, '0') + "3.ffn_down_exps.weight";  // 130 bytes
  t[8].name = long_name;
  ex = CollectExperts(t, {"/x/a-00001-of-00001.gguf"}, Spec3());
  ASSERT_TRUE(ex.ok()) << ex.error().message();
  layout = LayoutOf(*ex);
  ASSERT_FALSE(layout.ok());
  EXPECT_EQ(layout.error().headline(), "expert tensor name is too long for the Pack index: " + long_name);
}

TEST(PackExpertsParity, ExpectedTypesPerRole) {
  // Up and gate vote together; ties go to the earliest layer's type.
  EXPECT_EQ(ExpectedScaledExpertTypes({{kQ4K, kQ2K, kQ3K}, {kQ2K, kQ2K, kQ3K}}),
            (std::array<uint32_t, 3>{kQ2K, kQ2K, kQ3K}));
  EXPECT_EQ(ExpectedScaledExpertTypes({{kQ4K, kQ2K, kQ3K}}), (std::array<uint32_t, 3>{kQ4K, kQ4K, kQ3K}));
  EXPECT_EQ(ExpectedScaledExpertTypes({{kQ2K, kQ2K, kQ4K}, {kQ2K, kQ2K, kQ3K}}),
            (std::array<uint32_t, 3>{kQ2K, kQ2K, kQ4K}));
}

}  // namespace
}  // namespace k3pack::pack
