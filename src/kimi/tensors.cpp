#include "kimi/tensors.h"

#include <algorithm>
#include <set>

#include "k3pack/gguf.h"

namespace k3pack::kimi {

const char* TensorRoleName(TensorRole r) {
  switch (r) {
    case TensorRole::kMatrix: return "matrix";
    case TensorRole::kEmbedding: return "embedding";
    case TensorRole::kAttnKB: return "attn_k_b";
    case TensorRole::kAttnVB: return "attn_v_b";
    case TensorRole::kExpertUp: return "expert_up";
    case TensorRole::kExpertGate: return "expert_gate";
    case TensorRole::kExpertDown: return "expert_down";
    case TensorRole::kNorm: return "norm";
    case TensorRole::kResScore: return "res_score";
    case TensorRole::kSsmA: return "ssm_a";
    case TensorRole::kBias: return "bias";
    case TensorRole::kConv: return "conv";
    case TensorRole::kRouter: return "router";
    case TensorRole::kF32Matrix: return "f32_matrix";
  }
  return "?";
}

bool RoleIsF32(TensorRole r) {
  switch (r) {
    case TensorRole::kNorm:
    case TensorRole::kResScore:
    case TensorRole::kSsmA:
    case TensorRole::kBias:
    case TensorRole::kConv:
    case TensorRole::kRouter:
    case TensorRole::kF32Matrix:
      return true;
    default:
      return false;
  }
}

bool RoleIsExpert(TensorRole r) {
  return r == TensorRole::kExpertUp || r == TensorRole::kExpertGate || r == TensorRole::kExpertDown;
}

LayerKind LayerKindOf(const SynthDims& dims, uint32_t il) {
  if (synth::IsMlaLayer(dims, il)) return LayerKind::kMla;
  return il < dims.first_k_dense ? LayerKind::kDenseKda : LayerKind::kKda;
}

GgmlType FallbackType(GgmlType t, int64_t ne0) {
  auto fits = [&](GgmlType x) {
    const GgmlTypeInfo* info = GgmlTypeInfoFor(x);
    return info != nullptr && info->block_size != 0 && ne0 % info->block_size == 0;
  };
  if (fits(t)) return t;
  GgmlType fb = GgmlType::F16;
  switch (t) {
    case GgmlType::IQ1_S: case GgmlType::IQ1_M: case GgmlType::IQ2_XXS: case GgmlType::IQ2_XS:
    case GgmlType::IQ2_S: case GgmlType::IQ3_XXS: case GgmlType::IQ3_S: case GgmlType::IQ4_XS:
      fb = GgmlType::IQ4_NL; break;
    case GgmlType::Q2_0: case GgmlType::Q2_K: case GgmlType::Q3_K: case GgmlType::TQ1_0: case GgmlType::TQ2_0:
      fb = GgmlType::Q4_0; break;
    case GgmlType::Q4_K: fb = GgmlType::Q5_0; break;
    case GgmlType::Q5_K: fb = GgmlType::Q5_1; break;
    case GgmlType::Q6_K: fb = GgmlType::Q8_0; break;
    default: break;
  }
  return fits(fb) ? fb : GgmlType::F16;
}

Status ValidateDims(const SynthDims& d) {
  auto need = [](bool ok, const std::string& what) -> Status {
    if (!ok) return Error("invalid model dimensions: " + what);
    return Status::OK();
  };
  K3_RETURN_IF_ERROR(need(d.num_layers >= 1, "layers must be >= 1"));
  K3_RETURN_IF_ERROR(need(d.first_k_dense < d.num_layers, "first_k_dense_replace (" + std::to_string(d.first_k_dense) +
                                                              ") must be < layers (" + std::to_string(d.num_layers) + ")"));
  K3_RETURN_IF_ERROR(need(d.num_experts >= 1, "experts must be >= 1"));
  K3_RETURN_IF_ERROR(need(d.top_k >= 1 && d.top_k <= d.num_experts,
                          "top-k (" + std::to_string(d.top_k) + ") must be in 1..experts (" +
                              std::to_string(d.num_experts) + ")"));
  K3_RETURN_IF_ERROR(need(d.hidden > 0 && d.latent > 0 && d.moe_intermediate > 0 && d.dense_intermediate > 0,
                          "hidden, latent and intermediate sizes must be > 0"));
  K3_RETURN_IF_ERROR(need(d.heads > 0 && d.head_dim > 0 && d.q_lora_rank > 0 && d.kv_lora_rank > 0,
                          "heads, head-dim and lora ranks must be > 0"));
  K3_RETURN_IF_ERROR(need(d.conv_kernel > 0, "conv kernel must be > 0"));
  K3_RETURN_IF_ERROR(need(d.vocab >= 512 && d.vocab <= 240000,
                          "vocab must be in 512..240000 (256 byte tokens + unique merges + specials)"));
  K3_RETURN_IF_ERROR(need(d.num_layers <= 9999 && d.num_experts <= 65536, "layers <= 9999 and experts <= 65536"));
  // The table's extents multiply u32 values; from a corrupt file two of them
  // can pass INT64_MAX (signed overflow, a negative extent).
  auto fits = [](int64_t a, int64_t b) {
    int64_t p;
    return !__builtin_mul_overflow(a, b, &p);
  };
  const int64_t heads = d.heads;
  K3_RETURN_IF_ERROR(need(fits(heads, d.head_dim) && fits(heads, int64_t{synth::MlaQkNope(d)} + d.qk_rope) &&
                              fits(heads, synth::MlaVHead(d)) &&
                              fits(d.moe_intermediate, std::max<int64_t>(d.num_shared_experts, 1)),
                          "heads x head sizes or moe_intermediate x shared experts overflow int64"));
  for (uint32_t il : d.mla_layers.value_or(std::vector<uint32_t>{})) {
    K3_RETURN_IF_ERROR(need(il < d.num_layers, "MLA layer " + std::to_string(il) + " is out of range"));
  }
  return Status::OK();
}

namespace {

class TableBuilder {
 public:
  TableBuilder(const SynthDims& d, const TypePlan& p) : d_(d), p_(p) {}

  Status Add(std::string name, std::vector<int64_t> ne, TensorRole role, int32_t layer,
             std::vector<int64_t> alt_ne = {}) {
    ExpectedTensor t;
    t.name = std::move(name);
    t.ne = std::move(ne);
    t.alt_ne = std::move(alt_ne);
    t.role = role;
    t.layer = layer;
    GgmlType want = GgmlType::F32;
    switch (role) {
      case TensorRole::kMatrix: want = p_.matrix; break;
      case TensorRole::kEmbedding: want = p_.embedding; break;
      case TensorRole::kAttnKB: want = p_.attn_k_b; break;
      case TensorRole::kAttnVB: want = p_.attn_v_b; break;
      case TensorRole::kExpertUp: want = Experts(layer).up; break;
      case TensorRole::kExpertGate: want = Experts(layer).gate; break;
      case TensorRole::kExpertDown: want = Experts(layer).down; break;
      default: want = GgmlType::F32; break;
    }
    if (RoleIsExpert(role)) {
      const GgmlTypeInfo* info = GgmlTypeInfoFor(want);
      if (info == nullptr || info->block_size == 0) return Error("tensor '" + t.name + "': invalid expert type");
      if (t.ne[0] % info->block_size != 0) {
        return Error("tensor '" + t.name + "': ne[0]=" + std::to_string(t.ne[0]) + " is not a multiple of the " +
                     info->name + " block size " + std::to_string(info->block_size) +
                     " (expert stacks are never given a fallback type)");
      }
      t.type = want;
    } else {
      t.type = FallbackType(want, t.ne[0]);
    }
    out_.push_back(std::move(t));
    return Status::OK();
  }

  ExpertTypes Experts(int32_t layer) const {
    auto it = p_.layer_experts.find(static_cast<uint32_t>(layer));
    return it == p_.layer_experts.end() ? p_.experts : it->second;
  }

  std::vector<ExpectedTensor> Take() { return std::move(out_); }

 private:
  const SynthDims& d_;
  const TypePlan& p_;
  std::vector<ExpectedTensor> out_;
};

}  // namespace

Result<std::vector<ExpectedTensor>> ExpectedTensors(const SynthDims& d, const TypePlan& plan) {
  K3_RETURN_IF_ERROR(ValidateDims(d));
  for (const auto& [layer, types] : plan.layer_experts) {
    if (layer < d.first_k_dense || layer >= d.num_layers) {
      return Error("expert types given for layer " + std::to_string(layer) + ", which is not a MoE layer (MoE layers are " +
                   std::to_string(d.first_k_dense) + ".." + std::to_string(d.num_layers - 1) + ")");
    }
  }
  const int64_t E = d.hidden, V = d.vocab, H = d.heads, Dk = d.head_dim, Di = int64_t{d.heads} * d.head_dim;
  const int64_t C = d.conv_kernel, qr = d.q_lora_rank, kr = d.kv_lora_rank, dr = d.qk_rope;
  const int64_t dn = synth::MlaQkNope(d), dv = synth::MlaVHead(d), dk = dn + dr;
  const int64_t F = d.dense_intermediate, Fe = d.moe_intermediate, X = d.num_experts, L = d.latent;
  const int64_t Fs = Fe * std::max<int64_t>(d.num_shared_experts, 1);
  const bool res = d.attn_res_block_size > 0;

  TableBuilder b(d, plan);
  using R = TensorRole;
  K3_RETURN_IF_ERROR(b.Add("token_embd.weight", {E, V}, R::kEmbedding, -1));
  for (uint32_t il = 0; il < d.num_layers; ++il) {
    const int32_t l = static_cast<int32_t>(il);
    const std::string p = "blk." + std::to_string(il) + ".";
    K3_RETURN_IF_ERROR(b.Add(p + "attn_norm.weight", {E}, R::kNorm, l));
    if (LayerKindOf(d, il) == LayerKind::kMla) {
      K3_RETURN_IF_ERROR(b.Add(p + "attn_q_a_norm.weight", {qr}, R::kNorm, l));
      K3_RETURN_IF_ERROR(b.Add(p + "attn_q_a.weight", {E, qr}, R::kMatrix, l));
      K3_RETURN_IF_ERROR(b.Add(p + "attn_q_b.weight", {qr, H * dk}, R::kMatrix, l));
      K3_RETURN_IF_ERROR(b.Add(p + "attn_kv_a_mqa.weight", {E, kr + dr}, R::kMatrix, l));
      K3_RETURN_IF_ERROR(b.Add(p + "attn_kv_a_norm.weight", {kr}, R::kNorm, l));
      K3_RETURN_IF_ERROR(b.Add(p + "attn_k_b.weight", {dn, kr, H}, R::kAttnKB, l));
      K3_RETURN_IF_ERROR(b.Add(p + "attn_v_b.weight", {kr, dv, H}, R::kAttnVB, l));
      K3_RETURN_IF_ERROR(b.Add(p + "attn_gate.weight", {E, H * dv}, R::kMatrix, l));
      K3_RETURN_IF_ERROR(b.Add(p + "attn_output.weight", {H * dv, E}, R::kMatrix, l));
    } else {
      for (const char* qkv : {"q", "k", "v"}) {
        K3_RETURN_IF_ERROR(b.Add(p + "ssm_conv1d_" + qkv + ".weight", {C, 1, Di}, R::kConv, l, {C, 1, Di, 1}));
      }
      for (const char* qkv : {"q", "k", "v"}) {
        K3_RETURN_IF_ERROR(b.Add(p + "attn_" + qkv + ".weight", {E, Di}, R::kMatrix, l));
      }
      K3_RETURN_IF_ERROR(b.Add(p + "ssm_f_a.weight", {E, Dk}, R::kMatrix, l));
      K3_RETURN_IF_ERROR(b.Add(p + "ssm_f_b.weight", {Dk, Di}, R::kMatrix, l));
      K3_RETURN_IF_ERROR(b.Add(p + "ssm_beta.weight", {E, H}, R::kF32Matrix, l));
      K3_RETURN_IF_ERROR(b.Add(p + "ssm_a", {H}, R::kSsmA, l));
      K3_RETURN_IF_ERROR(b.Add(p + "ssm_dt.bias", {Di}, R::kBias, l));
      K3_RETURN_IF_ERROR(b.Add(p + "ssm_g.weight", {E, Di}, R::kMatrix, l));
      K3_RETURN_IF_ERROR(b.Add(p + "ssm_norm.weight", {Dk}, R::kNorm, l));
      K3_RETURN_IF_ERROR(b.Add(p + "attn_output.weight", {Di, E}, R::kMatrix, l));
    }
    if (res) K3_RETURN_IF_ERROR(b.Add(p + "attn_res_score.weight", {E}, R::kResScore, l));
    K3_RETURN_IF_ERROR(b.Add(p + "ffn_norm.weight", {E}, R::kNorm, l));
    if (res) K3_RETURN_IF_ERROR(b.Add(p + "ffn_res_score.weight", {E}, R::kResScore, l));
    if (il < d.first_k_dense) {
      K3_RETURN_IF_ERROR(b.Add(p + "ffn_gate.weight", {E, F}, R::kMatrix, l));
      K3_RETURN_IF_ERROR(b.Add(p + "ffn_up.weight", {E, F}, R::kMatrix, l));
      K3_RETURN_IF_ERROR(b.Add(p + "ffn_down.weight", {F, E}, R::kMatrix, l));
    } else {
      K3_RETURN_IF_ERROR(b.Add(p + "ffn_gate_inp.weight", {E, X}, R::kRouter, l));
      K3_RETURN_IF_ERROR(b.Add(p + "exp_probs_b.bias", {X}, R::kBias, l));
      K3_RETURN_IF_ERROR(b.Add(p + "ffn_routed_down.weight", {E, L}, R::kMatrix, l));
      K3_RETURN_IF_ERROR(b.Add(p + "ffn_gate_exps.weight", {L, Fe, X}, R::kExpertGate, l));
      K3_RETURN_IF_ERROR(b.Add(p + "ffn_up_exps.weight", {L, Fe, X}, R::kExpertUp, l));
      K3_RETURN_IF_ERROR(b.Add(p + "ffn_down_exps.weight", {Fe, L, X}, R::kExpertDown, l));
      K3_RETURN_IF_ERROR(b.Add(p + "ffn_routed_norm.weight", {L}, R::kNorm, l));
      K3_RETURN_IF_ERROR(b.Add(p + "ffn_routed_up.weight", {L, E}, R::kMatrix, l));
      K3_RETURN_IF_ERROR(b.Add(p + "ffn_gate_shexp.weight", {E, Fs}, R::kMatrix, l));
      K3_RETURN_IF_ERROR(b.Add(p + "ffn_up_shexp.weight", {E, Fs}, R::kMatrix, l));
      K3_RETURN_IF_ERROR(b.Add(p + "ffn_down_shexp.weight", {Fs, E}, R::kMatrix, l));
    }
  }
  K3_RETURN_IF_ERROR(b.Add("output_norm.weight", {E}, R::kNorm, -1));
  if (res) K3_RETURN_IF_ERROR(b.Add("output_res_score.weight", {E}, R::kResScore, -1));
  K3_RETURN_IF_ERROR(b.Add("output.weight", {E, V}, R::kEmbedding, -1));
  return b.Take();
}

namespace {

Result<int64_t> ReqInt(const gguf::GgufFile& f, const std::string& key) {
  const gguf::Value* v = f.Find(key);
  if (v == nullptr) return Error("'" + key + "'", ErrorKind::kKey).WithContext(f.path() + ": missing metadata key");
  auto i = v->AsInt();
  if (!i || *i < 0 || *i > UINT32_MAX) {
    return Error(f.path() + ": metadata key " + key + " must be a non-negative 32-bit integer");
  }
  return *i;
}

int64_t OptInt(const gguf::GgufFile& f, const std::string& key, int64_t def) {
  const gguf::Value* v = f.Find(key);
  if (v == nullptr) return def;
  auto i = v->AsInt();
  return i && *i >= 0 && *i <= UINT32_MAX ? *i : def;
}

// feed_forward_length as llama.cpp's get_key_or_arr reads it: a scalar, or
// one entry per layer. The table has one dense width, so the dense layers
// must agree; without dense layers the width is unused (the largest entry).
Result<int64_t> DenseFeedForward(const gguf::GgufFile& f, const std::string& key, uint32_t layers,
                                 uint32_t first_dense) {
  const gguf::Value* v = f.Find(key);
  if (v == nullptr || v->type != gguf::ValueType::kArray) return OptInt(f, key, 0);
  const gguf::ValueType et = v->array_type;
  const bool integer = et != gguf::ValueType::kString && et != gguf::ValueType::kBool &&
                       et != gguf::ValueType::kFloat32 && et != gguf::ValueType::kFloat64;
  if (!integer || v->array_count != layers) {
    return Error(f.path() + ": metadata key " + key + " must be an integer or an integer array of block_count (" +
                 std::to_string(layers) + ") entries");
  }
  int64_t width = 0;
  for (uint32_t il = 0; il < layers; ++il) {
    const int64_t x = v->ArrayInt(il);
    if (x < 0 || x > UINT32_MAX) {
      return Error(f.path() + ": metadata key " + key + "[" + std::to_string(il) + "] is out of range");
    }
    if (il < first_dense) {
      if (il > 0 && x != width) {
        return Error(f.path() + ": metadata key " + key + " gives dense layers different widths (" +
                     std::to_string(width) + " and " + std::to_string(x) + "); one width per model is supported");
      }
      width = x;
    } else if (first_dense == 0) {
      width = std::max(width, x);
    }
  }
  return width;
}

}  // namespace

Result<SynthDims> DimsFromGguf(const gguf::GgufFile& f) {
  const std::string a = "kimi-k3.";
  SynthDims d;
  auto u = [](int64_t v) { return static_cast<uint32_t>(v); };
  K3_ASSIGN_OR_RETURN(int64_t layers, ReqInt(f, a + "block_count"));
  d.num_layers = u(layers);
  K3_ASSIGN_OR_RETURN(int64_t hidden, ReqInt(f, a + "embedding_length"));
  d.hidden = u(hidden);
  K3_ASSIGN_OR_RETURN(int64_t experts, ReqInt(f, a + "expert_count"));
  d.num_experts = u(experts);
  K3_ASSIGN_OR_RETURN(int64_t topk, ReqInt(f, a + "expert_used_count"));
  d.top_k = u(topk);
  K3_ASSIGN_OR_RETURN(int64_t fe, ReqInt(f, a + "expert_feed_forward_length"));
  d.moe_intermediate = u(fe);
  K3_ASSIGN_OR_RETURN(int64_t heads, ReqInt(f, a + "attention.head_count"));
  d.heads = u(heads);
  K3_ASSIGN_OR_RETURN(int64_t dk, ReqInt(f, a + "kda.head_dim"));
  d.head_dim = u(dk);
  K3_ASSIGN_OR_RETURN(int64_t kr, ReqInt(f, a + "attention.kv_lora_rank"));
  d.kv_lora_rank = u(kr);
  K3_ASSIGN_OR_RETURN(int64_t conv, ReqInt(f, a + "ssm.conv_kernel"));
  d.conv_kernel = u(conv);
  K3_ASSIGN_OR_RETURN(int64_t shared, ReqInt(f, a + "expert_shared_count"));
  d.num_shared_experts = u(shared);
  K3_ASSIGN_OR_RETURN(int64_t block, ReqInt(f, a + "attn_res.block_size"));
  d.attn_res_block_size = u(block);
  d.first_k_dense = u(OptInt(f, a + "leading_dense_block_count", 0));
  d.latent = u(OptInt(f, a + "expert_latent_length", 0));
  if (d.latent == 0) d.latent = d.hidden;
  K3_ASSIGN_OR_RETURN(int64_t ff, DenseFeedForward(f, a + "feed_forward_length", d.num_layers, d.first_k_dense));
  d.dense_intermediate = u(ff);
  d.qk_rope = u(OptInt(f, a + "rope.dimension_count", 0));
  // llama.cpp sizes the MLA heads from these two keys (dk = dn + dr, dv),
  // independently of kda.head_dim; absent keys keep head_dim (K3's value).
  if (f.Find(a + "attention.key_length_mla") != nullptr) {
    K3_ASSIGN_OR_RETURN(int64_t dk_mla, ReqInt(f, a + "attention.key_length_mla"));
    if (dk_mla <= d.qk_rope) {
      return Error(f.path() + ": metadata key " + a + "attention.key_length_mla (" + std::to_string(dk_mla) +
                   ") must exceed rope.dimension_count (" + std::to_string(d.qk_rope) +
                   "): the MLA key head is the nope part plus the rope part");
    }
    d.mla_qk_nope = u(dk_mla - d.qk_rope);
  }
  if (f.Find(a + "attention.value_length_mla") != nullptr) {
    K3_ASSIGN_OR_RETURN(int64_t dv_mla, ReqInt(f, a + "attention.value_length_mla"));
    d.mla_v_head = u(dv_mla);
  }
  d.q_lora_rank = u(OptInt(f, a + "attention.q_lora_rank", 0));
  d.context_length = u(OptInt(f, a + "context_length", 0));
  d.vocab = u(OptInt(f, a + "vocab_size", 0));
  if (d.vocab == 0) {
    if (const gguf::Value* t = f.Find("tokenizer.ggml.tokens"); t != nullptr) d.vocab = u(t->array_count);
  }
  const std::string kv_key = a + "attention.head_count_kv";
  const gguf::Value* kv = f.Find(kv_key);
  if (kv == nullptr) return Error("'" + kv_key + "'", ErrorKind::kKey).WithContext(f.path() + ": missing metadata key");
  std::vector<uint32_t> mla;
  if (kv->type != gguf::ValueType::kArray) {
    // A scalar means "no per-layer pattern": every layer uses that count.
    auto n = kv->AsInt();
    if (n && *n > 0) {
      for (uint32_t il = 0; il < d.num_layers; ++il) mla.push_back(il);
    }
  } else {
    if (kv->array_count != d.num_layers) {
      return Error(f.path() + ": " + kv_key + " has " + std::to_string(kv->array_count) + " entries, block_count is " +
                   std::to_string(d.num_layers));
    }
    for (uint32_t il = 0; il < d.num_layers; ++il) {
      if (kv->ArrayInt(il) != 0) mla.push_back(il);
    }
  }
  d.mla_layers = std::move(mla);
  return d;
}

}  // namespace k3pack::kimi
