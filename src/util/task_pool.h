// A fixed set of threads running queued jobs in submission order: the pack
// builder's hashing beside its copy, the store's checksum checks beside its
// reads.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

namespace k3pack {

class TaskPool {
 public:
  // Starts up to `threads` (at least 1) threads: as many as the system
  // gives, and std::system_error when it gives none.
  explicit TaskPool(int threads);
  int threads() const { return static_cast<int>(threads_.size()); }
  // Runs every queued job, then joins the threads.
  ~TaskPool();
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;
  // The returned future is ready once `job` has run.
  std::future<void> Submit(std::function<void()> job);
  // Waits for `done`, running queued jobs on the calling thread meanwhile
  // (a thread waiting for its jobs runs them too, instead of idling while
  // the pool's threads catch up), and throws what the job threw (under
  // `ulimit -v`, std::bad_alloc): a job that failed never passes as done.
  void Wait(std::future<void>& done);

 private:
  bool RunOne();  // runs the oldest queued job here; false when none is queued
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> jobs_;
  bool closing_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace k3pack
