// Strict, zero-copy GGUF reading and writing (single files and split shard sets).
//
// GgufFile memory-maps a file, parses the header with every limit of ggml's
// C reader enforced, and hands out tensor bytes as views into the mapping.
// Each rejection names the file, the byte offset and the rule broken.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "k3pack/error.h"
#include "k3pack/ggml_types.h"

namespace k3pack {
class MappedFile;

namespace gguf {

enum class ValueType : uint32_t {
  kUint8 = 0, kInt8 = 1, kUint16 = 2, kInt16 = 3, kUint32 = 4, kInt32 = 5,
  kFloat32 = 6, kBool = 7, kString = 8, kArray = 9, kUint64 = 10, kInt64 = 11,
  kFloat64 = 12,
};
const char* ValueTypeName(ValueType t);          // "UINT8", ..., "FLOAT64"
size_t ValueTypeSize(ValueType t);               // 0 for STRING / ARRAY

// One metadata value. Scalars are decoded; numeric arrays stay a view into
// the file mapping (little-endian, `array_count` elements of `array_type`);
// string arrays are decoded into `strings`.
struct Value {
  ValueType type = ValueType::kUint8;
  // scalar payloads (only the one matching `type` is meaningful)
  uint64_t u64 = 0;    // all unsigned ints and bool
  int64_t i64 = 0;     // all signed ints
  double f64 = 0;      // FLOAT32 / FLOAT64
  std::string str;     // STRING
  // arrays
  ValueType array_type = ValueType::kUint8;
  uint64_t array_count = 0;
  const uint8_t* array_data = nullptr;  // numeric arrays: view into the mapping
  std::vector<std::string> strings;     // string arrays

  bool is_integer() const;
  // Any integer scalar as int64 (UINT64 above INT64_MAX fails); nullopt otherwise.
  std::optional<int64_t> AsInt() const;
  std::optional<double> AsFloat() const;   // float or integer scalar
  std::optional<std::string> AsString() const;
  // Numeric array element i as double / int64 (caller checks i < array_count).
  // ArrayInt saturates what int64 cannot hold (UINT64 above INT64_MAX,
  // out-of-range floats); ArrayUint64 is a UINT64 array's exact element.
  double ArrayFloat(uint64_t i) const;
  int64_t ArrayInt(uint64_t i) const;
  uint64_t ArrayUint64(uint64_t i) const;
};

struct KeyValue {
  std::string key;
  Value value;
  uint64_t offset = 0;  // file offset of the key
};

struct TensorInfo {
  std::string name;
  uint32_t n_dims = 0;
  std::array<int64_t, 4> ne = {1, 1, 1, 1};  // ggml order, ne[0] fastest
  GgmlType type = GgmlType::F32;
  uint64_t offset = 0;       // relative to the data section
  uint64_t data_offset = 0;  // absolute file offset of the first byte
  uint64_t nbytes = 0;
  uint64_t info_offset = 0;  // file offset of this tensor info

  // A zero extent makes the tensor empty; the other extents are then not
  // bounded by the reader's overflow guard, so never multiply them.
  bool empty() const { return ne[0] == 0 || ne[1] == 0 || ne[2] == 0 || ne[3] == 0; }
  int64_t n_elements() const { return empty() ? 0 : ne[0] * ne[1] * ne[2] * ne[3]; }
  std::vector<int64_t> shape() const { return {ne.begin(), ne.begin() + n_dims}; }  // ne order
  uint64_t row_bytes() const { return GgmlRowBytes(type, static_cast<uint64_t>(ne[0])); }
  uint64_t n_rows() const { return empty() ? 0 : static_cast<uint64_t>(ne[1] * ne[2] * ne[3]); }
};

struct ReadOptions {
  // ggml's reader requires packed, padded tensor offsets in info order.
  bool require_packed_offsets = true;
};

class GgufFile {
 public:
  GgufFile(const GgufFile&) = delete;  // the name index holds views into tensors_
  GgufFile& operator=(const GgufFile&) = delete;
  static Result<std::shared_ptr<const GgufFile>> Open(const std::string& path, const ReadOptions& opts = {});
  // Parses an in-memory image (used by fuzzers and tests); the mapping's
  // name labels errors. A null mapping is an error.
  static Result<std::shared_ptr<const GgufFile>> Parse(std::shared_ptr<const MappedFile> map, const ReadOptions& opts = {});

  const std::string& path() const;
  uint32_t version() const { return version_; }
  uint64_t file_size() const;
  uint32_t alignment() const { return alignment_; }
  // Aligned start of the tensor data section (= SGLang's metadata_nbytes).
  uint64_t data_offset() const { return data_offset_; }

  const std::vector<KeyValue>& metadata() const { return kv_; }
  const Value* Find(std::string_view key) const;
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* FindTensor(std::string_view name) const;

  // Zero-copy view of a tensor's bytes; valid while `mapping()` lives. `t`
  // must be one of tensors() (or a copy): another file's tensor, e.g. of
  // another shard (use ShardSet::Located::shard_index), gives an empty span.
  std::span<const uint8_t> TensorData(const TensorInfo& t) const;
  const std::shared_ptr<const MappedFile>& mapping() const { return map_; }

  std::string architecture() const;  // general.architecture or ""

 private:
  friend class Parser;
  GgufFile() = default;
  std::shared_ptr<const MappedFile> map_;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<KeyValue> kv_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string_view, size_t> by_name_;  // views into tensors_[i].name
};

// ---------------------------------------------------------------- shard sets

struct ShardName {
  std::string prefix;   // file name before "-NNNNN-of-NNNNN.gguf"
  uint32_t number = 0;  // 1-based
  uint32_t count = 0;
};
// Parses "<prefix>-NNNNN-of-NNNNN.gguf" (5 digits each); nullopt otherwise.
std::optional<ShardName> ParseShardName(std::string_view file_name);
// The inverse: "<prefix>-NNNNN-of-NNNNN.gguf" for a 1-based number.
std::string ShardFileName(std::string_view prefix, uint32_t number, uint32_t count);

// SGLang's verdict on the numbered files of a directory, given as (number,
// count) pairs: its discovery error text, or empty when they form one
// complete set (one count, numbers exactly 1..count).
std::string SglangSetError(const std::vector<std::pair<int64_t, int64_t>>& numbered);

// SGLang's discovery error for a directory it finds no *.gguf in
// ("no GGUF files found in {dir}", `dir` as SGLang shows it). A directory
// that cannot be listed (`list_errno` nonzero) reads the same to SGLang,
// whose glob skips it in silence; the hint says why and carries the errno.
Error NoGgufFilesError(const std::string& dir, int list_errno = 0);

struct ShardSetOptions {
  // Architecture required of every shard; empty accepts any.
  std::string expected_architecture = "kimi-k3";
  ReadOptions read;
};

// An opened, cross-checked split set (or a single unsplit file).
class ShardSet {
 public:
  // `path` is a directory or any one shard. In a directory, stray .gguf files
  // that are not part of a numbered set are ignored; if several complete sets
  // are present the error lists them and asks for one shard path.
  static Result<ShardSet> Open(const std::string& path, const ShardSetOptions& opts = {});
  // Only the discovery step: the shard paths in shard order.
  static Result<std::vector<std::string>> Discover(const std::string& path);

  const std::vector<std::shared_ptr<const GgufFile>>& shards() const { return shards_; }
  const GgufFile& first() const { return *shards_.front(); }  // split.no == 0: metadata
  const std::string& prefix() const { return prefix_; }
  const std::string& directory() const { return dir_; }
  size_t tensor_count() const;

  struct Located {
    const TensorInfo* info;
    uint32_t shard_index;
  };
  std::optional<Located> FindTensor(std::string_view name) const;
  // All tensors in shard order, then info order.
  std::vector<Located> AllTensors() const;

 private:
  std::vector<std::shared_ptr<const GgufFile>> shards_;
  std::string prefix_;
  std::string dir_;
};

// ------------------------------------------------------------------ writing

// A tensor to write. `fill` produces the bytes of [offset, offset+out.size())
// of the tensor's data and is called in order, in chunks. A null `fill` leaves
// the data as a hole (reads as zeros; costs no disk on sparse filesystems).
struct TensorSpec {
  std::string name;
  GgmlType type = GgmlType::F32;
  std::vector<int64_t> ne;  // ne order, 1..4 dims
  std::function<void(uint64_t offset, std::span<uint8_t> out)> fill;
};

class MetadataBuilder {
 public:
  MetadataBuilder& U8(std::string k, uint8_t v);
  MetadataBuilder& U16(std::string k, uint16_t v);
  MetadataBuilder& U32(std::string k, uint32_t v);
  MetadataBuilder& I32(std::string k, int32_t v);
  MetadataBuilder& U64(std::string k, uint64_t v);
  MetadataBuilder& F32(std::string k, float v);
  MetadataBuilder& Bool(std::string k, bool v);
  MetadataBuilder& Str(std::string k, std::string v);
  MetadataBuilder& StrArray(std::string k, std::vector<std::string> v);
  MetadataBuilder& F32Array(std::string k, const std::vector<float>& v);
  MetadataBuilder& I32Array(std::string k, const std::vector<int32_t>& v);
  MetadataBuilder& U32Array(std::string k, const std::vector<uint32_t>& v);
  MetadataBuilder& BoolArray(std::string k, const std::vector<bool>& v);
  // Raw encoded entry (for tests that craft odd values).
  MetadataBuilder& Raw(std::string k, ValueType type, std::string encoded_value);

  struct Entry { std::string key; ValueType type; std::string encoded; };
  const std::vector<Entry>& entries() const { return entries_; }

 private:
  std::vector<Entry> entries_;
};

struct WriteOptions {
  uint32_t alignment = 32;  // also written as general.alignment when != 32
  uint32_t version = 3;
};

// Writes one GGUF file via <path>.tmp + fsync + rename.
Status WriteGguf(const std::string& path, const MetadataBuilder& meta,
                 const std::vector<TensorSpec>& tensors, const WriteOptions& opts = {});

// Writes `<dir>/<prefix>-NNNNN-of-NNNNN.gguf` shards. `shard_of[i]` is the
// 0-based shard of tensors[i] (non-decreasing). Every shard gets split.no,
// split.count, split.tensors.count and `per_shard` keys; shard 0 also gets
// `meta`. Returns the paths written.
Result<std::vector<std::string>> WriteGgufSplit(const std::string& dir, const std::string& prefix,
                                                const MetadataBuilder& meta, const MetadataBuilder& per_shard,
                                                const std::vector<TensorSpec>& tensors,
                                                const std::vector<uint32_t>& shard_of,
                                                const WriteOptions& opts = {});

}  // namespace gguf
}  // namespace k3pack
