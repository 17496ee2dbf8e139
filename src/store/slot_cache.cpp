// SlotCache: SGLang's slot-level expert cache (include/k3pack/slot_cache.h).
// A policy decides residency over a uniform-cost copy of the object space
// (one slot = one object, as SGLang's slots); this file maps residency to
// slot numbers, reads misses and keeps the CUDA events SGLang keeps.
#include "k3pack/slot_cache.h"

#include <fcntl.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <queue>
#include <thread>
#include <unordered_map>
#include <utility>

#include "store/cuda_runtime.h"
#include "store/fork_guard.h"
#include "store/io_engine.h"
#include "store/miss_rows.h"
#include "store/policy.h"
#include "store/store_impl.h"
#include "util/interrupt.h"
#include "util/process_limits.h"
#include "util/threads.h"

namespace k3pack::store {

namespace {

constexpr uint32_t kNoSlot = 0xffffffffu;

// Waits for one call's reads; completions arrive on engine threads.
struct ReadBatch {
  std::mutex mu;
  std::condition_variable cv;
  size_t pending = 0;
  std::vector<std::optional<Error>> errors;
  std::vector<ObjectReadResult> results;

  // On an engine thread, which must not throw: the counts are copied
  // without the status, and an error whose text cannot be copied is
  // recorded as BareOutOfMemory (ReadInto names the object).
  void Done(size_t i, const ObjectReadResult& r) {
    std::lock_guard<std::mutex> lock(mu);
    results[i].bytes = r.bytes;
    results[i].max_range_ns = r.max_range_ns;
    results[i].latency_ns = r.latency_ns;
    if (!r.status.ok() && RanOutOfMemory([&] { errors[i] = r.status.error(); })) errors[i] = BareOutOfMemory();
    if (--pending == 0) cv.notify_all();
  }
  // Reads [first, end) were never submitted: nothing will call Done for them.
  void Unsubmitted(size_t first, size_t end) {
    std::lock_guard<std::mutex> lock(mu);
    for (size_t i = first; i < end; ++i) errors[i] = BareOutOfMemory();
    pending -= end - first;
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return pending == 0; });
  }
};

}  // namespace

struct SlotCache::Impl {
  SlotCacheOptions opt;
  StoreInfo info;
  PackGeometry geo;
  std::vector<std::vector<ReadRange>> ranges;  // per active layer
  UniqueFd fd, direct_fd;
  std::unique_ptr<IoEngine> engine;
  std::shared_ptr<ExpertStore> host;           // optional host-RAM tier
  ObjectChecksums checksums;                   // direct reads only (the host tier checks its own)
  pid_t opened_pid = ::getpid();               // a forked child may only close its copy (fork_guard.h)
  uint64_t slot_bytes = 0;

  // Slot memory.
  uint8_t* host_base = nullptr;
  void* device_base = nullptr;
  const cuda::Runtime* rt = nullptr;
  cuda::Stream transfer = nullptr;
  std::vector<cuda::Event> ready_ev, last_use_ev, stage_ev;
  std::vector<uint8_t> has_ready, has_last_use, stage_busy;
  std::vector<uint8_t*> staging;
  uint32_t stage_cursor = 0;

  mutable std::mutex mu;
  std::condition_variable cv;
  std::unique_ptr<Policy> policy;
  std::vector<uint32_t> slot_of;                // per ObjectId
  std::vector<ObjectId> key_of;                 // per slot
  std::priority_queue<uint32_t, std::vector<uint32_t>, std::greater<>> free_slots;
  PinCounts pins;                               // unreleased acquisitions, all threads
  int64_t total_pins = 0;                       // sum of pins: 0 = no thread holds anything
  // Per object: the thread's unreleased calls naming it, with the call
  // serials of the oldest of them (oldest first): a release from a thread
  // that holds no call on the object ends the oldest call's hold. Kept
  // inline, so that no release allocates; past kKept calls of one thread on
  // one object the newer ones' serials are taken as the newest known.
  struct Hold {
    static constexpr uint32_t kKept = 4;
    uint32_t calls = 0;
    std::array<uint64_t, kKept> serials{};
    uint64_t since() const { return serials[0]; }
    void Add(uint64_t serial) {
      if (calls < kKept) serials[calls] = serial;
      ++calls;
    }
    void RemoveNewest() { --calls; }  // a call undone: the last added
    void RemoveOldest() {
      const uint32_t known = std::min(calls, kKept);
      for (uint32_t i = 1; i < known; ++i) serials[i - 1] = serials[i];
      --calls;
      if (calls >= kKept) serials[kKept - 1] = serials[kKept - 2];
    }
    // Another hold of the same thread (an evicted object's, following its
    // slot) joins this one.
    void Merge(const Hold& other) {
      std::array<uint64_t, 2 * kKept> all{};
      const uint32_t mine = std::min(calls, kKept), theirs = std::min(other.calls, kKept);
      std::merge(serials.begin(), serials.begin() + mine, other.serials.begin(), other.serials.begin() + theirs,
                 all.begin());
      std::copy_n(all.begin(), std::min(mine + theirs, kKept), serials.begin());
      calls += other.calls;
    }
  };
  using Holds = std::unordered_map<ObjectId, Hold>;
  uint64_t call_serial = 0;
  std::map<std::thread::id, Holds> outstanding;
  // MarkUsed's "slot seen in this release" marks (serial == release_serial):
  // a release allocates nothing, so under `ulimit -v` it cannot fail and
  // leave a call's slots held for good.
  std::vector<uint64_t> release_mark;  // per slot
  uint64_t release_serial = 0;
  // Per slot: the thread that dropped its own last hold on the slot's object,
  // until any thread acquires it again. Such a thread naming the slot again
  // repeats its release: taken as another thread's, it let that thread's
  // slots be overwritten while it still used them.
  std::vector<std::thread::id> released_by;
  // Per slot: holds of a thread's unreleased calls on an object that the
  // same thread's later call evicted from the slot, where no object of that
  // call took them over (the call failed, or left the slot free). Those
  // calls still name the slot in their release; with their holds dropped,
  // the release ended another thread's hold on whatever the slot held by
  // then, and that thread's slot was overwritten while it read it.
  std::multimap<uint32_t, std::pair<std::thread::id, Hold>> orphaned;
  std::vector<uint64_t> generations;
  bool closed = false;

  // SGLang's counters, then k3pack's.
  uint64_t pack_reads = 0, pack_read_bytes = 0, pack_read_ns = 0, cache_hits = 0, cache_misses = 0,
           cache_evictions = 0, io_errors = 0, h2d_bytes = 0, checksum_errors = 0, checksum_verified = 0;
  std::vector<uint64_t> route_calls, route_tokens;
  uint64_t waits_for_other_threads = 0, host_tier_copies = 0;

  uint32_t slot_count() const { return static_cast<uint32_t>(key_of.size()); }
  bool HasOrphanedHold(uint32_t slot, std::thread::id owner) const {
    auto [first, last] = orphaned.equal_range(slot);
    return std::any_of(first, last, [&](const auto& entry) { return entry.second.first == owner; });
  }
  // Ends one call's orphaned hold on `slot`: `owner`'s oldest, or (owner
  // null) the oldest of any thread's that is older than `older_than` (0:
  // any). Allocates nothing, as every release.
  bool EndOrphanedHold(uint32_t slot, const std::thread::id* owner, uint64_t older_than = 0) {
    auto [first, last] = orphaned.equal_range(slot);
    auto oldest = last;
    for (auto it = first; it != last; ++it) {
      const auto& [tid, hold] = it->second;
      if (owner && tid != *owner) continue;
      if (!owner && older_than != 0 && hold.since() >= older_than) continue;
      if (oldest == last || hold.since() < oldest->second.second.since()) oldest = it;
    }
    if (oldest == last) return false;
    Hold& hold = oldest->second.second;
    hold.RemoveOldest();
    if (hold.calls == 0) orphaned.erase(oldest);
    return true;
  }
  uint64_t Generation(ObjectId id) {
    uint64_t& g = generations[id];
    if (g == 0) g = ObjectGeneration(geo.index_sha256, geo.space.LayerOf(id), geo.space.ExpertOf(id));
    return g;
  }
  void SetPins(const Holds& holds, int sign) {
    for (const auto& [k, hold] : holds) {
      pins[k] += sign * static_cast<int64_t>(hold.calls);
      total_pins += sign * static_cast<int64_t>(hold.calls);
    }
  }
  // Call `serial` naming each of `keys` (+1), or that call undone (-1).
  // Adding may throw std::bad_alloc, and then adds nothing; removing holds
  // that are there never allocates.
  static void AddHolds(Holds* holds, std::span<const ObjectId> keys, int sign, uint64_t serial = 0) {
    auto add = [&](ObjectId k, int by) {
      Hold& hold = (*holds)[k];
      if (by > 0) {
        hold.Add(serial);
      } else {
        hold.RemoveNewest();
      }
      if (hold.calls == 0) holds->erase(k);
    };
    size_t done = 0;
    try {
      for (; done < keys.size(); ++done) add(keys[done], sign);
    } catch (const std::bad_alloc&) {
      for (size_t i = 0; i < done; ++i) add(keys[i], -sign);
      throw;
    }
  }
  bool Fits(std::span<const ObjectId> keys) const;
  void FreeSlot(uint32_t slot);
  Status Attach(uint32_t slots);
  // Undoes Attach() (a CUDA attach that failed after it).
  void Detach();
  Status AttachCudaResources();
  // `requests`: each miss's request (empty: unknown), for the host tier.
  Status LoadMisses(uint32_t layer_index, const std::vector<std::pair<ObjectId, uint32_t>>& misses,
                    std::span<const uint64_t> requests);
  Status ReadInto(const std::vector<std::pair<ObjectId, uint8_t*>>& reads);
  Status CopyToSlot(uint32_t slot, const uint8_t* src);
  Status CopyFromHostTier(uint32_t layer_index, const std::vector<std::pair<ObjectId, uint32_t>>& misses,
                          std::span<const uint64_t> requests);
  void ReleaseCuda();
};

SlotCache::SlotCache(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SlotCache::~SlotCache() {
  (void)Close();
  // A forked child's copy: the engine's threads live in the parent only
  // (joining them here hangs, destroying their handles terminates).
  if (ForkedFrom(impl_->opened_pid)) (void)impl_->engine.release();
}
const StoreInfo& SlotCache::info() const { return impl_->info; }
uint64_t SlotCache::slot_bytes() const { return impl_->slot_bytes; }
bool SlotCache::attached() const {
  ForkSafeLock lock(impl_->mu, impl_->opened_pid);
  return impl_->slot_count() != 0;
}

Result<std::unique_ptr<SlotCache>> SlotCache::Open(const std::string& pack_path, const std::string& manifest_path,
                                                   const SlotCacheOptions& opt) {
  K3_RETURN_IF_ERROR(CheckStoreFiles(pack_path, manifest_path));
  auto impl = std::make_unique<Impl>();
  K3_ASSIGN_OR_RETURN(impl->fd, OpenReadOnly(pack_path));
  K3_ASSIGN_OR_RETURN(impl->geo, ValidatePack(pack_path, manifest_path, opt.store, impl->fd.get()));
  K3_RETURN_IF_ERROR(CheckRuntimeCounts(opt.store, "stage_slots", opt.stage_slots));
  if (opt.stage_slots > kMaxStageSlots) {
    return PastLimitError("stage_slots", kMaxStageSlots, std::to_string(opt.stage_slots));
  }
  K3_ASSIGN_OR_RETURN(IoBackend backend, ParseIoBackend(opt.store.io_backend));
  const ObjectSpace& s = impl->geo.space;
  // The policy is made when the slots are attached; an unknown name is
  // refused here, at construction, as ExpertStore::Open refuses it.
  K3_RETURN_IF_ERROR(MakePolicy(opt.store.policy, s, s.max_object_bytes()).status());
  impl->opt = opt;
  impl->slot_bytes = s.max_object_bytes();
  {
    K3_ASSIGN_OR_RETURN(ReadPlan plan, PlanObjectReads(pack_path, impl->geo, opt.store));
    impl->ranges = std::move(plan.ranges);
    impl->direct_fd = std::move(plan.direct_fd);
  }
  if (opt.store.direct_io && impl->slot_bytes % 4096 != 0)
    return Error("expert-pack direct I/O requires aligned staging")
        .WithHint("each slot holds " + std::to_string(impl->slot_bytes) + " bytes, not a multiple of 4096");
  if (opt.host_cache_bytes > 0) {
    StoreOptions host = opt.store;
    host.cache_bytes = opt.host_cache_bytes;
    K3_ASSIGN_OR_RETURN(impl->host, ExpertStore::Open(pack_path, manifest_path, host));
  } else {
    K3_ASSIGN_OR_RETURN(impl->engine, IoEngine::Create(backend, static_cast<uint32_t>(opt.store.queue_depth)));
    impl->checksums.mode = "off";
    if (opt.store.verify_checksums) {
      K3_ASSIGN_OR_RETURN(impl->checksums, LoadObjectChecksums(pack_path, impl->geo));
    }
  }
  impl->generations.assign(s.num_objects(), 0);
  impl->route_calls.assign(s.num_layers_total, 0);
  impl->route_tokens.assign(s.num_layers_total, 0);

  StoreInfo& info = impl->info;
  info = DescribePack(pack_path, manifest_path, impl->geo);
  info.cache_bytes = opt.host_cache_bytes;
  return std::unique_ptr<SlotCache>(new SlotCache(std::move(impl)));
}

// ------------------------------------------------------------------ attach

Status SlotCache::Impl::Attach(uint32_t slots) {
  if (slot_count() != 0) return Error("the expert slot cache is already attached to its memory", ErrorKind::kRuntime);
  const ObjectSpace& s = geo.space;
  if (slots < WorkingSetObjects(geo))  // min(top_k, owned experts)
    return Error("insufficient expert slots for one top-k expert working set: slots=" + std::to_string(slots) +
                     ", top_k=" + std::to_string(s.top_k) +
                     (geo.ep.whole() ? "" : ", owned experts=" + std::to_string(geo.owned.count())),
                 ErrorKind::kMemory);
  // Everything is made first and then moved in (moves cannot fail): an
  // allocation that failed half way left the cache "attached" with some of
  // its tables empty, so a retried attach was refused and the next call
  // indexed past their ends.
  Result<std::unique_ptr<Policy>> made = Error("not made");
  decltype(slot_of) new_slot_of;
  decltype(key_of) new_key_of;
  std::vector<uint32_t> all_slots;
  std::vector<uint64_t> new_release_mark;
  std::vector<std::thread::id> new_released_by;
  PinCounts new_pins;
  const bool out_of_memory = RanOutOfMemory([&] {
    // One slot holds any object: the policy counts slots, not bytes.
    ObjectSpace uniform = s;
    std::fill(uniform.object_bytes.begin(), uniform.object_bytes.end(), slot_bytes);
    made = MakePolicy(opt.store.policy, uniform, uint64_t{slots} * slot_bytes);
    new_slot_of.assign(s.num_objects(), kNoSlot);
    new_key_of.assign(slots, kNoObject);
    new_release_mark.assign(slots, 0);
    new_released_by.assign(slots, std::thread::id());
    new_pins.assign(s.num_objects(), 0);
    all_slots.resize(slots);
    for (uint32_t i = 0; i < slots; ++i) all_slots[i] = i;
  });
  if (out_of_memory)
    return OutOfMemoryOn("the expert slot cache's attach of " + std::to_string(slots) + " slots (nothing attached)");
  K3_RETURN_IF_ERROR(made.status());
  policy = std::move(made).value();
  slot_of = std::move(new_slot_of);
  key_of = std::move(new_key_of);
  release_mark = std::move(new_release_mark);
  released_by = std::move(new_released_by);
  pins = std::move(new_pins);
  free_slots = decltype(free_slots)(std::greater<>(), std::move(all_slots));  // ascending: already a heap
  return Status::OK();
}

void SlotCache::Impl::Detach() {
  policy.reset();
  slot_of.clear();
  key_of.clear();
  release_mark.clear();
  released_by.clear();
  orphaned.clear();
  pins.clear();
  free_slots = {};
  device_base = nullptr;
  has_ready.clear();
  has_last_use.clear();
  stage_busy.clear();
}

Status SlotCache::AttachHost(uint8_t* base, uint32_t slot_count) {
  Impl& s = *impl_;
  K3_RETURN_IF_ERROR(CheckOpenedHere(s.opened_pid));
  std::lock_guard<std::mutex> lock(s.mu);
  // After Close nothing would ever release what an attach takes (the CUDA
  // path's events, stream and pinned staging), nor serve from it.
  if (s.closed) return Error("expert store is closed", ErrorKind::kRuntime);
  if (base == nullptr) return Error("expert slot memory is null");
  if (s.opt.store.direct_io && reinterpret_cast<uintptr_t>(base) % 4096 != 0)
    return Error("expert-pack direct I/O requires aligned staging")
        .WithHint("the slot memory starts at an address that is not a multiple of 4096");
  K3_RETURN_IF_ERROR(s.Attach(slot_count));
  s.host_base = base;
  return Status::OK();
}

Status SlotCache::AttachCuda(void* device_base, uint32_t slot_count, int device) {
  Impl& s = *impl_;
  K3_RETURN_IF_ERROR(CheckOpenedHere(s.opened_pid));
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.closed) return Error("expert store is closed", ErrorKind::kRuntime);
  if (device_base == nullptr) return Error("expert slot memory is null");
  // `rt` is what sends Acquire down the CUDA path: it is set only with the
  // slots, and a failure takes both back, so a later AttachHost (or a retry)
  // finds the cache as it was before.
  K3_ASSIGN_OR_RETURN(const cuda::Runtime* rt, cuda::LoadRuntime());
  K3_RETURN_IF_ERROR(cuda::Check(*rt, rt->SetDevice(device), "cudaSetDevice"));
  K3_RETURN_IF_ERROR(s.Attach(slot_count));
  s.rt = rt;
  s.device_base = device_base;
  Status st = s.AttachCudaResources();
  if (!st.ok()) {
    s.ReleaseCuda();
    s.Detach();
  }
  return st;
}

Status SlotCache::Impl::AttachCudaResources() {
  K3_RETURN_IF_ERROR(cuda::Check(*rt, rt->StreamCreate(&transfer), "cudaStreamCreate"));
  auto make_events = [&](std::vector<cuda::Event>* v, size_t n) -> Status {
    v->assign(n, nullptr);
    for (auto& e : *v) K3_RETURN_IF_ERROR(cuda::Check(*rt, rt->EventCreate(&e), "cudaEventCreate"));
    return Status::OK();
  };
  K3_RETURN_IF_ERROR(make_events(&ready_ev, slot_count()));
  K3_RETURN_IF_ERROR(make_events(&last_use_ev, slot_count()));
  has_ready.assign(slot_count(), 0);
  has_last_use.assign(slot_count(), 0);
  if (!host) {  // the host tier's buffers are the staging otherwise
    K3_RETURN_IF_ERROR(make_events(&stage_ev, opt.stage_slots));
    stage_busy.assign(opt.stage_slots, 0);
    staging.assign(opt.stage_slots, nullptr);
    for (auto& p : staging) {
      void* q = nullptr;
      K3_RETURN_IF_ERROR(cuda::Check(*rt, rt->HostAlloc(&q, slot_bytes, 0), "cudaHostAlloc (staging)"));
      p = static_cast<uint8_t*>(q);
    }
  }
  return Status::OK();
}

void SlotCache::Impl::ReleaseCuda() {
  if (!rt) return;
  if (transfer) rt->StreamSynchronize(transfer);
  for (auto* v : {&ready_ev, &last_use_ev, &stage_ev})
    for (cuda::Event e : *v)
      if (e) rt->EventDestroy(e);
  for (uint8_t* p : staging)
    if (p) rt->FreeHost(p);
  if (transfer) rt->StreamDestroy(transfer);
  ready_ev.clear(), last_use_ev.clear(), stage_ev.clear(), staging.clear();
  transfer = nullptr;
  rt = nullptr;
}

// ------------------------------------------------------------------ acquire

bool SlotCache::Impl::Fits(std::span<const ObjectId> keys) const {
  // Slots that cannot be given up: resident objects pinned by other threads
  // or named by this call; every miss needs one of the rest.
  uint64_t blocked = 0, misses = 0;
  for (ObjectId k : keys) (slot_of[k] == kNoSlot ? misses : blocked) += 1;
  if (total_pins != 0) {  // the slow path only while other threads hold calls
    for (uint32_t slot = 0; slot < slot_count(); ++slot) {
      ObjectId k = key_of[slot];
      if (k != kNoObject && pins[k] != 0 && !std::binary_search(keys.begin(), keys.end(), k)) ++blocked;
    }
  }
  return blocked + misses <= slot_count();
}

void SlotCache::Impl::FreeSlot(uint32_t slot) {
  ObjectId k = key_of[slot];
  if (k != kNoObject) slot_of[k] = kNoSlot;
  key_of[slot] = kNoObject;
  free_slots.push(slot);
}

Result<std::vector<int32_t>> SlotCache::Acquire(uint32_t layer, std::span<const int64_t> ids,
                                                std::span<const int64_t> shape, std::optional<bool> is_prefill_opt,
                                                void* stream, std::span<const uint64_t> request_ids) {
  Impl& s = *impl_;
  const ObjectSpace& space = s.geo.space;
  K3_RETURN_IF_ERROR(CheckOpenedHere(s.opened_pid));  // no read would ever finish in a forked child
  if (!attached()) return Error("expert device cache is not initialized", ErrorKind::kRuntime);
  K3_ASSIGN_OR_RETURN(const PreparedAcquire prepared,
                      PrepareAcquire(s.geo, layer, shape, ids, is_prefill_opt, request_ids));
  const RouteCall& call = prepared.call;
  const CallRows* call_rows = prepared.call_rows();
  const int64_t rows = call.rows;
  const bool is_prefill = call.is_prefill;
  const uint32_t li = call.layer_index;
  const std::vector<ObjectId>& keys = call.keys;

  std::unique_lock<std::mutex> lock(s.mu);
  if (s.closed) return Error("expert store is closed", ErrorKind::kRuntime);
  ++s.route_calls[layer];
  s.route_tokens[layer] += static_cast<uint64_t>(rows);
  // Everything the call allocates comes before this thread's pins are
  // lowered (below): a failed allocation in between never restored them,
  // and another thread was then given this thread's held slots.
  std::vector<uint64_t> gens(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) gens[i] = s.Generation(keys[i]);
  // Room for every result before the cache changes (an object is one slot,
  // so a call evicts at most one per key): an allocation that fails while
  // the policy's choice is applied to the slots would leave them apart.
  AccessResult ar;
  ar.hit.reserve(keys.size());
  ar.evicted.reserve(keys.size());
  std::vector<uint32_t> vacated;
  vacated.reserve(keys.size());
  std::vector<std::pair<ObjectId, uint32_t>> misses;
  misses.reserve(keys.size());
  std::vector<int32_t> out;
  out.reserve(ids.size());
  std::vector<std::pair<uint32_t, Impl::Hold>> moved;  // (slot, holds) of this thread's evicted objects
  moved.reserve(keys.size());
  // This thread's own unreleased calls do not protect their slots (SGLang).
  Impl::Holds& mine = s.outstanding[std::this_thread::get_id()];
  s.SetPins(mine, -1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  bool waited = false;  // counted once per call (a Python caller wakes every 100 ms to poll Ctrl-C)
  while (!s.Fits(keys) && std::chrono::steady_clock::now() < deadline) {
    if (s.total_pins == 0) break;  // nothing will change: let the policy report SGLang's error
    if (!std::exchange(waited, true)) ++s.waits_for_other_threads;
    s.SetPins(mine, +1);
    s.cv.wait_until(lock, WakeForInterrupt(deadline));
    // Close() may have run meanwhile and shut the engine down: a read
    // submitted now would never finish (this call would wait forever).
    if (s.closed) return Error("expert store is closed", ErrorKind::kRuntime);
    K3_RETURN_IF_ERROR(PollInterruptUnlocked(lock));  // pins as on entry
    // The poll let go of the mutex: Close() may have run in it too.
    if (s.closed) return Error("expert store is closed", ErrorKind::kRuntime);
    s.SetPins(mine, -1);
  }
  const size_t free_before = s.free_slots.size();
  // The policy's own allocations may fail too: it stops with every
  // eviction it made reported, and what it took in gets slots below and is
  // forgotten with the call's other misses. (`ar.hit` is sized first thing
  // in Access, into the room reserved above, so it never fails there.)
  Status st = Status::OK();
  if (RanOutOfMemory([&] { st = s.policy->Access(keys, gens, is_prefill, &s.pins, &ar, call_rows); }))
    st = BareOutOfMemory();
  s.SetPins(mine, +1);
  // Evicted objects give up their slots, in eviction order; misses take the
  // free slots first (lowest index), then those slots in that order.
  for (ObjectId v : ar.evicted) {
    // An object of this thread's own unreleased call: its holds leave with
    // it. They were released later by slot, from whatever object the slot
    // then held (this call's), and the evicted object's stayed for good.
    if (auto it = mine.find(v); it != mine.end()) {
      moved.push_back({s.slot_of[v], it->second});
      s.pins[v] -= it->second.calls;
      s.total_pins -= it->second.calls;
      mine.erase(it);
      s.released_by[s.slot_of[v]] = std::this_thread::get_id();
    }
    vacated.push_back(s.slot_of[v]);
    s.slot_of[v] = kNoSlot;
    s.key_of[vacated.back()] = kNoObject;
  }
  s.cache_evictions += ar.evicted.size();
  size_t next_vacated = 0, free_used = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    ObjectId k = keys[i];
    if (ar.hit[i]) {
      ++s.cache_hits;
      continue;
    }
    // After a failed Access: keys it never reached.
    if (!s.policy->Resident(k) || s.slot_of[k] != kNoSlot) continue;
    ++s.cache_misses;
    uint32_t slot;
    if (free_used < free_before) {
      slot = s.free_slots.top();
      s.free_slots.pop();
      ++free_used;
    } else {
      slot = vacated[next_vacated++];
    }
    s.slot_of[k] = slot;
    s.key_of[slot] = k;
    misses.push_back({k, slot});
  }
  for (; next_vacated < vacated.size(); ++next_vacated) s.free_slots.push(vacated[next_vacated]);
  // Objects of this call that have no bytes are never served: forget them.
  auto forget_misses = [&] {
    for (auto [k, slot] : misses) {
      if (s.slot_of[k] != slot) continue;
      s.policy->Erase(k);
      s.FreeSlot(slot);
    }
  };
  // The earlier calls whose objects this call evicted name those slots in
  // their release. Their holds follow the slot to this call's object there,
  // which stays protected until both calls are released, in either order.
  // Where no object of this call took the slot (a failed call, a slot left
  // free) they stay with the slot, for that release to end.
  auto settle_moved = [&](bool call_succeeded) {
    for (const auto& slot_hold : moved) {  // no structured binding: clang 14 cannot capture one below
      const uint32_t slot = slot_hold.first;
      const Impl::Hold& hold = slot_hold.second;
      const ObjectId now = s.key_of[slot];
      auto it = !call_succeeded || now == kNoObject ? mine.end() : mine.find(now);
      if (it != mine.end()) {
        it->second.Merge(hold);
        s.pins[now] += hold.calls;
        s.total_pins += hold.calls;
        continue;
      }
      // With no memory for the record, those releases end nothing more here
      // than before it was kept.
      RanOutOfMemory([&] {
        s.orphaned.emplace(slot, std::make_pair(std::this_thread::get_id(), hold));
      });
    }
  };
  if (!st.ok()) {  // SGLang keeps what it processed before failing
    forget_misses();
    settle_moved(false);
    if (IsBareOutOfMemory(st.error())) return AcquireOutOfMemory("the slot cache", layer);
    const bool waited_out = waited && std::chrono::steady_clock::now() >= deadline;
    return ExplainCannotEvict(st.error(), keys.size(), s.slot_count(), waited_out);
  }
  // Pin the call for other threads before reading (the lock stays held:
  // one call's misses are read together, as SGLang does under its lock).
  // Without memory for the holds or the reads (`ulimit -v`), the misses are
  // forgotten like a failed read's: their slots never serve bytes not read.
  Impl::Holds held;
  const uint64_t call_serial = ++s.call_serial;
  if (RanOutOfMemory([&] {
        Impl::AddHolds(&held, keys, +1);
        Impl::AddHolds(&mine, keys, +1, call_serial);
      })) {
    forget_misses();
    settle_moved(false);
    s.cv.notify_all();
    return AcquireOutOfMemory("the slot cache", layer);
  }
  s.SetPins(held, +1);
  for (ObjectId k : keys) s.released_by[s.slot_of[k]] = std::thread::id();
  Status load = Status::OK();
  if (RanOutOfMemory([&] {
        // The host tier hears whose misses they are, as a call to it
        // directly: without, every acquire ended every request's staged reads.
        std::vector<uint64_t> miss_requests;
        if (s.host && !request_ids.empty() && !misses.empty()) {
          std::vector<int64_t> missed_experts;
          for (auto [k, slot] : misses) missed_experts.push_back(space.ExpertOf(k));
          FirstRowRequests(ids, static_cast<size_t>(shape[1]), request_ids, std::span<const int64_t>(missed_experts),
                           &miss_requests);
        }
        load = s.LoadMisses(li, misses, miss_requests);
      }))
    load = BareOutOfMemory();
  if (!load.ok()) {
    forget_misses();
    s.SetPins(held, -1);
    Impl::AddHolds(&mine, keys, -1);
    settle_moved(false);
    s.cv.notify_all();
    if (IsBareOutOfMemory(load.error()))
      return AcquireOutOfMemory("the slot cache", layer);
    return load.error();
  }
  if (s.rt) {  // the caller's stream waits for every slot this call uses
    for (ObjectId k : keys) {
      uint32_t slot = s.slot_of[k];
      if (!s.has_ready[slot]) continue;
      Status waits = cuda::Check(*s.rt, s.rt->StreamWaitEvent(stream, s.ready_ev[slot], 0), "cudaStreamWaitEvent");
      if (!waits.ok()) {
        // The caller gets no slots to release: the call's holds go now. The
        // slots' bytes are sound (their copies and ready events stand).
        s.SetPins(held, -1);
        Impl::AddHolds(&mine, keys, -1);
        settle_moved(false);
        s.cv.notify_all();
        return waits.error();
      }
    }
  }
  settle_moved(true);
  for (int64_t e : ids) out.push_back(static_cast<int32_t>(s.slot_of[space.Id(li, static_cast<uint32_t>(e))]));
  return out;
}

Status SlotCache::Impl::LoadMisses(uint32_t li, const std::vector<std::pair<ObjectId, uint32_t>>& misses,
                                   std::span<const uint64_t> requests) {
  if (misses.empty()) return Status::OK();
  if (host) return CopyFromHostTier(li, misses, requests);
  if (!rt) {  // host slots: read straight into them
    std::vector<std::pair<ObjectId, uint8_t*>> reads;
    for (auto [k, slot] : misses) reads.push_back({k, host_base + uint64_t{slot} * slot_bytes});
    Status st = ReadInto(reads);
    if (st.ok()) h2d_bytes += misses.size() * slot_bytes;
    return st;
  }
  // CUDA: batches of stage_slots through pinned staging, SGLang's order.
  for (size_t first = 0; first < misses.size(); first += opt.stage_slots) {
    const size_t n = std::min<size_t>(opt.stage_slots, misses.size() - first);
    std::vector<std::pair<ObjectId, uint8_t*>> reads;
    std::vector<uint32_t> stages;
    for (size_t i = 0; i < n; ++i) {
      uint32_t stage = stage_cursor;
      stage_cursor = (stage_cursor + 1) % opt.stage_slots;
      if (stage_busy[stage]) {
        K3_RETURN_IF_ERROR(cuda::Check(*rt, rt->EventSynchronize(stage_ev[stage]), "cudaEventSynchronize"));
        stage_busy[stage] = 0;
      }
      stages.push_back(stage);
      reads.push_back({misses[first + i].first, staging[stage]});
    }
    K3_RETURN_IF_ERROR(ReadInto(reads));
    for (size_t i = 0; i < n; ++i) {
      K3_RETURN_IF_ERROR(CopyToSlot(misses[first + i].second, staging[stages[i]]));
      K3_RETURN_IF_ERROR(cuda::Check(*rt, rt->EventRecord(stage_ev[stages[i]], transfer), "cudaEventRecord"));
      stage_busy[stages[i]] = 1;
    }
  }
  return Status::OK();
}

// Reads objects into host memory, all in flight together.
Status SlotCache::Impl::ReadInto(const std::vector<std::pair<ObjectId, uint8_t*>>& reads) {
  auto batch = std::make_shared<ReadBatch>();
  batch->pending = reads.size();
  batch->errors.resize(reads.size());
  batch->results.resize(reads.size());
  size_t submitted = 0;
  // Without memory for a request (`ulimit -v`) the rest are not submitted,
  // but those in flight are waited for: they write into the caller's slots.
  RanOutOfMemory([&] {
    for (; submitted < reads.size(); ++submitted) {
      const size_t i = submitted;
      auto r = MakeObjectRead(geo, ranges, reads[i].first, opt.store.direct_io ? direct_fd.get() : fd.get(),
                              opt.store.direct_io, reads[i].second);
      r->done = [batch, i](const ObjectReadResult& res) { batch->Done(i, res); };
      engine->Submit(std::move(r));  // queues all of it, or throws with nothing queued
    }
  });
  if (submitted < reads.size()) batch->Unsubmitted(submitted, reads.size());
  batch->Wait();
  std::optional<Error> first;
  for (size_t i = 0; i < reads.size(); ++i) {
    const ObjectReadResult& r = batch->results[i];
    // A read never submitted (no memory) reached no pack: not counted.
    if (i < submitted) {
      ++pack_reads;
      pack_read_bytes += r.bytes;
      pack_read_ns += r.max_range_ns;
    }
    if (batch->errors[i]) {
      if (i < submitted) ++io_errors;
      if (!first) first = ExplainReadError(geo, reads[i].first, *batch->errors[i]);
      continue;
    }
    // Damaged bytes never reach a caller: the call fails and its misses are forgotten.
    if (checksums.entry_crc32c.empty()) continue;
    Status ok = CheckObjectBytes(geo, checksums.entry_crc32c, reads[i].first, reads[i].second);
    ++(ok.ok() ? checksum_verified : checksum_errors);
    if (!ok.ok() && !first) first = ok.error();
  }
  if (!first) return Status::OK();
  return *first;
}

Status SlotCache::Impl::CopyToSlot(uint32_t slot, const uint8_t* src) {
  if (!rt) {
    std::memcpy(host_base + uint64_t{slot} * slot_bytes, src, slot_bytes);
  } else {
    // SGLang's transfer stream waits for the slot's last reader and last fill.
    if (has_ready[slot])
      K3_RETURN_IF_ERROR(cuda::Check(*rt, rt->StreamWaitEvent(transfer, ready_ev[slot], 0), "cudaStreamWaitEvent"));
    if (has_last_use[slot])
      K3_RETURN_IF_ERROR(
          cuda::Check(*rt, rt->StreamWaitEvent(transfer, last_use_ev[slot], 0), "cudaStreamWaitEvent"));
    uint8_t* dst = static_cast<uint8_t*>(device_base) + uint64_t{slot} * slot_bytes;
    Status st = cuda::Check(*rt, rt->MemcpyAsync(dst, src, slot_bytes, cuda::kHostToDevice, transfer),
                            "cudaMemcpyAsync (expert object)");
    K3_RETURN_IF_ERROR(st);
    K3_RETURN_IF_ERROR(cuda::Check(*rt, rt->EventRecord(ready_ev[slot], transfer), "cudaEventRecord"));
    has_ready[slot] = 1;
    has_last_use[slot] = 0;
  }
  h2d_bytes += slot_bytes;
  return Status::OK();
}

// Misses come from the host tier's cache (read by its own engine when not
// resident there), then are copied into their slots. A call may miss more
// objects than the host tier holds (a prefill touching many experts, a host
// tier smaller than a layer): they go through it in chunks that fit, each
// released before the next. In one host acquire they failed with "expert
// cache cannot evict the active top-k working set" although the slots had
// room.
Status SlotCache::Impl::CopyFromHostTier(uint32_t li, const std::vector<std::pair<ObjectId, uint32_t>>& misses,
                                         std::span<const uint64_t> requests) {
  const ObjectSpace& space = geo.space;
  const uint32_t k = space.top_k;
  const uint32_t layer = space.active_layer_ids[li];
  // Objects the host tier always fits (its budget / the largest object; at
  // least top_k, its open checks that). This cache's lock is held, so no
  // other call holds host objects meanwhile.
  const size_t chunk = std::max<size_t>(k, host->info().effective_capacity_objects);
  // One call for the host's staged prefetch (ExpertStore::BeginChunkedCall).
  const ChunkedHostCall one_call(*host, layer, misses.size() > chunk, requests);
  std::vector<int64_t> experts, ids;
  std::vector<uint64_t> row_requests;
  std::vector<size_t> route_of;
  for (size_t first = 0; first < misses.size(); first += chunk) {
    const size_t n = std::min(chunk, misses.size() - first);
    experts.clear();
    for (size_t i = 0; i < n; ++i) experts.push_back(space.ExpertOf(misses[first + i].first));
    // Whole rows (duplicates are free), one request each where known.
    MissRows(std::span<const int64_t>(experts), requests.empty() ? requests : requests.subspan(first, n), k, &ids,
             &row_requests, &route_of);
    const int64_t shape[2] = {static_cast<int64_t>(ids.size() / k), static_cast<int64_t>(k)};
    Result<Acquisition> acq = host->Acquire(layer, ids, shape, false, row_requests);
    if (!acq.ok()) return acq.error();  // the host tier counts its own I/O errors
    Status st;
    for (size_t i = 0; i < n && st.ok(); ++i) {
      st = CopyToSlot(misses[first + i].second, acq->routes[route_of[i]].bytes.data());
      ++host_tier_copies;
    }
    // The host tier may reuse its buffers once released: finish the copies first.
    if (rt) {
      Status sync = cuda::Check(*rt, rt->StreamSynchronize(transfer), "cudaStreamSynchronize");
      if (st.ok()) st = sync;
    }
    Status released = host->MarkUsed(*acq);
    K3_RETURN_IF_ERROR(st);
    K3_RETURN_IF_ERROR(released);
  }
  return Status::OK();
}

Status SlotCache::MarkUsed(std::span<const int32_t> slots, void* stream) {
  Impl& s = *impl_;
  K3_RETURN_IF_ERROR(CheckOpenedHere(s.opened_pid));
  std::lock_guard<std::mutex> lock(s.mu);
  // All checked before any is released: a refused call releases nothing (its
  // caller still uses those slots and may release them again).
  for (int32_t slot : slots)
    if (slot < 0 || static_cast<uint32_t>(slot) >= s.slot_count())
      return Error("expert slot " + std::to_string(slot) + " is out of range (" + std::to_string(s.slot_count()) +
                   " slots)");
  auto next_serial = [&] {
    if (++s.release_serial == 0) {  // wrapped: old marks could alias the new serial
      std::fill(s.release_mark.begin(), s.release_mark.end(), 0);
      s.release_serial = 1;
    }
  };
  if (s.rt) {
    // The slots' last-use events first: a CUDA error there releases nothing
    // (a caller that retries must not release a hold twice, which would
    // take another thread's).
    next_serial();
    for (int32_t slot : slots) {
      if (s.release_mark[slot] == s.release_serial) continue;
      s.release_mark[slot] = s.release_serial;
      K3_RETURN_IF_ERROR(cuda::Check(*s.rt, s.rt->EventRecord(s.last_use_ev[slot], stream), "cudaEventRecord"));
    }
    for (int32_t slot : slots) {
      s.has_last_use[slot] = 1;
      s.has_ready[slot] = 0;
    }
  }
  next_serial();
  const std::thread::id self = std::this_thread::get_id();
  const auto mine = s.outstanding.find(self);
  for (int32_t slot : slots) {
    if (s.release_mark[slot] == s.release_serial) continue;  // a slot named twice is released once
    s.release_mark[slot] = s.release_serial;
    // A call of this thread whose object its later call evicted: its hold
    // stayed with the slot (the objects there since are others' to end).
    ObjectId k = s.key_of[slot];
    if (!s.orphaned.empty() && s.EndOrphanedHold(static_cast<uint32_t>(slot), &self)) {
      // Its last hold here: a repeat of this release is one, as below.
      if (!s.HasOrphanedHold(static_cast<uint32_t>(slot), self) &&
          (k == kNoObject || mine == s.outstanding.end() || !mine->second.contains(k)))
        s.released_by[slot] = self;
      continue;
    }
    // Release one hold on the object, this thread's first, else another
    // thread's (a call may be released by another thread than the one that
    // made it), never another's for a release this thread already made.
    auto drop = [&](Impl::Holds& holds) {
      auto it = holds.find(k);
      if (it == holds.end()) return false;
      it->second.RemoveOldest();
      if (it->second.calls == 0) holds.erase(it);
      --s.pins[k];
      --s.total_pins;
      return true;
    };
    if (k != kNoObject && mine != s.outstanding.end() && drop(mine->second)) {
      if (!mine->second.contains(k)) s.released_by[slot] = self;
      continue;
    }
    if (s.released_by[slot] == self) continue;
    // Slots do not say whose call they end: the thread that took the object
    // first (calls released in the order they were made, as a completion
    // thread does). The first in thread-id order ended a later call's hold,
    // whose thread still read the slot while the earlier one's next call,
    // now the object's only holder, overwrote it.
    Impl::Holds* oldest = nullptr;
    uint64_t oldest_since = 0;
    for (auto& [tid, holds] : s.outstanding) {
      auto it = k == kNoObject ? holds.end() : holds.find(k);
      if (it == holds.end() || (oldest && it->second.since() >= oldest_since)) continue;
      oldest = &holds;
      oldest_since = it->second.since();
    }
    // An orphaned hold on the slot from an older call ends first.
    if (!s.orphaned.empty() && s.EndOrphanedHold(static_cast<uint32_t>(slot), nullptr, oldest ? oldest_since : 0))
      continue;
    if (oldest) drop(*oldest);
  }
  if (mine != s.outstanding.end() && mine->second.empty()) s.outstanding.erase(mine);
  s.cv.notify_all();
  return Status::OK();
}

Status SlotCache::Prefetch(uint32_t layer, std::span<const int64_t> ids, std::optional<uint64_t> request_id) {
  K3_RETURN_IF_ERROR(CheckOpenedHere(impl_->opened_pid));
  if (!impl_->host) return Error("prefetch needs a host tier (host_cache_mib > 0)");
  return impl_->host->Prefetch(layer, ids, request_id);
}

Status SlotCache::Keep(uint32_t layer, std::span<const int64_t> ids, std::optional<uint64_t> request_id) {
  K3_RETURN_IF_ERROR(CheckOpenedHere(impl_->opened_pid));
  if (!impl_->host) return Error("keep hints need a host tier (host_cache_mib > 0)");
  return impl_->host->Keep(layer, ids, request_id);
}

// ------------------------------------------------------------------ stats

nlohmann::json SlotCache::Snapshot() const {
  const Impl& s = *impl_;
  ForkSafeLock lock(s.mu, s.opened_pid);
  const ObjectSpace& space = s.geo.space;
  nlohmann::json j = nlohmann::json::object();
  j["pack_path"] = s.geo.resolved_pack_path;  // SGLang's str(Path(pack_path).resolve())
  j["pack_entries"] = s.geo.index_count;
  j["pack_reads"] = s.pack_reads;
  j["pack_read_bytes"] = s.pack_read_bytes;
  j["pack_read_ns"] = s.pack_read_ns;
  j["read_splits"] = s.opt.store.read_splits;
  j["direct_io"] = s.opt.store.direct_io;
  j["cache_hits"] = s.cache_hits;
  j["cache_misses"] = s.cache_misses;
  j["cache_evictions"] = s.cache_evictions;
  j["cache_policy"] = s.opt.store.policy;
  j["kernel_backend"] = "custom";
  const uint64_t resident = s.policy ? s.policy->resident_count() : 0;
  j["resident_experts"] = resident;
  j["resident_bytes"] = resident * s.slot_bytes;
  j["h2d_bytes"] = s.h2d_bytes;
  j["cache_vram_reserve_mib"] = s.opt.cache_vram_reserve_mib;
  j["fallback_count"] = 0;
  j["io_errors"] = s.io_errors;
  j["pack_format"] = s.geo.format;
  j["active_moe_layers"] = space.num_active_layers();
  if (s.slot_count() != 0) {
    j["cache_capacity_experts"] = s.slot_count();
    j["cache_capacity_bytes"] = uint64_t{s.slot_count()} * s.slot_bytes;
    j["staged_bytes"] = s.staging.size() * s.slot_bytes;
  }
  j["mean_read_ms"] = s.pack_reads ? double(s.pack_read_ns) / double(s.pack_reads) / 1e6 : 0.0;
  j["route_calls_by_layer"] = s.route_calls;
  j["route_tokens_by_layer"] = s.route_tokens;
  nlohmann::json k = nlohmann::json::object();
  k["profile"] = s.geo.profile;
  k["slot_memory"] = s.rt ? "cuda" : (s.host_base ? "host" : "none");
  k["io_backend"] = s.opt.store.io_backend;
  k["queue_depth"] = s.opt.store.queue_depth;
  k["queue_depth_max"] = s.engine ? s.engine->max_device_reads() : 0;
  k["waits_for_other_threads"] = s.waits_for_other_threads;
  k["checksums"] = s.host ? "by the host tier" : s.checksums.mode;
  k["checksum_errors"] = s.checksum_errors;
  k["checksum_verified_objects"] = s.checksum_verified;
  k["host_tier_bytes"] = s.opt.host_cache_bytes;
  k["host_tier_copies"] = s.host_tier_copies;
  k["ep"] = EpSnapshot(s.geo);
  if (s.host) {
    // The pack is read by the host tier: its reads are the store's reads.
    nlohmann::json h = s.host->Snapshot();
    for (const char* key : {"pack_reads", "pack_read_bytes", "pack_read_ns", "io_errors", "mean_read_ms"})
      j[key] = h[key];
    k["host_tier"] = {{"cache_hits", h["cache_hits"]}, {"cache_misses", h["cache_misses"]},
                      {"cache_evictions", h["cache_evictions"]}, {"resident_experts", h["resident_experts"]},
                      {"policy", h["cache_policy"]}};
    // prefetch()/keep() go to the host tier: its accounting (issued =
    // useful + wasted + cancelled + staged + failed) is theirs to check.
    if (h.contains("k3pack") && h["k3pack"].contains("prefetch")) k["host_tier"]["prefetch"] = h["k3pack"]["prefetch"];
  }
  j["k3pack"] = k;
  return j;
}

Status SlotCache::Close() {
  Impl& s = *impl_;
  ForkSafeLock lock(s.mu, s.opened_pid);
  if (s.closed) return Status::OK();
  s.closed = true;
  if (ForkedFrom(s.opened_pid)) {
    // The engine's threads and the CUDA context are the parent's: give up
    // this copy's descriptors only (the host tier closes its own copy).
    s.fd = UniqueFd();
    s.direct_fd = UniqueFd();
    return s.host ? s.host->Close() : Status::OK();
  }
  s.cv.notify_all();  // calls waiting for room give up (they see `closed`)
  if (s.engine) s.engine->Shutdown();
  Status st = s.host ? s.host->Close() : Status::OK();
  s.ReleaseCuda();
  s.fd = UniqueFd();
  s.direct_fd = UniqueFd();
  return st;
}

}  // namespace k3pack::store
