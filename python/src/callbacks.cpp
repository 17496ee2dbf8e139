// Python callables handed to the engine (log lines, lock waits), called back
// from native threads under the GIL.
#include <cmath>
#include <limits>

#include "common.h"

namespace k3py {

std::shared_ptr<py::object> HoldCallable(py::object fn) {
  return std::shared_ptr<py::object>(new py::object(std::move(fn)), [](py::object* p) {
    CallbackGil gil;
    if (gil.held()) delete p;  // else the interpreter is exiting: leave it to the process's end
  });
}

void DiscardCallbackError(py::error_already_set& e, const char* what) {
  if (e.matches(PyExc_KeyboardInterrupt)) {
    // A Ctrl-C whose handler ran inside the callback (the main thread was
    // running its Python code) raised there; discarded, it was lost and the
    // call went on for as long as it lasts. Re-armed, it stops the call at
    // its next interrupt check (PendingSignals), or is raised when it returns.
    PyErr_SetInterrupt();
    return;
  }
  e.discard_as_unraisable(what);
}

std::function<void(const std::string&)> LineCallback(py::object fn) {
  if (fn.is_none()) return nullptr;
  auto holder = HoldCallable(std::move(fn));
  return [holder](const std::string& line) {
    CallbackGil gil;
    if (!gil.held()) return;
    try {
      (*holder)(line);
    } catch (py::error_already_set& e) {
      DiscardCallbackError(e, "k3pack log callback");
    }
  };
}

std::function<void(const std::string&)> LogLines(const py::object& log) {
  return LineCallback(log.is_none() ? py::module_::import("logging").attr("getLogger")("k3pack").attr("warning") : log);
}

namespace {

k3pack::LockWait LockWaitOf(const py::object& wait, const py::object& log,
                            const std::shared_ptr<PendingSignals>& signals) {
  k3pack::LockWait w;
  w.option = "wait=SECONDS";
  if (py::isinstance<py::str>(wait) && wait.cast<std::string>() == "forever") {
    w.seconds = std::numeric_limits<double>::infinity();
  } else if (!wait.is_none()) {
    const bool number = (py::isinstance<py::int_>(wait) || py::isinstance<py::float_>(wait)) &&
                        !py::isinstance<py::bool_>(wait);
    double seconds = -1;
    if (number) {
      seconds = PyFloat_AsDouble(wait.ptr());
      // An int past a double's range (OverflowError, which .cast<double>()
      // turned into "Unable to cast"): longer than float('inf') waits when
      // positive, refused below as negative otherwise.
      if (seconds == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        seconds = wait > py::int_(0) ? std::numeric_limits<double>::infinity() : -1;
      }
    }
    if (!number || std::isnan(seconds) || seconds < 0) {
      throw py::value_error("wait must be a number of seconds (0 or more), float('inf') or 'forever', got " +
                            py::repr(wait).cast<std::string>());
    }
    w.seconds = seconds;
  }
  w.notify = LogLines(log);
  w.interrupted = PendingSignals::CheckOf(signals);
  return w;
}

}  // namespace

LockWaitKeyword::LockWaitKeyword(const py::object& wait, const py::object& log, const std::string& waiting_for)
    : signals_(std::make_shared<PendingSignals>("waiting for " + waiting_for)),
      scope_(LockWaitOf(wait, log, signals_)) {}

}  // namespace k3py
