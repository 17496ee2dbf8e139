// The Kimi-K3 tensor table: every tensor llama.cpp's Kimi-K3 loader expects,
// with its GGUF name, ne-order shape and the storage type a converted and
// quantized file carries, for any dimensions.
//
// The synthetic writer builds its files from this table, and the doctor and
// loader compare real files against it (names, shapes, which tensors must
// stay F32), so the layout facts live in exactly one place.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "k3pack/error.h"
#include "k3pack/ggml_types.h"
#include "k3pack/synth.h"

namespace k3pack::gguf {
class GgufFile;
}

namespace k3pack::kimi {

using synth::ExpertTypes;
using synth::SynthDims;

enum class LayerKind { kDenseKda, kKda, kMla };  // attention kind (KDA = recurrent)

// What a tensor is, which decides its storage type and how synthetic values
// are generated.
enum class TensorRole {
  kMatrix,        // 2-D weight, quantized to the matrix type
  kEmbedding,     // token_embd / output (quantized; SGLang loads them as GGUF)
  kAttnKB,        // MLA attn_k_b (3-D; SGLang requires Q4_0)
  kAttnVB,        // MLA attn_v_b (3-D; SGLang requires Q2_K)
  kExpertUp,      // ffn_up_exps   {L, Fe, X}
  kExpertGate,    // ffn_gate_exps {L, Fe, X}
  kExpertDown,    // ffn_down_exps {Fe, L, X}
  kNorm,          // RMSNorm weights (F32, values near 1)
  kResScore,      // folded attention-residual score vectors (F32)
  kSsmA,          // blk.N.ssm_a: -exp(A_log), F32, strictly negative
  kBias,          // ssm_dt.bias, exp_probs_b.bias (F32)
  kConv,          // ssm_conv1d_{q,k,v} (F32, 3-D {C, 1, Di})
  kRouter,        // ffn_gate_inp (F32, forced by the converter)
  kF32Matrix,     // 2-D weights converted files keep in F32 (ssm_beta)
};
const char* TensorRoleName(TensorRole r);
// True for roles a conversion must leave in F32 (norms, vectors, conv,
// router, ssm_a, residual scores, ssm_beta).
bool RoleIsF32(TensorRole r);
bool RoleIsExpert(TensorRole r);

struct ExpectedTensor {
  std::string name;
  std::vector<int64_t> ne;  // ne order, ne[0] fastest
  GgmlType type = GgmlType::F32;
  TensorRole role = TensorRole::kMatrix;
  int32_t layer = -1;       // -1 = top level
  // A second shape llama.cpp's loader accepts for the same bytes, empty when
  // there is none: conv1d is {C, 1, Di, 1} as the Python converter writes it
  // (it keeps trailing 1s) and {C, 1, Di} after llama-quantize.
  std::vector<int64_t> alt_ne = {};

  bool ShapeMatches(const std::vector<int64_t>& shape) const {
    return shape == ne || (!alt_ne.empty() && shape == alt_ne);
  }
};

// Storage types for the non-F32 roles.
struct TypePlan {
  GgmlType matrix = GgmlType::Q8_0;
  GgmlType embedding = GgmlType::Q8_0;
  GgmlType attn_k_b = GgmlType::Q4_0;  // SGLang: k_b_qweight_type must be 2
  GgmlType attn_v_b = GgmlType::Q2_K;  // SGLang: v_b_qweight_type must be 10
  ExpertTypes experts;
  std::map<uint32_t, ExpertTypes> layer_experts;
};

LayerKind LayerKindOf(const SynthDims& dims, uint32_t il);

// llama-quantize's substitute when ne[0] is not a multiple of t's block
// (spec §3.5); returns t itself when it fits.
GgmlType FallbackType(GgmlType t, int64_t ne0);

// The full tensor list in file order: token_embd, blk.0 .. blk.N-1, then
// output_norm, output_res_score, output. Non-expert quantized types fall back
// like llama-quantize when ne[0] does not fit the block; an expert type that
// does not fit is an error naming the tensor (experts are never substituted:
// the pack format depends on the exact type).
Result<std::vector<ExpectedTensor>> ExpectedTensors(const SynthDims& dims, const TypePlan& plan = {});

// Checks the dimensions for internal consistency (nonzero sizes, top_k <=
// experts, first_k_dense < layers, MLA ids in range, ...).
Status ValidateDims(const SynthDims& dims);

// Reads the dimensions back from the kimi-k3.* metadata of shard 0, so a real
// or synthetic file can be compared against ExpectedTensors. Missing required
// keys are ErrorKind::kKey naming the key.
Result<SynthDims> DimsFromGguf(const gguf::GgufFile& first_shard);

}  // namespace k3pack::kimi
