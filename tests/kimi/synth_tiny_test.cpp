// The tiny synthetic model: layout, metadata, determinism, payload validity.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "k3pack/quant.h"
#include "kimi/synth_fill.h"
#include "kimi/tensors.h"
#include "synth_test_util.h"

namespace k3pack::synth {
namespace {

using testing::ReadAll;
using testing::TempDir;
using testing::Tiny;

TEST(SynthTiny, WritesTheTableInThreeShards) {
  TempDir dir;
  auto res = WriteSynthModel(Tiny(dir.path()));
  ASSERT_TRUE(res.ok()) << res.error().message();
  ASSERT_EQ(res->shard_paths.size(), 3u);
  EXPECT_EQ(std::filesystem::path(res->shard_paths[0]).filename(), "KIMI-K3-SYNTH-00001-of-00003.gguf");
  EXPECT_EQ(res->mla_layers, std::vector<uint32_t>{3});

  auto set = gguf::ShardSet::Open(dir.path());
  ASSERT_TRUE(set.ok()) << set.error().message();
  auto table = kimi::ExpectedTensors(TinyDims());
  ASSERT_TRUE(table.ok()) << table.error().message();
  // 4 top + 5x4 per layer + 13x3 KDA + 8 MLA + 3 dense + 11x3 MoE.
  EXPECT_EQ(table->size(), 107u);
  ASSERT_EQ(set->tensor_count(), table->size());
  EXPECT_EQ(res->tensor_count, table->size());

  // Names, shapes and types in file order, across shards.
  auto all = set->AllTensors();
  ASSERT_EQ(all.size(), table->size());
  for (size_t i = 0; i < all.size(); ++i) {
    const auto& want = (*table)[i];
    EXPECT_EQ(all[i].info->name, want.name);
    EXPECT_EQ(all[i].info->shape(), want.ne) << want.name;
    EXPECT_EQ(all[i].info->type, want.type) << want.name;
  }
  // Every shard non-empty, shard order non-decreasing (contiguous ranges).
  std::set<uint32_t> used;
  for (size_t i = 0; i < all.size(); ++i) {
    used.insert(all[i].shard_index);
    if (i > 0) {
      EXPECT_GE(all[i].shard_index, all[i - 1].shard_index);
    }
  }
  EXPECT_EQ(used.size(), 3u);

  // Expert stacks: experts on ne[2]; slab sizes are 4096-multiples.
  auto up = set->FindTensor("blk.1.ffn_up_exps.weight");
  ASSERT_TRUE(up);
  EXPECT_EQ(up->info->shape(), (std::vector<int64_t>{512, 1024, 16}));
  EXPECT_EQ(up->info->type, GgmlType::Q2_K);
  EXPECT_EQ(up->info->nbytes / 16, 172032u);
  auto down = set->FindTensor("blk.3.ffn_down_exps.weight");
  ASSERT_TRUE(down);
  EXPECT_EQ(down->info->shape(), (std::vector<int64_t>{1024, 512, 16}));
  EXPECT_EQ(down->info->type, GgmlType::Q3_K);
  EXPECT_EQ(down->info->nbytes / 16, 225280u);
  // SGLang's split MLA K/V types; F32 where the converter forces it.
  EXPECT_EQ(set->FindTensor("blk.3.attn_k_b.weight")->info->type, GgmlType::Q4_0);
  EXPECT_EQ(set->FindTensor("blk.3.attn_v_b.weight")->info->type, GgmlType::Q2_K);
  EXPECT_EQ(set->FindTensor("blk.1.ffn_gate_inp.weight")->info->type, GgmlType::F32);
  EXPECT_EQ(set->FindTensor("blk.0.ssm_conv1d_q.weight")->info->shape(), (std::vector<int64_t>{4, 1, 256}));
  EXPECT_EQ(set->FindTensor("token_embd.weight")->info->type, GgmlType::Q8_0);
  EXPECT_TRUE(set->FindTensor("output_res_score.weight"));
  EXPECT_FALSE(set->FindTensor("blk.0.ffn_gate_inp.weight"));  // layer 0 is dense
  EXPECT_TRUE(set->FindTensor("blk.0.ffn_gate.weight"));
}

TEST(SynthTiny, MetadataOnlyInShardZero) {
  TempDir dir;
  auto res = WriteSynthModel(Tiny(dir.path()));
  ASSERT_TRUE(res.ok()) << res.error().message();
  for (size_t s = 0; s < res->shard_paths.size(); ++s) {
    auto f = gguf::GgufFile::Open(res->shard_paths[s]);
    ASSERT_TRUE(f.ok()) << f.error().message();
    EXPECT_EQ((*f)->architecture(), "kimi-k3");
    ASSERT_NE((*f)->Find("split.no"), nullptr);
    EXPECT_EQ((*f)->Find("split.no")->type, gguf::ValueType::kUint16);
    EXPECT_EQ(*(*f)->Find("split.no")->AsInt(), static_cast<int64_t>(s));
    EXPECT_EQ(*(*f)->Find("split.count")->AsInt(), 3);
    EXPECT_EQ((*f)->Find("split.tensors.count")->type, gguf::ValueType::kInt32);
    EXPECT_EQ(*(*f)->Find("split.tensors.count")->AsInt(), 107);
    if (s > 0) {
      EXPECT_EQ((*f)->metadata().size(), 4u) << res->shard_paths[s];
    }
  }
  auto f0 = gguf::GgufFile::Open(res->shard_paths[0]);
  ASSERT_TRUE(f0.ok());
  const auto& g = **f0;
  EXPECT_EQ(*g.Find("kimi-k3.block_count")->AsInt(), 4);
  EXPECT_EQ(*g.Find("kimi-k3.expert_count")->AsInt(), 16);
  EXPECT_EQ(*g.Find("kimi-k3.expert_used_count")->AsInt(), 4);
  EXPECT_EQ(*g.Find("kimi-k3.expert_latent_length")->AsInt(), 512);
  EXPECT_EQ(*g.Find("kimi-k3.activation.situ_beta")->AsFloat(), 4.0);
  EXPECT_EQ(*g.Find("kimi-k3.activation.situ_linear_beta")->AsFloat(), 25.0);
  const gguf::Value* kv = g.Find("kimi-k3.attention.head_count_kv");
  ASSERT_NE(kv, nullptr);
  ASSERT_EQ(kv->type, gguf::ValueType::kArray);
  EXPECT_EQ(kv->array_type, gguf::ValueType::kInt32);
  ASSERT_EQ(kv->array_count, 4u);
  EXPECT_EQ(kv->ArrayInt(0), 0);
  EXPECT_EQ(kv->ArrayInt(3), 1);
  EXPECT_EQ(g.Find("kimi-k3.expert_weights_norm")->type, gguf::ValueType::kBool);
  EXPECT_EQ(g.Find("tokenizer.ggml.tokens")->strings.size(), 512u);
  EXPECT_EQ(*g.Find("tokenizer.ggml.model")->AsString(), "gpt2");

  // The dims read back from the file equal the ones written.
  auto dims = kimi::DimsFromGguf(g);
  ASSERT_TRUE(dims.ok()) << dims.error().message();
  auto again = kimi::ExpectedTensors(*dims);
  ASSERT_TRUE(again.ok());
  auto orig = kimi::ExpectedTensors(TinyDims());
  ASSERT_EQ(again->size(), orig->size());
  for (size_t i = 0; i < orig->size(); ++i) {
    EXPECT_EQ((*again)[i].name, (*orig)[i].name);
    EXPECT_EQ((*again)[i].ne, (*orig)[i].ne);
  }
}

TEST(SynthTiny, ConfigAndTokenizer) {
  TempDir dir;
  auto res = WriteSynthModel(Tiny(dir.path()));
  ASSERT_TRUE(res.ok()) << res.error().message();
  auto cfg = nlohmann::json::parse(ReadAll(res->config_path));
  EXPECT_EQ(cfg["model_type"], "kimi_k3");
  const auto& t = cfg["text_config"];
  EXPECT_EQ(t["model_type"], "kimi_linear");
  EXPECT_EQ(t["num_hidden_layers"], 4);
  EXPECT_EQ(t["first_k_dense_replace"], 1);
  EXPECT_EQ(t["num_experts"], 16);
  EXPECT_EQ(t["num_experts_per_token"], 4);
  EXPECT_EQ(t["num_shared_experts"], 2);
  EXPECT_EQ(t["hidden_size"], 512);
  EXPECT_EQ(t["routed_expert_hidden_size"], 512);
  EXPECT_EQ(t["moe_intermediate_size"], 1024);
  EXPECT_EQ(t["hidden_act"], "situ");
  EXPECT_EQ(t["activation_situ_beta"], 4.0);
  EXPECT_EQ(t["activation_situ_linear_beta"], 25.0);
  EXPECT_EQ(t["linear_attn_config"]["full_attn_layers"], nlohmann::json::array({4}));
  EXPECT_EQ(t["architectures"], nlohmann::json::array({"KimiLinearForCausalLM"}));
  EXPECT_EQ(ReadAll(res->tokenizer_dir + "/config.json"), ReadAll(res->config_path));
  auto tc = nlohmann::json::parse(ReadAll(res->tokenizer_dir + "/tokenizer_config.json"));
  EXPECT_EQ(tc["bos_token"], "[BOS]");
  const std::string tik = ReadAll(res->tokenizer_dir + "/tiktoken.model");
  EXPECT_EQ(std::count(tik.begin(), tik.end(), '\n'), 448);  // 512 - 64 reserved
  EXPECT_EQ(tik.substr(0, 7), "AA== 0\n");
}

TEST(SynthTiny, SameSeedSameBytesOtherSeedOtherBytes) {
  TempDir a, b, c;
  auto ra = WriteSynthModel(Tiny(a.path(), 42));
  auto rb = WriteSynthModel(Tiny(b.path(), 42));
  auto rc = WriteSynthModel(Tiny(c.path(), 43));
  ASSERT_TRUE(ra.ok() && rb.ok() && rc.ok());
  for (size_t s = 0; s < ra->shard_paths.size(); ++s) {
    const std::string x = ReadAll(ra->shard_paths[s]);
    EXPECT_EQ(x, ReadAll(rb->shard_paths[s])) << "shard " << s;
    EXPECT_NE(x, ReadAll(rc->shard_paths[s])) << "shard " << s;
  }
  EXPECT_EQ(ReadAll(ra->tokenizer_dir + "/tiktoken.model"), ReadAll(rb->tokenizer_dir + "/tiktoken.model"));
  // Re-running into the same directory replaces the set.
  auto again = WriteSynthModel(Tiny(a.path(), 42));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(ReadAll(again->shard_paths[0]), ReadAll(rb->shard_paths[0]));
}

TEST(SynthTiny, FloatTensorsHaveTheRightSigns) {
  TempDir dir;
  auto res = WriteSynthModel(Tiny(dir.path()));
  ASSERT_TRUE(res.ok()) << res.error().message();
  auto set = gguf::ShardSet::Open(dir.path());
  ASSERT_TRUE(set.ok());
  int ssm_a = 0;
  for (const auto& loc : set->AllTensors()) {
    const auto& t = *loc.info;
    if (t.type != GgmlType::F32) continue;
    auto v = testing::F32Values(*set->shards()[loc.shard_index], t);
    for (float x : v) ASSERT_TRUE(std::isfinite(x)) << t.name;
    if (t.name.ends_with(".ssm_a")) {
      ++ssm_a;
      for (float x : v) EXPECT_LT(x, 0.0f) << t.name;
    }
    if (t.name.ends_with("_norm.weight")) {
      for (float x : v) EXPECT_NEAR(x, 1.0f, 0.11f) << t.name;
    }
  }
  EXPECT_EQ(ssm_a, 3);
}

// Every block's scale fields decode to small finite numbers. Q8_0/Q2_K/Q3_K
// offsets are spelled out here independently of the writer's table.
void ExpectScalesFinite(const gguf::ShardSet& set) {
  for (const auto& loc : set.AllTensors()) {
    const auto& t = *loc.info;
    const GgmlTypeInfo* info = GgmlTypeInfoFor(t.type);
    if (!info->quantized) continue;
    auto fields = ScaleFields(t.type);
    ASSERT_FALSE(fields.empty()) << t.name << " " << GgmlTypeName(t.type);
    auto bytes = set.shards()[loc.shard_index]->TensorData(t);
    ASSERT_EQ(bytes.size() % info->type_size, 0u);
    for (size_t off = 0; off < bytes.size(); off += info->type_size) {
      const uint8_t* blk = bytes.data() + off;
      for (const auto& f : fields) {
        const float s = DecodeScale(f, blk);
        ASSERT_TRUE(std::isfinite(s) && std::fabs(s) < 1.0f) << t.name << " block " << off / info->type_size;
      }
      uint16_t h = 0;
      if (t.type == GgmlType::Q8_0) std::memcpy(&h, blk, 2);
      if (t.type == GgmlType::Q2_K) std::memcpy(&h, blk + 80, 2);
      if (t.type == GgmlType::Q3_K) std::memcpy(&h, blk + 108, 2);
      ASSERT_NE(h & 0x7C00, 0x7C00) << t.name;  // exponent not all-ones: not Inf/NaN
    }
  }
}

// And the quant module's ggml-exact dequantizers agree: every value finite
// and weight-sized.
void ExpectDequantFinite(const gguf::ShardSet& set) {
  for (const auto& loc : set.AllTensors()) {
    const auto& t = *loc.info;
    if (!quant::CanDequantize(t.type)) continue;
    auto st = quant::ComputeStats(t.type, set.shards()[loc.shard_index]->TensorData(t), t.ne[0], t.n_rows());
    ASSERT_TRUE(st.ok()) << t.name << ": " << st.error().message();
    EXPECT_EQ(st->nan_count, 0u) << t.name << " " << GgmlTypeName(t.type);
    EXPECT_EQ(st->inf_count, 0u) << t.name << " " << GgmlTypeName(t.type);
    EXPECT_LT(std::max(std::fabs(st->min), std::fabs(st->max)), 16.0) << t.name << " " << GgmlTypeName(t.type);
  }
}

TEST(SynthTiny, QuantScalesFinite) {
  TempDir dir;
  ASSERT_TRUE(WriteSynthModel(Tiny(dir.path())).ok());
  auto set = gguf::ShardSet::Open(dir.path());
  ASSERT_TRUE(set.ok());
  ExpectScalesFinite(*set);
  ExpectDequantFinite(*set);
}

TEST(SynthTiny, EveryQuantTypeAsExpertsAndPerLayerMixes) {
  // Every storage type a GGUF may carry (ids 0..42 minus the 8 removed ones),
  // three per MoE layer as a per-layer mix, in one model.
  std::vector<GgmlType> types;
  for (uint32_t id = 0; id < kGgmlTypeCount; ++id) {
    if (IsValidGgmlType(id)) types.push_back(static_cast<GgmlType>(id));
  }
  ASSERT_EQ(types.size(), 35u);
  TempDir dir;
  SynthOptions o = Tiny(dir.path());
  o.dims.num_experts = 2;
  o.dims.top_k = 1;
  o.dims.num_layers = 1 + static_cast<uint32_t>((types.size() + 2) / 3);
  for (size_t i = 0; i < types.size(); i += 3) {
    auto pick = [&](size_t k) { return types[std::min(k, types.size() - 1)]; };
    o.layer_expert_types[1 + static_cast<uint32_t>(i / 3)] = {pick(i), pick(i + 1), pick(i + 2)};
  }
  auto res = WriteSynthModel(o);
  ASSERT_TRUE(res.ok()) << res.error().message();
  auto set = gguf::ShardSet::Open(dir.path());
  ASSERT_TRUE(set.ok()) << set.error().message();
  std::set<GgmlType> seen;
  for (uint32_t il = 1; il < o.dims.num_layers; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    const ExpertTypes& want = o.layer_expert_types.at(il);
    EXPECT_EQ(set->FindTensor(p + "ffn_up_exps.weight")->info->type, want.up);
    EXPECT_EQ(set->FindTensor(p + "ffn_gate_exps.weight")->info->type, want.gate);
    EXPECT_EQ(set->FindTensor(p + "ffn_down_exps.weight")->info->type, want.down);
    seen.insert({want.up, want.gate, want.down});
  }
  EXPECT_EQ(seen.size(), types.size());
  ExpectScalesFinite(*set);
  ExpectDequantFinite(*set);
}

TEST(SynthTiny, RejectsBadOptions) {
  TempDir dir;
  SynthOptions o = Tiny(dir.path());
  o.dims.top_k = 17;
  EXPECT_FALSE(WriteSynthModel(o).ok());
  o = Tiny(dir.path());
  o.layer_expert_types[0] = {};  // layer 0 is dense
  auto r = WriteSynthModel(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("not a MoE layer"), std::string::npos);
  o = Tiny(dir.path());
  o.dims.latent = 384;  // 384 % 256 != 0: Q2_K experts cannot be stored
  r = WriteSynthModel(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("ffn_gate_exps"), std::string::npos);
  EXPECT_FALSE(PresetOptions("huge").ok());
  EXPECT_FALSE(ParseExpertTypes("Q2_K,Q2_K").ok());
  EXPECT_FALSE(ParseExpertTypes("Q2_K,Q2_K,Q9_K").ok());
  // Typed names in any case, as llama.cpp's tools take them (ggml's own spelling is "q2_K").
  auto typed = ParseExpertTypes("q2_k,q2_K,iq2_xxs");
  ASSERT_TRUE(typed.ok()) << typed.error().message();
  auto exact = ParseExpertTypes("Q2_K,Q2_K,IQ2_XXS");
  ASSERT_TRUE(exact.ok()) << exact.error().message();
  EXPECT_EQ(typed->up, exact->up);
  EXPECT_EQ(typed->gate, exact->gate);
  EXPECT_EQ(typed->down, exact->down);
  auto mix = ParseLayerExpertTypes({"1:Q2_K,Q2_K,Q3_K;2:IQ2_XS,IQ2_XS,IQ3_XXS", "3:MXFP4,MXFP4,MXFP4"});
  ASSERT_TRUE(mix.ok()) << mix.error().message();
  EXPECT_EQ(mix->size(), 3u);
  EXPECT_EQ(mix->at(3).down, GgmlType::MXFP4);
  EXPECT_FALSE(ParseLayerExpertTypes({"x:Q2_K,Q2_K,Q3_K"}).ok());
  EXPECT_FALSE(ParseLayerExpertTypes({"1:Q2_K,Q2_K,Q3_K", "1:Q2_K,Q2_K,Q3_K"}).ok());
}

TEST(SynthTiny, MatrixTypeFallsBackLikeLlamaQuantize) {
  // ssm_f_b has ne[0] = head_dim = 64: Q4_K (256-blocks) falls back to Q5_0.
  EXPECT_EQ(kimi::FallbackType(GgmlType::Q4_K, 64), GgmlType::Q5_0);
  EXPECT_EQ(kimi::FallbackType(GgmlType::IQ2_XS, 128), GgmlType::IQ4_NL);
  EXPECT_EQ(kimi::FallbackType(GgmlType::Q2_K, 128), GgmlType::Q4_0);
  EXPECT_EQ(kimi::FallbackType(GgmlType::Q2_K, 48), GgmlType::F16);
  EXPECT_EQ(kimi::FallbackType(GgmlType::Q8_0, 512), GgmlType::Q8_0);
  TempDir dir;
  SynthOptions o = Tiny(dir.path());
  o.matrix_type = GgmlType::Q4_K;
  ASSERT_TRUE(WriteSynthModel(o).ok());
  auto set = gguf::ShardSet::Open(dir.path());
  ASSERT_TRUE(set.ok());
  EXPECT_EQ(set->FindTensor("blk.0.ssm_f_b.weight")->info->type, GgmlType::Q5_0);
  EXPECT_EQ(set->FindTensor("blk.0.attn_q.weight")->info->type, GgmlType::Q4_K);
}

}  // namespace
}  // namespace k3pack::synth
