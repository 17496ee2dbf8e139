#include "store/buffer_pool.h"

#include <cstdlib>

namespace k3pack::store {

BufferPool::~BufferPool() {
  for (auto& [size, list] : free_)
    for (uint8_t* p : list) std::free(p);
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
    void* raw = nullptr;
    if (posix_memalign(&raw, 4096, bytes) != 0) return nullptr;
    p = static_cast<uint8_t*>(raw);
    std::lock_guard<std::mutex> lock(mu_);
    allocated_ += bytes;
  }
  std::weak_ptr<BufferPool> weak = weak_from_this();
  return std::shared_ptr<uint8_t>(p, [weak, bytes](uint8_t* q) {
    if (auto pool = weak.lock()) {
      pool->Release(q, bytes);
    } else {
      std::free(q);
    }
  });
}

void BufferPool::Release(uint8_t* p, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (free_bytes_ + bytes > max_free_) {
    allocated_ -= bytes;
    std::free(p);
    return;
  }
  free_[bytes].push_back(p);
  free_bytes_ += bytes;
}

}  // namespace k3pack::store
