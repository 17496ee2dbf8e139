// Native calls and interpreter exit (see NoGil in common.h).
//
// CPython ends any thread that takes the GIL after finalization has begun
// with pthread_exit(). Inside a C++ frame that unwind runs into a noexcept
// destructor (the GIL's own release guard) and the process aborts:
// "terminate called without an active exception", exit status 134, for a
// script whose only fault was to exit while a daemon thread was in k3pack.
//
// The atexit hook registered at import runs before finalization, on the
// thread that will finalize. It marks the interpreter as exiting (long calls
// stop at their next interrupt check, new calls from other threads are
// refused), then waits without the GIL until every thread inside a native
// section has taken the GIL back and left it. A thread still inside when the
// wait gives up is parked when it comes back instead of touching the GIL:
// the process is about to end, and parking is the one way out that neither
// aborts nor runs Python code after finalization.
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "common.h"

namespace k3py {
namespace {

// Atomics only: a fork() child inherits them from whatever state the
// parent's threads left, and resets them (ResetInChild).
std::atomic<int> inside{0};     // threads between NoGil's release and its re-acquire
std::atomic<int> returning{0};  // threads between deciding to take the GIL and holding it
std::atomic<bool> exiting{false};
std::atomic<bool> abandoned{false};  // the exit stopped waiting: nobody may take the GIL any more
std::atomic<std::thread::id> finalizing_thread{};

bool OnFinalizingThread() { return exiting.load() && finalizing_thread.load() == std::this_thread::get_id(); }

// The finalizing thread never needs the guard: CPython does not end it.
bool RefusedForExit() { return exiting.load() && !OnFinalizingThread(); }

// Announces a GIL take; false when the exit has given up on this thread.
// Paired with the exit's store of `abandoned` and load of `returning`: one of
// the two sides sees the other (sequentially consistent atomics).
bool AnnounceGilTake() {
  returning.fetch_add(1);
  if (!abandoned.load()) return true;
  returning.fetch_sub(1);
  return false;
}

// Never returns: see the file comment.
[[noreturn]] void Park() {
  for (;;) pause();
}

std::chrono::milliseconds ExitWait() {
  // Test seam: a short wait, so a test reaches the parking path quickly.
  if (const char* v = std::getenv("K3PACK_TEST_EXIT_WAIT_MS")) return std::chrono::milliseconds(std::atol(v));
  return std::chrono::seconds(10);
}

void WaitForNativeCallsAtExit() {
  finalizing_thread.store(std::this_thread::get_id());
  exiting.store(true);
  py::gil_scoped_release nogil;  // not NoGil: this thread waits for the others
  const auto deadline = std::chrono::steady_clock::now() + ExitWait();
  auto busy = [] { return inside.load() > 0 || returning.load() > 0; };
  while (busy() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!busy()) return;
  abandoned.store(true);
  // Threads that announced their GIL take before seeing `abandoned` get it as
  // soon as this thread lets go of it; wait for them to hold it and leave.
  while (returning.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::fprintf(stderr,
               "k3pack: %d call(s) on other threads were still running at interpreter exit; "
               "their threads stop where they are when the process ends\n",
               inside.load());
}

void ResetInChild() {
  inside.store(0);
  returning.store(0);
  exiting.store(false);
  abandoned.store(false);
}

}  // namespace

NoGil::NoGil() {
  inside.fetch_add(1);  // before the check: the exit's wait sees this call or this call sees the exit
  if (RefusedForExit()) {
    inside.fetch_sub(1);
    Raise(k3pack::Error("the interpreter is exiting: k3pack refuses new calls from threads other than the one "
                        "finalizing it (they could not take the GIL back)",
                        k3pack::ErrorKind::kRuntime));
  }
  release_.emplace();
}

NoGil::NoGil(std::nothrow_t) {
  inside.fetch_add(1);  // as NoGil(): the exit's wait sees this call or this call sees the exit
  if (exiting.load() || PyGILState_Check() == 0) {
    inside.fetch_sub(1);
    return;
  }
  release_.emplace();
}

NoGil::~NoGil() {
  if (!release_) return;  // NoGil(std::nothrow) kept the GIL
  const bool finalizer = OnFinalizingThread();
  if (!finalizer && !AnnounceGilTake()) Park();
  release_.reset();  // takes the GIL back
  if (!finalizer) returning.fetch_sub(1);
  inside.fetch_sub(1);
}

CallbackGil::CallbackGil() {
  if (OnFinalizingThread()) {
    acquire_.emplace();
    return;
  }
  if (RefusedForExit() || !AnnounceGilTake()) return;
  acquire_.emplace();
  returning.fetch_sub(1);
}

void RegisterExitGuard(py::module_& m) {
  m.def("_wait_for_native_calls_at_exit", &WaitForNativeCallsAtExit,
        "atexit hook: stops long calls, waits for threads inside k3pack to return (internal)");
  py::module_::import("atexit").attr("register")(m.attr("_wait_for_native_calls_at_exit"));
  pthread_atfork(nullptr, nullptr, &ResetInChild);
}

}  // namespace k3py
