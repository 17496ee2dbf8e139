#include <cstring>
#include <limits>

#include "k3pack/gguf.h"

namespace k3pack::gguf {

const char* ValueTypeName(ValueType t) {
  static const char* kNames[] = {"UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32",
                                 "BOOL", "STRING", "ARRAY", "UINT64", "INT64", "FLOAT64"};
  auto i = static_cast<uint32_t>(t);
  return i < 13 ? kNames[i] : "INVALID";
}

size_t ValueTypeSize(ValueType t) {
  switch (t) {
    case ValueType::kUint8: case ValueType::kInt8: case ValueType::kBool: return 1;
    case ValueType::kUint16: case ValueType::kInt16: return 2;
    case ValueType::kUint32: case ValueType::kInt32: case ValueType::kFloat32: return 4;
    case ValueType::kUint64: case ValueType::kInt64: case ValueType::kFloat64: return 8;
    case ValueType::kString: case ValueType::kArray: return 0;
  }
  return 0;
}

bool Value::is_integer() const {
  switch (type) {
    case ValueType::kUint8: case ValueType::kInt8: case ValueType::kUint16: case ValueType::kInt16:
    case ValueType::kUint32: case ValueType::kInt32: case ValueType::kUint64: case ValueType::kInt64:
      return true;
    default:
      return false;
  }
}

static bool IsSigned(ValueType t) {
  return t == ValueType::kInt8 || t == ValueType::kInt16 || t == ValueType::kInt32 || t == ValueType::kInt64;
}

std::optional<int64_t> Value::AsInt() const {
  if (!is_integer()) return std::nullopt;
  if (IsSigned(type)) return i64;
  if (u64 > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
  return static_cast<int64_t>(u64);
}

std::optional<double> Value::AsFloat() const {
  if (type == ValueType::kFloat32 || type == ValueType::kFloat64) return f64;
  if (auto i = AsInt()) return static_cast<double>(*i);
  return std::nullopt;
}

std::optional<std::string> Value::AsString() const {
  if (type == ValueType::kString) return str;
  return std::nullopt;
}

template <typename T>
static T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

double Value::ArrayFloat(uint64_t i) const {
  const uint8_t* p = array_data + i * ValueTypeSize(array_type);
  switch (array_type) {
    case ValueType::kFloat32: return Load<float>(p);
    case ValueType::kFloat64: return Load<double>(p);
    case ValueType::kUint64: return static_cast<double>(Load<uint64_t>(p));
    default: return static_cast<double>(ArrayInt(i));
  }
}

// Float elements read as integers truncate toward zero and saturate (NaN
// reads 0): a plain cast of an out-of-range float is undefined behaviour
// (found by gguf_reader_fuzz, input regression-float-array-to-int).
static int64_t SaturatingInt(double d) {
  if (d != d) return 0;
  if (d >= 9223372036854775808.0) return std::numeric_limits<int64_t>::max();
  if (d < -9223372036854775808.0) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(d);
}

int64_t Value::ArrayInt(uint64_t i) const {
  const uint8_t* p = array_data + i * ValueTypeSize(array_type);
  switch (array_type) {
    case ValueType::kUint8: case ValueType::kBool: return Load<uint8_t>(p);
    case ValueType::kInt8: return Load<int8_t>(p);
    case ValueType::kUint16: return Load<uint16_t>(p);
    case ValueType::kInt16: return Load<int16_t>(p);
    case ValueType::kUint32: return Load<uint32_t>(p);
    case ValueType::kInt32: return Load<int32_t>(p);
    case ValueType::kUint64: {
      const uint64_t u = Load<uint64_t>(p);
      return u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? std::numeric_limits<int64_t>::max()
                                                                               : static_cast<int64_t>(u);
    }
    case ValueType::kInt64: return Load<int64_t>(p);
    case ValueType::kFloat32: return SaturatingInt(Load<float>(p));
    case ValueType::kFloat64: return SaturatingInt(Load<double>(p));
    default: return 0;
  }
}

uint64_t Value::ArrayUint64(uint64_t i) const { return Load<uint64_t>(array_data + i * sizeof(uint64_t)); }

}  // namespace k3pack::gguf
