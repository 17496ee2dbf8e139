// Internals of the non-expert stream: gguf-py's view dtype/shape for a GGUF
// tensor, float16/bfloat16 conversions and the ones_like fill.
#pragma once

#include <cstdint>
#include <vector>

#include "k3pack/gguf.h"
#include "k3pack/loader.h"

namespace k3pack::loader {

struct ViewType {
  DType dtype = DType::kUint8;
  std::vector<int64_t> shape;  // numpy order
};

// What `GGUFReader(...).tensors[i].data` is: element types (F32, F16, F64,
// I8..I64) as typed arrays of reversed-ne shape; block types as uint8 with
// ne[0] replaced by the row byte count. BF16 is bfloat16 unless
// `sglang_compat` (then gguf-py's raw bytes).
ViewType GgufPyView(const gguf::TensorInfo& t, bool sglang_compat);

bool IsFloatDType(DType d);
std::vector<uint8_t> OnesLike(DType dtype, size_t count);

// Round-to-nearest-even conversions (torch/numpy semantics).
uint16_t FloatToHalfBits(float f);
float HalfBitsToFloat(uint16_t h);
uint16_t FloatToBFloatBits(float f);
float BFloatBitsToFloat(uint16_t b);

}  // namespace k3pack::loader
