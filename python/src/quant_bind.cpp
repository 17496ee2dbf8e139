// k3pack.dequantize / k3pack.tensor_stats (binds include/k3pack/quant.h).
//
// Input is what k3pack.GGUFFile.tensor_data (or gguf-py) hands out: for block
// types (and BF16) a uint8 array whose last axis is a row's bytes; for element
// types (F32, F16, F64, I8..I64) a typed array. The output is float32 in
// element shape, bit-identical to ggml's dequantize_row_<type>.
#include <pybind11/stl.h>

#include <cstring>

#include "common.h"
#include "k3pack/ggml_types.h"
#include "k3pack/quant.h"

namespace k3py {
namespace {

using k3pack::GgmlType;
namespace quant = k3pack::quant;

GgmlType TypeArg(const py::object& t) {
  if (py::isinstance<py::str>(t)) {
    auto g = k3pack::GgmlTypeFromName(t.cast<std::string>());
    if (!g) throw py::value_error("unknown ggml type name '" + t.cast<std::string>() + "'");
    return *g;
  }
  const std::optional<uint32_t> id = TypeIdArg(t);
  if (!id || !k3pack::IsValidGgmlType(*id))
    throw py::value_error("invalid ggml type id " + py::str(t).cast<std::string>());
  return static_cast<GgmlType>(*id);
}

struct Rows {
  std::span<const uint8_t> bytes;
  int64_t ne0 = 0;
  uint64_t rows = 0;
  std::vector<py::ssize_t> out_shape;
};

// Works out (ne0, rows) from the array's shape and the type, following
// gguf-py's quant_shape_from_byte_shape for byte arrays.
Rows RowsOf(const py::array& a, GgmlType t) {
  const k3pack::GgmlTypeInfo* info = k3pack::GgmlTypeInfoFor(t);
  Rows r;
  r.bytes = {static_cast<const uint8_t*>(a.data()), static_cast<size_t>(a.nbytes())};
  std::vector<py::ssize_t> shape(a.shape(), a.shape() + a.ndim());
  if (shape.empty()) shape.push_back(1);
  const py::ssize_t last = shape.back();
  const size_t item = static_cast<size_t>(a.itemsize());
  if (item == 1 && !(info->block_size == 1 && info->type_size == 1)) {
    // Byte rows: last axis = blocks * type_size.
    if (last % info->type_size != 0)
      throw py::value_error("last axis (" + std::to_string(last) + " bytes) is not a whole number of " +
                            info->name + " blocks (" + std::to_string(info->type_size) + " bytes each)");
    r.ne0 = last / info->type_size * info->block_size;
  } else {
    if (item != info->type_size || info->block_size != 1)
      throw py::value_error(std::string("a typed array of itemsize ") + std::to_string(item) +
                            " cannot hold " + info->name + " data; pass the uint8 byte view");
    // Of the right width, the array's bits were decoded whatever its dtype:
    // int32 [1, 2] as F32 gave 1e-45 and 3e-45, a float16 1.0 as BF16 gave
    // 0.0078125, a float32 as I32 its bit pattern. An array of values of
    // another kind is refused; unsigned integers and opaque ('V') items stay
    // the way to pass raw bits (ml_dtypes' bfloat16 is one), and signed ones
    // for the two 16-bit floats (`tensor.view(torch.int16).numpy()`, as
    // to_torch and ssm_a_to_a_log take).
    const char kind = a.dtype().kind();
    const bool float_type = t == GgmlType::F16 || t == GgmlType::F32 || t == GgmlType::F64;
    const bool int_type = t == GgmlType::I8 || t == GgmlType::I16 || t == GgmlType::I32 || t == GgmlType::I64;
    const bool half_type = t == GgmlType::F16 || t == GgmlType::BF16;
    const bool takes = kind == 'u' || kind == 'V' || (float_type && kind == 'f') || (int_type && kind == 'i') ||
                       (half_type && kind == 'i');
    if (!takes) {
      const std::string dtype = py::str(a.dtype()).cast<std::string>();
      const bool vowel = !dtype.empty() && std::string("aeiou").find(dtype[0]) != std::string::npos;
      throw py::type_error(std::string(vowel ? "an " : "a ") + dtype + " array cannot hold " + info->name +
                           " data: its values would be read as " + info->name +
                           " bit patterns; pass an array of the type's own values, its bits as unsigned "
                           "integers, or the uint8 byte view");
    }
    r.ne0 = last;
  }
  r.rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) r.rows *= static_cast<uint64_t>(shape[i]);
  r.out_shape = shape;
  if (a.ndim() == 0) r.out_shape.clear();
  else r.out_shape.back() = r.ne0;
  return r;
}

// `data` as a C-contiguous array in little-endian byte order, which is what
// the decoders read. A typed array in big-endian order (gguf-py hands those
// out for a big-endian GGUF, numpy makes them with dtype '>f4') holds the
// same values with swapped bytes; taken as it was, every value came out as
// the decode of its swapped bytes.
py::array LittleEndianArray(const py::object& data) {
  py::array a = py::array::ensure(data, py::array::c_style);
  if (!a) throw py::type_error("data must be an array");
  if (a.dtype().byteorder() == '>') {
    a = py::array::ensure(a.attr("astype")(a.dtype().attr("newbyteorder")("<")), py::array::c_style);
  }
  return a;
}

}  // namespace

void RegisterQuant(py::module_& m) {
  m.def("dequantize", [](py::array data, py::object type, const py::object& threads_arg, py::object out_arg) {
    GgmlType t = TypeArg(type);
    const int threads = IntInRange<int>(threads_arg, "threads", 0, INT_MAX);
    if (!quant::CanDequantize(t))
      throw py::value_error(std::string("cannot dequantize ") + std::string(k3pack::GgmlTypeName(t)));
    py::array a = LittleEndianArray(data);
    Rows r = RowsOf(a, t);
    const std::vector<py::ssize_t> shape = r.out_shape;
    py::array_t<float> out;
    if (out_arg.is_none()) {
      out = py::array_t<float>(shape);
    } else {
      // A caller-owned float32 buffer (reused across calls: no fresh pages
      // to fault in). Must be C-contiguous, writable and of the output shape.
      if (!py::isinstance<py::array_t<float>>(out_arg)) throw py::type_error("out must be a float32 numpy array");
      out = out_arg.cast<py::array_t<float>>();
      const bool contiguous = (out.flags() & py::array::c_style) != 0;
      if (!contiguous || !out.writeable()) throw py::value_error("out must be C-contiguous and writable");
      if (std::vector<py::ssize_t>(out.shape(), out.shape() + out.ndim()) != shape)
        throw py::value_error("out has the wrong shape for the decoded values");
    }
    std::span<float> dst(out.mutable_data(), static_cast<size_t>(out.size()));
    k3pack::Status st;
    {
      // One call over the whole array (its rows are consecutive blocks),
      // without the GIL, split over threads in C++.
      NoGil nogil;
      const uint64_t need = k3pack::GgmlRowBytes(t, static_cast<uint64_t>(r.ne0)) * r.rows;
      if (need > r.bytes.size()) {
        st = k3pack::Error("data holds " + std::to_string(r.bytes.size()) + " bytes, " + std::to_string(need) +
                           " needed");
      } else {
        st = quant::DequantizeParallel(t, r.bytes.first(need), dst, threads);
      }
    }
    Check(st);
    return out;
  }, py::arg("data"), py::arg("type"), py::arg("threads") = 0, py::arg("out") = py::none(),
     "float32 values of `data` stored as ggml `type` (name or id); shape as gguf-py's dequantize.\n"
     "threads: 0 = one per CPU (large arrays only), 1 = the calling thread. out: optional float32\n"
     "array of the output shape to decode into (returned).");

  m.def("tensor_stats", [](py::array data, py::object type) {
    GgmlType t = TypeArg(type);
    py::array a = LittleEndianArray(data);
    Rows r = RowsOf(a, t);
    k3pack::Result<quant::TensorStats> s = [&] {
      NoGil nogil;
      return quant::ComputeStats(t, r.bytes, r.ne0, r.rows);
    }();
    quant::TensorStats v = Unwrap(std::move(s));
    py::dict d;
    d["min"] = v.min;
    d["max"] = v.max;
    d["mean"] = v.mean;
    d["nan_count"] = v.nan_count;
    d["inf_count"] = v.inf_count;
    d["count"] = v.count;
    return d;
  }, py::arg("data"), py::arg("type"), "min/max/mean over finite values, NaN/Inf counts");

  m.def("quant_isa", [] { return std::string(quant::IsaName(quant::DetectedIsa())); },
        "the SIMD code path dequantize uses on this CPU");
  m.def("_ignored_isa_cap", &quant::IgnoredIsaCap,
        "K3PACK_QUANT_ISA's value when it names no code path (so it caps nothing), else ''");
}

}  // namespace k3py
