// GGUF writer: the layout llama.cpp's reader expects (packed, padded tensor
// data in info order) written through a temp file, fsync and rename. Tensors
// without a fill callback are left as holes so huge synthetic sets stay sparse.
#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "k3pack/gguf.h"
#include "util/file.h"

namespace k3pack::gguf {

namespace {

uint64_t Pad(uint64_t x, uint64_t n) { return (x + n - 1) / n * n; }

template <typename T>
void Put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

void PutString(std::string& out, std::string_view s) {
  Put<uint64_t>(out, s.size());
  out.append(s.data(), s.size());
}

template <typename T>
std::string EncodeArray(ValueType elem, const std::vector<T>& v) {
  std::string out;
  Put<int32_t>(out, static_cast<int32_t>(elem));
  Put<uint64_t>(out, v.size());
  for (const T& x : v) Put<T>(out, x);
  return out;
}

}  // namespace

#define K3_SCALAR_SETTER(Method, CType, VType)                      \
  MetadataBuilder& MetadataBuilder::Method(std::string k, CType v) { \
    std::string enc;                                                 \
    Put<CType>(enc, v);                                              \
    return Raw(std::move(k), VType, std::move(enc));                 \
  }
K3_SCALAR_SETTER(U8, uint8_t, ValueType::kUint8)
K3_SCALAR_SETTER(U16, uint16_t, ValueType::kUint16)
K3_SCALAR_SETTER(U32, uint32_t, ValueType::kUint32)
K3_SCALAR_SETTER(I32, int32_t, ValueType::kInt32)
K3_SCALAR_SETTER(U64, uint64_t, ValueType::kUint64)
K3_SCALAR_SETTER(F32, float, ValueType::kFloat32)
#undef K3_SCALAR_SETTER

MetadataBuilder& MetadataBuilder::Bool(std::string k, bool v) {
  return Raw(std::move(k), ValueType::kBool, std::string(1, v ? '\1' : '\0'));
}

MetadataBuilder& MetadataBuilder::Str(std::string k, std::string v) {
  std::string enc;
  PutString(enc, v);
  return Raw(std::move(k), ValueType::kString, std::move(enc));
}

MetadataBuilder& MetadataBuilder::StrArray(std::string k, std::vector<std::string> v) {
  std::string enc;
  Put<int32_t>(enc, static_cast<int32_t>(ValueType::kString));
  Put<uint64_t>(enc, v.size());
  for (const auto& s : v) PutString(enc, s);
  return Raw(std::move(k), ValueType::kArray, std::move(enc));
}

MetadataBuilder& MetadataBuilder::F32Array(std::string k, const std::vector<float>& v) {
  return Raw(std::move(k), ValueType::kArray, EncodeArray(ValueType::kFloat32, v));
}

MetadataBuilder& MetadataBuilder::I32Array(std::string k, const std::vector<int32_t>& v) {
  return Raw(std::move(k), ValueType::kArray, EncodeArray(ValueType::kInt32, v));
}

MetadataBuilder& MetadataBuilder::U32Array(std::string k, const std::vector<uint32_t>& v) {
  return Raw(std::move(k), ValueType::kArray, EncodeArray(ValueType::kUint32, v));
}

MetadataBuilder& MetadataBuilder::BoolArray(std::string k, const std::vector<bool>& v) {
  std::vector<uint8_t> bytes(v.begin(), v.end());
  return Raw(std::move(k), ValueType::kArray, EncodeArray(ValueType::kBool, bytes));
}

MetadataBuilder& MetadataBuilder::Raw(std::string k, ValueType type, std::string encoded_value) {
  for (auto& e : entries_) {
    if (e.key == k) {  // setting a key twice replaces it, as gguf_set_* does
      e.type = type;
      e.encoded = std::move(encoded_value);
      return *this;
    }
  }
  entries_.push_back({std::move(k), type, std::move(encoded_value)});
  return *this;
}

namespace {

Status ValidateTensor(const TensorSpec& t, uint64_t* nbytes) {
  if (t.name.empty() || t.name.size() > 63) {
    return Error("cannot write tensor '" + t.name + "': names must be 1..63 bytes (ggml's limit)");
  }
  if (t.ne.empty() || t.ne.size() > 4) {
    return Error("cannot write tensor '" + t.name + "': 1..4 dimensions required");
  }
  const GgmlTypeInfo* info = GgmlTypeInfoFor(t.type);
  if (info == nullptr || info->block_size == 0) {
    return Error("cannot write tensor '" + t.name + "': invalid ggml type");
  }
  for (int64_t d : t.ne) {
    if (d < 0) return Error("cannot write tensor '" + t.name + "': negative dimension");
  }
  // The reader's guard: a file ggml would refuse is never written.
  if (ElementCountOverflows(t.ne)) return Error("cannot write tensor '" + t.name + "': element count overflows int64");
  uint64_t n = 1;
  for (int64_t d : t.ne) n *= static_cast<uint64_t>(d);
  if (t.ne[0] % info->block_size != 0) {
    return Error("cannot write tensor '" + t.name + "': ne[0]=" + std::to_string(t.ne[0]) +
                 " is not a multiple of the " + info->name + " block size " + std::to_string(info->block_size));
  }
  *nbytes = n / info->block_size * info->type_size;
  return Status::OK();
}

// The alignment is written as general.alignment and pads every offset: a
// value ggml's reader refuses (and 0, a division by zero in Pad) is never
// written.
Status CheckAlignment(const std::string& path, const WriteOptions& opts) {
  if (opts.alignment == 0 || !std::has_single_bit(opts.alignment)) {
    return Error("cannot write " + path + ": alignment " + std::to_string(opts.alignment) +
                 " is not a nonzero power of two (ggml's rule for general.alignment)");
  }
  return Status::OK();
}

// ggml's reader refuses a file (and llama.cpp a split set) naming a tensor
// twice; checked over everything to be written before any file is created.
Status CheckUniqueNames(const std::vector<TensorSpec>& tensors) {
  std::unordered_set<std::string_view> seen;
  for (const TensorSpec& t : tensors) {
    if (!seen.insert(t.name).second) return Error("cannot write GGUF: duplicate tensor name '" + t.name + "'");
  }
  return Status::OK();
}

Status WriteOne(const std::string& path, const std::vector<MetadataBuilder::Entry>& kv,
                const std::vector<const TensorSpec*>& tensors, const WriteOptions& opts) {
  std::string head;
  head.append("GGUF", 4);
  Put<uint32_t>(head, opts.version);
  Put<uint64_t>(head, tensors.size());
  Put<uint64_t>(head, kv.size());
  for (const auto& e : kv) {
    PutString(head, e.key);
    Put<uint32_t>(head, static_cast<uint32_t>(e.type));
    head += e.encoded;
  }
  std::vector<uint64_t> offsets, sizes;
  uint64_t cursor = 0;
  for (const TensorSpec* t : tensors) {
    uint64_t nbytes = 0;
    K3_RETURN_IF_ERROR(ValidateTensor(*t, &nbytes));
    PutString(head, t->name);
    Put<uint32_t>(head, static_cast<uint32_t>(t->ne.size()));
    for (int64_t d : t->ne) Put<int64_t>(head, d);
    Put<uint32_t>(head, static_cast<uint32_t>(t->type));
    Put<uint64_t>(head, cursor);
    offsets.push_back(cursor);
    sizes.push_back(nbytes);
    cursor += Pad(nbytes, opts.alignment);
  }
  const uint64_t data_offset = Pad(head.size(), opts.alignment);
  head.resize(data_offset, '\0');

  K3_ASSIGN_OR_RETURN(AtomicFile out, AtomicFile::Create(path));
  K3_RETURN_IF_ERROR(out.Write(head.data(), head.size(), 0));
  std::vector<uint8_t> buf;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i]->fill) continue;  // hole
    buf.resize(static_cast<size_t>(std::min<uint64_t>(sizes[i], 8u << 20)));
    for (uint64_t done = 0; done < sizes[i];) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), sizes[i] - done));
      std::memset(buf.data(), 0, n);
      tensors[i]->fill(done, std::span<uint8_t>(buf.data(), n));
      K3_RETURN_IF_ERROR(out.Write(buf.data(), n, data_offset + offsets[i] + done));
      done += n;
    }
  }
  if (::ftruncate(out.fd(), static_cast<off_t>(data_offset + cursor)) != 0) {
    return out.Fail(Error::FromErrno("cannot size the file", errno));
  }
  return out.Commit();
}

std::vector<MetadataBuilder::Entry> WithAlignment(std::vector<MetadataBuilder::Entry> kv, const WriteOptions& opts) {
  if (opts.alignment != 32) {
    MetadataBuilder b;
    b.U32("general.alignment", opts.alignment);
    bool present = false;
    for (auto& e : kv) {
      if (e.key == "general.alignment") {
        e = b.entries()[0];
        present = true;
      }
    }
    if (!present) kv.push_back(b.entries()[0]);
  }
  return kv;
}

}  // namespace

Status WriteGguf(const std::string& path, const MetadataBuilder& meta, const std::vector<TensorSpec>& tensors,
                 const WriteOptions& opts) {
  K3_RETURN_IF_ERROR(CheckAlignment(path, opts));
  K3_RETURN_IF_ERROR(CheckUniqueNames(tensors));
  std::vector<const TensorSpec*> ptrs;
  for (const auto& t : tensors) ptrs.push_back(&t);
  return WriteOne(path, WithAlignment(meta.entries(), opts), ptrs, opts);
}

Result<std::vector<std::string>> WriteGgufSplit(const std::string& dir, const std::string& prefix,
                                                const MetadataBuilder& meta, const MetadataBuilder& per_shard,
                                                const std::vector<TensorSpec>& tensors,
                                                const std::vector<uint32_t>& shard_of, const WriteOptions& opts) {
  K3_RETURN_IF_ERROR(CheckAlignment(dir, opts));
  if (shard_of.size() != tensors.size()) return Error("WriteGgufSplit: shard_of must have one entry per tensor");
  uint32_t count = 1;
  for (size_t i = 0; i < shard_of.size(); ++i) {
    if (i > 0 && shard_of[i] < shard_of[i - 1]) return Error("WriteGgufSplit: shard_of must be non-decreasing");
    count = std::max(count, shard_of[i] + 1);
  }
  // split.no / split.count are UINT16 (and the file names have 5 digits).
  if (count > 65535) {
    return Error("WriteGgufSplit: at most 65535 shards (split.count is UINT16), asked for " + std::to_string(count));
  }
  K3_RETURN_IF_ERROR(CheckUniqueNames(tensors));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Error::FromErrno("cannot create directory " + dir, ec.value());

  std::vector<std::string> paths;
  for (uint32_t s = 0; s < count; ++s) {
    MetadataBuilder m = s == 0 ? meta : per_shard;
    if (s == 0) {
      for (const auto& e : per_shard.entries()) m.Raw(e.key, e.type, e.encoded);
    }
    m.U16("split.no", static_cast<uint16_t>(s));
    m.U16("split.count", static_cast<uint16_t>(count));
    m.I32("split.tensors.count", static_cast<int32_t>(tensors.size()));
    std::vector<const TensorSpec*> mine;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (shard_of[i] == s) mine.push_back(&tensors[i]);
    }
    std::string path = (std::filesystem::path(dir) / ShardFileName(prefix, s + 1, count)).string();
    K3_RETURN_IF_ERROR(WriteOne(path, WithAlignment(m.entries(), opts), mine, opts));
    paths.push_back(std::move(path));
  }
  return paths;
}

}  // namespace k3pack::gguf
