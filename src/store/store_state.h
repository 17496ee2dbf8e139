// ExpertStore::Impl: the store's mutable state (guarded by `mu`) and stats.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <map>
#include <optional>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include <unistd.h>

#include "k3pack/store.h"
#include "util/buffer_pool.h"
#include "util/task_pool.h"
#include "store/io_engine.h"
#include "store/next_call_holds.h"
#include "store/latency_window.h"
#include "store/policy.h"
#include "store/store_impl.h"
#include "util/process_limits.h"

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
    // Staged prefetch (prefetch_mode "staged"): the entry lives in `staged`
    // until an acquire takes it (into `entries`) or drops it.
    bool submitted = false;    // its read went to the engine
    bool speculative_io = false;  // submitted as a speculative read (counts against the prefetch queue depth)
    bool dropped = false;      // left staging untaken; an in-flight read is discarded when it lands
  };

  // Immutable after Open.
  pid_t opened_pid = ::getpid();  // a forked child may only close its copy (fork_guard.h)
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
  // Tickets handed out and not yet released. Acquisition is a copyable
  // struct: a copy of a released one still carries its ticket, and releasing
  // it again must not unpin what other calls hold.
  std::unordered_set<uint64_t> live_tickets;
  bool closed = false;
  // SGLang's counters.
  uint64_t pack_reads = 0, pack_read_bytes = 0, pack_read_ns = 0;
  uint64_t cache_hits = 0, cache_misses = 0, cache_evictions = 0, io_errors = 0;
  std::vector<uint64_t> route_calls, route_tokens;  // indexed by layer id
  uint64_t last_flush_calls = 0;
  // k3pack's.
  std::vector<uint64_t> layer_hits, layer_misses;  // per active layer
  LatencyWindow latency;  // read latencies of the most recent reads
  uint64_t prefetch_issued = 0, prefetch_useful = 0, prefetch_wasted = 0;
  // Staged prefetch (guarded by mu).
  bool staged_mode = true;
  uint64_t prefetch_budget = 0;                  // resolved StoreOptions::prefetch_budget_bytes
  uint64_t prefetch_depth = 1;                   // resolved StoreOptions::prefetch_queue_depth
  std::vector<std::shared_ptr<Entry>> staged;    // per ObjectId; null = not staged
  // What each Prefetch() staged, held for its request's next acquire of the
  // layer (any acquire of the layer when it gave no id): dropped when the
  // last hold naming it ends untaken. A hold still naming an object another
  // request took keeps its count, so if that object is staged again it may
  // wait for that hold too: dropped late (within NextCallHolds::kMaxCalls
  // acquires of the layer), never before the request it was staged for has
  // come.
  std::optional<NextCallHolds> stage_holds;
  // Chunked calls in progress (ExpertStore::BeginChunkedCall): (thread,
  // layer index); their acquires do not end the staged holds.
  std::vector<std::pair<std::thread::id, uint32_t>> chunked_calls;
  bool InChunkedCall(uint32_t li) const {
    return std::find(chunked_calls.begin(), chunked_calls.end(), std::make_pair(std::this_thread::get_id(), li)) !=
           chunked_calls.end();
  }
  // keep_predicted: resident objects a Prefetch() or Keep() named, as the
  // policy's keep hints, held the same way (set only with keep_predicted).
  std::optional<NextCallHolds> kept;
  // The policy reads keep hints from the first hint on (Keep(), or a staged
  // Prefetch() of residents). Told of hints
  // from open, request-aware took every previous-token expert without one
  // as unlikely to return, in a store whose caller never gives any: its
  // hits differed from the simulator's (trace replay against --simulate).
  bool keep_hints_given = false;
  uint64_t prefetch_kept = 0;                    // hints given, for stats
  std::deque<std::shared_ptr<Entry>> spec_queue; // staged, read not yet submitted
  uint64_t spec_inflight = 0;                    // speculative reads submitted, not finished
  uint64_t staged_bytes = 0, staged_bytes_max = 0;  // charged against prefetch_budget
  // Staged, neither taken nor dropped yet: issued = useful + wasted +
  // cancelled + staged_objects + prefetch_failed at every moment. In-flight
  // reads are no stand-in: one taken or dropped is still in flight.
  uint64_t staged_objects = 0;
  uint64_t prefetch_failed = 0;  // staged reads that failed or never started before anyone took them
  uint64_t prefetch_issued_bytes = 0, prefetch_useful_bytes = 0, prefetch_wasted_bytes = 0;
  uint64_t prefetch_refused = 0, prefetch_refused_bytes = 0;      // budget full
  uint64_t prefetch_cancelled = 0, prefetch_cancelled_bytes = 0;  // dropped before their read was issued
  uint64_t checksum_errors = 0, checksum_verified = 0;
  // What an acquire waits on for an object whose entry could not be
  // allocated: failed, with BareOutOfMemory (made at open, while memory was
  // there). Never in `entries`.
  std::shared_ptr<Entry> out_of_memory_entry = [] {
    auto e = std::make_shared<Entry>();
    e->state = Entry::kFailed;
    e->error = BareOutOfMemory();
    return e;
  }();
  // Checks run here, not on io_uring's one reaping thread: there they would
  // run one after another while other reads' completions wait behind them.
  // Declared last: destroyed (joined) first.
  std::unique_ptr<TaskPool> verify_pool;

  uint64_t Generation(ObjectId id);
  void Pin(ObjectId id);
  void ForgetObject(ObjectId id);
  void Unpin(ObjectId id);
  void BecameResident(ObjectId id);
  void DropEntry(ObjectId id, bool evicted);
  void ReleasePrefetchPins(uint32_t layer_index);
  void EndAcquisition(std::thread::id owner);
  bool Fits(std::span<const ObjectId> keys) const;
  std::shared_ptr<Entry> StartRead(ObjectId id, bool prefetched);
  // Allocates e's buffer and hands its read to the engine.
  void SubmitRead(const std::shared_ptr<Entry>& e);
  // Staged prefetch (staged_prefetch.cpp).
  Status StagePrefetch(uint32_t layer_index, std::span<const ObjectId> keys, uint64_t request);
  // Takes staged object `id` for an acquire (null if not staged): it becomes
  // the cache's entry, its read submitted now if it was still queued.
  std::shared_ptr<Entry> TakeStaged(ObjectId id);
  // An acquire of the layer by `requests` (empty: not known) took what it
  // routes; the groups it ends drop what they alone still hold.
  void EndStaged(uint32_t layer_index, std::span<const uint64_t> requests);
  // Keep hints on `residents` for `request`'s next acquire of the layer
  // (kept must be set).
  void KeepResidents(uint32_t layer_index, uint64_t request, std::span<const ObjectId> residents);
  // Drops `id` if staged: a queued read is cancelled, a ready object freed,
  // a read in flight discarded when it lands.
  void DropStaged(ObjectId id);
  void PumpSpeculative();
  // A staged entry's read finished (mu held): bookkeeping before FinishRead.
  void FinishStagedRead(const std::shared_ptr<Entry>& e, bool ok);
  // How a read ended: only reads that reached the pack count in pack_reads
  // and io_errors (one never started, for lack of a buffer or memory, did not).
  enum class ReadEnd { kRead, kChecksumFailed, kNeverStarted };
  void FinishRead(const std::shared_ptr<Entry>& e, const ObjectReadResult& r, ReadEnd how = ReadEnd::kRead);
  // Checks a finished read's bytes (when checksums are on), then FinishRead.
  void CheckAndFinish(const std::shared_ptr<Entry>& e, const ObjectReadResult& r);
  // The object's bytes against its CRC32Cs (engine or verify thread, no
  // lock needed: entry_crc32c is immutable). An error names layer, expert
  // and offset.
  Status CheckObject(ObjectId id, const uint8_t* bytes) const;
  nlohmann::json SnapshotLocked() const;
  // Writes the stats file from a snapshot taken now. Serialized by
  // stats_mu (always taken before mu, never while holding it): concurrent
  // flushes from several threads' MarkUsed used to share the temporary file
  // (one's rename then failed, or the file mixed two snapshots).
  Status WriteStatsJson() const;
  mutable std::mutex stats_mu;
};

}  // namespace k3pack::store
