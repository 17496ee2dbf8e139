// Running one work loop on several threads, the calling thread included: the
// shape of every sweep that pulls jobs from a shared counter.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <new>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace k3pack {

// Runs `start` (which starts a thread) and returns the error of a thread that
// could not be started, empty when it was. std::thread throws
// std::system_error when pthread_create fails and std::bad_alloc when the
// thread's state cannot be allocated: under an address-space limit either
// comes, and a std::bad_alloc let through with other threads running ended
// the process (std::terminate).
template <typename Start>
std::error_code TryStartThread(Start&& start) {
  try {
    start();
    return {};
  } catch (const std::system_error& e) {
    return e.code();
  } catch (const std::bad_alloc&) {
    return std::make_error_code(std::errc::not_enough_memory);
  }
}

// Runs a background thread's body and says whether it ended by
// std::bad_alloc. Under `ulimit -v` any allocation may fail (a thread's
// malloc arena is address space too), and an exception leaving a thread ends
// the process (std::terminate, SIGABRT): the owner records the failure
// without allocating (a flag) and reports it from the thread that waits.
template <typename Body>
bool RanOutOfMemory(Body&& body) {
  try {
    body();
    return false;
  } catch (const std::bad_alloc&) {
    return true;
  }
}

// Joins the threads still running when the scope is left, by an exception
// too (std::bad_alloc on the thread that owns them): a std::thread destroyed
// while joinable ends the process. `stop` first tells them to finish early.
template <typename Stop>
class JoinedOnExit {
 public:
  JoinedOnExit(std::vector<std::thread>& threads, Stop stop) : threads_(threads), stop_(std::move(stop)) {}
  ~JoinedOnExit() {
    if (std::none_of(threads_.begin(), threads_.end(), [](const std::thread& t) { return t.joinable(); })) return;
    stop_();
    for (std::thread& t : threads_)
      if (t.joinable()) t.join();
  }
  JoinedOnExit(const JoinedOnExit&) = delete;
  JoinedOnExit& operator=(const JoinedOnExit&) = delete;

 private:
  std::vector<std::thread>& threads_;
  Stop stop_;
};

// Calls `work` on max(1, threads) threads (threads - 1 new ones plus the
// caller) and returns once every call has returned. When the system gives
// fewer threads (a pids or address-space limit), `work` runs on those it
// gave: a loop pulling from a shared counter still does every job. An
// exception thrown by any call (std::bad_alloc under `ulimit -v`) is thrown
// again here once every thread has been joined, as if one thread had run.
template <typename Work>
void RunOnThreads(unsigned threads, Work&& work) {
  const unsigned wanted = std::max(1u, threads);
  std::vector<std::exception_ptr> thrown(wanted);  // before any thread: may throw with none running
  auto run = [&work](std::exception_ptr* slot) {
    try {
      work();
    } catch (...) {
      *slot = std::current_exception();  // the thrown object's reference, no allocation
    }
  };
  std::vector<std::thread> pool;
  for (unsigned k = 1; k < wanted; ++k) {
    if (TryStartThread([&] { pool.emplace_back(run, &thrown[k]); })) break;
  }
  run(&thrown[0]);
  for (auto& th : pool) th.join();
  for (const std::exception_ptr& e : thrown)
    if (e) std::rethrow_exception(e);
}

// Calls job(i) once for every i in [0, jobs), on up to `threads` threads
// that pull the next i from a shared counter (RunOnThreads: every job runs
// on the threads the system gives). A job that throws ends the others'
// loops too: its exception is what the call ends with.
template <typename Job>
void RunJobsOnThreads(unsigned threads, uint64_t jobs, Job&& job) {
  std::atomic<uint64_t> next{0};
  RunOnThreads(threads, [&] {
    for (uint64_t j; (j = next.fetch_add(1)) < jobs;) {
      try {
        job(j);
      } catch (...) {
        next.store(jobs);
        throw;
      }
    }
  });
}

}  // namespace k3pack
