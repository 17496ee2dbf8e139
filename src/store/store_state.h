// ExpertStore::Impl: the store's mutable state (guarded by `mu`) and stats.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include "k3pack/store.h"
#include "store/buffer_pool.h"
#include "store/io_engine.h"
#include "store/policy.h"
#include "store/store_impl.h"

namespace k3pack::store {

struct ExpertStore::Impl {
  struct Entry {
    enum State { kLoading, kReady, kFailed };
    ObjectId id = 0;
    std::shared_ptr<uint8_t> buffer;
    State state = kLoading;
    std::optional<Error> error;
    bool prefetched = false;  // brought in by Prefetch()
    bool used = false;        // acquired at least once since it was read
  };
  static constexpr size_t kMaxLatencySamples = 1 << 20;

  // Immutable after Open.
  StoreOptions opt;
  StoreInfo info;
  PackGeometry geo;
  std::vector<std::vector<ReadRange>> ranges;  // per active layer
  UniqueFd fd, direct_fd;
  std::unique_ptr<IoEngine> engine;
  std::shared_ptr<BufferPool> pool;
  // Per pack entry (ObjectId * 3 + role), from the digest sidecar; empty when
  // objects are not checked, and then checksum_mode says why.
  std::vector<uint32_t> entry_crc32c;
  std::string checksum_mode;

  // Guarded by mu.
  mutable std::mutex mu;
  std::condition_variable cv;
  std::unique_ptr<Policy> policy;
  std::vector<std::shared_ptr<Entry>> entries;   // per ObjectId; null = not resident
  std::vector<uint32_t> pins;                    // outstanding acquires + prefetch leases
  std::vector<uint8_t> prefetch_pinned;
  std::vector<std::vector<ObjectId>> prefetch_by_layer;
  std::vector<uint64_t> generations;             // lazily computed, 0 = not yet
  uint64_t pinned_resident_bytes = 0;
  uint64_t active_acquisitions = 0, next_ticket = 0, loading = 0;
  std::map<std::thread::id, uint64_t> active_by_thread;  // who holds the active acquisitions
  bool closed = false;
  // SGLang's counters.
  uint64_t pack_reads = 0, pack_read_bytes = 0, pack_read_ns = 0;
  uint64_t cache_hits = 0, cache_misses = 0, cache_evictions = 0, io_errors = 0, resident_experts = 0;
  std::vector<uint64_t> route_calls, route_tokens;  // indexed by layer id
  uint64_t last_flush_calls = 0;
  // k3pack's.
  std::vector<uint64_t> layer_hits, layer_misses;  // per active layer
  std::vector<uint64_t> latency_ns;
  uint64_t prefetch_issued = 0, prefetch_useful = 0, prefetch_wasted = 0;
  uint64_t checksum_errors = 0, checksum_verified = 0;

  uint64_t Generation(ObjectId id);
  void Pin(ObjectId id);
  void Unpin(ObjectId id);
  void BecameResident(ObjectId id);
  void DropEntry(ObjectId id, bool evicted);
  void ReleasePrefetchPins(uint32_t layer_index);
  void EndAcquisition(std::thread::id owner);
  bool Fits(std::span<const ObjectId> keys) const;
  std::shared_ptr<Entry> StartRead(ObjectId id, bool prefetched);
  void FinishRead(const std::shared_ptr<Entry>& e, const ObjectReadResult& r, bool checksum_failed = false);
  // The object's bytes against its CRC32Cs (engine thread, no lock needed:
  // entry_crc32c is immutable). An error names layer, expert and offset.
  Status CheckObject(ObjectId id, const uint8_t* bytes) const;
  nlohmann::json SnapshotLocked() const;
  Status WriteStatsJson(const nlohmann::json& snapshot) const;
};

}  // namespace k3pack::store
