// k3pack.NonExpertStream: SGLang's kimi_k3_nonexpert_weights_iterator order
// and values, as zero-copy numpy views (see include/k3pack/loader.h).
#include <pybind11/stl.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>

#include "common.h"
#include "k3pack/loader.h"

namespace k3py {
namespace {

namespace loader = k3pack::loader;

struct PyNamedTensor {
  std::string name;
  std::string source_name;
  std::string kind;
  std::string dtype;  // "float32", "bfloat16", "uint8", ...
  py::object array;
  bool zero_copy = false;
  std::string source_type;
  uint32_t shard_index = 0;
};

// verify_metadata's first __next__ hashes whole shards for minutes without
// the GIL: between chunks it answers Ctrl-C (PendingSignals), and it stops
// for a close() waiting on another thread.
struct StreamInterrupt {
  std::atomic<bool> closing{false};
  PendingSignals signals{"verifying the shards"};

  k3pack::Status Check() {
    if (closing.load()) return k3pack::Error("the stream was closed while it was verifying its shards");
    return signals.Check();
  }
  void RaiseIfInterrupted() { signals.RaiseIfInterrupted(); }
};

struct PyStream {
  // Empty once closed: close() frees the C++ stream (its shard mapping and
  // descriptor) at once, not when the Python object is collected.
  std::optional<loader::NonExpertStream> stream;
  loader::LoadStats closed_stats;  // stats() after close()
  std::string manifest_path;
  // __next__ runs without the GIL; two Python threads sharing one iterator
  // must not step the C++ stream at the same time.
  std::unique_ptr<std::mutex> mu = std::make_unique<std::mutex>();
  // What the stream's interrupt_check reports to __next__ and close().
  std::shared_ptr<StreamInterrupt> interrupt;
  pid_t opened_pid = getpid();
};

// A fork() child inherits the stream's mutex as it was at the fork: locked
// for good when another thread was inside __next__ then (that thread is not
// copied), with the stream copied in the middle of a step. In a child the
// mutex is only tried, with the GIL held, so that case is an error instead
// of a hang. Returns the held lock in a child, an empty one in the process
// that opened the stream (it waits for the mutex without the GIL);
// `in_use_at_fork` says the child could not have it.
std::unique_lock<std::mutex> LockInForkedChild(const PyStream& s, bool* in_use_at_fork = nullptr) {
  if (getpid() == s.opened_pid) return {};
  std::unique_lock<std::mutex> lock(*s.mu, std::try_to_lock);
  if (lock.owns_lock()) return lock;
  if (in_use_at_fork) {
    *in_use_at_fork = true;
    return lock;
  }
  Raise(k3pack::Error("this NonExpertStream was inside next() on another thread of process " +
                          std::to_string(s.opened_pid) + " when it forked into this process (" +
                          std::to_string(getpid()) + "): its copy here stopped mid-step and cannot be used",
                      k3pack::ErrorKind::kRuntime));
}

// The stream's mutex, taken without the GIL unless LockInForkedChild has it.
std::unique_lock<std::mutex> StreamLock(const PyStream& s, std::unique_lock<std::mutex>& child) {
  return child.owns_lock() ? std::move(child) : std::unique_lock<std::mutex>(*s.mu);
}

py::dtype NumpyDtype(loader::DType d) {
  // bfloat16 has no numpy dtype: its bit patterns are handed out as uint16.
  return Dtype(loader::DTypeNumpyStr(d));
}

PyNamedTensor Convert(loader::NamedTensor&& t) {
  PyNamedTensor out;
  // The stream maps its shards copy-on-write (o.copy_on_write) and computes the rest into buffers of their own.
  out.array = ReadOnlyView(NumpyDtype(t.dtype), t.shape, t.data.data(), std::move(t.owner), /*private_bytes=*/true);
  if (t.writable) {
    // Copy mode: a buffer of this tensor's own (not the shard mapping), so
    // the caller may write into it as into SGLang's torch.tensor() copies.
    py::detail::array_proxy(out.array.ptr())->flags |= py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  }
  out.name = std::move(t.name);
  out.source_name = std::move(t.source_name);
  out.kind = loader::TensorKindName(t.kind);
  out.dtype = loader::DTypeName(t.dtype);
  out.zero_copy = t.zero_copy;
  out.source_type = std::string(k3pack::GgmlTypeName(t.source_type));
  out.shard_index = t.shard_index;
  return out;
}

void CloseStream(PyStream& s) {
  if (s.interrupt) s.interrupt->closing = true;  // a __next__ hashing shards stops at its next chunk
  bool in_use_at_fork = false;
  std::unique_lock<std::mutex> child = LockInForkedChild(s, &in_use_at_fork);
  if (in_use_at_fork) return;  // nothing here can be freed safely; the process's end frees it
  NoGil nogil;  // waits for a __next__ running on another thread
  std::unique_lock<std::mutex> lock = StreamLock(s, child);
  if (!s.stream) return;
  s.closed_stats = s.stream->stats();
  s.stream.reset();
}

py::dict StatsDict(const loader::LoadStats& s) {
  py::dict d;
  d["shards_total"] = s.shards_total;
  d["shards_opened"] = s.shards_opened;
  d["source_tensors"] = s.source_tensors;
  d["routed_skipped"] = s.routed_skipped;
  d["routed_skipped_bytes"] = s.routed_skipped_bytes;
  d["emitted"] = s.emitted;
  d["zero_copy_tensors"] = s.zero_copy_tensors;
  d["zero_copy_bytes"] = s.zero_copy_bytes;
  d["computed_bytes"] = s.computed_bytes;
  d["copied_bytes"] = s.copied_bytes;
  return d;
}

}  // namespace

void RegisterLoader(py::module_& m) {
  py::class_<PyNamedTensor>(m, "NonExpertTensor",
                            "One emitted tensor: SGLang name, numpy array and where it came from.")
      .def_readonly("name", &PyNamedTensor::name, "SGLang runtime parameter name")
      .def_readonly("source_name", &PyNamedTensor::source_name, "GGUF tensor name")
      .def_readonly("kind", &PyNamedTensor::kind,
                    "plain | qweight_type | qweight | a_log | residual_projection | residual_norm")
      .def_readonly("dtype", &PyNamedTensor::dtype,
                    "element type name; 'bfloat16' arrays hold the bit patterns as uint16")
      .def_readonly("array", &PyNamedTensor::array, "read-only numpy array (zero-copy where possible)")
      .def_readonly("zero_copy", &PyNamedTensor::zero_copy, "array is a view into the shard's memory map")
      .def_readonly("source_type", &PyNamedTensor::source_type, "GGUF storage type name")
      .def_readonly("shard_index", &PyNamedTensor::shard_index,
                    "the source shard's index in the manifest's source.shards (0-based)")
      .def("__repr__", [](const PyNamedTensor& t) {
        return "NonExpertTensor(" + t.name + ", " + t.dtype + ", " +
               py::str(t.array.attr("shape")).cast<std::string>() + ")";
      });

  py::class_<PyStream>(m, "NonExpertStream",
                       "Iterator over Kimi-K3's non-routed weights of an adapter manifest, in SGLang's order.")
      .def(py::init([](const std::string& manifest_path, bool sglang_compat, bool verify_metadata,
                       bool release_pages, bool drop_page_cache, bool copy) {
             loader::LoadOptions o;
             o.sglang_compat = sglang_compat;
             o.verify_metadata = verify_metadata;
             o.release_pages = release_pages;
             o.drop_page_cache = drop_page_cache;
             o.copy = copy;
             // The arrays reach torch, which ignores numpy's read-only flag:
             // a write must not be a SIGSEGV.
             o.copy_on_write = true;
             auto interrupt = std::make_shared<StreamInterrupt>();
             o.interrupt_check = [interrupt] { return interrupt->Check(); };
             k3pack::Result<loader::NonExpertStream> r = [&] {
               NoGil nogil;
               return loader::NonExpertStream::Open(manifest_path, o);
             }();
             PyStream s;
             s.stream.emplace(Unwrap(std::move(r)));
             s.manifest_path = s.stream->manifest_path();
             s.interrupt = std::move(interrupt);
             return s;
           }),
           py::arg("manifest_path"), py::arg("sglang_compat") = false, py::arg("verify_metadata") = false,
           py::arg("release_pages") = true, py::arg("drop_page_cache") = false, py::arg("copy") = false,
           "opens the manifest's shards with SGLang's checks (its texts); the options: k3pack.nonexpert_tensors")
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", [](PyStream& s) {
        std::unique_lock<std::mutex> child = LockInForkedChild(s);
        k3pack::Result<std::optional<loader::NamedTensor>> r = [&] {
          NoGil nogil;
          std::unique_lock<std::mutex> lock = StreamLock(s, child);
          if (!s.stream) return k3pack::Result<std::optional<loader::NamedTensor>>(std::nullopt);  // closed
          return s.stream->Next();
        }();
        s.interrupt->RaiseIfInterrupted();
        if (!r.ok() && s.interrupt->closing.load()) throw py::stop_iteration();  // closed meanwhile, as a closed generator
        std::optional<loader::NamedTensor> t = Unwrap(std::move(r));
        if (!t) throw py::stop_iteration();
        return Convert(std::move(*t));
      })
      .def_property_readonly("stats", [](const PyStream& s) {
        loader::LoadStats now;
        std::unique_lock<std::mutex> child = LockInForkedChild(s);
        {
          NoGil nogil;  // __next__ on another thread updates them under mu
          std::unique_lock<std::mutex> lock = StreamLock(s, child);
          now = s.stream ? s.stream->stats() : s.closed_stats;
        }
        return StatsDict(now);
      }, "counters so far: shards opened, tensors emitted, zero-copy / computed / copied bytes, routed skipped")
      .def_property_readonly("manifest_path", [](const PyStream& s) { return s.manifest_path; },
                             "the adapter manifest being streamed")
      .def("close", &CloseStream, "ends the stream now: frees the open shard's mapping and descriptor (arrays already handed out stay "
         "valid: they hold their own bytes); further iteration stops at once, like a closed generator's. "
         "Repeated calls do nothing")
      .def_property_readonly("closed", [](const PyStream& s) {
        std::unique_lock<std::mutex> child = LockInForkedChild(s);
        NoGil nogil;
        std::unique_lock<std::mutex> lock = StreamLock(s, child);
        return !s.stream;
      },
                             "whether close() has been called")
      .def("__enter__", [](py::object self) { return self; }, "returns the stream; it is closed when the with block ends")
      .def("__exit__", [](PyStream& s, py::object, py::object, py::object) { CloseStream(s); },
           "close() at the end of a with block");

  m.def("ssm_a_to_a_log", [](py::array values) {
    // float32 / float16 arrays (bfloat16: pass uint16 bits with dtype='bfloat16' via the Python wrapper).
    std::string kind = py::str(values.dtype()).cast<std::string>();
    loader::DType d;
    if (kind == "float32") d = loader::DType::kFloat32;
    else if (kind == "float16") d = loader::DType::kFloat16;
    else if (kind == "uint16") d = loader::DType::kBFloat16;
    else throw py::type_error("ssm_a must be float32, float16 or uint16 (bfloat16 bits), got " + kind);
    py::array c = py::array::ensure(values, py::array::c_style);
    std::span<const uint8_t> bytes(static_cast<const uint8_t*>(c.data()), static_cast<size_t>(c.nbytes()));
    std::vector<uint8_t> out = Unwrap(loader::ALogFromSsmA(d, bytes));
    py::array result(c.dtype(), std::vector<py::ssize_t>(c.shape(), c.shape() + c.ndim()));
    std::memcpy(result.mutable_data(), out.data(), out.size());
    return result;
  }, py::arg("values"), "A_log = log(-ssm_a) with SGLang's checks and errors (same dtype out)");
}

}  // namespace k3py
