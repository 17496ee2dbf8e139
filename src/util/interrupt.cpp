#include "util/interrupt.h"

#include <algorithm>
#include <utility>

namespace k3pack {

namespace {
thread_local std::function<Status()> current_check;
}  // namespace

ScopedInterruptCheck::ScopedInterruptCheck(std::function<Status()> check) : previous_(std::move(current_check)) {
  current_check = std::move(check);
}

ScopedInterruptCheck::~ScopedInterruptCheck() { current_check = std::move(previous_); }

bool HasInterruptCheck() { return static_cast<bool>(current_check); }

Status PollInterruptCheck() { return current_check ? current_check() : Status::OK(); }

std::chrono::steady_clock::time_point WakeForInterrupt(std::chrono::steady_clock::time_point deadline) {
  if (!current_check) return deadline;
  return std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(100));
}

Status PollInterruptUnlocked(std::unique_lock<std::mutex>& lock) {
  if (!current_check) return Status::OK();
  lock.unlock();
  Status st = current_check();
  lock.lock();
  return st;
}

}  // namespace k3pack
