// Decoding ggml tensor storage to float32, and the dot products the CPU
// expert forward is built on.
//
// Every decoder reproduces ggml's dequantize_row_<type> bit for bit (same
// tables, same float operation order, no fused multiply-add), so values
// printed by `k3pack dump-tensor` or used by `k3pack::moe` are exactly the
// ones llama.cpp's to_float produces. SIMD kernels (AVX2, AVX-512) are picked
// at run time from what the CPU supports and give the same bits as the scalar
// reference; tests hold them to that.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "k3pack/error.h"
#include "k3pack/ggml_types.h"

namespace k3pack::quant {

// Code paths. kAuto = the best the running CPU supports.
enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAuto = 3 };
// The best the CPU supports, capped by K3PACK_QUANT_ISA (scalar, avx2,
// avx512 or auto; read once).
Isa DetectedIsa();
const char* IsaName(Isa isa);  // "scalar", "avx2", "avx512", "auto"
// K3PACK_QUANT_ISA's value when it names none of IsaName's values, so it
// caps nothing ("" when unset or valid): the CLI and the Python module warn
// of it, since a typo would otherwise leave the choice silently uncapped.
std::string IgnoredIsaCap();
// True when `isa` has a kernel of its own for `t` (otherwise a lower ISA's runs).
bool HasKernel(GgmlType t, Isa isa);

// Every storage type a GGUF may hold except Q8_1 (an activation-only type).
bool CanDequantize(GgmlType t);

// Decodes dst.size() elements (a whole number of blocks) from `src`, which
// must hold at least GgmlRowBytes(t, dst.size()) bytes. Integer types
// (I8..I64) decode to their values; F64 rounds to float.
Status DequantizeRow(GgmlType t, std::span<const uint8_t> src, std::span<float> dst, Isa isa = Isa::kAuto);

// DequantizeRow split over `threads` threads (0 = one per online CPU). A
// whole tensor is one run of blocks (rows are whole blocks), so any
// contiguous tensor can be passed at once. Work is cut on block boundaries
// into pieces of at least 1 MiB of output, so small inputs stay on the
// calling thread; the output bits do not depend on the split.
Status DequantizeParallel(GgmlType t, std::span<const uint8_t> src, std::span<float> dst, int threads = 0,
                          Isa isa = Isa::kAuto);

// `rows` rows of `ne0` elements each, packed one after another in `bytes`.
Result<std::vector<float>> DequantizeRows(GgmlType t, std::span<const uint8_t> bytes, int64_t ne0, uint64_t rows);

// Summary of decoded values for `k3pack inspect --stats`. min/max/mean are
// over finite values only (0 when there are none); NaN and +-Inf are counted.
struct TensorStats {
  double min = 0;
  double max = 0;
  double mean = 0;
  uint64_t nan_count = 0;
  uint64_t inf_count = 0;
  uint64_t count = 0;  // all elements, finite or not
};
// Streams through the rows in chunks (no full float copy of the tensor).
Result<TensorStats> ComputeStats(GgmlType t, std::span<const uint8_t> bytes, int64_t ne0, uint64_t rows);
// The same, calling `on_rows(rows_done)` each time at least `every_bytes` more
// of `bytes` are decoded, and once at the end. One expert stack of a full-size
// checkpoint is several GB (minutes to decode), so a caller reports progress
// and releases the pages it has finished with inside a tensor, not only
// between tensors. The statistics are the same as without the callback.
Result<TensorStats> ComputeStats(GgmlType t, std::span<const uint8_t> bytes, int64_t ne0, uint64_t rows,
                                 uint64_t every_bytes, const std::function<void(uint64_t rows_done)>& on_rows);

// ------------------------------------------------------------ dot products
//
// A float activation vector prepared for dots against rows of one weight
// type, the way ggml's CPU backend does: Q8_K for K-quant / IQ / TQ weights,
// Q8_0 for Q8_0 / Q4_0 / Q5_0 / IQ4_NL / MXFP4 / NVFP4 weights. Types
// without an integer kernel here use a float dot against the decoded row.
// The integer path differs from the exact float dot by the activation's
// quantization error only; see docs/quant.md for the bound tested.
struct PreparedActivation {
  GgmlType weight_type = GgmlType::F32;
  GgmlType act_type = GgmlType::F32;  // Q8_K, Q8_0 or F32
  int64_t n = 0;
  std::vector<uint8_t> q;  // quantized blocks (empty for F32)
  std::vector<float> f;    // the float values as given
};

// ggml's vec_dot_type for `weight` as used here: Q8_K, Q8_0 or F32.
GgmlType ActivationTypeFor(GgmlType weight);
// True when a dot for `weight` runs as integer products on a quantized activation.
bool HasIntegerDot(GgmlType weight);

// x.size() must be a multiple of the weight type's block size.
// allow_integer = false forces the float path (decode the row, float dot).
Result<PreparedActivation> PrepareActivation(GgmlType weight_type, std::span<const float> x,
                                             bool allow_integer = true);

// ggml's quantize_row_q8_K_ref / quantize_row_q8_0_ref (x.size() % 256 / 32 == 0).
void QuantizeRowQ8K(std::span<const float> x, uint8_t* out);
void QuantizeRowQ8_0(std::span<const float> x, uint8_t* out);

// One row (x.n elements of weight_type) dotted with the prepared activation.
Result<float> DotRow(std::span<const uint8_t> row, const PreparedActivation& x);
// Exact reference: decode the row to float and accumulate in double.
Result<double> DotRowReference(GgmlType t, std::span<const uint8_t> row, std::span<const float> x);

// y[r] = row_r . x for `rows` rows of x.n elements packed in `bytes`.
// threads <= 1 runs on the calling thread.
Status MatVec(std::span<const uint8_t> bytes, uint64_t rows, const PreparedActivation& x, std::span<float> y,
              int threads = 1);

}  // namespace k3pack::quant
