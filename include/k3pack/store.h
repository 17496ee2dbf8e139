// The expert store: SGLang's KimiGGMLExpertPackStore rebuilt as a host-memory
// expert cache over a GGMLMOEPACKv1 pack.
//
// Open() runs every start-up check SGLang runs, in its order and with its
// error texts (manifest, header, all index entries, index digest). Acquire()
// takes one layer's [tokens, top_k] routing matrix and hands back, for each
// route in order (duplicates kept), a view of that expert object's bytes,
// reading only what is not resident; MarkUsed() releases a call. Reads run
// on a pread thread pool or io_uring, buffered or O_DIRECT, several in flight;
// Prefetch() starts reads without waiting. Replacement policies are named
// ("reuse-lfu-lru-v2" = SGLang's, exactly; "lru"; "quota-decay", ours).
//
// Thread-safe: any number of threads may acquire / prefetch / mark_used.
// Views hold shared ownership of their bytes, so a view stays valid after
// MarkUsed() or eviction (the bytes are recycled only once no view is left).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "k3pack/ep.h"
#include "k3pack/error.h"

namespace k3pack::store {

struct StoreOptions {
  uint64_t cache_bytes = 4096ull << 20;       // host-memory budget for resident objects
  std::string policy = "reuse-lfu-lru-v2";
  std::string io_backend = "pread";           // "pread" | "uring"
  bool direct_io = false;                     // O_DIRECT (objects and ranges must be 4096-aligned)
  int64_t read_splits = 1;                    // ranges per object read (SGLang's read_splits)
  int64_t queue_depth = 16;                   // reads in flight (SGLang: stage_slots)
  int64_t stats_flush_interval = 0;           // write stats every N route calls (0: only at close)
  std::string stats_path;                     // empty: no stats file
  bool verify_pack_sha256 = false;            // hash the whole pack at open
  // Check every object read from the pack (each miss) against the CRC32Cs of
  // the digest sidecar `<pack>.digests`: a damaged object is an error naming
  // layer, expert and file offset, and is never cached. Without a sidecar, or
  // with one written before k3pack recorded CRCs, nothing is checked; the
  // stats say so ("k3pack.checksums").
  bool verify_checksums = true;
  // Expected (num_hidden_layers, num_experts, top_k). Unset: Kimi-K3's
  // (93, 896, 16) for a kimi-k3 manifest, the manifest's own for "scaled".
  std::optional<uint32_t> expected_layers, expected_experts, expected_top_k;
  // Where object buffers come from (default posix_memalign / free); must
  // return 4096-aligned memory or null. DeviceExpertTier::PinnedHostBuffers()
  // supplies pinned memory, so copies to a GPU need no staging.
  std::function<void*(uint64_t bytes)> buffer_alloc;
  std::function<void(void* p, uint64_t bytes)> buffer_free;
  // Expert parallelism: serve one EP rank, i.e. only the experts SGLang's EP
  // gives it (k3pack/ep.h). Unset: the manifest's k3pack.ep for a rank pack,
  // else every expert. Set on a rank pack, it must name the same rank; set on
  // a full pack, the store is that rank's view of it. A rank store reads,
  // caches and prefetches only owned experts; a route to any other expert is
  // refused before any I/O (SGLang's EP never sends one: a routing bug). Ids
  // stay global, and a row may hold 1..top_k routes (a token's share).
  std::optional<ep::Rank> ep;
  // What errors about `ep` call its size and rank (the Python module passes
  // its keywords ep_size / ep_rank); by default neutral ("EP size").
  ep::RankNames ep_names;
  // Prefetch() (docs/store.md, "Prefetch policy"). "staged" (default): a
  // speculative read lands in a staging area outside the cache; the next
  // Acquire() of that layer takes the objects it routes to (inserted through
  // the policy exactly as demand misses, without a read of their own) and
  // drops the rest, so a speculative read never evicts an object demand-only
  // caching would have kept (keep_predicted below is the one way a
  // prediction changes the victims). "cache": the older rule, reads go into the cache through
  // the policy (may evict residents), pinned until the next Acquire() of
  // that layer.
  std::string prefetch_mode = "staged";
  // Staged mode: bytes of staged objects (queued, in flight or ready, and
  // dropped reads still in flight); a prefetch past it is refused (counted).
  // 0: two top-k working sets of the largest object.
  uint64_t prefetch_budget_bytes = 0;
  // Staged mode: speculative reads submitted at once; the rest wait in the
  // store and are cancelled (never issued) if the acquire they were for no
  // longer needs them. 0: half of queue_depth (at least 1), so demand reads
  // find room in the engine (with a queue depth of 1 the one read may be a
  // speculative one). Past queue_depth, the extra speculative reads wait in
  // the engine's queue, ahead of demand reads submitted after them.
  int64_t prefetch_queue_depth = 0;
  // Staged mode: a resident object named by Prefetch() or Keep() is kept for
  // that request's next Acquire() of its layer: victim searches pass over it
  // (in the policy's order) while any other unpinned resident is left. With
  // next-token predictions (Keep(layer, ...) right after that layer's
  // acquire, for the same layer at the next token) the predictions then
  // steer eviction through the other layers' misses: at 0.54% of K3 it cuts
  // bytes read per token by a fifth in `trace sweep --timing --horizon token
  // --keep-predicted`. false: prefetch never changes what the cache evicts
  // (exactly demand-only caching), and Keep() fails.
  bool keep_predicted = true;
};

// One routed object's bytes, with the role views SGLang's kernels use.
struct ExpertView {
  uint32_t layer = 0;
  uint32_t expert = 0;
  std::span<const uint8_t> bytes;              // whole object: up | gate | down
  std::span<const uint8_t> up, gate, down;
  std::shared_ptr<const void> owner;           // keeps `bytes` alive
};

// The result of one Acquire(): views in route order (tokens x top_k).
struct Acquisition {
  uint32_t layer = 0;
  std::vector<ExpertView> routes;
  std::vector<uint32_t> distinct_objects;      // internal: what MarkUsed releases
  uint64_t ticket = 0;                         // 0 once released
  std::thread::id owner;                       // internal: the acquiring thread
  const void* store = nullptr;                 // internal: the ExpertStore that handed it out
};

// Layout facts a caller (or binding) needs.
struct StoreInfo {
  std::string pack_path, manifest_path, profile;  // profile: "kimi-k3" | "scaled"
  uint32_t num_hidden_layers = 0, num_experts = 0, top_k = 0;
  std::vector<uint32_t> active_layer_ids;
  std::vector<uint64_t> object_bytes;          // per active layer
  std::vector<std::array<uint64_t, 3>> role_offsets, role_bytes;  // per active layer: up, gate, down
  std::string index_sha256;
  uint64_t index_count = 0, data_start = 0, pack_size = 0;
  uint64_t cache_bytes = 0;
  uint64_t effective_capacity_objects = 0;     // resident objects that always fit (budget / largest object)
  double open_seconds = 0;
  ep::Rank ep;                                 // size 1: every expert
  ep::ExpertRange owned_experts;               // global ids this store serves
};

class ExpertStore {
 public:
  static Result<std::shared_ptr<ExpertStore>> Open(const std::string& pack_path, const std::string& manifest_path,
                                                   const StoreOptions& options = {});
  ~ExpertStore();
  ExpertStore(const ExpertStore&) = delete;
  ExpertStore& operator=(const ExpertStore&) = delete;

  const StoreInfo& info() const;

  // `expert_ids` is row-major with `shape` (must be {tokens, top_k}).
  // is_prefill defaults to tokens > 1 (SGLang). Errors: SGLang's texts for
  // an inactive layer, a wrong top-k width, an out-of-range id, an eviction
  // that would drop the active working set, and short/failed reads.
  // `request_ids` (optional): the request of the call (one id) or of each
  // row; the "request-aware" and "adaptive" policies learn per request from
  // them. Empty: unknown (every policy behaves as without them). 2^64-1 is
  // reserved for "no request" and refused here, in Prefetch() and in Keep().
  Result<Acquisition> Acquire(uint32_t layer, std::span<const int64_t> expert_ids, std::span<const int64_t> shape,
                              std::optional<bool> is_prefill = std::nullopt,
                              std::span<const uint64_t> request_ids = {});
  // Convenience for one decode token: ids.size() must be top_k.
  Result<Acquisition> AcquireToken(uint32_t layer, std::span<const int64_t> expert_ids);
  // Releases the call's objects for eviction; may flush stats. Idempotent,
  // also through copies of the acquisition (one release in all). Errors: an
  // acquisition of another store (nothing is released), a stats write.
  Status MarkUsed(Acquisition& acquisition);

  // Starts reading the given experts of `layer` (any count, duplicates ok)
  // without waiting, for the next Acquire() of that layer by `request_id`
  // (the request whose next token was predicted; without it, the layer's
  // next acquire of any request; at most 16 acquires of the layer either
  // way). An acquire that routes to one waits for it if it is still in
  // flight. Where they land depends on StoreOptions::prefetch_mode (staged:
  // outside the cache, taken by any acquire that routes to them and dropped
  // at that request's acquire if none did; cache: in the cache, pinned until
  // the layer's next acquire). Objects already resident are not read; with
  // StoreOptions::keep_predicted they are kept until that acquire. So with
  // requests decoded side by side a prediction outlives the other requests'
  // acquires of its layer.
  Status Prefetch(uint32_t layer, std::span<const int64_t> expert_ids,
                  std::optional<uint64_t> request_id = std::nullopt);
  // Keep hints without reads: the resident ones of `expert_ids` are kept
  // (passed over by evictions) until `request_id`'s next acquire of `layer`,
  // as Prefetch() keeps them, and nothing is read. The use: next-token
  // predictions, a token ahead, where reading the guesses that are not
  // resident costs more bandwidth than it saves when reads, not latency,
  // bound decode (docs/store.md, "Predictions that steer eviction"). Fails
  // when keep hints are off (StoreOptions::keep_predicted, staged mode).
  Status Keep(uint32_t layer, std::span<const int64_t> expert_ids,
              std::optional<uint64_t> request_id = std::nullopt);

  // For a front tier (DeviceExpertTier, the slot cache) that reads one call's
  // misses of `layer` through this store in several Acquire()s, each of what
  // this store always holds: between BeginChunkedCall() and EndChunkedCall()
  // this thread's acquires of the layer leave the staged reads in place (a
  // later chunk takes them; ended by the first chunk, they were dropped and
  // read again), and EndChunkedCall() ends the staged holds of `request_ids`
  // (empty: of any request) once, as one acquire of the whole call would.
  void BeginChunkedCall(uint32_t layer);
  void EndChunkedCall(uint32_t layer, std::span<const uint64_t> request_ids = {});

  // SGLang's stats dict (same keys) plus k3pack's under "k3pack".
  nlohmann::json Snapshot() const;
  Status WriteStats() const;
  // Waits for reads in flight, writes stats (if a path is set), closes the pack.
  Status Close();

  // Test seam: replace range read results (see store/io_engine.h). Set before use.
  void SetReadFaultHook(std::function<void(uint64_t file_offset, uint64_t length, int64_t* result)> hook);

  struct Impl;

 private:
  explicit ExpertStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace k3pack::store
