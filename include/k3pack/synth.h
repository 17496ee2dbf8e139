// Synthetic Kimi-K3 checkpoints: a split GGUF set in llama.cpp's exact
// Kimi-K3 layout (kimi-k3.* keys, tensor names, ne-order shapes, KDA/MLA
// layer pattern, converter transforms already applied), plus the HF-style
// config.json and a small tokenizer directory SGLang's tooling reads.
//
// Every other module tests against these files, so the writer is
// deterministic (same options + seed -> same bytes) and can inject one
// named defect per fault, each of the kind a broken conversion or a damaged
// download produces in the wild.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "k3pack/error.h"
#include "k3pack/ggml_types.h"
#include "k3pack/progress.h"

namespace k3pack::synth {

// Model dimensions. Names follow the GGUF symbols of the spec (§4.3).
struct SynthDims {
  uint32_t num_layers = 4;             // block_count
  uint32_t first_k_dense = 1;          // leading_dense_block_count (dense FFN layers 0..k-1)
  uint32_t num_experts = 16;           // expert_count (X)
  uint32_t top_k = 4;                  // expert_used_count
  uint32_t num_shared_experts = 2;     // expert_shared_count
  uint32_t hidden = 512;               // embedding_length (E)
  uint32_t latent = 512;               // expert_latent_length = routed_expert_hidden_size (L)
  uint32_t moe_intermediate = 1024;    // expert_feed_forward_length (Fe)
  uint32_t dense_intermediate = 1024;  // feed_forward_length (F), dense layers only
  uint32_t heads = 4;                  // attention.head_count (H), KDA and MLA
  uint32_t head_dim = 64;              // kda.head_dim (Dk); MLA qk_nope / v_head unless set below
  uint32_t qk_rope = 32;               // rope.dimension_count (dr)
  uint32_t q_lora_rank = 256;          // attention.q_lora_rank (qr)
  uint32_t kv_lora_rank = 256;         // attention.kv_lora_rank (kr)
  uint32_t conv_kernel = 4;            // ssm.conv_kernel (C)
  uint32_t vocab = 512;                // vocab_size (V)
  uint32_t context_length = 8192;
  uint32_t attn_res_block_size = 2;    // 0 = no *_res_score tensors
  // 0-based MLA (full-attention) layers; every other layer is KDA. nullopt =
  // K3's pattern: (il + 1) % 4 == 0, plus the last layer.
  std::optional<std::vector<uint32_t>> mla_layers;
  // MLA head sizes: qk_nope (dn = attention.key_length_mla - dr) and v_head
  // (attention.value_length_mla). 0 = head_dim, as in Kimi-K3 where all
  // three are 128.
  uint32_t mla_qk_nope = 0;
  uint32_t mla_v_head = 0;
};
inline uint32_t MlaQkNope(const SynthDims& d) { return d.mla_qk_nope != 0 ? d.mla_qk_nope : d.head_dim; }
inline uint32_t MlaVHead(const SynthDims& d) { return d.mla_v_head != 0 ? d.mla_v_head : d.head_dim; }

SynthDims TinyDims();          // 4 layers, 16 experts, top-4, hidden 512 (the test model)
SynthDims K3StructureDims();   // the real Kimi-K3: 93 layers, 896 experts, 24 MLA + 69 KDA

// True when layer `il` is MLA under `dims` (explicit list or K3's pattern).
bool IsMlaLayer(const SynthDims& dims, uint32_t il);

// Storage types of one MoE layer's routed expert stacks.
struct ExpertTypes {
  GgmlType up = GgmlType::Q2_K;
  GgmlType gate = GgmlType::Q2_K;
  GgmlType down = GgmlType::Q3_K;
};
// "up,gate,down" type names, e.g. "Q2_K,Q2_K,Q3_K".
Result<ExpertTypes> ParseExpertTypes(std::string_view text);
// "L:up,gate,down" items separated by ';' (or given one per string).
Result<std::map<uint32_t, ExpertTypes>> ParseLayerExpertTypes(const std::vector<std::string>& items);

// One `--tensor-type PATTERN=TYPE` override, llama-quantize style: every
// tensor whose name contains PATTERN gets TYPE (the first matching override
// wins). Published "dynamic" mixes are expressed this way (attention and
// shared experts at Q8_0 or BF16, ffn_down_exps above gate/up, ...).
struct TensorTypeOverride {
  std::string pattern;
  GgmlType type = GgmlType::F32;
};
// "PATTERN=TYPE" items separated by ';' (or given one per string).
Result<std::vector<TensorTypeOverride>> ParseTensorTypes(const std::vector<std::string>& items);

// One defect each, injected after (or instead of) the clean write.
enum class Fault {
  kRawSsmA,           // first KDA layer's ssm_a holds raw A_log (mixed signs, small)
  kNanSsmA,           // one ssm_a element is NaN
  kZeroSsmA,          // one KDA layer's ssm_a is all zeros
  kBadSplitNo,        // shard 2 (index 1) says split.no = 2 (last shard when only one)
  kStaleTensorCount,  // split.tensors.count = real count + 1 in every shard
  kMissingExpert,     // one routed expert stack (blk.<last>.ffn_gate_exps.weight) absent
  kWrongExpertDtype,  // one layer's ffn_gate_exps stored as Q4_K (or Q5_K) unlike the rest
  kUnknownTensorName, // an extra tensor blk.1.ffn_mystery.weight
  kTruncatedShard,    // last shard cut inside its last tensor's data
};
std::string_view FaultName(Fault f);          // "raw-ssm-a", ...
Result<Fault> ParseFault(std::string_view name);
std::vector<Fault> AllFaults();

struct SynthOptions {
  std::string out_dir;
  std::string prefix = "KIMI-K3-SYNTH";
  uint64_t seed = 0;
  SynthDims dims;
  uint32_t shards = 3;
  ExpertTypes expert_types;                          // every MoE layer ...
  std::map<uint32_t, ExpertTypes> layer_expert_types;  // ... except these
  GgmlType matrix_type = GgmlType::Q8_0;  // other 2-D weights (embeddings and output included)
  // Applied after the types above; quantized types on non-expert tensors fall
  // back like llama-quantize, an expert type that does not fit is an error.
  std::vector<TensorTypeOverride> tensor_types;
  uint32_t alignment = 32;             // general.alignment (written when != 32), a power of two
  bool metadata_in_every_shard = false;  // general.*/kimi-k3.*/tokenizer.* keys in every shard, not shard 0 only
  // Tensors larger than this are written as holes (sparse, reading as zeros,
  // which every ggml type dequantizes to 0). UINT64_MAX = all data real.
  uint64_t hole_threshold_bytes = UINT64_MAX;
  std::vector<Fault> faults;
  // Tensor data written so far (bytes and tensors with real data; holes are
  // not written, so not counted). May be empty.
  ProgressFn progress;
};

// Preset by name: "tiny" (default test model) or "k3-structure" (real
// dimensions, 19 shards, large tensors as holes).
Result<SynthOptions> PresetOptions(std::string_view preset);

struct SynthResult {
  std::vector<std::string> shard_paths;  // in shard order
  std::string config_path;               // <out>/config.json
  std::string tokenizer_dir;             // <out>/tokenizer
  uint64_t tensor_count = 0;             // tensors actually written
  uint64_t total_bytes = 0;              // sum of shard file sizes
  std::vector<uint32_t> mla_layers;      // resolved MLA layer ids
  // One line per injected fault naming the affected file/tensor/key.
  std::vector<std::string> fault_notes;
};

// How many tensors WriteSynthModel would write for `opts` (faults that add
// or remove a tensor included), after every check it makes before writing
// except those of out_dir and the shard count: for a caller that checks
// `shards` (at most one shard per tensor) before it touches out_dir.
Result<uint64_t> PlannedTensorCount(const SynthOptions& opts);

// Writes the model. Existing `<prefix>-NNNNN-of-NNNNN.gguf` files in out_dir
// are removed first so a directory always holds exactly one set.
Result<SynthResult> WriteSynthModel(const SynthOptions& opts);

}  // namespace k3pack::synth
