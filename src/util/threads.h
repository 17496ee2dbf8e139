// Running one work loop on several threads, the calling thread included: the
// shape of every sweep that pulls jobs from a shared counter.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <system_error>
#include <thread>
#include <vector>

namespace k3pack {

// Calls `work` on max(1, threads) threads (threads - 1 new ones plus the
// caller) and returns once every call has returned. When the system gives
// fewer threads (a pids or address-space limit), `work` runs on those it
// gave: a loop pulling from a shared counter still does every job.
template <typename Work>
void RunOnThreads(unsigned threads, Work&& work) {
  std::vector<std::thread> pool;
  for (unsigned k = 1; k < std::max(1u, threads); ++k) {
    try {
      pool.emplace_back([&work] { work(); });
    } catch (const std::system_error&) {
      break;
    }
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
