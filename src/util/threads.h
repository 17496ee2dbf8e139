// Running one work loop on several threads, the calling thread included: the
// shape of every sweep that pulls jobs from a shared counter.
#pragma once

#include <algorithm>
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

}  // namespace k3pack
