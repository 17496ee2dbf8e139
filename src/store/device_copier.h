// Host-to-device copies for the device tier, spread over worker threads.
// One thread cannot feed a GPU: a single memcpy into pinned staging runs at
// a few GB/s while the DMA engines take 50+. Each worker owns a stream and
// two pinned staging buffers, so its next host copy overlaps its last DMA.
// A pinned source goes to the DMA engine as it is (zero copy); without
// staging, pageable sources do too and the driver stages them itself.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "k3pack/error.h"
#include "store/cuda_runtime.h"

namespace k3pack::store {

struct CopyJob {
  const void* src = nullptr;  // host
  void* dst = nullptr;        // device
  uint64_t size = 0;
  bool src_pinned = false;    // page-locked: DMA straight from it
};

class DeviceCopier {
 public:
  // Starts `workers` copy threads, or as many as the process gives (an error
  // when it gives none).
  static Result<std::unique_ptr<DeviceCopier>> Open(const cuda::Runtime* rt, int device, uint32_t workers,
                                                    uint64_t staging_bytes, bool stage_pageable);
  ~DeviceCopier();
  DeviceCopier(const DeviceCopier&) = delete;
  DeviceCopier& operator=(const DeviceCopier&) = delete;

  // Copies every job and returns once all bytes are on the device (or the
  // first error, after every copy already started has finished). Throws
  // std::bad_alloc (under `ulimit -v`) only with no job queued.
  Status CopyAll(std::span<const CopyJob> jobs);
  uint32_t workers() const { return static_cast<uint32_t>(lanes_.size()); }
  bool stages_pageable() const { return stage_; }

 private:
  struct Lane {
    cuda::Stream stream = nullptr;
    void* staging[2] = {nullptr, nullptr};
    cuda::Event copied[2] = {nullptr, nullptr};  // recorded after the DMA out of staging[i]
    bool pending[2] = {false, false};
    int next = 0;
  };
  DeviceCopier(const cuda::Runtime* rt, int device, bool stage) : rt_(rt), device_(device), stage_(stage) {}
  Status Copy(Lane& lane, const CopyJob& job);
  void Release(Lane& lane);  // its stream, events and staging
  void Work(Lane* lane);

  const cuda::Runtime* rt_;
  int device_;
  bool stage_;
  std::vector<Lane> lanes_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<const CopyJob*> queue_;
  size_t remaining_ = 0;
  Status first_error_;
  bool stopping_ = false;
};

}  // namespace k3pack::store
