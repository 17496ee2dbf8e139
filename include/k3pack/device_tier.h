// Optional GPU tier above the host ExpertStore: a device-memory cache of
// expert objects, filled with asynchronous host-to-device copies, so a GPU
// MoE kernel can read routed experts in place. Misses are read by the host
// store (its cache, I/O engine and checks) and copied by several workers,
// each with its own stream: through pinned staging buffers (a worker's next
// host copy overlaps its last DMA), or straight from the host store's
// buffers when the store was opened with UsePinnedHostBuffers(). Replacement
// on the device is LRU among the slots no unreleased call holds.
//
// The CUDA runtime is loaded at run time (no nvcc, no build-time CUDA): on
// a machine without libcudart or a GPU, Open() fails with a message that
// says so, and nothing else in k3pack depends on a GPU.
//
// Acquire and Release are serialized by one mutex; device spans stay valid
// until their acquisition is released.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include <nlohmann/json.hpp>

#include "k3pack/error.h"
#include "k3pack/store.h"

namespace k3pack::store {

struct DeviceTierOptions {
  uint64_t device_bytes = 1ull << 30;  // device-memory budget for resident objects
  int device = 0;                      // CUDA device ordinal
  uint32_t copy_workers = 4;           // threads (and streams) copying misses to the device
  bool stage_pageable = true;          // copy pageable sources through pinned staging (2 per worker);
                                       // false: hand them to the driver, which stages them itself
};

// Device memory: not readable from the host (see CopyToHost).
struct DeviceSpan {
  const void* data = nullptr;
  uint64_t size = 0;
};

struct DeviceExpertView {
  uint32_t layer = 0, expert = 0;
  DeviceSpan bytes, up, gate, down;  // whole object and its role sub-ranges
};

struct DeviceAcquisition {
  uint32_t layer = 0;
  std::vector<DeviceExpertView> routes;  // route order (tokens x top_k), duplicates kept
  std::vector<uint32_t> slots;           // internal: what Release lets go
  uint64_t ticket = 0;                   // 0 once released
  const void* tier = nullptr;            // internal: the DeviceExpertTier that handed it out
};

class DeviceExpertTier {
 public:
  static Result<std::unique_ptr<DeviceExpertTier>> Open(std::shared_ptr<ExpertStore> host,
                                                        const DeviceTierOptions& options = {});
  // Sets options.buffer_alloc / buffer_free so the store's object buffers
  // are pinned host memory: misses then go to the device with no staging
  // copy. Fails where no CUDA runtime can be loaded.
  static Status UsePinnedHostBuffers(StoreOptions& options);
  ~DeviceExpertTier();
  DeviceExpertTier(const DeviceExpertTier&) = delete;
  DeviceExpertTier& operator=(const DeviceExpertTier&) = delete;

  // Same routing contract and errors as ExpertStore::Acquire. On return the
  // bytes of every route are on the device (all copies complete).
  // `request_ids` (optional, as ExpertStore::Acquire's: one id for the call
  // or one per row): the host store's acquire of the device misses carries
  // them, each missed object as a route of the first row that asked for it,
  // so a request-aware host policy learns from what reaches it.
  Result<DeviceAcquisition> Acquire(uint32_t layer, std::span<const int64_t> expert_ids,
                                    std::span<const int64_t> shape, std::span<const uint64_t> request_ids = {});
  // Lets the acquisition's slots be replaced again. Idempotent, also through
  // copies of the acquisition (one release in all). Errors: an acquisition
  // of another tier (nothing is released).
  Status Release(DeviceAcquisition& acquisition);

  // Copies device bytes back to host memory (dst.size() bytes from src.data).
  Status CopyToHost(const DeviceSpan& src, std::span<uint8_t> dst) const;

  // Slots, hits, misses, evictions, bytes and seconds of host-to-device
  // copies, the runtime library and versions.
  nlohmann::json Snapshot() const;

  struct Impl;

 private:
  explicit DeviceExpertTier(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace k3pack::store
