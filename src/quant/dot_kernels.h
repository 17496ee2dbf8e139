// Integer dot products of one weight row with a quantized activation row
// (Q8_0 or Q8_K blocks), in the manner of ggml's vec_dot_<w>_<act>: integer
// sums per sub-block, scaled once per block in float.
#pragma once

#include <cstdint>

#include "k3pack/ggml_types.h"

namespace k3pack::quant::internal {

// Returns nullptr when `weight` has no integer kernel here.
using IntDotFn = float (*)(const uint8_t* w, const uint8_t* act, int64_t nblocks_act);
IntDotFn IntegerDotFor(GgmlType weight);
IntDotFn IntegerDotForGeneric(GgmlType weight);  // the generic build (tests)
IntDotFn IntegerDotForAvx2(GgmlType weight);     // only valid on AVX2 CPUs
IntDotFn IqDotAvx2(GgmlType weight);             // hand-written IQ kernels (AVX2 CPUs)

// Q8_K block: float d, int8 qs[256], int16 bsums[16] (sums of 16 qs each).
inline constexpr int kQ8KBytes = 292;
inline constexpr int kQ8_0Bytes = 34;

}  // namespace k3pack::quant::internal
