#include "util/buffer_pool.h"

#include <cstdlib>
#include <new>

namespace k3pack {

uint8_t* BufferPool::Allocate(const BufferAllocator& a, uint64_t bytes) {
  if (a.allocate) return static_cast<uint8_t*>(a.allocate(bytes));
  void* raw = nullptr;
  return posix_memalign(&raw, 4096, bytes) == 0 ? static_cast<uint8_t*>(raw) : nullptr;
}

void BufferPool::Free(const BufferAllocator& a, uint8_t* p, uint64_t bytes) {
  if (a.release) a.release(p, bytes);
  else std::free(p);
}

BufferPool::~BufferPool() {
  for (auto& [size, list] : free_)
    for (uint8_t* p : list) Free(*allocator_, p, size);
}

uint64_t BufferPool::allocated_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocated_;
}

std::shared_ptr<uint8_t> BufferPool::Get(uint64_t bytes) {
  bytes = (bytes + 4095) / 4096 * 4096;
  uint8_t* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(bytes);
    if (it != free_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
      free_bytes_ -= bytes;
    }
  }
  if (p == nullptr) {
    p = Allocate(*allocator_, bytes);
    if (p == nullptr) return nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    allocated_ += bytes;
  }
  std::weak_ptr<BufferPool> weak = weak_from_this();
  return std::shared_ptr<uint8_t>(p, [weak, alloc = allocator_, bytes](uint8_t* q) {
    if (auto pool = weak.lock()) {
      pool->Release(q, bytes);
    } else {
      Free(*alloc, q, bytes);
    }
  });
}

void BufferPool::Drain() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [size, list] : free_) {
    for (uint8_t* p : list) Free(*allocator_, p, size);
    allocated_ -= size * list.size();
  }
  free_.clear();
  free_bytes_ = 0;
  max_free_ = 0;
}

void BufferPool::Release(uint8_t* p, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_bytes_ + bytes > max_free_) {
    allocated_ -= bytes;
    Free(*allocator_, p, bytes);
    return;
  }
  try {
    free_[bytes].push_back(p);
    free_bytes_ += bytes;
  } catch (const std::bad_alloc&) {
    // This runs in a shared_ptr's deleter, where an exception ends the
    // process: with no memory to keep the buffer for reuse, free it.
    allocated_ -= bytes;
    Free(*allocator_, p, bytes);
  }
}

}  // namespace k3pack
