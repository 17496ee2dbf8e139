// ErrorKind -> Python exception class, and the numpy view helper.
#include <Python.h>

#include <csignal>
#include <cstring>

#include "common.h"
#include "k3pack/pack.h"

namespace k3py {
namespace {

PyObject* ExceptionClass(k3pack::ErrorKind kind) {
  using k3pack::ErrorKind;
  switch (kind) {
    case ErrorKind::kValue: return PyExc_ValueError;
    case ErrorKind::kKey: return PyExc_KeyError;
    case ErrorKind::kFileNotFound: return PyExc_FileNotFoundError;
    case ErrorKind::kFileExists: return PyExc_FileExistsError;
    case ErrorKind::kOS: return PyExc_OSError;
    case ErrorKind::kEOF: return PyExc_EOFError;
    case ErrorKind::kRuntime: return PyExc_RuntimeError;
    case ErrorKind::kMemory: return PyExc_MemoryError;
  }
  return PyExc_RuntimeError;
}

// C++ code writes a bare missing-key KeyError as Python's repr of the key
// ("'format'"), because that is what str(KeyError('format')) prints. To get
// the same str() in Python the exception's argument must be the unquoted key.
std::string KeyErrorArg(const std::string& msg) {
  if (msg.size() >= 2 && msg.front() == '\'' && msg.back() == '\'') {
    std::string inner = msg.substr(1, msg.size() - 2);
    if (inner.find('\'') == std::string::npos && inner.find('\\') == std::string::npos) return inner;
  }
  return msg;
}

}  // namespace

void Raise(const k3pack::Error& error) {
  std::string msg = error.message();
  std::string hint;
  size_t h = msg.find("\nhint: ");
  if (h != std::string::npos) {
    hint = msg.substr(h + 1);
    msg.resize(h);
  }
  if (error.kind() == k3pack::ErrorKind::kKey) msg = KeyErrorArg(msg);
  py::object cls = py::reinterpret_borrow<py::object>(ExceptionClass(error.kind()));
  if (error.kind() == k3pack::ErrorKind::kOS && error.sys_errno() != 0) {
    // OSError(errno, ...) is the subclass Python's own calls raise for that
    // errno (EACCES and EPERM: PermissionError, as open() raises), so
    // `except PermissionError` catches k3pack's as it catches Python's.
    PyObject* probe = PyObject_CallFunction(PyExc_OSError, "is", error.sys_errno(), "");
    if (probe == nullptr) throw py::error_already_set();
    cls = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(Py_TYPE(probe)));
    Py_DECREF(probe);
  }
  py::object text = py::reinterpret_steal<py::object>(
      PyUnicode_DecodeUTF8(msg.data(), static_cast<Py_ssize_t>(msg.size()), "replace"));
  py::object exc = cls(text);
  if (error.sys_errno() != 0 && PyObject_IsInstance(exc.ptr(), PyExc_OSError) == 1) {
    exc.attr("errno") = error.sys_errno();
  }
  exc.attr("k3pack_kind") = k3pack::ErrorKindName(error.kind());
  if (!hint.empty()) {
    // The note keeps the "hint: " label (it is shown in tracebacks beside the
    // message); the attribute is the hint itself, without it, so code that
    // prints "hint: " + exc.k3pack_hint does not say "hint: hint:".
    exc.attr("k3pack_hint") = error.hint();
    if (py::hasattr(exc, "add_note")) exc.attr("add_note")(hint);  // Python >= 3.11
  }
  PyErr_SetObject(cls.ptr(), exc.ptr());
  throw py::error_already_set();
}

void RaiseBuildError(const k3pack::Error& error) {
  const int code = k3pack::pack::InterruptExitCode(error);
  if (code <= 128) Raise(error);
  ::raise(code - 128);  // Python's C handler only records it; PyErr_CheckSignals runs the Python one
  if (PyErr_CheckSignals() == 0) Raise(error);
  py::error_already_set raised;
  // default_int_handler's KeyboardInterrupt says nothing: it says where to resume.
  if (raised.matches(PyExc_KeyboardInterrupt) && py::len(raised.value().attr("args")) == 0) {
    raised.value().attr("args") = py::make_tuple(py::str(error.message()));
  }
  throw raised;
}

py::dtype Dtype(const char* typestr) {
  // numpy type numbers (stable ABI values; NPY_INT64/UINT64 are LONG/ULONG on LP64 Linux).
  static const std::pair<const char*, int> kTypes[] = {
      {"|b1", 0},  {"|i1", 1},  {"|u1", 2},  {"<i2", 3},  {"<u2", 4},  {"<i4", 5}, {"<u4", 6},
      {"<i8", 7},  {"<u8", 8},  {"<f4", 11}, {"<f8", 12}, {"<f2", 23}, {"i1", 1},  {"u1", 2}};
  for (const auto& [name, num] : kTypes) {
    if (std::strcmp(name, typestr) == 0) return py::dtype(num);
  }
  return py::dtype(std::string(typestr));
}

namespace {
const char kPrivateBytes[] = "k3pack.private_bytes";
}  // namespace

py::array ReadOnlyView(const py::dtype& dtype, const std::vector<int64_t>& shape, const void* data,
                       std::shared_ptr<const void> owner, bool private_bytes) {
  auto* holder = new std::shared_ptr<const void>(std::move(owner));
  py::capsule base(holder, [](void* p) { delete static_cast<std::shared_ptr<const void>*>(p); });
  if (private_bytes && PyCapsule_SetName(base.ptr(), kPrivateBytes) != 0) throw py::error_already_set();
  std::vector<py::ssize_t> dims(shape.begin(), shape.end());
  std::vector<py::ssize_t> strides(dims.size());
  py::ssize_t stride = dtype.itemsize();
  for (size_t i = dims.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= dims[i];
  }
  // A non-null dummy pointer for empty arrays keeps numpy from allocating.
  static const uint8_t kEmpty[16] = {};
  const void* ptr = data ? data : kEmpty;
  py::array arr(dtype, dims, strides, ptr, base);
  // The bytes are a file mapping (private copy-on-write, or read-only) or a
  // buffer the array shares: numpy users get them read-only.
  py::detail::array_proxy(arr.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  return arr;
}

void RegisterErrors(py::module_& m) {
  m.def("_writes_stay_private", [](py::handle array) {
    py::handle base = array;
    while (py::isinstance<py::array>(base)) base = py::detail::array_proxy(base.ptr())->base;
    return base && PyCapsule_CheckExact(base.ptr()) && PyCapsule_GetName(base.ptr()) != nullptr &&
           std::strcmp(PyCapsule_GetName(base.ptr()), kPrivateBytes) == 0;
  }, py::arg("array"),
     "whether a write through `array` (torch ignores numpy's read-only flag) changes bytes private to it: "
     "an array k3pack made over a private copy-on-write mapping or a buffer of its own (internal)");
  m.def("_raise_for_test", [](const std::string& kind, const std::string& message, int err) {
    static const std::pair<const char*, k3pack::ErrorKind> kKinds[] = {
        {"ValueError", k3pack::ErrorKind::kValue},       {"KeyError", k3pack::ErrorKind::kKey},
        {"FileNotFoundError", k3pack::ErrorKind::kFileNotFound},
        {"FileExistsError", k3pack::ErrorKind::kFileExists}, {"OSError", k3pack::ErrorKind::kOS},
        {"EOFError", k3pack::ErrorKind::kEOF},           {"RuntimeError", k3pack::ErrorKind::kRuntime},
        {"MemoryError", k3pack::ErrorKind::kMemory}};
    for (const auto& [name, k] : kKinds) {
      if (kind == name) Raise(k3pack::Error(message, k, err));
    }
    throw py::value_error("unknown kind " + kind);
  }, "Raises a k3pack error of the given kind (tests of the exception mapping).",
     py::arg("kind"), py::arg("message"), py::arg("errno") = 0);
}

}  // namespace k3py
