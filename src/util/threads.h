// Running one work loop on several threads, the calling thread included: the
// shape of every sweep that pulls jobs from a shared counter.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <new>
#include <system_error>
#include <thread>
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

// Calls `work` on max(1, threads) threads (threads - 1 new ones plus the
// caller) and returns once every call has returned. When the system gives
// fewer threads (a pids or address-space limit), `work` runs on those it
// gave: a loop pulling from a shared counter still does every job.
template <typename Work>
void RunOnThreads(unsigned threads, Work&& work) {
  std::vector<std::thread> pool;
  for (unsigned k = 1; k < std::max(1u, threads); ++k) {
    if (TryStartThread([&] { pool.emplace_back([&work] { work(); }); })) break;
  }
  work();
  for (auto& th : pool) th.join();
}

// Calls job(i) once for every i in [0, jobs), on up to `threads` threads
// that pull the next i from a shared counter (RunOnThreads: every job runs
// on the threads the system gives).
template <typename Job>
void RunJobsOnThreads(unsigned threads, uint64_t jobs, Job&& job) {
  std::atomic<uint64_t> next{0};
  RunOnThreads(threads, [&] {
    for (uint64_t j; (j = next.fetch_add(1)) < jobs;) job(j);
  });
}

}  // namespace k3pack
