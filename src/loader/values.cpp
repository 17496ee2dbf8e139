// Element types, gguf-py view shapes and the value transforms of the
// non-expert stream (A_log, ones, Python shape reprs).
#include "loader/values.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace k3pack::loader {

const char* DTypeName(DType d) {
  switch (d) {
    case DType::kUint8: return "uint8";
    case DType::kInt8: return "int8";
    case DType::kInt16: return "int16";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
  }
  return "?";
}

size_t DTypeSize(DType d) {
  switch (d) {
    case DType::kUint8: case DType::kInt8: return 1;
    case DType::kInt16: case DType::kFloat16: case DType::kBFloat16: return 2;
    case DType::kInt32: case DType::kFloat32: return 4;
    case DType::kInt64: case DType::kFloat64: return 8;
  }
  return 1;
}

const char* DTypeNumpyStr(DType d) {
  switch (d) {
    case DType::kUint8: return "|u1";
    case DType::kInt8: return "|i1";
    case DType::kInt16: return "<i2";
    case DType::kInt32: return "<i4";
    case DType::kInt64: return "<i8";
    case DType::kFloat16: return "<f2";
    case DType::kBFloat16: return "<u2";
    case DType::kFloat32: return "<f4";
    case DType::kFloat64: return "<f8";
  }
  return "|u1";
}

const char* TensorKindName(TensorKind k) {
  switch (k) {
    case TensorKind::kPlain: return "plain";
    case TensorKind::kQweightType: return "qweight_type";
    case TensorKind::kQweight: return "qweight";
    case TensorKind::kALog: return "a_log";
    case TensorKind::kResidualProjection: return "residual_projection";
    case TensorKind::kResidualNorm: return "residual_norm";
  }
  return "?";
}

int64_t NamedTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string PyTupleRepr(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

ViewType GgufPyView(const gguf::TensorInfo& t, bool sglang_compat) {
  ViewType v;
  std::vector<int64_t> rev(t.ne.rbegin() + (4 - t.n_dims), t.ne.rend());  // reversed ne, n_dims entries
  auto element = [&](DType d) {
    v.dtype = d;
    v.shape = rev;
  };
  switch (t.type) {
    case GgmlType::F32: element(DType::kFloat32); return v;
    case GgmlType::F16: element(DType::kFloat16); return v;
    case GgmlType::F64: element(DType::kFloat64); return v;
    case GgmlType::I8: element(DType::kInt8); return v;
    case GgmlType::I16: element(DType::kInt16); return v;
    case GgmlType::I32: element(DType::kInt32); return v;
    case GgmlType::I64: element(DType::kInt64); return v;
    case GgmlType::BF16:
      if (!sglang_compat) {
        element(DType::kBFloat16);
        return v;
      }
      break;  // gguf-py: raw bytes
    default: break;
  }
  // gguf-py's quant_shape_to_byte_shape: (*reversed(ne)[:-1], row bytes).
  v.dtype = DType::kUint8;
  v.shape = rev;
  if (v.shape.empty()) v.shape.push_back(0);
  v.shape.back() = static_cast<int64_t>(t.row_bytes());
  return v;
}

namespace {

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400) == 0);
      mant &= 0x3ff;
      bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round-to-nearest-even float -> half (as torch/numpy do).
uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  x &= 0x7fffffff;
  if (x >= 0x7f800000u) return sign | (x > 0x7f800000u ? 0x7e00 : 0x7c00);
  if (x >= 0x477ff000u) return sign | 0x7c00;  // rounds to >= 65520: inf
  if (x < 0x38800000u) {                       // below the smallest normal half
    if (x < 0x33000000u) return sign;          // < 2^-25: rounds to 0
    const uint32_t e = x >> 23;
    const uint32_t m = (x & 0x7fffff) | 0x800000;
    const uint32_t shift = 126 - e;  // 14..24
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) ++r;
    return sign | static_cast<uint16_t>(r);
  }
  uint32_t r = x + 0xfff + ((x >> 13) & 1);  // round mantissa to 10 bits
  r -= 0x38000000u;                          // rebias 127 -> 15 (112 << 23)
  return sign | static_cast<uint16_t>(r >> 13);
}

float BFloatToFloat(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToBFloat(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet NaN
  x += 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

double LoadAsDouble(DType d, const uint8_t* p) {
  switch (d) {
    case DType::kFloat32: { float f; std::memcpy(&f, p, 4); return f; }
    case DType::kFloat64: { double f; std::memcpy(&f, p, 8); return f; }
    case DType::kFloat16: { uint16_t h; std::memcpy(&h, p, 2); return HalfToFloat(h); }
    case DType::kBFloat16: { uint16_t h; std::memcpy(&h, p, 2); return BFloatToFloat(h); }
    default: return 0;
  }
}

// double -> half rounded once. Through a float rounded to nearest, a double
// just off a half's midpoint can land on the midpoint and then tie to even
// the wrong way (log(0.005340576171875) does). Rounding the float to odd
// instead (toward zero, last bit set when inexact) keeps it on the correct
// side of every midpoint, since a float has 13 more bits than a half.
uint16_t DoubleToHalf(double v) {
  if (std::isnan(v)) return FloatToHalf(static_cast<float>(v));
  if (std::fabs(v) >= 65520.0) return std::signbit(v) ? 0xfc00 : 0x7c00;  // rounds to infinity
  float f = static_cast<float>(v);
  if (static_cast<double>(f) != v) {
    if (std::fabs(static_cast<double>(f)) > std::fabs(v)) f = std::nextafter(f, 0.0f);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    bits |= 1;
    std::memcpy(&f, &bits, 4);
  }
  return FloatToHalf(f);
}

void StoreFromDouble(DType d, double v, uint8_t* p) {
  switch (d) {
    case DType::kFloat32: { float f = static_cast<float>(v); std::memcpy(p, &f, 4); break; }
    case DType::kFloat64: std::memcpy(p, &v, 8); break;
    case DType::kFloat16: { uint16_t h = DoubleToHalf(v); std::memcpy(p, &h, 2); break; }
    case DType::kBFloat16: { uint16_t h = FloatToBFloat(static_cast<float>(v)); std::memcpy(p, &h, 2); break; }
    default: break;
  }
}

}  // namespace

bool IsFloatDType(DType d) {
  return d == DType::kFloat16 || d == DType::kBFloat16 || d == DType::kFloat32 || d == DType::kFloat64;
}

uint16_t FloatToHalfBits(float f) { return FloatToHalf(f); }
float HalfBitsToFloat(uint16_t h) { return HalfToFloat(h); }
uint16_t FloatToBFloatBits(float f) { return FloatToBFloat(f); }
float BFloatBitsToFloat(uint16_t b) { return BFloatToFloat(b); }

Result<std::vector<uint8_t>> ALogFromSsmA(DType dtype, std::span<const uint8_t> values) {
  const Error not_finite("Kimi-K3 GGUF ssm_a must contain finite floating values");
  if (!IsFloatDType(dtype)) return not_finite;
  const size_t es = DTypeSize(dtype);
  const size_t n = values.size() / es;
  // torch order: is_floating_point() and isfinite(raw).all() over every
  // element first, then all(raw < 0).
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(LoadAsDouble(dtype, values.data() + i * es))) return not_finite;
  }
  for (size_t i = 0; i < n; ++i) {
    if (!(LoadAsDouble(dtype, values.data() + i * es) < 0)) {
      return Error("Kimi-K3 GGUF ssm_a must contain only -exp(A_log) values");
    }
  }
  std::vector<uint8_t> out(n * es);
  for (size_t i = 0; i < n; ++i) {
    // In double, then rounded once to the source dtype (float32 stays
    // float32, float16 stays float16: torch.log keeps the dtype).
    const double x = LoadAsDouble(dtype, values.data() + i * es);
    StoreFromDouble(dtype, std::log(-x), out.data() + i * es);
  }
  return out;
}

std::vector<uint8_t> OnesLike(DType dtype, size_t count) {
  const size_t es = DTypeSize(dtype);
  std::vector<uint8_t> out(count * es);
  uint8_t one[8] = {};
  switch (dtype) {
    case DType::kFloat16: { uint16_t h = 0x3c00; std::memcpy(one, &h, 2); break; }
    case DType::kBFloat16: { uint16_t h = 0x3f80; std::memcpy(one, &h, 2); break; }
    case DType::kFloat32: { float f = 1.0f; std::memcpy(one, &f, 4); break; }
    case DType::kFloat64: { double f = 1.0; std::memcpy(one, &f, 8); break; }
    default: one[0] = 1; break;  // little-endian integer 1 of any width
  }
  for (size_t i = 0; i < count; ++i) std::memcpy(out.data() + i * es, one, es);
  return out;
}

}  // namespace k3pack::loader
