#include "store/fork_guard.h"

#include <string>

namespace k3pack::store {

Status CheckOpenedHere(pid_t opened_pid) {
  if (!ForkedFrom(opened_pid)) return Status::OK();
  return Error("expert store was opened by process " + std::to_string(opened_pid) +
                   " and cannot be used in process " + std::to_string(::getpid()) +
                   " forked from it: its I/O threads did not survive fork()",
               ErrorKind::kRuntime)
      .WithHint("open a new store in this process (after the fork); this copy can only be closed");
}

}  // namespace k3pack::store
