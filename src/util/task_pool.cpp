#include "util/task_pool.h"

#include <algorithm>
#include <chrono>
#include <system_error>

#include "util/threads.h"

namespace k3pack {

TaskPool::TaskPool(int threads) {
  for (int i = 0; i < std::max(1, threads); ++i) {
    const std::error_code failed = TryStartThread([this] {
      threads_.emplace_back([this] {
        while (true) {
          std::packaged_task<void()> job;
          {
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait(lock, [this] { return closing_ || !jobs_.empty(); });
            if (jobs_.empty()) return;  // closing, and nothing left to run
            job = std::move(jobs_.front());
            jobs_.pop_front();
          }
          job();
        }
      });
    });
    if (!failed) continue;
    // Out of threads (a process or address-space limit): fewer threads
    // still run every job; none would leave submitted jobs unrun, so that
    // is the caller's error to handle. No thread is running then, so
    // leaving the constructor by an exception is safe.
    if (threads_.empty()) throw std::system_error(failed);
    break;
  }
}

TaskPool::~TaskPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

std::future<void> TaskPool::Submit(std::function<void()> job) {
  std::packaged_task<void()> task(std::move(job));
  std::future<void> done = task.get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(task));
  }
  cv_.notify_one();
  return done;
}

bool TaskPool::RunOne() {
  std::packaged_task<void()> job;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (jobs_.empty()) return false;
    job = std::move(jobs_.front());
    jobs_.pop_front();
  }
  job();
  return true;
}

void TaskPool::Wait(std::future<void>& done) {
  while (done.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    if (!RunOne()) done.wait();
  }
  done.get();
}

}  // namespace k3pack
