// Shared helpers of the _k3pack extension: raising k3pack errors as the
// Python exceptions SGLang raises, and zero-copy numpy views whose base
// object keeps the C++ owner (a file mapping or a buffer) alive.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <climits>
#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "k3pack/ep.h"
#include "k3pack/error.h"
#include "store/runtime_options.h"
#include "util/interrupt.h"
#include "util/lock_file.h"

namespace k3py {

namespace py = pybind11;

// Sets the Python exception for `error` and throws error_already_set.
// ErrorKind picks the class (ValueError, KeyError, FileNotFoundError, ...);
// args[0] is the first line of the message (SGLang's text); a "hint: ..."
// line after it becomes a PEP 678 note and the `k3pack_hint` attribute; a
// non-zero errno is stored in `errno` (OSError family).
[[noreturn]] void Raise(const k3pack::Error& error);

// Raise() for what BuildPack returned. A copy stopped by SIGINT / SIGTERM
// (pack::InterruptExitCode) checkpointed and returned; its handler kept the
// signal from Python meanwhile. The signal is delivered now, to what Python
// does with it: Ctrl-C raises KeyboardInterrupt, as every other long call
// does, with the error's text (where the rerun resumes) as its argument;
// SIGTERM's default ends the process. A handler that raises nothing leaves
// the error itself raised.
[[noreturn]] void RaiseBuildError(const k3pack::Error& error);

// Returns the value or raises.
template <typename T>
T Unwrap(k3pack::Result<T>&& r) {
  if (!r.ok()) Raise(r.error());
  return std::move(r).value();
}
inline void Check(const k3pack::Status& s) {
  if (!s.ok()) Raise(s.error());
}

// Drop-in for py::gil_scoped_release around native work. It counts the
// threads inside native code so that the interpreter's exit can wait for them
// (exit_guard.cpp: a thread that takes the GIL once finalization has begun is
// ended by CPython with pthread_exit, which aborts inside a C++ frame). Once
// the interpreter is exiting, constructing one on a thread other than the
// finalizing one raises RuntimeError (with the GIL still held).
class NoGil {
 public:
  NoGil();
  // For a destructor, which must not raise and may run anywhere (a garbage
  // collection, interpreter teardown): lets go of the GIL only where this
  // thread holds it and the interpreter is not exiting; otherwise keeps it.
  explicit NoGil(std::nothrow_t);
  ~NoGil();
  NoGil(const NoGil&) = delete;
  NoGil& operator=(const NoGil&) = delete;

 private:
  std::optional<py::gil_scoped_release> release_;
};

// The GIL for a callback from native code (progress, logging, signal checks,
// dropping a Python object), unless the interpreter is exiting: then held()
// is false and the callback must be skipped.
class CallbackGil {
 public:
  CallbackGil();
  bool held() const { return acquire_.has_value(); }

 private:
  std::optional<py::gil_scoped_acquire> acquire_;
};

// With the GIL: makes the KeyboardInterrupt that a callback on this thread
// raised, and nothing has raised since, the current Python error
// (DiscardCallbackError); false when there is none.
bool RestoreCallbackInterrupt();

// Ctrl-C for calls that run for minutes in C++ without the GIL (whole-shard
// and whole-pack digests, full payload checks). The engine polls Check()
// between chunks on the calling thread: it takes the GIL and runs Python's
// signal handlers; a handler that raised (KeyboardInterrupt) has its
// exception kept here and the engine is stopped with an error. Once the GIL
// is back, RaiseIfInterrupted() raises that exception instead of the
// engine's error.
class PendingSignals {
 public:
  explicit PendingSignals(std::string doing) : doing_(std::move(doing)) {}
  k3pack::Status Check() {
    CallbackGil gil;
    if (!gil.held()) return k3pack::Error("interrupted while " + doing_ + ": the interpreter is exiting", k3pack::ErrorKind::kRuntime);
    // A Ctrl-C whose handler already ran, inside a callback, or one now.
    if (!RestoreCallbackInterrupt() && PyErr_CheckSignals() == 0) return k3pack::Status::OK();
    raised_.emplace();  // takes the handler's exception out of the interpreter
    return k3pack::Error("interrupted while " + doing_);
  }
  void RaiseIfInterrupted() {
    if (!raised_) return;
    py::error_already_set e = std::move(*raised_);
    raised_.reset();
    throw e;
  }
  // For an engine's options: the check, sharing this object.
  static std::function<k3pack::Status()> CheckOf(const std::shared_ptr<PendingSignals>& p) {
    return [p] { return p->Check(); };
  }

 private:
  std::string doing_;
  std::optional<py::error_already_set> raised_;  // set and read only with the GIL held
};

// Runs `call` without the GIL, with Ctrl-C polled by the bounded waits in
// it (util/interrupt.h: the store's wait for room in its cache); a
// KeyboardInterrupt it took is raised here, with the GIL back.
template <typename Call>
auto InterruptibleWithoutGil(const std::string& doing, Call&& call) {
  auto signals = std::make_shared<PendingSignals>(doing);
  auto result = [&] {
    NoGil nogil;
    k3pack::ScopedInterruptCheck check(PendingSignals::CheckOf(signals));
    return call();
  }();
  signals->RaiseIfInterrupted();
  return result;
}

// Shares a Python callable with C++ code that may copy and drop it on any
// thread: the last reference is released under the GIL. One that is not
// callable is a TypeError naming `keyword`: it was taken, and each call of it
// then failed as an unraisable "'int' object is not callable" while the
// operation went on.
std::shared_ptr<py::object> HoldCallable(py::object fn, const char* keyword);

// What a Python callback raised, from native code that cannot raise it
// (`what` names the callback); called with the GIL held. Reported as
// unraisable, except KeyboardInterrupt (a Ctrl-C's handler ran inside the
// callback): it is kept, and raised by the first interrupt check on the
// callback's thread (PendingSignals), else where the main thread next runs
// Python code - not re-armed as a Ctrl-C, which ran a program's own SIGINT
// handler a second time.
void DiscardCallbackError(py::error_already_set& e, const char* what);

// Marks the calling thread as inside a user callback of a k3pack call while
// the object lives. A writer called from there (build_pack from build_pack's
// own progress callback) ran as the call under way, through the pack's lock,
// which is re-entrant for the thread holding it, and the outer call then
// failed on files the inner one had replaced.
class InUserCallback {
 public:
  InUserCallback();
  ~InUserCallback();
  InUserCallback(const InUserCallback&) = delete;
  InUserCallback& operator=(const InUserCallback&) = delete;
};
// RuntimeError when the calling thread is inside a user callback (above):
// `call` ("k3pack.build_pack") cannot start there.
void RefuseInsideUserCallback(const char* call);

// A C++ line callback that calls `fn` (None: no callback) under the GIL; an
// exception it raises is reported as unraisable, never into the engine
// (DiscardCallbackError).
std::function<void(const std::string&)> LineCallback(py::object fn, const char* keyword);

// `log`'s callback, or (None) the "k3pack" logger's warning: for what a
// caller must hear of even when it passed no log (a wait, a start-over).
std::function<void(const std::string&)> LogLines(const py::object& log);  // `log`, checked as LineCallback's

// The `wait=` keyword of the writers (the CLI's --wait), set for the calling
// thread while the object lives: None or 0 refuses at once when another
// process holds the output's lock; a number of seconds, or float("inf") /
// "forever", waits that long for it to let go. What it waits for goes to
// `log` (None: the "k3pack" logger, as a warning: a waiting call must not
// look hung). Ctrl-C ends the wait; RaiseIfInterrupted(), with the GIL back,
// raises its KeyboardInterrupt. A bad value raises ValueError here.
class LockWaitKeyword {
 public:
  LockWaitKeyword(const py::object& wait, const py::object& log, const std::string& waiting_for);
  void RaiseIfInterrupted() { signals_->RaiseIfInterrupted(); }

 private:
  std::shared_ptr<PendingSignals> signals_;
  k3pack::ScopedLockWait scope_;
};

// A path argument as the file system's bytes, encoded as os.fsencode does:
// a file whose name is not UTF-8 comes from os.listdir as a str with
// surrogate escapes, which pybind11's std::string caster refused
// ("incompatible function arguments"). Take the parameter as py::str.
inline std::string PathArg(const py::str& path) {
  py::bytes b = py::reinterpret_steal<py::bytes>(PyUnicode_EncodeFSDefault(path.ptr()));
  if (!b) throw py::error_already_set();
  return std::string(b);
}

// A path for Python, decoded as os.fsdecode does: pybind11's strict UTF-8
// decode raised UnicodeDecodeError for a name that is not UTF-8 (a shard
// ShardSet found in a directory), after the file had been opened.
inline py::str PathStr(const std::string& path) {
  PyObject* s = PyUnicode_DecodeFSDefaultAndSize(path.data(), static_cast<Py_ssize_t>(path.size()));
  if (!s) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(s);
}

// numpy dtype for an array-protocol typestr ("|u1", "<f4", "<u2", ...).
// Built from the type number: py::dtype(std::string) goes through numpy's
// Python-level parser and costs ~100 us per call.
py::dtype Dtype(const char* typestr);

// A read-only numpy array over [data, data + bytes) with the given dtype and
// C-contiguous shape; `owner` is held by the array's base (a capsule).
// private_bytes: a write through the array changes bytes no one else sees (a
// private copy-on-write mapping, a buffer of its own), which the capsule's
// name records for WritesStayPrivate; otherwise they are shared (the file's
// read-only mapping, the expert store's cache).
py::array ReadOnlyView(const py::dtype& dtype, const std::vector<int64_t>& shape, const void* data,
                       std::shared_ptr<const void> owner, bool private_bytes = false);

// What the library's EP errors (ep::CheckRank) call the size and rank from
// Python: the keywords, not the CLI's flags. The store bindings pass them as
// StoreOptions::ep_names.
inline constexpr k3pack::ep::RankNames kEpKeywordNames{"ep_size", "ep_rank"};

// The ep_size / ep_rank keywords of the store bindings: both or neither
// (neither: the manifest's k3pack.ep, else the whole model). Their ranges are
// checked here, before the values are narrowed to uint32 (a negative rank
// must not wrap, one past int64 is no TypeError); divisibility by the expert
// count is the library's check, at open, in the same words (kEpKeywordNames).
std::optional<k3pack::ep::Rank> EpRankArg(const py::object& ep_size, const py::object& ep_rank);

// The name of `o`'s type ("float", "NoneType"), for a TypeError naming what
// was passed.
inline std::string TypeNameOf(const py::handle& o) {
  return py::str(py::type::handle_of(o).attr("__name__")).cast<std::string>();
}

// The request_ids keyword of acquire: None (unknown), one non-negative int
// for the call, or a sequence of them, one per row. `keyword` is what the
// messages name (prefetch's and keep's is request_id: "request_ids must be
// non-negative" named a keyword those methods do not have).
inline std::vector<uint64_t> RequestIdsArg(const py::object& o, const std::string& keyword = "request_ids") {
  std::vector<uint64_t> out;
  if (o.is_none()) return out;
  // A value of another type is a TypeError, as Python's own int arguments.
  const auto bad = [&](const py::handle& h) {
    throw py::type_error((keyword == "request_ids" ? std::string("request_ids must be None, an int or a sequence of ints")
                                                   : keyword + " must be None or an int") +
                         ", got " + TypeNameOf(h));
  };
  auto one = [&](const py::handle& h) {
    if (!py::isinstance<py::int_>(h) && !py::hasattr(h, "__index__")) bad(h);
    py::int_ i(py::reinterpret_borrow<py::object>(h));
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
    if (overflow < 0 || (overflow == 0 && v < 0))
      Raise(k3pack::Error(keyword + " must be non-negative", k3pack::ErrorKind::kValue));
    if (overflow == 0) {
      out.push_back(static_cast<uint64_t>(v));
      return;
    }
    // Past int64: an unsigned 64-bit id still fits; anything larger cannot.
    const unsigned long long u = PyLong_AsUnsignedLongLong(i.ptr());
    if (PyErr_Occurred()) {
      PyErr_Clear();
      Raise(k3pack::Error(keyword + " must be below 2**64", k3pack::ErrorKind::kValue));
    }
    out.push_back(static_cast<uint64_t>(u));
  };
  if (py::isinstance<py::str>(o) || py::isinstance<py::bytes>(o)) bad(o);
  if (py::isinstance<py::iterable>(o)) {  // a list, tuple or array: one per row
    for (py::handle h : o) one(h);
  } else if (py::hasattr(o, "__index__")) {  // an int or a numpy integer
    one(o);
  } else {
    bad(o);
  }
  return out;
}

// prefetch()'s and keep()'s request_id: None or one id (the request whose
// next token was predicted), checked as request_ids are.
inline std::optional<uint64_t> PredictionRequestArg(const py::object& o, const char* method) {
  const std::vector<uint64_t> ids = RequestIdsArg(o, "request_id");
  // A sequence, even of one id ([1] was taken as 1), is not the one id.
  if (ids.size() > 1 || (!o.is_none() && !py::hasattr(o, "__index__")))
    Raise(k3pack::Error(std::string(method) + " takes one request_id: the request whose next token was predicted",
                        k3pack::ErrorKind::kValue));
  return ids.empty() ? std::nullopt : std::optional<uint64_t>(ids[0]);
}

// An integer id argument of the stores (topk_ids, expert_ids, slot indices):
// anything numpy.asarray takes (a numpy array, a CPU torch tensor, a list) of
// an integer dtype, as int64 values in C order; `shape` (optional) gets its
// shape. A float or bool array is a TypeError naming `arg`: casting it would
// turn expert 3.7 into expert 3 and serve the wrong expert without a word.
// An empty array may have any dtype (np.asarray([[]]) is float64).
inline std::vector<int64_t> IntegerIdsArg(const py::handle& obj, const char* arg,
                                          std::vector<int64_t>* shape = nullptr) {
  py::array a = py::isinstance<py::array>(obj) ? py::reinterpret_borrow<py::array>(obj)
                                               : py::array(py::module_::import("numpy").attr("asarray")(obj));
  const char kind = a.dtype().kind();
  if (a.size() != 0 && kind != 'i' && kind != 'u')
    throw py::type_error(std::string(arg) + " must hold integers (expert ids / slots), got dtype " +
                         py::str(a.dtype()).cast<std::string>());
  py::array_t<int64_t, py::array::c_style | py::array::forcecast> v(a);
  if (shape) shape->assign(v.shape(), v.shape() + v.ndim());
  return std::vector<int64_t>(v.data(), v.data() + v.size());
}

// An integer argument as a Python int: an int, or anything with __index__
// (a numpy integer); anything else is a TypeError naming `arg`.
inline py::int_ IndexArg(const py::handle& o, const char* arg) {
  if (!PyIndex_Check(o.ptr()))
    throw py::type_error(std::string(arg) + " must be an int, got " + TypeNameOf(o));
  py::object i = py::reinterpret_steal<py::object>(PyNumber_Index(o.ptr()));
  if (!i) throw py::error_already_set();
  return py::reinterpret_steal<py::int_>(i.release());
}

// An integer argument taken as a py::object, so that every int reaches the
// caller's own range check: `.cast<uint32_t>()` of -1, 2**32 or a float was
// pybind11's cast_error, a RuntimeError "Unable to cast Python instance to
// C++ type" that named neither the argument nor the value. Its value, or
// nullopt past int64 (no id can be that); not an int: IndexArg's TypeError.
inline std::optional<int64_t> IntArg(const py::handle& o, const char* arg) {
  const py::int_ i = IndexArg(o, arg);
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (overflow != 0) return std::nullopt;
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  return v;
}

// An integer option (a count, a byte size, an expected dimension) as a T in
// lo..hi. pybind11's casters of a T parameter refused an int outside T with
// "incompatible function arguments", a TypeError that named no argument and
// listed the whole signature; an int outside lo..hi is a ValueError naming
// `arg`, the range and the value, and another kind IndexArg's TypeError.
template <typename T>
T IntInRange(const py::handle& o, const char* arg, T lo, T hi) {
  const py::int_ v = IndexArg(o, arg);
  if (v < py::int_(lo) || v > py::int_(hi))
    throw py::value_error(std::string(arg) + " must be in " + std::to_string(lo) + ".." + std::to_string(hi) +
                          ", got " + py::repr(v).cast<std::string>());
  return v.cast<T>();
}

// An option the library refuses in SGLang's words below `lo` ("... must be
// positive", "... cannot be negative"): any int below `lo` is passed on for
// that (one past int64 as INT64_MIN, refused alike); above `hi` (where the
// library would narrow it) it is IntInRange's ValueError.
inline int64_t CountArg(const py::handle& o, const char* arg, int64_t lo, int64_t hi) {
  const py::int_ v = IndexArg(o, arg);
  if (v < py::int_(lo)) return IntArg(v, arg).value_or(INT64_MIN);
  return IntInRange<int64_t>(v, arg, lo, hi);
}

// A count the store checks itself (store/runtime_options.h: SGLang's
// "must be positive" below 1, k3pack's `limit` above it), taken as any int:
// one in lo..hi (what the C++ option holds) is passed on for the library to
// judge, and one outside is refused here with the library's own error, so
// 2**32 and 2**100 read alike.
inline int64_t StoreCountArg(const py::handle& o, const char* arg, uint64_t limit, int64_t lo, int64_t hi) {
  const py::int_ v = IndexArg(o, arg);
  const std::string shown = py::repr(v).cast<std::string>();
  if (v < py::int_(lo)) Raise(k3pack::store::NotPositiveError(arg, shown));
  if (v > py::int_(hi)) Raise(k3pack::store::PastLimitError(arg, limit, shown));
  return v.cast<int64_t>();
}

// An optional integer option: None, or IntInRange.
template <typename T>
std::optional<T> OptionalIntInRange(const py::handle& o, const char* arg, T lo, T hi) {
  if (o.is_none()) return std::nullopt;
  return IntInRange<T>(o, arg, lo, hi);
}

// A bool argument by Python's truth value (what `if x:` decides): pybind11's
// bool caster took only objects with __bool__ (a list, a str was "Unable to
// cast"); an exception __bool__ or __len__ raises propagates.
inline bool TruthArg(const py::handle& o) {
  const int truth = PyObject_IsTrue(o.ptr());
  if (truth < 0) throw py::error_already_set();
  return truth != 0;
}

// A ggml type argument that is not a name (the caller took a str as one):
// its id, or nullopt for an int no type id (uint32) can be, which the caller
// reports as its unknown-type error; anything but an int is a TypeError.
inline std::optional<uint32_t> TypeIdArg(const py::handle& o) {
  if (!PyIndex_Check(o.ptr()))
    throw py::type_error("type must be a ggml type name (str) or id (int), got " + TypeNameOf(o));
  const std::optional<int64_t> v = IntArg(o, "type");
  if (!v || *v < 0 || *v > int64_t{UINT32_MAX}) return std::nullopt;
  return static_cast<uint32_t>(*v);
}

// A layer id argument: any int. One that no layer can have (negative, or
// past 32 bits) is SGLang's inactive-layer ValueError rather than pybind11's
// "incompatible function arguments" TypeError - past int64 too, which an
// int64_t parameter turned into that TypeError.
inline uint32_t LayerArg(const py::handle& layer) {
  const std::optional<int64_t> v = IntArg(layer, "layer");
  if (!v || *v < 0 || *v > int64_t{UINT32_MAX})
    Raise(k3pack::Error("layer " + py::str(layer).cast<std::string>() + " is not an active routed MoE layer",
                        k3pack::ErrorKind::kValue));
  return static_cast<uint32_t>(*v);
}

// prefetch() and keep() of a store (`method`): (layer, expert_ids, *,
// request_id=None) calling `call` (e.g. &ExpertStore::Prefetch) without the
// GIL.
template <class Store>
auto PredictionMethod(const char* method,
                      k3pack::Status (Store::*call)(uint32_t, std::span<const int64_t>, std::optional<uint64_t>)) {
  return [method, call](Store& self, py::object layer_arg, py::object ids, py::object request_id) {
    const uint32_t layer = LayerArg(layer_arg);
    std::vector<int64_t> v = IntegerIdsArg(ids, "expert_ids");
    const std::optional<uint64_t> request = PredictionRequestArg(request_id, method);
    k3pack::Status st;
    {
      NoGil nogil;
      st = (self.*call)(layer, v, request);
    }
    Check(st);
  };
}

// Registration of each binding file.
void RegisterExitGuard(py::module_& m);
void RegisterErrors(py::module_& m);
void RegisterGguf(py::module_& m);
void RegisterLoader(py::module_& m);
void RegisterQuant(py::module_& m);
void RegisterPack(py::module_& m);
void RegisterStore(py::module_& m);
void RegisterSlotCache(py::module_& m);
void RegisterSynth(py::module_& m);

}  // namespace k3py
