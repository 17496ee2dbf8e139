// Deterministic tensor payloads for synthetic models.
//
// Bytes are a pure function of (seed, tensor, byte position), so a tensor can
// be produced in any chunking and two runs with one seed write identical
// files. Quantized blocks get random quant bits, but every scale field (the
// fp16 d/dmin, Q8_K's float d, MXFP4's E8M0 exponent, NVFP4's UE4M3 bytes,
// IQ1_M's scattered fp16) is forced to a small positive finite value, so any
// dequantizer yields finite numbers of weight-like magnitude.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "k3pack/ggml_types.h"

namespace k3pack::synth {

// What the numbers of a float tensor look like.
enum class ValueKind {
  kWeight,    // small, zero-centred (|x| <= 0.02)
  kNorm,      // near 1 (RMSNorm weights)
  kResScore,  // small, zero-centred residual-score vectors
  kSsmA,      // -exp(A_log), A_log in [0, log 16]: strictly negative, in [-16, -1]
  kRawALog,   // A_log as the checkpoint stores it: mixed signs, |x| <= 0.5
  kBias,      // small, zero-centred
  kConv,      // conv taps, |x| <= 0.25
};

struct FillPlan {
  GgmlType type = GgmlType::F32;
  ValueKind kind = ValueKind::kWeight;
  uint64_t seed = 0;  // per tensor (see TensorSeed)
};

uint64_t Mix64(uint64_t x);  // splitmix64 finalizer
// Seed of one tensor: model seed mixed with a hash of the tensor name.
uint64_t TensorSeed(uint64_t model_seed, std::string_view tensor_name);

// The value element `i` of a float tensor takes (before conversion to the
// storage type).
float ElementValue(ValueKind kind, uint64_t seed, uint64_t i);

// Writes bytes [offset, offset + out.size()) of the tensor's data.
void FillRange(const FillPlan& plan, uint64_t offset, std::span<uint8_t> out);

// Writes bytes [offset, offset + out.size()) of `values` stored as `type`, a
// non-block type (F32, F16, BF16, F64, integers); nothing for a block type.
// How a tensor whose values are computed up front (ssm_a) honours a type
// override: its bytes are those values in the tensor's own storage type.
void EncodeFloats(GgmlType type, std::span<const float> values, uint64_t offset, std::span<uint8_t> out);

// Where a block type keeps its scales, for the writer and for checks.
enum class ScaleKind { kF16, kF32, kE8M0, kUE4M3, kIQ1MScattered };
struct ScaleField {
  uint32_t offset;  // byte offset inside the block
  ScaleKind kind;
};
// Empty for non-block types (F32, F16, BF16, integers).
std::span<const ScaleField> ScaleFields(GgmlType t);
// Decodes one scale field of `block` to float (for finiteness checks).
float DecodeScale(const ScaleField& f, const uint8_t* block);

float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);

}  // namespace k3pack::synth
