// Big buffers recycled by size, so a steady state of same-sized buffers never
// returns to the allocator: a fresh 11 MiB buffer costs ~2,900 page faults,
// about as long as reading it from a fast SSD. The expert store's object
// buffers (4096-aligned, O_DIRECT reads land in them) and the loader's
// copy-mode tensors (2 MiB-aligned huge pages) come from one.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace k3pack {

// Where buffers come from; empty functions mean 4096-aligned posix_memalign
// and free.
struct BufferAllocator {
  std::function<void*(uint64_t bytes)> allocate;
  std::function<void(void* p, uint64_t bytes)> release;
};

class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  // Keeps at most `max_free_bytes` of released buffers for reuse.
  explicit BufferPool(uint64_t max_free_bytes, BufferAllocator allocator = {})
      : max_free_(max_free_bytes), allocator_(std::make_shared<const BufferAllocator>(std::move(allocator))) {}
  ~BufferPool();
  // A buffer of at least `bytes` (rounded up to 4096; a released buffer is
  // reused for the same rounded size); returned to the pool when the last
  // reference drops, even after the pool itself is gone (then freed). Null
  // if memory is exhausted.
  std::shared_ptr<uint8_t> Get(uint64_t bytes);
  uint64_t allocated_bytes() const;
  // Frees every buffer kept for reuse and keeps none from now on: buffers
  // still referenced are freed when their last reference drops. For an
  // owner that is done (a closed store) but may live on.
  void Drain();

 private:
  void Release(uint8_t* p, uint64_t bytes);
  static uint8_t* Allocate(const BufferAllocator& a, uint64_t bytes);
  static void Free(const BufferAllocator& a, uint8_t* p, uint64_t bytes);
  mutable std::mutex mu_;
  uint64_t max_free_;
  // Shared with outstanding buffers, which may outlive the pool.
  std::shared_ptr<const BufferAllocator> allocator_;
  uint64_t free_bytes_ = 0;
  uint64_t allocated_ = 0;
  std::map<uint64_t, std::vector<uint8_t*>> free_;
};

}  // namespace k3pack
