// Activation quantization (ggml's reference Q8_K / Q8_0 quantizers) and the
// public dot-product / mat-vec entry points.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>

#include "k3pack/quant.h"
#include "quant/dot_kernels.h"
#include "quant/fp.h"
#include "quant/kernels.h"
#include "util/threads.h"

namespace k3pack::quant {
namespace {

float DotF32(const float* a, const float* b, int64_t n) {
  switch (DetectedIsa()) {
    case Isa::kAvx512: return internal::DotF32Avx512(a, b, n);
    case Isa::kAvx2: return internal::DotF32Avx2(a, b, n);
    default: return internal::DotF32Scalar(a, b, n);
  }
}

// ggml's nearest_int, exactly: adding 1.5 * 2^23 rounds to an integer (half
// to even) in the float adder, and the low mantissa bits hold it. That equals
// nearbyint for |v| <= 2^22 (checked on every such float) and is defined for
// every input, where a float-to-int cast is undefined behaviour for a NaN or
// infinity: those reach here from a NaN or infinite activation element, or
// from a block whose largest magnitude is so small that -127/max overflows.
// They get ggml's values (0 once stored as int8), not whatever the cast gives.
inline int NearestInt(float v) {
  const float shifted = v + 12582912.0f;
  return static_cast<int>(FloatToBits(shifted) & 0x007FFFFFu) - 0x00400000;
}

// ggml's `qs[j] = roundf(x * id)` (round half away from zero, stored to
// int8). A finite x * id is below 2^8 in magnitude (at most 127 * 1.5 when
// d = amax/127 is a float subnormal with few bits); a NaN or infinity (a NaN
// element, an infinite one times id = 0, or id = 1/d overflowed) has no
// integer value, and converting it is undefined behaviour: it is stored as 0,
// which is what x86 builds of ggml store (the low byte of cvttss2si's
// 0x80000000). Finite values keep the modular int8 store of the C cast.
inline int8_t RoundToQ8(float v) {
  if (!std::isfinite(v)) return 0;
  return static_cast<int8_t>(static_cast<int>(std::round(v)));
}

}  // namespace

namespace internal {
float DotF32Scalar(const float* a, const float* b, int64_t n) {
  float s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}
}  // namespace internal

void QuantizeRowQ8K(std::span<const float> x, uint8_t* out) {
  const size_t nb = x.size() / 256;
  for (size_t i = 0; i < nb; ++i, out += internal::kQ8KBytes) {
    const float* xb = x.data() + 256 * i;
    float amax = 0, max = 0;
    for (int j = 0; j < 256; ++j) {
      const float ax = std::fabs(xb[j]);
      if (ax > amax) {
        amax = ax;
        max = xb[j];
      }
    }
    if (amax == 0) {
      std::memset(out, 0, internal::kQ8KBytes);
      continue;
    }
    const float iscale = -127.f / max;
    int8_t qs[256];
    for (int j = 0; j < 256; ++j) qs[j] = static_cast<int8_t>(std::min(127, NearestInt(iscale * xb[j])));
    int16_t bsums[16];
    for (int j = 0; j < 16; ++j) {
      int s = 0;
      for (int k = 0; k < 16; ++k) s += qs[16 * j + k];
      bsums[j] = static_cast<int16_t>(s);
    }
    const float d = 1 / iscale;
    std::memcpy(out, &d, 4);
    std::memcpy(out + 4, qs, 256);
    std::memcpy(out + 260, bsums, 32);
  }
}

void QuantizeRowQ8_0(std::span<const float> x, uint8_t* out) {
  const size_t nb = x.size() / 32;
  for (size_t i = 0; i < nb; ++i, out += internal::kQ8_0Bytes) {
    const float* xb = x.data() + 32 * i;
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / ((1 << 7) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    const uint16_t dh = Fp32ToFp16(d);
    std::memcpy(out, &dh, 2);
    for (int j = 0; j < 32; ++j) out[2 + j] = static_cast<uint8_t>(RoundToQ8(xb[j] * id));
  }
}

GgmlType ActivationTypeFor(GgmlType weight) {
  if (!internal::IntegerDotFor(weight)) return GgmlType::F32;
  switch (weight) {
    case GgmlType::Q8_0: case GgmlType::Q4_0: case GgmlType::IQ4_NL: case GgmlType::MXFP4:
      return GgmlType::Q8_0;
    default:
      return GgmlType::Q8_K;
  }
}

bool HasIntegerDot(GgmlType weight) { return internal::IntegerDotFor(weight) != nullptr; }

Result<PreparedActivation> PrepareActivation(GgmlType weight_type, std::span<const float> x, bool allow_integer) {
  if (!CanDequantize(weight_type)) {
    return Error("dot: no decoder for weight type " + std::string(GgmlTypeName(weight_type)));
  }
  const uint32_t blk = GgmlTypeInfoFor(weight_type)->block_size;
  if (x.size() % blk != 0) {
    return Error("dot: activation length " + std::to_string(x.size()) + " is not a multiple of the " +
                 std::string(GgmlTypeName(weight_type)) + " block size " + std::to_string(blk));
  }
  PreparedActivation p;
  p.weight_type = weight_type;
  p.act_type = allow_integer ? ActivationTypeFor(weight_type) : GgmlType::F32;
  p.n = static_cast<int64_t>(x.size());
  p.f.assign(x.begin(), x.end());
  if (p.act_type == GgmlType::Q8_K) {
    p.q.resize(x.size() / 256 * internal::kQ8KBytes);
    QuantizeRowQ8K(x, p.q.data());
  } else if (p.act_type == GgmlType::Q8_0) {
    p.q.resize(x.size() / 32 * internal::kQ8_0Bytes);
    QuantizeRowQ8_0(x, p.q.data());
  }
  return p;
}

namespace {

// Dot without argument checks; `row` holds x.n elements of x.weight_type.
float DotUnchecked(const uint8_t* row, const PreparedActivation& x) {
  if (auto fn = x.act_type == GgmlType::F32 ? nullptr : internal::IntegerDotFor(x.weight_type)) {
    const int64_t per = x.act_type == GgmlType::Q8_K ? 256 : 32;
    return fn(row, x.q.data(), x.n / per);
  }
  if (x.weight_type == GgmlType::F32) {
    // A row is dotted in place when it is 4-byte aligned. A GGUF with
    // general.alignment 1 may put an F32 tensor at any offset, and a float
    // load from a misaligned address is undefined behaviour, so such a row is
    // copied first (the same DotF32 over the same values: the same bits).
    if (reinterpret_cast<uintptr_t>(row) % alignof(float) == 0) {
      return DotF32(reinterpret_cast<const float*>(row), x.f.data(), x.n);
    }
    thread_local std::vector<float> copy;
    copy.resize(static_cast<size_t>(x.n));
    std::memcpy(copy.data(), row, static_cast<size_t>(x.n) * sizeof(float));
    return DotF32(copy.data(), x.f.data(), x.n);
  }
  // Float path: decode a chunk of whole blocks at a time and dot it.
  const GgmlTypeInfo* info = GgmlTypeInfoFor(x.weight_type);
  constexpr int64_t kChunk = 4096;
  const int64_t chunk = std::max<int64_t>(info->block_size, kChunk / info->block_size * info->block_size);
  thread_local std::vector<float> buf;
  buf.resize(static_cast<size_t>(chunk));
  float acc = 0;
  for (int64_t off = 0; off < x.n; off += chunk) {
    const int64_t len = std::min(chunk, x.n - off);
    const uint8_t* src = row + static_cast<uint64_t>(off) / info->block_size * info->type_size;
    (void)DequantizeRow(x.weight_type, {src, GgmlRowBytes(x.weight_type, static_cast<uint64_t>(len))},
                        {buf.data(), static_cast<size_t>(len)});
    acc += DotF32(buf.data(), x.f.data() + off, len);
  }
  return acc;
}

}  // namespace

Result<float> DotRow(std::span<const uint8_t> row, const PreparedActivation& x) {
  const uint64_t need = GgmlRowBytes(x.weight_type, static_cast<uint64_t>(x.n));
  if (row.size() < need) {
    return Error("dot: row of " + std::to_string(x.n) + " " + std::string(GgmlTypeName(x.weight_type)) +
                 " elements needs " + std::to_string(need) + " bytes, got " + std::to_string(row.size()));
  }
  return DotUnchecked(row.data(), x);
}

Result<double> DotRowReference(GgmlType t, std::span<const uint8_t> row, std::span<const float> x) {
  std::vector<float> w(x.size());
  K3_RETURN_IF_ERROR(DequantizeRow(t, row, w, Isa::kScalar));
  double acc = 0;
  for (size_t i = 0; i < x.size(); ++i) acc += static_cast<double>(w[i]) * x[i];
  return acc;
}

Status MatVec(std::span<const uint8_t> bytes, uint64_t rows, const PreparedActivation& x, std::span<float> y,
              int threads) {
  const uint64_t row_bytes = GgmlRowBytes(x.weight_type, static_cast<uint64_t>(x.n));
  if (y.size() < rows) return Error("matvec: output has " + std::to_string(y.size()) + " slots for " +
                                    std::to_string(rows) + " rows");
  if (rows != 0 && bytes.size() / rows < row_bytes) {
    return Error("matvec: " + std::to_string(rows) + " rows of " + std::to_string(row_bytes) +
                 " bytes do not fit in " + std::to_string(bytes.size()) + " bytes");
  }
  auto run = [&](uint64_t r0, uint64_t r1) {
    for (uint64_t r = r0; r < r1; ++r) y[r] = DotUnchecked(bytes.data() + r * row_bytes, x);
  };
  const uint64_t nt = std::clamp<uint64_t>(static_cast<uint64_t>(std::max(threads, 1)), 1, std::max<uint64_t>(rows, 1));
  if (nt == 1) {
    run(0, rows);
    return Status::OK();
  }
  // A process that cannot start every thread (a pids or address-space
  // limit) still computes every row.
  const uint64_t per = (rows + nt - 1) / nt;
  RunJobsOnThreads(static_cast<unsigned>(nt), nt,
                   [&](uint64_t t) { run(std::min(rows, t * per), std::min(rows, t * per + per)); });
  return Status::OK();
}

}  // namespace k3pack::quant
