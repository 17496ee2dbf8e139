// k3pack.GGUFFile / k3pack.ShardSet / the ggml type table.
//
// Tensor bytes are handed out as read-only numpy views into the file mapping
// (no copy); `layout="gguf"` reproduces gguf-py's ReaderTensor.data shapes and
// dtypes so code written against gguf-py sees the same arrays.
#include <pybind11/stl.h>

#include <Python.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include "common.h"
#include "k3pack/ggml_types.h"
#include "k3pack/gguf.h"
#include "util/file.h"

namespace k3py {
namespace {

using k3pack::GgmlType;
namespace gguf = k3pack::gguf;

// An open descriptor of a GGUF file's inode, kept beside its mapping: each
// array handed to Python is its own private mapping of the bytes made from
// it (PrivateView), and its size is checked before a view is made.
struct FileHandle {
  int fd = -1;
  std::string path;
  uint64_t size_at_open = 0;
  ~FileHandle() {
    if (fd >= 0) ::close(fd);
  }
};
using Handle = std::shared_ptr<const FileHandle>;

struct PyGguf {
  std::shared_ptr<const gguf::GgufFile> file;
  Handle handle;
};

struct PyTensor {
  gguf::TensorInfo info;
  int64_t shard_index = -1;  // -1 for a tensor of a lone GGUFFile
  std::string path;
};

struct PyShardSet {
  gguf::ShardSet set;
  std::vector<Handle> handles;  // one per shard, in shard order
};

// Live PrivateMaps. Each is one kernel mapping, and a process has at most
// vm.max_map_count of them (65530 by default) for everything (malloc, thread
// stacks, torch): past kMaxPrivateMaps live arrays, a further one is a view
// of the file's shared read-only mapping instead, as before private views.
std::atomic<int64_t> g_private_maps{0};
constexpr int64_t kMaxPrivateMaps = 16384;

// A MAP_PRIVATE range of a file, unmapped when the last array over it goes.
struct PrivateMap {
  void* base = nullptr;
  size_t len = 0;
  ~PrivateMap() {
    if (base) {
      ::munmap(base, len);
      g_private_maps.fetch_sub(1, std::memory_order_relaxed);
    }
  }
};

// Opens `file`'s path again for PrivateView. The mapping was made from an
// earlier open of the same path, so the descriptor is checked to be the same
// file (size and first page), not one renamed into its place meanwhile.
Handle OpenHandle(const gguf::GgufFile& file) {
  auto h = std::make_shared<FileHandle>();
  h->path = file.path();
  h->size_at_open = file.file_size();
  h->fd = ::open(h->path.c_str(), O_RDONLY | O_CLOEXEC);
  if (h->fd < 0) Raise(k3pack::Error::FromErrno("cannot open " + h->path, errno));
  struct stat st {};
  bool same = ::fstat(h->fd, &st) == 0 && static_cast<uint64_t>(st.st_size) == h->size_at_open;
  if (same && h->size_at_open > 0) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(h->size_at_open, 4096));
    std::vector<uint8_t> head(n);
    same = ::pread(h->fd, head.data(), n, 0) == static_cast<ssize_t>(n) &&
           std::memcmp(head.data(), file.mapping()->data(), n) == 0;
  }
  if (!same) Raise(k3pack::Error(h->path + ": the file changed while it was being opened; open it again"));
  return h;
}

// A numpy array over [data, data + n) of `file`'s mapping, as its own
// private, copy-on-write mapping of those file bytes. torch.from_numpy
// ignores numpy's read-only flag, and a write through a view of the shared
// PROT_READ mapping killed the process with SIGSEGV; here a write lands in a
// page private to this array: never in the file, never in another array
// (each view gets its own mapping; numpy still marks it read-only). Past
// kMaxPrivateMaps live ones, or where mmap fails, the shared view it is. The
// file's current size is checked first: reading a mapped page past the end
// of a file truncated since it was opened is a SIGBUS, so a view of bytes
// the file no longer has is refused instead.
py::array PrivateView(const gguf::GgufFile& file, const Handle& h, const py::dtype& dtype,
                      const std::vector<int64_t>& shape, const uint8_t* data, size_t n, const std::string& what) {
  if (!h || n == 0) return ReadOnlyView(dtype, shape, data, file.mapping());
  const uint64_t off = static_cast<uint64_t>(data - file.mapping()->data());
  struct stat st {};
  if (::fstat(h->fd, &st) != 0) Raise(k3pack::Error::FromErrno("cannot stat " + h->path, errno));
  if (static_cast<uint64_t>(st.st_size) < off + n) {
    Raise(k3pack::Error(h->path + ": the file changed on disk after it was opened: it is now " +
                        std::to_string(st.st_size) + " bytes (" + std::to_string(h->size_at_open) +
                        " when opened), but " + what + " is bytes " + std::to_string(off) + ".." +
                        std::to_string(off + n))
              .WithHint("open the file again; reading bytes a file no longer has through its mapping would kill "
                        "the process with SIGBUS"));
  }
  static const uint64_t kPage = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t start = off / kPage * kPage;
  if (g_private_maps.fetch_add(1, std::memory_order_relaxed) < kMaxPrivateMaps) {
    auto map = std::make_shared<PrivateMap>();
    map->len = static_cast<size_t>(off + n - start);
    void* p = ::mmap(nullptr, map->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, h->fd,
                     static_cast<off_t>(start));
    if (p != MAP_FAILED) {
      map->base = p;  // from here the PrivateMap gives the count back
      const uint8_t* at = static_cast<const uint8_t*>(p) + (off - start);
      return ReadOnlyView(dtype, shape, at, std::move(map), /*private_bytes=*/true);
    }
  }
  g_private_maps.fetch_sub(1, std::memory_order_relaxed);
  return ReadOnlyView(dtype, shape, data, file.mapping());
}

py::object Utf8(const std::string& s) {
  return py::reinterpret_steal<py::object>(
      PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace"));
}

// numpy dtype of an element type, or none for block types / BF16.
const char* ElementTypestr(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return "<f4";
    case GgmlType::F16: return "<f2";
    case GgmlType::F64: return "<f8";
    case GgmlType::I8: return "|i1";
    case GgmlType::I16: return "<i2";
    case GgmlType::I32: return "<i4";
    case GgmlType::I64: return "<i8";
    default: return nullptr;
  }
}

py::object ScalarValue(gguf::ValueType t, const uint8_t* p) {
  switch (t) {
    case gguf::ValueType::kUint8: return py::int_(p[0]);
    case gguf::ValueType::kInt8: return py::int_(static_cast<int8_t>(p[0]));
    case gguf::ValueType::kBool: return py::bool_(p[0] != 0);
    case gguf::ValueType::kUint16: { uint16_t v; std::memcpy(&v, p, 2); return py::int_(v); }
    case gguf::ValueType::kInt16: { int16_t v; std::memcpy(&v, p, 2); return py::int_(v); }
    case gguf::ValueType::kUint32: { uint32_t v; std::memcpy(&v, p, 4); return py::int_(v); }
    case gguf::ValueType::kInt32: { int32_t v; std::memcpy(&v, p, 4); return py::int_(v); }
    case gguf::ValueType::kUint64: { uint64_t v; std::memcpy(&v, p, 8); return py::int_(v); }
    case gguf::ValueType::kInt64: { int64_t v; std::memcpy(&v, p, 8); return py::int_(v); }
    case gguf::ValueType::kFloat32: { float v; std::memcpy(&v, p, 4); return py::float_(v); }
    case gguf::ValueType::kFloat64: { double v; std::memcpy(&v, p, 8); return py::float_(v); }
    default: return py::none();
  }
}

// gguf-py's ReaderField.contents(): scalars, str, list for arrays.
py::object ValueToPython(const gguf::Value& v) {
  switch (v.type) {
    case gguf::ValueType::kString: return Utf8(v.str);
    case gguf::ValueType::kBool: return py::bool_(v.u64 != 0);
    case gguf::ValueType::kFloat32:
    case gguf::ValueType::kFloat64: return py::float_(v.f64);
    case gguf::ValueType::kUint8:
    case gguf::ValueType::kUint16:
    case gguf::ValueType::kUint32:
    case gguf::ValueType::kUint64: return py::int_(v.u64);
    case gguf::ValueType::kInt8:
    case gguf::ValueType::kInt16:
    case gguf::ValueType::kInt32:
    case gguf::ValueType::kInt64: return py::int_(v.i64);
    case gguf::ValueType::kArray: {
      py::list out;
      if (v.array_type == gguf::ValueType::kString) {
        for (const auto& s : v.strings) out.append(Utf8(s));
        return out;
      }
      size_t es = gguf::ValueTypeSize(v.array_type);
      for (uint64_t i = 0; i < v.array_count; ++i) out.append(ScalarValue(v.array_type, v.array_data + i * es));
      return out;
    }
  }
  return py::none();
}

std::string TypeString(const gguf::Value& v) {
  if (v.type == gguf::ValueType::kArray)
    return std::string("ARRAY[") + gguf::ValueTypeName(v.array_type) + "]";
  return gguf::ValueTypeName(v.type);
}

const char* ArrayTypestr(gguf::ValueType t) {
  switch (t) {
    case gguf::ValueType::kUint8: return "|u1";
    case gguf::ValueType::kInt8: return "|i1";
    case gguf::ValueType::kBool: return "|b1";
    case gguf::ValueType::kUint16: return "<u2";
    case gguf::ValueType::kInt16: return "<i2";
    case gguf::ValueType::kUint32: return "<u4";
    case gguf::ValueType::kInt32: return "<i4";
    case gguf::ValueType::kUint64: return "<u8";
    case gguf::ValueType::kInt64: return "<i8";
    case gguf::ValueType::kFloat32: return "<f4";
    case gguf::ValueType::kFloat64: return "<f8";
    default: return nullptr;
  }
}

// numpy shape + dtype of a tensor for one of the layouts:
//   "gguf":  gguf-py ReaderTensor.data (typed for F16/F32/F64/I8..I64,
//            otherwise uint8 rows of ne0/block*type_size bytes; BF16 too)
//   "typed": as "gguf" but BF16 as uint16 bit patterns in element shape
//   "raw":   flat uint8 of nbytes
py::array TensorView(const std::shared_ptr<const gguf::GgufFile>& file, const Handle& h, const gguf::TensorInfo& t,
                     const std::string& layout) {
  std::span<const uint8_t> bytes = file->TensorData(t);
  const std::string what = "tensor '" + t.name + "'";
  auto view = [&](const char* ts, const std::vector<int64_t>& shape) {
    return PrivateView(*file, h, Dtype(ts), shape, bytes.data(), bytes.size(), what);
  };
  if (layout == "raw") {
    return view("|u1", {static_cast<int64_t>(bytes.size())});
  }
  if (layout != "gguf" && layout != "typed") {
    throw py::value_error("layout must be 'gguf', 'typed' or 'raw', got '" + layout + "'");
  }
  std::vector<int64_t> shape(t.ne.rend() - t.n_dims, t.ne.rend());  // reversed ne, numpy order
  const char* ts = ElementTypestr(t.type);
  if (!ts && layout == "typed" && t.type == GgmlType::BF16) ts = "<u2";
  if (ts) return view(ts, shape);
  // Block types: the fastest axis becomes the row's byte count.
  if (shape.empty()) shape.push_back(1);
  shape.back() = static_cast<int64_t>(t.row_bytes());
  return view("|u1", shape);
}

py::tuple ShapeTuple(const gguf::TensorInfo& t) {
  py::tuple out(t.n_dims);
  for (uint32_t i = 0; i < t.n_dims; ++i) out[i] = py::int_(t.ne[i]);
  return out;
}

py::dict TypeInfoDict(uint32_t id) {
  const k3pack::GgmlTypeInfo* info = k3pack::GgmlTypeInfoFor(id);
  if (!info || info->block_size == 0) throw py::key_error("unknown or removed ggml type id " + std::to_string(id));
  py::dict d;
  d["name"] = info->name;
  d["id"] = id;
  d["block_size"] = info->block_size;
  d["type_size"] = info->type_size;
  d["quantized"] = info->quantized;
  return d;
}

PyGguf OpenGguf(const py::str& path_arg, bool packed) {
  const std::string path = PathArg(path_arg);
  gguf::ReadOptions ro;
  ro.require_packed_offsets = packed;
  k3pack::Result<std::shared_ptr<const gguf::GgufFile>> r = [&] {
    NoGil nogil;
    return gguf::GgufFile::Open(path, ro);
  }();
  PyGguf g{Unwrap(std::move(r)), nullptr};
  g.handle = OpenHandle(*g.file);
  return g;
}

}  // namespace

void RegisterGguf(py::module_& m) {
  py::class_<PyTensor>(m, "GGUFTensor", "One tensor info of a GGUF file (shape in GGUF ne order).")
      .def_property_readonly("name", [](const PyTensor& t) { return Utf8(t.info.name); },
                             "tensor name (bytes that are not UTF-8 shown as U+FFFD)")
      .def_property_readonly("type", [](const PyTensor& t) { return std::string(k3pack::GgmlTypeName(t.info.type)); },
                             "ggml type name of the data ('Q2_K', 'F32', 'BF16', ...)")
      .def_property_readonly("type_id", [](const PyTensor& t) { return static_cast<uint32_t>(t.info.type); },
                             "ggml type id as stored in the tensor info")
      .def_property_readonly("shape", [](const PyTensor& t) { return ShapeTuple(t.info); },
                             "GGUF ne order, ne[0] (the contiguous axis) first, n_dims entries")
      .def_property_readonly("n_dims", [](const PyTensor& t) { return t.info.n_dims; },
                             "number of dimensions stored in the file (the length of shape)")
      .def_property_readonly("n_elements", [](const PyTensor& t) { return t.info.n_elements(); },
                             "product of the extents; 0 when any extent is 0")
      .def_property_readonly("offset", [](const PyTensor& t) { return t.info.offset; },
                             "offset relative to the data section")
      .def_property_readonly("data_offset", [](const PyTensor& t) { return t.info.data_offset; },
                             "absolute file offset of the first byte")
      .def_property_readonly("nbytes", [](const PyTensor& t) { return t.info.nbytes; },
                             "bytes of the tensor's data, without the padding to the alignment")
      .def_property_readonly("row_bytes", [](const PyTensor& t) { return t.info.row_bytes(); },
                             "bytes of one row along ne[0]: ne[0] / block size * type size")
      .def_property_readonly("shard_index", [](const PyTensor& t) -> py::object {
        return t.shard_index < 0 ? py::object(py::none()) : py::object(py::int_(t.shard_index));
      }, "0-based shard holding the tensor (ShardSet), or None for a tensor of a lone GGUFFile")
      .def_property_readonly("path", [](const PyTensor& t) { return PathStr(t.path); },
                             "path of the GGUF file that holds the tensor")
      .def("__repr__", [](const PyTensor& t) {
        // Utf8 as `name`: a name that is not UTF-8 made repr() raise UnicodeDecodeError.
        return Utf8("GGUFTensor(" + t.info.name + ", " + std::string(k3pack::GgmlTypeName(t.info.type)) + ", " +
                    py::str(ShapeTuple(t.info)).cast<std::string>() + ", nbytes=" + std::to_string(t.info.nbytes) +
                    ")");
      });

  py::class_<PyGguf>(m, "GGUFFile",
                     "A memory-mapped, strictly checked GGUF file. Tensor data are zero-copy numpy views.")
      .def(py::init(&OpenGguf), py::arg("path"), py::arg("require_packed_offsets") = true,
           "maps `path` and checks its header, metadata and tensor infos (GGUF v2 or v3, little-endian; errors "
           "name the byte offset). require_packed_offsets=True is ggml's rule: tensor offsets packed in info "
           "order, each padded to the alignment; False accepts any aligned offsets")
      .def_property_readonly("path", [](const PyGguf& g) { return PathStr(g.file->path()); },
                             "the path the file was opened as")
      .def_property_readonly("version", [](const PyGguf& g) { return g.file->version(); }, "GGUF version (2 or 3)")
      .def_property_readonly("alignment", [](const PyGguf& g) { return g.file->alignment(); },
                             "tensor data alignment in bytes: general.alignment, else 32")
      .def_property_readonly("data_offset", [](const PyGguf& g) { return g.file->data_offset(); },
                             "aligned start of the tensor data section (SGLang's metadata_nbytes)")
      .def_property_readonly("file_size", [](const PyGguf& g) { return g.file->file_size(); }, "file size in bytes")
      .def_property_readonly("architecture", [](const PyGguf& g) { return g.file->architecture(); },
                             "general.architecture, or '' when the key is absent or not a string")
      .def_property_readonly("metadata", [](const PyGguf& g) {
        py::dict d;
        for (const auto& kv : g.file->metadata()) d[Utf8(kv.key)] = ValueToPython(kv.value);
        return d;
      }, "key -> value as gguf-py's ReaderField.contents() gives it (arrays as lists)")
      .def_property_readonly("metadata_types", [](const PyGguf& g) {
        py::dict d;
        for (const auto& kv : g.file->metadata()) d[Utf8(kv.key)] = TypeString(kv.value);
        return d;
      }, "key -> GGUF value type name ('UINT32', 'STRING', 'ARRAY[FLOAT32]', ...)")
      .def("metadata_array", [](const PyGguf& g, const std::string& key) {
        const gguf::Value* v = g.file->Find(key);
        if (!v) throw py::key_error(key);
        const char* ts = v->type == gguf::ValueType::kArray ? ArrayTypestr(v->array_type) : nullptr;
        if (!ts) throw py::type_error("metadata key '" + key + "' is not a numeric array");
        const size_t n = static_cast<size_t>(v->array_count) * gguf::ValueTypeSize(v->array_type);
        return PrivateView(*g.file, g.handle, Dtype(ts), {static_cast<int64_t>(v->array_count)}, v->array_data, n,
                           "metadata array '" + key + "'");
      }, py::arg("key"), "zero-copy numpy view of a numeric array value")
      .def_property_readonly("tensors", [](const PyGguf& g) {
        std::vector<PyTensor> out;
        out.reserve(g.file->tensors().size());
        for (const auto& t : g.file->tensors()) out.push_back({t, -1, g.file->path()});
        return out;
      }, "every tensor info (GGUFTensor), in the file's order")
      .def("tensor", [](const PyGguf& g, const std::string& name) {
        const gguf::TensorInfo* t = g.file->FindTensor(name);
        if (!t) throw py::key_error(name);
        return PyTensor{*t, -1, g.file->path()};
      }, py::arg("name"), "the GGUFTensor called `name`; KeyError when there is none")
      .def("__contains__", [](const PyGguf& g, const std::string& name) { return g.file->FindTensor(name) != nullptr; },
           "whether the file has a tensor of that name")
      .def("__len__", [](const PyGguf& g) { return g.file->tensors().size(); }, "number of tensors")
      .def("tensor_data", [](const PyGguf& g, const std::string& name, const std::string& layout) {
        const gguf::TensorInfo* t = g.file->FindTensor(name);
        if (!t) throw py::key_error(name);
        return TensorView(g.file, g.handle, *t, layout);
      }, py::arg("name"), py::arg("layout") = "gguf",
         "read-only numpy view: layout 'gguf' (gguf-py's ReaderTensor.data), 'typed' (BF16 as uint16 in "
         "element shape), 'raw' (flat uint8)")
      .def("__repr__", [](const PyGguf& g) {
        return "GGUFFile(" + py::repr(PathStr(g.file->path())).cast<std::string>() +
               ", tensors=" + std::to_string(g.file->tensors().size()) + ")";
      });

  py::class_<PyShardSet>(m, "ShardSet", "An opened, cross-checked split GGUF set (or one unsplit file).")
      .def(py::init([](const py::str& path_arg, const std::string& architecture, bool packed) {
             const std::string path = PathArg(path_arg);
             gguf::ShardSetOptions o;
             o.expected_architecture = architecture;
             o.read.require_packed_offsets = packed;
             k3pack::Result<gguf::ShardSet> r = [&] {
               NoGil nogil;
               return gguf::ShardSet::Open(path, o);
             }();
             PyShardSet s{Unwrap(std::move(r)), {}};
             for (const auto& f : s.set.shards()) s.handles.push_back(OpenHandle(*f));
             return s;
           }),
           py::arg("path"), py::arg("architecture") = "kimi-k3", py::arg("require_packed_offsets") = true,
           "path: a directory or any shard; architecture: required general.architecture ('' = any)")
      .def_static("discover", [](const py::str& path) {
        py::list out;
        for (const std::string& p : Unwrap(gguf::ShardSet::Discover(PathArg(path)))) out.append(PathStr(p));
        return out;
      },
                  py::arg("path"), "shard paths in shard order")
      .def_property_readonly("shards", [](const PyShardSet& s) {
        std::vector<PyGguf> out;
        for (size_t i = 0; i < s.set.shards().size(); ++i) out.push_back({s.set.shards()[i], s.handles[i]});
        return out;
      }, "the shards as GGUFFile objects, in shard order (split.no 0 first)")
      .def_property_readonly("paths", [](const PyShardSet& s) {
        py::list out;
        for (const auto& f : s.set.shards()) out.append(PathStr(f->path()));
        return out;
      }, "the shard paths, in shard order")
      .def_property_readonly("prefix", [](const PyShardSet& s) { return PathStr(s.set.prefix()); },
                             "file name before '-NNNNN-of-NNNNN.gguf'; for an unsplit file, its name without "
                             "the extension")
      .def_property_readonly("directory", [](const PyShardSet& s) { return PathStr(s.set.directory()); },
                             "the folder of the shards")
      .def_property_readonly("tensor_count", [](const PyShardSet& s) { return s.set.tensor_count(); },
                             "number of tensors in all shards together")
      .def_property_readonly("metadata", [](const PyShardSet& s) {
        py::dict d;
        for (const auto& kv : s.set.first().metadata()) d[Utf8(kv.key)] = ValueToPython(kv.value);
        return d;
      }, "metadata of shard 0 (the only shard with the full key set)")
      .def_property_readonly("tensors", [](const PyShardSet& s) {
        std::vector<PyTensor> out;
        for (const auto& loc : s.set.AllTensors())
          out.push_back({*loc.info, loc.shard_index, s.set.shards()[loc.shard_index]->path()});
        return out;
      }, "all tensors in shard order, then info order")
      .def("tensor", [](const PyShardSet& s, const std::string& name) {
        auto loc = s.set.FindTensor(name);
        if (!loc) throw py::key_error(name);
        return PyTensor{*loc->info, loc->shard_index, s.set.shards()[loc->shard_index]->path()};
      }, py::arg("name"), "the GGUFTensor called `name`, from whichever shard holds it; KeyError when none does")
      .def("__contains__", [](const PyShardSet& s, const std::string& name) { return s.set.FindTensor(name).has_value(); },
           "whether any shard has a tensor of that name")
      .def("__len__", [](const PyShardSet& s) { return s.set.tensor_count(); }, "number of tensors in all shards")
      .def("tensor_data", [](const PyShardSet& s, const std::string& name, const std::string& layout) {
        auto loc = s.set.FindTensor(name);
        if (!loc) throw py::key_error(name);
        return TensorView(s.set.shards()[loc->shard_index], s.handles[loc->shard_index], *loc->info, layout);
      }, py::arg("name"), py::arg("layout") = "gguf",
         "read-only numpy view of the tensor's bytes in its shard, in the layouts of GGUFFile.tensor_data; "
         "KeyError when no shard has the tensor");

  m.def("ggml_type_info", [](py::object key) {
    if (py::isinstance<py::str>(key)) {
      auto t = k3pack::GgmlTypeFromName(key.cast<std::string>());
      if (!t) throw py::key_error("unknown ggml type name " + key.cast<std::string>());
      return TypeInfoDict(static_cast<uint32_t>(*t));
    }
    const std::optional<uint32_t> id = TypeIdArg(key);
    if (!id) throw py::key_error("unknown or removed ggml type id " + py::str(key).cast<std::string>());
    return TypeInfoDict(*id);
  }, py::arg("type"), "{name, id, block_size, type_size, quantized} for a type name ('Q2_K') or id");
  m.def("ggml_types", [] {
    py::list out;
    for (uint32_t id = 0; id < k3pack::kGgmlTypeCount; ++id)
      if (k3pack::IsValidGgmlType(id)) out.append(TypeInfoDict(id));
    return out;
  }, "every type id a GGUF file may carry");
  m.def("parse_shard_name", [](const std::string& name) -> py::object {
    auto s = gguf::ParseShardName(name);
    if (!s) return py::none();
    return py::make_tuple(s->prefix, s->number, s->count);
  }, py::arg("file_name"), "'<prefix>-NNNNN-of-NNNNN.gguf' -> (prefix, number, count) or None");
}

}  // namespace k3py
