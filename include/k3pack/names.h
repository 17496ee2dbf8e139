// Kimi-K3 GGUF tensor name -> SGLang parameter name(s), and the routed-expert
// skip rule, exactly as SGLang's non-expert iterator applies them.
//
// The loader streams with this table; the doctor uses it to tell which GGUF
// names a server will accept before anything is loaded. One table, one place.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "k3pack/error.h"
#include "k3pack/ggml_types.h"

namespace k3pack::kimi {

// What the loader must do to the GGUF tensor to obtain a target's value.
enum class TargetTransform : uint8_t {
  kNone,                // the tensor as stored
  kALog,                // blk.N.ssm_a -> A_log = log(-x)
  kResidualProjection,  // *_res_score -> [1, d] projection (the score itself)
  kResidualNorm,        // *_res_score -> ones(d) norm weight
};
const char* TargetTransformName(TargetTransform t);  // "none", "a_log", ...

struct Target {
  std::string name;  // SGLang parameter name before quantized renaming
  TargetTransform transform = TargetTransform::kNone;
};

// Which table matched (for reports; SGLang takes the first hit).
enum class NameTable : uint8_t { kTopLevel, kResidual, kCommon, kKda, kMla };
const char* NameTableName(NameTable t);  // "top-level", "residual", "common", "kda", "mla"

struct Mapping {
  std::vector<Target> targets;  // 1, or 2 for residual scores (projection, norm)
  NameTable table = NameTable::kTopLevel;
  std::optional<uint32_t> layer;  // for blk.N.* names
};

// SGLang's kimi_k3_checkpoint_targets plus the transform of each target.
// Unknown names: ErrorKind::kKey, message
// "unsupported Kimi-K3 GGUF tensor name: {name}" (the text, not Python's
// quoted KeyError repr). Layer numbers are what Python's `\d+` takes: one or
// more Unicode decimal digits, written in the target as SGLang's
// f"model.layers.{int(layer)}." writes them ("blk.01.x" -> "model.layers.1.x",
// "blk.\u0663.x" -> "model.layers.3.x"); Mapping::layer is that int (3).
Result<Mapping> MapTensorName(std::string_view gguf_name);

// The name as the converter spells it, "blk.{int(layer)}.{suffix}", for a
// name of SGLang's per-layer form ("blk.07.attn_norm.weight" ->
// "blk.7.attn_norm.weight"); any other name unchanged. Two names with one
// spelling are one tensor to SGLang: the same layer, the same targets.
std::string ConverterSpelling(std::string_view gguf_name);

// ^blk\.\d+\.ffn_(?:gate|up|down)_exps\.weight$ : a routed-expert aggregate,
// type-checked and then skipped by the non-expert stream (its bytes are the
// expert pack's business). *_shexp and ffn_routed_* are not routed aggregates.
bool IsRoutedExpertAggregate(std::string_view gguf_name);

// SGLang's notion of "quantized" for the stream: any type but F32/F16/BF16
// (so I8..I64 and F64 count as quantized too, as in kimi_k3_gguf.py).
bool IsSglangQuantized(GgmlType type);

// The heads an ssm_a of GGUF shape `ne` holds for SGLang's A_log loader:
// ne {H} or {1, H, 1, 1} (numpy (H,) or (1, 1, H, 1)); -1 for any other
// shape (ne {1, H} among them), which that loader refuses.
int64_t SsmAHeadsOf(std::span<const int64_t> ne);

// Runtime name of a target: for a quantized tensor a final "weight" becomes
// "qweight" (only when the name ends with ".weight"); otherwise unchanged.
std::string RuntimeName(std::string_view target, bool quantized);
// Name of the companion type scalar yielded before a quantized value:
// runtime name minus a trailing "qweight", plus "qweight_type"
// ("x.qweight" -> "x.qweight_type", "self_attn.k_b_qweight" ->
// "self_attn.k_b_qweight_type").
std::string QweightTypeName(std::string_view runtime_name);

// Every (suffix, target suffix, table) row of the per-layer tables, in lookup
// order (documentation, tests, doctor listings).
struct TableRow {
  const char* gguf_suffix;
  const char* sglang_suffix;  // after "model.layers.N."
  NameTable table;
};
const std::vector<TableRow>& LayerTableRows();

}  // namespace k3pack::kimi
