// Shared helpers of the _k3pack extension: raising k3pack errors as the
// Python exceptions SGLang raises, and zero-copy numpy views whose base
// object keeps the C++ owner (a file mapping or a buffer) alive.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "k3pack/ep.h"
#include "k3pack/error.h"

namespace k3py {

namespace py = pybind11;

// Sets the Python exception for `error` and throws error_already_set.
// ErrorKind picks the class (ValueError, KeyError, FileNotFoundError, ...);
// args[0] is the first line of the message (SGLang's text); a "hint: ..."
// line after it becomes a PEP 678 note and the `k3pack_hint` attribute; a
// non-zero errno is stored in `errno` (OSError family).
[[noreturn]] void Raise(const k3pack::Error& error);

// Returns the value or raises.
template <typename T>
T Unwrap(k3pack::Result<T>&& r) {
  if (!r.ok()) Raise(r.error());
  return std::move(r).value();
}
inline void Check(const k3pack::Status& s) {
  if (!s.ok()) Raise(s.error());
}

// numpy dtype for an array-protocol typestr ("|u1", "<f4", "<u2", ...).
// Built from the type number: py::dtype(std::string) goes through numpy's
// Python-level parser and costs ~100 us per call.
py::dtype Dtype(const char* typestr);

// A read-only numpy array over [data, data + bytes) with the given dtype and
// C-contiguous shape; `owner` is held by the array's base (a capsule).
py::array ReadOnlyView(const py::dtype& dtype, const std::vector<int64_t>& shape, const void* data,
                       std::shared_ptr<const void> owner);

// The ep_size / ep_rank keywords of the store bindings: both or neither
// (neither: the manifest's k3pack.ep, else the whole model).
inline std::optional<k3pack::ep::Rank> EpRankArg(std::optional<uint32_t> ep_size, std::optional<uint32_t> ep_rank) {
  if (!ep_size && !ep_rank) return std::nullopt;
  if (!ep_size || !ep_rank)
    Raise(k3pack::Error("ep_size and ep_rank go together: pass both (or neither, for a rank pack's own rank)"));
  return k3pack::ep::Rank{*ep_size, *ep_rank};
}

// The request_ids keyword of acquire: None (unknown), one non-negative int
// for the call, or a sequence of them, one per row.
inline std::vector<uint64_t> RequestIdsArg(const py::object& o) {
  std::vector<uint64_t> out;
  if (o.is_none()) return out;
  const auto bad = [] {
    Raise(k3pack::Error("request_ids must be None, an int or a sequence of ints", k3pack::ErrorKind::kValue));
  };
  auto one = [&](const py::handle& h) {
    if (!py::isinstance<py::int_>(h) && !py::hasattr(h, "__index__")) bad();
    const long long v = py::int_(py::reinterpret_borrow<py::object>(h)).cast<long long>();
    if (v < 0) Raise(k3pack::Error("request_ids must be non-negative", k3pack::ErrorKind::kValue));
    out.push_back(static_cast<uint64_t>(v));
  };
  if (py::isinstance<py::str>(o) || py::isinstance<py::bytes>(o)) bad();
  if (py::isinstance<py::iterable>(o)) {  // a list, tuple or array: one per row
    for (py::handle h : o) one(h);
  } else if (py::hasattr(o, "__index__")) {  // an int or a numpy integer
    one(o);
  } else {
    bad();
  }
  return out;
}

// Registration of each binding file.
void RegisterErrors(py::module_& m);
void RegisterGguf(py::module_& m);
void RegisterLoader(py::module_& m);
void RegisterQuant(py::module_& m);
void RegisterPack(py::module_& m);
void RegisterStore(py::module_& m);
void RegisterSlotCache(py::module_& m);
void RegisterSynth(py::module_& m);

}  // namespace k3py
