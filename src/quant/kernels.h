// Internal kernel tables of the quant module. A dequantizer turns `nblocks`
// consecutive blocks into nblocks * block_size floats. Each ISA fills the
// entries it has; empty entries fall back to the next lower ISA and finally
// to the scalar reference, which exists for every decodable type.
#pragma once

#include <cstdint>

#include "k3pack/ggml_types.h"

namespace k3pack::quant::internal {

using DequantFn = void (*)(const uint8_t* src, float* dst, int64_t nblocks);

struct DequantTable {
  DequantFn fn[kGgmlTypeCount] = {};
};

// Scalar reference decoders, one per storage type (the ggml op order).
const DequantTable& ScalarTable();
// Fills the scalar table; split over three files to keep each focused.
void RegisterScalarBasic(DequantTable& t);   // floats, ints, 32-blocks, FP4, Q1_0/Q2_0
void RegisterScalarKQuants(DequantTable& t); // Q2_K..Q8_K, TQ1_0, TQ2_0, IQ4_XS
void RegisterScalarIq(DequantTable& t);      // IQ2_*, IQ3_*, IQ1_*

// SIMD tables; only meaningful when the CPU supports the ISA.
const DequantTable& Avx2Table();
const DequantTable& Avx512Table();

// Float dot products (for the dequantize-then-dot path).
float DotF32Scalar(const float* a, const float* b, int64_t n);
float DotF32Avx2(const float* a, const float* b, int64_t n);
float DotF32Avx512(const float* a, const float* b, int64_t n);

}  // namespace k3pack::quant::internal
