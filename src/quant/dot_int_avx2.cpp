// The integer dot kernels of dot_int_impl.inc compiled for AVX2 and
// auto-vectorized (O3); chosen at run time by IntegerDotFor.
#include <cstring>

#include "quant/dot_kernels.h"
#include "quant/fp.h"
#include "quant/iq_tables.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#pragma GCC optimize("O3")

namespace k3pack::quant::internal {
namespace avx2 {
namespace {
#include "quant/dot_int_impl.inc"
}  // namespace
}  // namespace avx2

IntDotFn IntegerDotForAvx2(GgmlType weight) {
  if (IntDotFn f = IqDotAvx2(weight)) return f;
  return avx2::Lookup(weight);
}

}  // namespace k3pack::quant::internal

#pragma GCC pop_options
