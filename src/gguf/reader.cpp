// GGUF header parser. Every length, count and offset is checked against the
// bytes that remain before it is used, mirroring ggml's gguf.cpp limits, so a
// truncated or hostile file yields an error naming the byte offset and rule.
#include <bit>
#include <cstring>
#include <functional>
#include <limits>
#include <unordered_set>

#include "k3pack/gguf.h"
#include "util/file.h"

namespace k3pack::gguf {

namespace {

constexpr uint64_t kMaxStringLength = 1ull << 30;  // GGUF_MAX_STRING_LENGTH
constexpr uint64_t kMaxArrayElements = 1ull << 30;  // GGUF_MAX_ARRAY_ELEMENTS
constexpr size_t kMaxNameBytes = 63;                // GGML_MAX_NAME - 1
constexpr uint32_t kMaxDims = 4;
// Smallest possible encodings, used to bound counts before reserving memory.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;
// Name length, n_dims, type, offset: ggml accepts n_dims == 0 (a one-element
// tensor), which has no extents at all.
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;

uint64_t Pad(uint64_t x, uint64_t n) { return (x + n - 1) / n * n; }

}  // namespace

// Friend of GgufFile: fills its private members while walking the header.
class Parser {
 public:
  Parser(std::shared_ptr<const MappedFile> map, const ReadOptions& opts)
      : map_(std::move(map)), opts_(opts), data_(map_->data()), size_(map_->size()) {}

  Result<std::shared_ptr<const GgufFile>> Run() {
    auto file = std::shared_ptr<GgufFile>(new GgufFile());
    file->map_ = map_;
    K3_RETURN_IF_ERROR(ParseHeader(*file));
    return std::shared_ptr<const GgufFile>(std::move(file));
  }

 private:
  Error Fail(uint64_t at, const std::string& rule) const {
    return Error(map_->path() + ": offset " + std::to_string(at) + ": " + rule);
  }
  uint64_t remaining() const { return size_ - pos_; }

  template <typename T>
  Result<T> Read(const char* what) {
    if (remaining() < sizeof(T)) {
      return Fail(pos_, std::string("file is truncated while reading ") + what + " (need " +
                            std::to_string(sizeof(T)) + " bytes, " + std::to_string(remaining()) + " left)");
    }
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  Result<std::string> ReadString(const char* what) {
    uint64_t at = pos_;
    K3_ASSIGN_OR_RETURN(uint64_t len, Read<uint64_t>(what));
    if (len > kMaxStringLength) {
      return Fail(at, std::string(what) + " length " + std::to_string(len) + " exceeds the 1 GiB string limit");
    }
    if (len > remaining()) {
      return Fail(at, std::string(what) + " length " + std::to_string(len) + " exceeds the " +
                          std::to_string(remaining()) + " bytes left in the file");
    }
    std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(len));
    pos_ += len;
    return s;
  }

  Status ReadScalar(ValueType t, Value& v, const std::string& key) {
    switch (t) {
      case ValueType::kUint8: { K3_ASSIGN_OR_RETURN(v.u64, Read<uint8_t>("UINT8 value")); break; }
      case ValueType::kInt8: { K3_ASSIGN_OR_RETURN(v.i64, Read<int8_t>("INT8 value")); break; }
      case ValueType::kUint16: { K3_ASSIGN_OR_RETURN(v.u64, Read<uint16_t>("UINT16 value")); break; }
      case ValueType::kInt16: { K3_ASSIGN_OR_RETURN(v.i64, Read<int16_t>("INT16 value")); break; }
      case ValueType::kUint32: { K3_ASSIGN_OR_RETURN(v.u64, Read<uint32_t>("UINT32 value")); break; }
      case ValueType::kInt32: { K3_ASSIGN_OR_RETURN(v.i64, Read<int32_t>("INT32 value")); break; }
      case ValueType::kUint64: { K3_ASSIGN_OR_RETURN(v.u64, Read<uint64_t>("UINT64 value")); break; }
      case ValueType::kInt64: { K3_ASSIGN_OR_RETURN(v.i64, Read<int64_t>("INT64 value")); break; }
      case ValueType::kFloat32: { K3_ASSIGN_OR_RETURN(float f, Read<float>("FLOAT32 value")); v.f64 = f; break; }
      case ValueType::kFloat64: { K3_ASSIGN_OR_RETURN(v.f64, Read<double>("FLOAT64 value")); break; }
      case ValueType::kBool: { K3_ASSIGN_OR_RETURN(uint8_t b, Read<uint8_t>("BOOL value")); v.u64 = b != 0; break; }
      case ValueType::kString: { K3_ASSIGN_OR_RETURN(v.str, ReadString(("value of key '" + key + "'").c_str())); break; }
      case ValueType::kArray: break;  // handled by caller
    }
    return Status::OK();
  }

  Status ReadValue(Value& v, const std::string& key, uint64_t type_at) {
    K3_ASSIGN_OR_RETURN(int32_t raw_type, Read<int32_t>("value type"));
    if (raw_type < 0 || raw_type > static_cast<int32_t>(ValueType::kFloat64)) {
      return Fail(type_at, "key '" + key + "' has invalid value type " + std::to_string(raw_type) + " (valid: 0..12)");
    }
    v.type = static_cast<ValueType>(raw_type);
    if (v.type != ValueType::kArray) return ReadScalar(v.type, v, key);

    uint64_t at = pos_;
    K3_ASSIGN_OR_RETURN(int32_t raw_elem, Read<int32_t>("array element type"));
    if (raw_elem < 0 || raw_elem > static_cast<int32_t>(ValueType::kFloat64) ||
        raw_elem == static_cast<int32_t>(ValueType::kArray)) {
      return Fail(at, "key '" + key + "' has invalid array element type " + std::to_string(raw_elem) +
                          (raw_elem == static_cast<int32_t>(ValueType::kArray)
                               ? " (nested arrays are not allowed)"
                               : " (valid types are 0..12)"));
    }
    v.array_type = static_cast<ValueType>(raw_elem);
    at = pos_;
    K3_ASSIGN_OR_RETURN(v.array_count, Read<uint64_t>("array length"));
    if (v.array_count > kMaxArrayElements) {
      return Fail(at, "key '" + key + "' array has " + std::to_string(v.array_count) +
                          " elements, above the limit of 1073741824");
    }
    const size_t elem = v.array_type == ValueType::kString ? 8 : ValueTypeSize(v.array_type);
    if (v.array_count * elem > remaining()) {
      return Fail(at, "key '" + key + "' array of " + std::to_string(v.array_count) + " elements needs at least " +
                          std::to_string(v.array_count * elem) + " bytes, only " + std::to_string(remaining()) +
                          " left");
    }
    if (v.array_type == ValueType::kString) {
      v.strings.reserve(static_cast<size_t>(v.array_count));
      for (uint64_t i = 0; i < v.array_count; ++i) {
        K3_ASSIGN_OR_RETURN(std::string s, ReadString(("array element of key '" + key + "'").c_str()));
        v.strings.push_back(std::move(s));
      }
    } else {
      v.array_data = data_ + pos_;
      pos_ += v.array_count * elem;
    }
    return Status::OK();
  }

  Status ParseHeader(GgufFile& f) {
    if (size_ < 4 || std::memcmp(data_, "GGUF", 4) != 0) {
      return Fail(0, "not a GGUF file (magic is not \"GGUF\")");
    }
    pos_ = 4;
    K3_ASSIGN_OR_RETURN(uint32_t version, Read<uint32_t>("version"));
    // gguf.cpp's order: 0 is simply bad, other values with zero low bits are
    // another byte order.
    if (version == 0) return Fail(4, "bad GGUF version 0");
    if ((version & 0xFFFF) == 0) {
      return Fail(4, "GGUF version field " + std::to_string(version) +
                         " looks byte-swapped: big-endian GGUF files are not supported (convert it to little-endian)");
    }
    if (version == 1) return Fail(4, "GGUF v1 is no longer supported (re-convert the model)");
    if (version < 2 || version > 3) return Fail(4, "unsupported GGUF version " + std::to_string(version) + " (supported: 2, 3)");
    f.version_ = version;

    K3_ASSIGN_OR_RETURN(int64_t n_tensors, Read<int64_t>("tensor count"));
    K3_ASSIGN_OR_RETURN(int64_t n_kv, Read<int64_t>("metadata key/value count"));
    if (n_tensors < 0 || static_cast<uint64_t>(n_tensors) > remaining() / kMinTensorInfoBytes) {
      return Fail(8, "tensor count " + std::to_string(n_tensors) + " is negative or cannot fit in the file");
    }
    if (n_kv < 0 || static_cast<uint64_t>(n_kv) > remaining() / kMinKvBytes) {
      return Fail(16, "metadata key/value count " + std::to_string(n_kv) + " is negative or cannot fit in the file");
    }

    std::unordered_set<std::string> keys;
    f.kv_.reserve(static_cast<size_t>(n_kv));
    for (int64_t i = 0; i < n_kv; ++i) {
      KeyValue kv;
      kv.offset = pos_;
      K3_ASSIGN_OR_RETURN(kv.key, ReadString("metadata key"));
      if (kv.key.empty()) return Fail(kv.offset, "metadata key #" + std::to_string(i) + " is empty");
      if (!keys.insert(kv.key).second) return Fail(kv.offset, "duplicate metadata key '" + kv.key + "'");
      K3_RETURN_IF_ERROR(ReadValue(kv.value, kv.key, pos_));
      if (kv.key == "general.alignment") {
        if (kv.value.type != ValueType::kUint32) {
          return Fail(kv.offset, "general.alignment must be UINT32, got " + std::string(ValueTypeName(kv.value.type)));
        }
        if (kv.value.u64 == 0 || !std::has_single_bit(kv.value.u64)) {
          return Fail(kv.offset, "general.alignment must be a nonzero power of two, got " + std::to_string(kv.value.u64));
        }
        f.alignment_ = static_cast<uint32_t>(kv.value.u64);
      }
      f.kv_.push_back(std::move(kv));
    }

    std::unordered_set<std::string> names;
    f.tensors_.reserve(static_cast<size_t>(n_tensors));
    for (int64_t i = 0; i < n_tensors; ++i) {
      TensorInfo t;
      t.info_offset = pos_;
      K3_ASSIGN_OR_RETURN(t.name, ReadString("tensor name"));
      if (t.name.size() > kMaxNameBytes) {
        return Fail(t.info_offset, "tensor name '" + t.name + "' is " + std::to_string(t.name.size()) +
                                       " bytes; ggml allows at most 63");
      }
      if (!names.insert(t.name).second) return Fail(t.info_offset, "duplicate tensor name '" + t.name + "'");
      K3_RETURN_IF_ERROR(ParseTensorShape(t));
      f.tensors_.push_back(std::move(t));
    }

    f.data_offset_ = Pad(pos_, f.alignment_);
    for (size_t i = 0; i < f.tensors_.size(); ++i) f.by_name_.emplace(f.tensors_[i].name, i);
    return PlaceTensors(f);
  }

  Status ParseTensorShape(TensorInfo& t) {
    uint64_t at = pos_;
    K3_ASSIGN_OR_RETURN(t.n_dims, Read<uint32_t>("tensor n_dims"));
    if (t.n_dims > kMaxDims) {
      return Fail(at, "tensor '" + t.name + "' has " + std::to_string(t.n_dims) + " dimensions; at most 4 allowed");
    }
    for (uint32_t d = 0; d < t.n_dims; ++d) {
      at = pos_;
      K3_ASSIGN_OR_RETURN(t.ne[d], Read<int64_t>("tensor dimension"));
      if (t.ne[d] < 0) return Fail(at, "tensor '" + t.name + "' has negative ne[" + std::to_string(d) + "]");
    }
    if (ElementCountOverflows(t.ne)) {
      return Fail(at, "tensor '" + t.name + "' element count overflows int64");
    }
    at = pos_;
    K3_ASSIGN_OR_RETURN(int32_t raw_type, Read<int32_t>("tensor type"));
    const GgmlTypeInfo* info = raw_type >= 0 ? GgmlTypeInfoFor(static_cast<uint32_t>(raw_type)) : nullptr;
    if (info == nullptr) {
      return Fail(at, "tensor '" + t.name + "' has unknown ggml type " + std::to_string(raw_type) + " (valid: 0..42)");
    }
    if (info->block_size == 0) {
      return Fail(at, "tensor '" + t.name + "' has ggml type " + std::to_string(raw_type) +
                          ", which was removed from the GGUF format");
    }
    t.type = static_cast<GgmlType>(raw_type);
    if (t.ne[0] % info->block_size != 0) {
      return Fail(at, "tensor '" + t.name + "' ne[0]=" + std::to_string(t.ne[0]) + " is not a multiple of the " +
                          std::string(info->name) + " block size " + std::to_string(info->block_size));
    }
    const uint64_t blocks = static_cast<uint64_t>(t.n_elements()) / info->block_size;
    if (blocks > std::numeric_limits<uint64_t>::max() / info->type_size) {
      return Fail(at, "tensor '" + t.name + "' byte size overflows");
    }
    t.nbytes = blocks * info->type_size;
    K3_ASSIGN_OR_RETURN(t.offset, Read<uint64_t>("tensor data offset"));
    return Status::OK();
  }

  Status PlaceTensors(GgufFile& f) {
    uint64_t expected = 0;
    for (TensorInfo& t : f.tensors_) {
      const uint64_t at = t.info_offset;
      if (opts_.require_packed_offsets && t.offset != expected) {
        return Fail(at, "tensor '" + t.name + "' has offset " + std::to_string(t.offset) + ", expected " +
                            std::to_string(expected) + " (tensors must be packed in order, each padded to " +
                            std::to_string(f.alignment_) + " bytes)");
      }
      if (t.offset % f.alignment_ != 0) {
        return Fail(at, "tensor '" + t.name + "' offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                            std::to_string(f.alignment_));
      }
      const uint64_t padded = Pad(t.nbytes, f.alignment_);
      if (padded < t.nbytes || expected + padded < expected) {
        return Fail(at, "tensor '" + t.name + "' data size overflows (" + std::to_string(t.nbytes) + " bytes padded to " +
                            std::to_string(f.alignment_) + ", after " + std::to_string(expected) + " bytes of data)");
      }
      expected += padded;
      if (f.data_offset_ > size_ || t.offset > size_ - f.data_offset_ || t.nbytes > size_ - f.data_offset_ - t.offset) {
        return Fail(at, "tensor '" + t.name + "' data [" + std::to_string(f.data_offset_ + t.offset) + ", +" +
                            std::to_string(t.nbytes) + ") is not within the file (size " + std::to_string(size_) +
                            "); the file may be truncated");
      }
      t.data_offset = f.data_offset_ + t.offset;
    }
    return Status::OK();
  }

  std::shared_ptr<const MappedFile> map_;
  ReadOptions opts_;
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

Result<std::shared_ptr<const GgufFile>> GgufFile::Parse(std::shared_ptr<const MappedFile> map, const ReadOptions& opts) {
  if (!map) return Error("GgufFile::Parse: no mapping given (null)");
  return Parser(std::move(map), opts).Run();
}

Result<std::shared_ptr<const GgufFile>> GgufFile::Open(const std::string& path, const ReadOptions& opts) {
  K3_ASSIGN_OR_RETURN(auto map, MappedFile::Open(path));
  return Parse(std::move(map), opts);
}

const std::string& GgufFile::path() const { return map_->path(); }
uint64_t GgufFile::file_size() const { return map_->size(); }

const Value* GgufFile::Find(std::string_view key) const {
  for (const KeyValue& kv : kv_) {
    if (kv.key == key) return &kv.value;
  }
  return nullptr;
}

const TensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

std::span<const uint8_t> GgufFile::TensorData(const TensorInfo& t) const {
  // Another file's TensorInfo (say, of another shard of the set) would give a
  // view of the wrong bytes, or past the end of this mapping: only this
  // file's own tensors (or copies of them) have a view here.
  const std::less<const TensorInfo*> before;  // a total order over unrelated pointers too
  const bool listed = !before(&t, tensors_.data()) && before(&t, tensors_.data() + tensors_.size());
  if (!listed) {
    const TensorInfo* own = FindTensor(t.name);
    if (!own || own->data_offset != t.data_offset || own->nbytes != t.nbytes) return {};
  }
  return {map_->data() + t.data_offset, static_cast<size_t>(t.nbytes)};
}

std::string GgufFile::architecture() const {
  const Value* v = Find("general.architecture");
  return v && v->type == ValueType::kString ? v->str : std::string();
}

}  // namespace k3pack::gguf
