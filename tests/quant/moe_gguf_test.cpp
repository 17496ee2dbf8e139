// The expert forward fed straight from GGUF source tensors: the synthetic
// tiny model's stacked expert tensors, sliced per expert by an ExpertSource.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "k3pack/gguf.h"
#include "k3pack/moe.h"

namespace k3pack::moe {
namespace {

namespace fs = std::filesystem;

// Expert e's slice of a stacked [.., .., n_experts] tensor.
std::span<const uint8_t> Slice(const gguf::ShardSet& set, const std::string& name, uint32_t e, GgmlType* type) {
  auto loc = set.FindTensor(name);
  if (!loc) return {};
  *type = loc->info->type;
  const uint64_t per = loc->info->nbytes / static_cast<uint64_t>(loc->info->ne[2]);
  return set.shards()[loc->shard_index]->TensorData(*loc->info).subspan(e * per, per);
}

TEST(MoeGguf, ForwardFromSynthModelTensors) {
  if (!fs::exists(K3PACK_BIN)) GTEST_SKIP() << "k3pack CLI not built";
  const fs::path dir = fs::temp_directory_path() / ("k3q-moe-" + std::to_string(getpid()));
  const std::string cmd = std::string(K3PACK_BIN) + " synth --preset tiny --out " + dir.string() + " >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  auto set = gguf::ShardSet::Open(dir.string());
  ASSERT_TRUE(set.ok()) << set.error().message();
  auto gate = set->FindTensor("blk.1.ffn_gate_exps.weight");
  auto down = set->FindTensor("blk.1.ffn_down_exps.weight");
  ASSERT_TRUE(gate && down);
  MoeConfig cfg;
  cfg.latent = gate->info->ne[0];
  cfg.inter = gate->info->ne[1];
  cfg.num_experts = static_cast<uint32_t>(gate->info->ne[2]);
  cfg.top_k = std::min<uint32_t>(4, cfg.num_experts);
  ASSERT_EQ(down->info->ne[0], cfg.inter);
  ASSERT_EQ(down->info->ne[1], cfg.latent);
  const gguf::ShardSet& s = *set;
  ExpertSource src = [&](uint32_t layer, uint32_t e) -> Result<ExpertWeights> {
    ExpertWeights w;
    const std::string p = "blk." + std::to_string(layer) + ".";
    w.up = Slice(s, p + "ffn_up_exps.weight", e, &w.up_type);
    w.gate = Slice(s, p + "ffn_gate_exps.weight", e, &w.gate_type);
    w.down = Slice(s, p + "ffn_down_exps.weight", e, &w.down_type);
    if (w.up.empty() || w.gate.empty() || w.down.empty()) return Error("missing expert tensors in layer " + p);
    return w;
  };
  std::mt19937 rng(3);
  std::normal_distribution<float> g(0, 1);
  std::vector<float> logits(cfg.num_experts), x(static_cast<size_t>(cfg.latent));
  for (auto& v : logits) v = g(rng);
  for (auto& v : x) v = g(rng);
  cfg.quantize_activations = false;
  auto ref = Forward(1, logits, {}, x, src, cfg);
  cfg.quantize_activations = true;
  auto got = Forward(1, logits, {}, x, src, cfg);
  ASSERT_TRUE(ref.ok()) << ref.error().message();
  ASSERT_TRUE(got.ok()) << got.error().message();
  double num = 0, den = 0;
  for (size_t i = 0; i < ref->size(); ++i) {
    ASSERT_TRUE(std::isfinite((*got)[i]));
    num += ((*got)[i] - (*ref)[i]) * ((*got)[i] - (*ref)[i]);
    den += (*ref)[i] * (*ref)[i];
  }
  EXPECT_GT(den, 0);
  EXPECT_LT(std::sqrt(num / den), 0.03);
  EXPECT_FALSE(Forward(99, logits, {}, x, src, cfg).ok());  // no such layer: the source's error comes back
  fs::remove_all(dir);
}

}  // namespace
}  // namespace k3pack::moe
