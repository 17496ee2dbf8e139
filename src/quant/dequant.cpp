// Run-time kernel choice and the public decoding entry points.
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "k3pack/quant.h"
#include "quant/kernels.h"
#include "util/threads.h"

namespace k3pack::quant {
namespace internal {

const DequantTable& ScalarTable() {
  static const DequantTable table = [] {
    DequantTable t;
    RegisterScalarBasic(t);
    RegisterScalarKQuants(t);
    RegisterScalarIq(t);
    return t;
  }();
  return table;
}

}  // namespace internal

namespace {

Isa ProbeIsa() {
  Isa best = Isa::kScalar;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // F16C through CPUID: clang (14) has no "f16c" for __builtin_cpu_supports,
  // and the fuzz build compiles this file with clang.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c) {
    best = Isa::kAvx2;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl")) {
      best = Isa::kAvx512;
    }
  }
#endif
  // K3PACK_QUANT_ISA=scalar|avx2 caps the choice (benchmarks, debugging).
  if (const char* cap = std::getenv("K3PACK_QUANT_ISA")) {
    const std::string c(cap);
    if (c == "scalar") best = Isa::kScalar;
    if (c == "avx2" && best == Isa::kAvx512) best = Isa::kAvx2;
  }
  return best;
}

bool IsIsaName(const std::string& s) {
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAuto}) {
    if (s == IsaName(isa)) return true;
  }
  return false;
}

Isa Resolve(Isa isa) {
  const Isa best = DetectedIsa();
  if (isa == Isa::kAuto) return best;
  return static_cast<int>(isa) > static_cast<int>(best) ? best : isa;
}

internal::DequantFn Pick(GgmlType t, Isa isa) {
  const uint32_t id = static_cast<uint32_t>(t);
  if (id >= kGgmlTypeCount) return nullptr;
  isa = Resolve(isa);
  if (isa == Isa::kAvx512 && internal::Avx512Table().fn[id]) return internal::Avx512Table().fn[id];
  if ((isa == Isa::kAvx512 || isa == Isa::kAvx2) && internal::Avx2Table().fn[id]) return internal::Avx2Table().fn[id];
  return internal::ScalarTable().fn[id];
}

}  // namespace

Isa DetectedIsa() {
  static const Isa isa = ProbeIsa();
  return isa;
}

std::string IgnoredIsaCap() {
  const char* cap = std::getenv("K3PACK_QUANT_ISA");
  return cap == nullptr || IsIsaName(cap) ? std::string() : std::string(cap);
}

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    case Isa::kAuto: return "auto";
  }
  return "?";
}

bool HasKernel(GgmlType t, Isa isa) {
  const uint32_t id = static_cast<uint32_t>(t);
  if (id >= kGgmlTypeCount) return false;
  switch (isa) {
    case Isa::kScalar: return internal::ScalarTable().fn[id] != nullptr;
    case Isa::kAvx2: return internal::Avx2Table().fn[id] != nullptr;
    case Isa::kAvx512: return internal::Avx512Table().fn[id] != nullptr;
    case Isa::kAuto: return Pick(t, Isa::kAuto) != nullptr;
  }
  return false;
}

bool CanDequantize(GgmlType t) {
  const uint32_t id = static_cast<uint32_t>(t);
  return IsValidGgmlType(id) && internal::ScalarTable().fn[id] != nullptr;
}

namespace {

Status CheckShape(GgmlType t, uint64_t n, uint64_t src_bytes, const char* what) {
  if (!CanDequantize(t)) {
    return Error(std::string("cannot decode tensor type ") + std::string(GgmlTypeName(t)) +
                 ": no float conversion for this type");
  }
  const GgmlTypeInfo* info = GgmlTypeInfoFor(t);
  if (n % info->block_size != 0) {
    return Error(std::string(what) + ": " + std::to_string(n) + " elements is not a multiple of the " +
                 std::string(GgmlTypeName(t)) + " block size " + std::to_string(info->block_size));
  }
  const uint64_t need = GgmlRowBytes(t, n);
  if (src_bytes < need) {
    return Error(std::string(what) + ": " + std::to_string(n) + " " + std::string(GgmlTypeName(t)) +
                     " elements need " + std::to_string(need) + " bytes, got " + std::to_string(src_bytes),
                 ErrorKind::kEOF);
  }
  return Status::OK();
}

}  // namespace

Status DequantizeRow(GgmlType t, std::span<const uint8_t> src, std::span<float> dst, Isa isa) {
  K3_RETURN_IF_ERROR(CheckShape(t, dst.size(), src.size(), "dequantize"));
  const internal::DequantFn fn = Pick(t, isa);
  const int64_t nblocks = static_cast<int64_t>(dst.size() / GgmlTypeInfoFor(t)->block_size);
  if (nblocks > 0) fn(src.data(), dst.data(), nblocks);
  return Status::OK();
}

Status DequantizeParallel(GgmlType t, std::span<const uint8_t> src, std::span<float> dst, int threads, Isa isa) {
  K3_RETURN_IF_ERROR(CheckShape(t, dst.size(), src.size(), "dequantize"));
  const GgmlTypeInfo* info = GgmlTypeInfoFor(t);
  const internal::DequantFn fn = Pick(t, isa);
  const uint64_t nblocks = dst.size() / info->block_size;
  if (nblocks == 0) return Status::OK();
  // Pieces of >= 1 MiB of output: below that, starting a thread costs more
  // than the decoding it takes over.
  constexpr uint64_t kMinPieceFloats = (uint64_t{1} << 20) / sizeof(float);
  const uint64_t min_blocks = std::max<uint64_t>(1, kMinPieceFloats / info->block_size);
  uint64_t want = threads > 0 ? static_cast<uint64_t>(threads) : std::max(1u, std::thread::hardware_concurrency());
  want = std::min<uint64_t>(want, std::max<uint64_t>(1, nblocks / min_blocks));
  auto run = [&](uint64_t b0, uint64_t b1) {
    if (b1 > b0) {
      fn(src.data() + b0 * info->type_size, dst.data() + b0 * info->block_size, static_cast<int64_t>(b1 - b0));
    }
  };
  if (want <= 1) {
    run(0, nblocks);
    return Status::OK();
  }
  const uint64_t per = (nblocks + want - 1) / want;
  // A process that cannot start every thread (a pids or address-space
  // limit) still decodes every piece.
  RunJobsOnThreads(static_cast<unsigned>(want), want,
                   [&](uint64_t k) { run(std::min(nblocks, k * per), std::min(nblocks, (k + 1) * per)); });
  return Status::OK();
}

Result<std::vector<float>> DequantizeRows(GgmlType t, std::span<const uint8_t> bytes, int64_t ne0, uint64_t rows) {
  if (ne0 < 0) return Error("dequantize: negative row length " + std::to_string(ne0));
  const uint64_t n0 = static_cast<uint64_t>(ne0);
  if (rows != 0 && n0 > (uint64_t{1} << 40) / rows) return Error("dequantize: tensor too large to decode at once");
  // Zero rows (a [512, 0] tensor, valid in GGUF) need no bytes at all.
  K3_RETURN_IF_ERROR(CheckShape(t, n0, rows == 0 ? UINT64_MAX : bytes.size(), "dequantize"));
  const uint64_t row_bytes = GgmlRowBytes(t, n0);
  if (bytes.size() < row_bytes * rows) {
    return Error("dequantize: " + std::to_string(rows) + " rows of " + std::to_string(row_bytes) + " bytes need " +
                     std::to_string(row_bytes * rows) + " bytes, got " + std::to_string(bytes.size()),
                 ErrorKind::kEOF);
  }
  std::vector<float> out(n0 * rows);
  const internal::DequantFn fn = Pick(t, Isa::kAuto);
  const int64_t nblocks = static_cast<int64_t>(n0 / GgmlTypeInfoFor(t)->block_size);
  for (uint64_t r = 0; r < rows && nblocks > 0; ++r) fn(bytes.data() + r * row_bytes, out.data() + r * n0, nblocks);
  return out;
}

Result<TensorStats> ComputeStats(GgmlType t, std::span<const uint8_t> bytes, int64_t ne0, uint64_t rows) {
  return ComputeStats(t, bytes, ne0, rows, 0, {});
}

Result<TensorStats> ComputeStats(GgmlType t, std::span<const uint8_t> bytes, int64_t ne0, uint64_t rows,
                                 uint64_t every_bytes, const std::function<void(uint64_t rows_done)>& on_rows) {
  if (ne0 < 0) return Error("stats: negative row length " + std::to_string(ne0));
  const uint64_t n0 = static_cast<uint64_t>(ne0);
  K3_RETURN_IF_ERROR(CheckShape(t, n0, rows == 0 ? UINT64_MAX : bytes.size(), "stats"));
  if (rows == 0) return TensorStats{};  // no row buffer for a row length nothing backs
  const uint64_t row_bytes = GgmlRowBytes(t, n0);
  if (rows != 0 && bytes.size() / rows < row_bytes) {
    return Error("stats: " + std::to_string(rows) + " rows of " + std::to_string(row_bytes) + " bytes need more than " +
                     std::to_string(bytes.size()) + " bytes",
                 ErrorKind::kEOF);
  }
  TensorStats st;
  const internal::DequantFn fn = Pick(t, Isa::kAuto);
  const int64_t nblocks = static_cast<int64_t>(n0 / GgmlTypeInfoFor(t)->block_size);
  std::vector<float> buf(n0);
  double sum = 0;
  uint64_t finite = 0;
  double mn = INFINITY, mx = -INFINITY;
  // Rows between two on_rows calls: at least one, at most every_bytes' worth.
  const uint64_t rows_per_call = std::max<uint64_t>(1, row_bytes > 0 ? every_bytes / row_bytes : rows);
  for (uint64_t r = 0; r < rows && nblocks > 0; ++r) {
    if (on_rows && r > 0 && r % rows_per_call == 0) on_rows(r);
    fn(bytes.data() + r * row_bytes, buf.data(), nblocks);
    double row_sum = 0;
    for (float v : buf) {
      if (std::isnan(v)) {
        ++st.nan_count;
      } else if (std::isinf(v)) {
        ++st.inf_count;
      } else {
        row_sum += v;
        ++finite;
        if (v < mn) mn = v;
        if (v > mx) mx = v;
      }
    }
    sum += row_sum;
  }
  if (on_rows) on_rows(rows);
  st.count = n0 * rows;
  if (finite > 0) {
    st.min = mn;
    st.max = mx;
    st.mean = sum / static_cast<double>(finite);
  }
  return st;
}

}  // namespace k3pack::quant
