// Python callables handed to the engine (log lines, lock waits), called back
// from native threads under the GIL.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common.h"

namespace k3py {

std::shared_ptr<py::object> HoldCallable(py::object fn, const char* keyword) {
  if (!PyCallable_Check(fn.ptr())) {
    throw py::type_error(std::string(keyword) + " must be a callable or None, got " + TypeNameOf(fn));
  }
  return std::shared_ptr<py::object>(new py::object(std::move(fn)), [](py::object* p) {
    CallbackGil gil;
    if (gil.held()) delete p;  // else the interpreter is exiting: leave it to the process's end
  });
}

namespace {

thread_local int t_user_callbacks = 0;

}  // namespace

InUserCallback::InUserCallback() { ++t_user_callbacks; }
InUserCallback::~InUserCallback() { --t_user_callbacks; }

void RefuseInsideUserCallback(const char* call) {
  if (t_user_callbacks == 0) return;
  throw std::runtime_error(std::string(call) + " cannot be called from a progress or log callback of a k3pack call "
                           "running on this thread: the writers' locks let their own thread in, so a write there "
                           "replaced the files of a build under way; start it after the call returns, or from "
                           "another thread");
}

namespace {

// A KeyboardInterrupt a callback raised, not yet raised again. Read and
// written with the GIL held only.
struct CallbackInterrupt {
  std::thread::id thread;  // the callback's
  py::object type, value, trace;
  bool raised = false;
};
using CallbackInterruptPtr = std::shared_ptr<CallbackInterrupt>;

// Leaked: an entry whose pending call never ran (the process ended) must not
// drop its Python objects after the interpreter has gone.
std::vector<CallbackInterruptPtr>& CallbackInterrupts() {
  static auto* kept = new std::vector<CallbackInterruptPtr>();
  return *kept;
}

void RestoreInterrupt(CallbackInterrupt& i) {
  i.raised = true;
  PyErr_Restore(i.type.release().ptr(), i.value.release().ptr(), i.trace.release().ptr());
}

// Py_AddPendingCall's function, run by the main thread with the GIL where it
// next runs Python code (as Python raises a Ctrl-C's exception): raises the
// interrupt when no interrupt check of its call took it.
int RaiseUntakenInterrupt(void* arg) {
  std::unique_ptr<CallbackInterruptPtr> entry(static_cast<CallbackInterruptPtr*>(arg));
  auto& kept = CallbackInterrupts();
  kept.erase(std::remove(kept.begin(), kept.end(), *entry), kept.end());
  if ((*entry)->raised) return 0;
  RestoreInterrupt(**entry);
  return -1;
}

}  // namespace

bool RestoreCallbackInterrupt() {
  for (const CallbackInterruptPtr& entry : CallbackInterrupts()) {
    if (entry->raised || entry->thread != std::this_thread::get_id()) continue;
    RestoreInterrupt(*entry);
    return true;
  }
  return false;
}

void DiscardCallbackError(py::error_already_set& e, const char* what) {
  if (e.matches(PyExc_KeyboardInterrupt)) {
    // A Ctrl-C whose handler ran inside the callback (the main thread was
    // running its Python code) raised there; discarded, it was lost and the
    // call went on for as long as it lasts.
    auto entry = std::make_shared<CallbackInterrupt>(
        CallbackInterrupt{std::this_thread::get_id(), e.type(), e.value(), e.trace()});
    auto* arg = new CallbackInterruptPtr(entry);
    if (Py_AddPendingCall(&RaiseUntakenInterrupt, arg) == 0) {
      CallbackInterrupts().push_back(std::move(entry));
    } else {
      delete arg;           // the queue is full: a pending Ctrl-C instead,
      PyErr_SetInterrupt();  // which runs the SIGINT handler once more
    }
    return;
  }
  e.discard_as_unraisable(what);
}

std::function<void(const std::string&)> LineCallback(py::object fn, const char* keyword) {
  if (fn.is_none()) return nullptr;
  auto holder = HoldCallable(std::move(fn), keyword);
  return [holder](const std::string& line) {
    CallbackGil gil;
    if (!gil.held()) return;
    try {
      const InUserCallback inside;
      (*holder)(line);
    } catch (py::error_already_set& e) {
      DiscardCallbackError(e, "k3pack log callback");
    }
  };
}

std::function<void(const std::string&)> LogLines(const py::object& log) {
  return LineCallback(log.is_none() ? py::module_::import("logging").attr("getLogger")("k3pack").attr("warning") : log,
                      "log");
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
