// Appending a batch to a queue that other threads take from, all or nothing.
#pragma once

#include <cstddef>
#include <new>

namespace k3pack {

// Appends make(i) for every i in [0, n) to the back of `queue` (a
// std::deque, its lock held by the caller). Under `ulimit -v` a push_back
// may throw std::bad_alloc: what this call appended is taken back and the
// exception rethrown, so no consumer ever sees half a batch (a read whose
// job never finishes, a copy of jobs its caller has let go).
template <typename Queue, typename Make>
void AppendAllOrNone(Queue& queue, size_t n, Make&& make) {
  size_t appended = 0;
  try {
    for (; appended < n; ++appended) queue.push_back(make(appended));
  } catch (const std::bad_alloc&) {
    for (; appended > 0; --appended) queue.pop_back();
    throw;
  }
}

}  // namespace k3pack
