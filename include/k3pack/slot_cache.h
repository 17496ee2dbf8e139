// SGLang's expert device cache, served by k3pack: one caller-owned block of
// `slot_count` slots of `slot_bytes` each (a torch.uint8 tensor
// [slot_count, object_bytes] on the CPU or a CUDA device), filled from a
// GGMLMOEPACKv1 pack. Acquire() takes one layer's [tokens, top_k] routes and
// returns the slot of each route in route order, duplicates kept, exactly as
// SGLang's KimiGGMLExpertPackStore.acquire does; MarkUsed() ends a call.
//
// Replacement is a named policy over slots ("reuse-lfu-lru-v2" gives SGLang's
// hit / miss / eviction sequence and slot choice: a free slot in index order
// first, else the policy's victim's slot). Misses are read by the store's I/O
// engine (pread pool or io_uring, buffered or O_DIRECT, all of a call's
// misses in flight at once): straight into the slot on the CPU, through
// pinned staging and a transfer stream on CUDA, or from an optional host-RAM
// tier (an ExpertStore) between the SSD and the slots.
//
// CUDA stream rules (SGLang's): when Acquire returns, every returned slot is
// ready for work queued on the caller's stream (the stream waits on events;
// no device-wide sync); a slot named in MarkUsed is not overwritten before
// the work queued on the caller's stream at that moment has finished.
//
// Thread-safe. A thread's own unreleased acquisitions do not protect their
// slots from its next call (SGLang's rule, so single-threaded sequences are
// SGLang's exactly); a hold on a slot that call takes moves to its new
// object, so releasing both calls, in either order, frees it, and the new
// object stays held until then. Where that call failed (or left the slot
// free), the earlier call's hold stays with the slot: its release ends
// that, never a hold another thread took on the slot since. Other threads'
// unreleased acquisitions protect their slots, and a call that cannot fit
// waits for them (bounded) before failing with SGLang's text.
// A release takes the releasing thread's own hold on each slot first, else
// another thread's (a call may be released from another thread than the one
// that made it): the hold of the oldest unreleased call on the slot's
// object. Slots carry no call identity, so a release from another thread
// is right when calls on the same objects are released in the order they
// were made (as a completion thread does); one that releases a later call
// while an earlier call on the same objects is still in use ends the earlier
// call's hold, and that call's slots may be overwritten while it reads them.
// A thread that dropped its own last hold on a slot and names it again
// before anybody acquires it repeats its release: that releases nothing.
// Once another thread has acquired the slot, a repeat cannot be told from a
// release of that thread's call, and ends it. Another thread's call must be
// released from a thread that holds no call on the same slots: one that
// released its own there cannot tell the two releases apart, and the other
// call stays held (a later call that needs its slots waits its bound and
// fails). Thread ids are reused once a thread exits: a new thread may
// inherit an exited one's mark until the slots are acquired again.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "k3pack/error.h"
#include "k3pack/store.h"

namespace k3pack::store {

struct SlotCacheOptions {
  // Pack checks and reads: policy, io_backend, direct_io, read_splits,
  // verify_pack_sha256, expected_*; queue_depth is the reads in flight.
  // store.cache_bytes is ignored: see host_cache_bytes.
  StoreOptions store;
  // The host-RAM tier between SSD and slots (0: none, as SGLang; misses are
  // read straight into the slot or its staging buffer).
  uint64_t host_cache_bytes = 0;
  uint32_t stage_slots = 16;          // pinned staging buffers (CUDA only)
  int64_t cache_vram_reserve_mib = 0; // reported in the stats, as SGLang does
};

class SlotCache {
 public:
  // Runs every SGLang start-up check on the pack and manifest.
  static Result<std::unique_ptr<SlotCache>> Open(const std::string& pack_path, const std::string& manifest_path,
                                                 const SlotCacheOptions& options);
  ~SlotCache();
  SlotCache(const SlotCache&) = delete;
  SlotCache& operator=(const SlotCache&) = delete;

  const StoreInfo& info() const;
  // SGLang's object_payload_bytes: one slot's size (the largest object).
  uint64_t slot_bytes() const;

  // Hands the cache its slot memory (once). Host memory must be 4096-aligned
  // when direct I/O is on. The CUDA form loads the runtime (dlopen).
  Status AttachHost(uint8_t* base, uint32_t slot_count);
  Status AttachCuda(void* device_base, uint32_t slot_count, int device);
  bool attached() const;

  // `stream`: the caller's current cudaStream_t (CUDA only; null = default).
  // `request_ids`: as ExpertStore::Acquire's (empty: unknown).
  Result<std::vector<int32_t>> Acquire(uint32_t layer, std::span<const int64_t> expert_ids,
                                       std::span<const int64_t> shape, std::optional<bool> is_prefill,
                                       void* stream = nullptr, std::span<const uint64_t> request_ids = {});
  Status MarkUsed(std::span<const int32_t> slots, void* stream = nullptr);
  // Starts host-tier reads of `expert_ids` (needs a host tier);
  // `request_id` as ExpertStore::Prefetch's.
  Status Prefetch(uint32_t layer, std::span<const int64_t> expert_ids,
                  std::optional<uint64_t> request_id = std::nullopt);
  // Keep hints for the host tier, as ExpertStore::Keep (needs a host tier).
  Status Keep(uint32_t layer, std::span<const int64_t> expert_ids,
              std::optional<uint64_t> request_id = std::nullopt);

  // SGLang's stats keys (§7.3/§7.7) plus k3pack's under "k3pack".
  nlohmann::json Snapshot() const;
  Status Close();

  struct Impl;

 private:
  explicit SlotCache(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace k3pack::store
