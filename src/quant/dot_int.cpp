// Scalar integer dot kernels (weight row x Q8_0 / Q8_K activation row).
// Per block: exact int32 sums of quant products times integer sub-scales,
// then one float scale per block, as ggml's generic vec_dot does.
#include <cstring>

#include "k3pack/quant.h"
#include "quant/dot_kernels.h"
#include "quant/fp.h"
#include "quant/iq_tables.h"

namespace k3pack::quant::internal {
namespace generic {
namespace {
#include "quant/dot_int_impl.inc"
}  // namespace
}  // namespace generic

IntDotFn IntegerDotForGeneric(GgmlType weight) { return generic::Lookup(weight); }

IntDotFn IntegerDotFor(GgmlType weight) {
  // Q2_K / Q3_K: the plain build measured faster than the vectorized one.
  const bool avx2_wins = weight != GgmlType::Q2_K && weight != GgmlType::Q3_K;
  if (avx2_wins && static_cast<int>(DetectedIsa()) >= static_cast<int>(Isa::kAvx2)) {
    if (IntDotFn f = IntegerDotForAvx2(weight)) return f;
  }
  return generic::Lookup(weight);
}

}  // namespace k3pack::quant::internal
