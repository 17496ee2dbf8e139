// ExpertStore: acquire / prefetch / mark_used over a policy, a buffer pool
// and an I/O engine. One mutex guards the policy and the entry table; reads
// complete on engine threads and wake waiters through one condition variable.
#include <fcntl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <system_error>

#include "k3pack/pack.h"
#include "store/fork_guard.h"
#include "store/store_state.h"
#include "util/interrupt.h"
#include "util/process_limits.h"
#include "util/threads.h"

namespace k3pack::store {

ExpertStore::ExpertStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ExpertStore::~ExpertStore() {
  (void)Close();
  // A forked child's copy: the engine's and checksum pool's threads live in
  // the parent only; destroying their handles here would join (hang) or
  // terminate. Leave them (their memory is the child's to lose at exit).
  if (ForkedFrom(impl_->opened_pid)) {
    (void)impl_->engine.release();
    (void)impl_->verify_pool.release();
  }
}
const StoreInfo& ExpertStore::info() const { return impl_->info; }

void ExpertStore::SetReadFaultHook(std::function<void(uint64_t, uint64_t, int64_t*)> hook) {
  impl_->engine->SetFaultHook(std::move(hook));
}

Result<std::shared_ptr<ExpertStore>> ExpertStore::Open(const std::string& pack_path, const std::string& manifest_path,
                                                       const StoreOptions& opt) {
  auto t0 = std::chrono::steady_clock::now();
  K3_RETURN_IF_ERROR(CheckStoreFiles(pack_path, manifest_path));
  if (!opt.stats_path.empty()) K3_RETURN_IF_ERROR(CheckStatsFile(opt.stats_path));
  auto impl = std::make_unique<Impl>();
  K3_ASSIGN_OR_RETURN(impl->fd, OpenReadOnly(pack_path));
  K3_ASSIGN_OR_RETURN(impl->geo, ValidatePack(pack_path, manifest_path, opt, impl->fd.get()));
  // Runtime state (SGLang's _initialize_runtime_state) checks.
  K3_RETURN_IF_ERROR(CheckRuntimeCounts(opt, "cache_bytes", opt.cache_bytes));
  if (static_cast<bool>(opt.buffer_alloc) != static_cast<bool>(opt.buffer_free))
    return Error("StoreOptions.buffer_alloc and buffer_free must be set together");
  if (opt.prefetch_mode != "staged" && opt.prefetch_mode != "cache")
    return Error("unknown prefetch mode '" + opt.prefetch_mode + "' (known: staged, cache)");
  if (opt.prefetch_queue_depth < 0) return Error("prefetch queue depth cannot be negative");
  K3_ASSIGN_OR_RETURN(IoBackend backend, ParseIoBackend(opt.io_backend));
  const PackGeometry& g = impl->geo;
  const ObjectSpace& s = g.space;
  impl->opt = opt;
  {
    K3_ASSIGN_OR_RETURN(ReadPlan plan, PlanObjectReads(pack_path, g, opt));
    impl->ranges = std::move(plan.ranges);
    impl->direct_fd = std::move(plan.direct_fd);
  }
  const uint64_t largest = s.max_object_bytes();
  // A rank store's token never needs more than its owned experts resident.
  const uint64_t working_set = WorkingSetObjects(g);
  if (opt.cache_bytes < working_set * largest)
    return Error("insufficient expert cache budget for one top-k expert working set: budget=" +
                     std::to_string(opt.cache_bytes) + ", object=" + std::to_string(largest),
                 ErrorKind::kMemory)
        .WithHint("the cache must hold " + std::string(g.ep.whole() ? "top_k (" : "min(top_k, owned experts) (") +
                  std::to_string(working_set) + ") objects: at least " +
                  std::to_string((working_set * largest + (1 << 20) - 1) >> 20) + " MiB");
  K3_ASSIGN_OR_RETURN(impl->policy, MakePolicy(opt.policy, s, opt.cache_bytes));
  K3_ASSIGN_OR_RETURN(impl->engine, IoEngine::Create(backend, static_cast<uint32_t>(opt.queue_depth)));
  impl->pool = std::make_shared<BufferPool>(opt.cache_bytes, BufferAllocator{opt.buffer_alloc, opt.buffer_free});
  impl->entries.resize(s.num_objects());
  impl->pins.assign(s.num_objects(), 0);
  impl->prefetch_pinned.assign(s.num_objects(), 0);
  impl->generations.assign(s.num_objects(), 0);
  impl->route_calls.assign(s.num_layers_total, 0);
  impl->route_tokens.assign(s.num_layers_total, 0);
  impl->layer_hits.assign(s.num_active_layers(), 0);
  impl->layer_misses.assign(s.num_active_layers(), 0);
  impl->prefetch_by_layer.resize(s.num_active_layers());
  impl->staged_mode = opt.prefetch_mode == "staged";
  impl->prefetch_budget = opt.prefetch_budget_bytes ? opt.prefetch_budget_bytes : 2 * working_set * largest;
  impl->prefetch_depth = opt.prefetch_queue_depth ? static_cast<uint64_t>(opt.prefetch_queue_depth)
                                                  : static_cast<uint64_t>(std::max<int64_t>(1, opt.queue_depth / 2));
  impl->staged.resize(s.num_objects());
  impl->stage_holds.emplace(s.num_objects(), s.num_active_layers());
  if (impl->staged_mode && opt.keep_predicted) impl->kept.emplace(s.num_objects(), s.num_active_layers());
  impl->checksum_mode = "off";
  if (opt.verify_checksums) {
    K3_ASSIGN_OR_RETURN(ObjectChecksums sums, LoadObjectChecksums(pack_path, impl->geo));
    impl->entry_crc32c = std::move(sums.entry_crc32c);
    impl->checksum_mode = std::move(sums.mode);
    // The pread backend checks on its own `queue_depth` threads already.
    if (backend == IoBackend::kUring && !impl->entry_crc32c.empty()) {
      // One core checks 11-18 GB/s of CRC32C (three interleaved `crc32`
      // streams; docs/store.md), so 8 outrun any drive array a host feeds a
      // store from, and a many-core server does not get a thread per core per
      // open store (expert-parallel ranks each open one; a container's pids
      // limit counts them all).
      constexpr unsigned kMaxChecksumThreads = 8;
      try {
        impl->verify_pool = std::make_unique<TaskPool>(
            static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 2u, kMaxChecksumThreads)));
      } catch (const std::system_error&) {
        // No thread to spare: io_uring's reaping thread checks each read
        // itself, slower under load but every byte still checked.
      }
    }
  }

  StoreInfo& info = impl->info;
  info = DescribePack(pack_path, manifest_path, g);
  info.cache_bytes = opt.cache_bytes;
  info.effective_capacity_objects = opt.cache_bytes / largest;
  info.open_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return std::shared_ptr<ExpertStore>(new ExpertStore(std::move(impl)));
}

// ------------------------------------------------------------------ helpers

Status ExpertStore::Impl::CheckObject(ObjectId id, const uint8_t* bytes) const {
  return CheckObjectBytes(geo, entry_crc32c, id, bytes);
}

uint64_t ExpertStore::Impl::Generation(ObjectId id) {
  uint64_t& g = generations[id];
  if (g == 0) g = ObjectGeneration(geo.index_sha256, geo.space.LayerOf(id), geo.space.ExpertOf(id));
  return g;
}

void ExpertStore::Impl::Pin(ObjectId id) {
  if (pins[id]++ == 0 && policy->Resident(id)) pinned_resident_bytes += geo.space.Cost(id);
}

// Keeps pinned_resident_bytes == sum of costs of resident objects with pins
// when an object that someone still pins (after a failed read) comes back.
void ExpertStore::Impl::BecameResident(ObjectId id) {
  if (pins[id] != 0) pinned_resident_bytes += geo.space.Cost(id);
}

// mu held. An object whose bytes will not be served (its read failed, or
// could not be started) leaves the cache and the pinned-bytes count.
void ExpertStore::Impl::ForgetObject(ObjectId id) {
  if (policy->Resident(id)) {
    if (pins[id] != 0) pinned_resident_bytes -= geo.space.Cost(id);
    policy->Erase(id);
  }
  entries[id].reset();
}

void ExpertStore::Impl::Unpin(ObjectId id) {
  if (--pins[id] == 0 && policy->Resident(id)) pinned_resident_bytes -= geo.space.Cost(id);
}

void ExpertStore::Impl::DropEntry(ObjectId id, bool evicted) {
  std::shared_ptr<Entry>& e = entries[id];
  if (e && e->prefetched && !e->used) {
    ++prefetch_wasted;
    prefetch_wasted_bytes += geo.space.Cost(id);
    // Counted: a read still in flight that then fails is not also `failed`.
    e->used = true;
  }
  if (evicted) ++cache_evictions;
  e.reset();
}

void ExpertStore::Impl::ReleasePrefetchPins(uint32_t li) {
  for (ObjectId id : prefetch_by_layer[li]) {
    if (prefetch_pinned[id]) {
      prefetch_pinned[id] = 0;
      Unpin(id);
    }
  }
  prefetch_by_layer[li].clear();
}

void ExpertStore::Impl::EndAcquisition(std::thread::id owner) {
  --active_acquisitions;
  auto it = active_by_thread.find(owner);
  if (it != active_by_thread.end() && --it->second == 0) active_by_thread.erase(it);
}

bool ExpertStore::Impl::Fits(std::span<const ObjectId> keys) const {
  uint64_t need = 0, blocked = pinned_resident_bytes;
  for (ObjectId k : keys) {
    if (!policy->Resident(k)) need += geo.space.Cost(k);
    else if (pins[k] == 0) blocked += geo.space.Cost(k);
  }
  return blocked + need <= policy->capacity_bytes();
}

// mu held. Never throws: with no memory for the entry, the object is
// forgotten as after a failed read, and the shared failed entry stands in.
std::shared_ptr<ExpertStore::Impl::Entry> ExpertStore::Impl::StartRead(ObjectId id, bool prefetched) {
  std::shared_ptr<Entry> e;
  if (RanOutOfMemory([&] { e = std::make_shared<Entry>(); })) {
    ForgetObject(id);
    return out_of_memory_entry;
  }
  e->id = id;
  e->prefetched = prefetched;
  entries[id] = e;
  SubmitRead(e);
  return e;
}

// mu held. Never throws: a read that cannot be started (no buffer, no memory
// for its request under `ulimit -v`) fails its entry, so that nobody waits
// for it forever. It also runs on I/O threads (speculative reads started as
// others finish), where an exception would end the process.
void ExpertStore::Impl::SubmitRead(const std::shared_ptr<Entry>& e) {
  const ObjectId id = e->id;
  const uint32_t li = geo.space.LayerIndexOf(id);
  e->submitted = true;
  ++loading;
  const bool out_of_memory = RanOutOfMemory([&] {
    e->buffer = pool->Get(geo.space.object_bytes[li]);
    if (!e->buffer) return;
    auto read = MakeObjectRead(geo, ranges, id, opt.direct_io ? direct_fd.get() : fd.get(), opt.direct_io,
                               e->buffer.get());
    read->done = [this, e](const ObjectReadResult& r) {
      // Queuing allocates, on the I/O thread: with no memory for it, the
      // read is checked here instead.
      if (verify_pool && r.status.ok() &&
          !RanOutOfMemory([&] { verify_pool->Submit([this, e, r] { CheckAndFinish(e, r); }); })) {
        return;
      }
      CheckAndFinish(e, r);
    };
    engine->Submit(std::move(read));  // queues all of it, or throws with nothing queued
  });
  if (out_of_memory) {
    FinishRead(e, {BareOutOfMemory(), 0, 0, 0}, ReadEnd::kNeverStarted);
  } else if (!e->buffer) {
    // The buffer allocator said no (posix_memalign, or cudaHostAlloc for
    // pinned buffers): not necessarily the address-space limit.
    Error no_buffer = BareOutOfMemory();
    RanOutOfMemory([&] {
      no_buffer = Error("cannot allocate an expert buffer of " + std::to_string(geo.space.object_bytes[li]) +
                            " bytes for expert-pack object (layer " + std::to_string(geo.space.LayerOf(id)) +
                            ", expert " + std::to_string(geo.space.ExpertOf(id)) + ")",
                        ErrorKind::kMemory, ENOMEM)
                      .WithHint(OutOfMemoryHint());
    });
    FinishRead(e, {std::move(no_buffer), 0, 0, 0}, ReadEnd::kNeverStarted);
  }
}

// Never throws: it runs on I/O and checksum threads (a checksum job's
// exception would be kept in a future nobody reads, and the read would
// never finish).
void ExpertStore::Impl::CheckAndFinish(const std::shared_ptr<Entry>& e, const ObjectReadResult& r) {
  // Before anyone can see the bytes.
  if (r.status.ok() && !entry_crc32c.empty()) {
    Status bad = Status::OK();
    // Only a mismatch allocates (its text): without memory for that, the
    // bytes are refused all the same.
    if (RanOutOfMemory([&] { bad = CheckObject(e->id, e->buffer.get()); })) bad = BareOutOfMemory();
    if (!bad.ok()) {
      ObjectReadResult damaged = r;  // an OK status: copied without allocating
      damaged.status = std::move(bad);
      std::lock_guard<std::mutex> lock(mu);
      FinishRead(e, damaged, ReadEnd::kChecksumFailed);
      return;
    }
  }
  std::lock_guard<std::mutex> lock(mu);
  FinishRead(e, r);
}

// mu held.
void ExpertStore::Impl::FinishRead(const std::shared_ptr<Entry>& e, const ObjectReadResult& r, ReadEnd how) {
  --loading;
  if (how != ReadEnd::kNeverStarted) {
    ++pack_reads;
    pack_read_bytes += r.bytes;
    pack_read_ns += r.max_range_ns;
    latency.Add(r.latency_ns);
  }
  if (r.status.ok() && !entry_crc32c.empty()) ++checksum_verified;
  if (r.status.ok()) {
    e->state = Entry::kReady;
    if (e->prefetched && staged_mode) FinishStagedRead(e, true);
  } else {
    if (how == ReadEnd::kChecksumFailed) ++checksum_errors;
    if (how == ReadEnd::kRead) ++io_errors;
    e->state = Entry::kFailed;
    // On an I/O thread: a text that cannot be copied is replaced by one that
    // needs no memory, and the waiter says what was lost (ExplainReadError).
    if (RanOutOfMemory([&] { e->error = r.status.error(); })) e->error = BareOutOfMemory();
    if (e->prefetched && staged_mode) FinishStagedRead(e, false);
    if (e->prefetched && !staged_mode && !e->used) {  // the cache mode's term of the identity
      ++prefetch_failed;
      e->used = true;
    }
    // Never serve or keep the bytes: forget the object.
    if (entries[e->id] == e) ForgetObject(e->id);
  }
  cv.notify_all();
}

// ------------------------------------------------------------------ acquire

Result<Acquisition> ExpertStore::AcquireToken(uint32_t layer, std::span<const int64_t> ids) {
  int64_t shape[2] = {1, static_cast<int64_t>(ids.size())};
  return Acquire(layer, ids, shape, std::nullopt);
}

Result<Acquisition> ExpertStore::Acquire(uint32_t layer, std::span<const int64_t> ids, std::span<const int64_t> shape,
                                         std::optional<bool> is_prefill_opt, std::span<const uint64_t> request_ids) {
  Impl& s = *impl_;
  const ObjectSpace& space = s.geo.space;
  K3_RETURN_IF_ERROR(CheckOpenedHere(s.opened_pid));  // no read would ever finish in a forked child
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
  s.ReleasePrefetchPins(li);
  if (s.kept) s.kept->CallStarts(li, request_ids);
  ++s.route_calls[layer];
  s.route_tokens[layer] += static_cast<uint64_t>(rows);
  // Other callers' working sets are protected; wait for them rather than fail
  // (bounded, in case this very thread holds the acquisitions in the way).
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  bool waited = false;
  while (!s.Fits(keys)) {
    // The store's own prefetch pins go before any wait: they are hints, and
    // waiting on other threads with them held stalled the call for the whole
    // bound where dropping them made room at once.
    bool dropped = false;
    for (uint32_t l = 0; l < space.num_active_layers(); ++l) {
      dropped |= !s.prefetch_by_layer[l].empty();
      s.ReleasePrefetchPins(l);
    }
    if (dropped) continue;
    const uint64_t mine = s.active_by_thread.count(std::this_thread::get_id())
                              ? s.active_by_thread[std::this_thread::get_id()] : 0;
    if (s.active_acquisitions > mine && std::chrono::steady_clock::now() < deadline) {
      waited = true;
      s.cv.wait_until(lock, WakeForInterrupt(deadline));
      // Close() may have run meanwhile: its engine takes no more reads (a
      // read submitted now would never finish, and this call wait forever).
      if (s.closed) return Error("expert store is closed", ErrorKind::kRuntime);
      K3_RETURN_IF_ERROR(PollInterruptUnlocked(lock));
      // The poll let go of the mutex: Close() may have run in it too.
      if (s.closed) return Error("expert store is closed", ErrorKind::kRuntime);
      continue;
    }
    break;  // let the policy report SGLang's error
  }
  std::vector<uint64_t> gens(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) gens[i] = s.Generation(keys[i]);
  // Allocated before the cache changes: from here on, no allocation of
  // this call may fail with pins taken and not given back.
  std::vector<std::shared_ptr<Impl::Entry>> call_entries(keys.size());
  AccessResult ar;
  // The policy's own allocations may fail too (`ulimit -v`): it stops with
  // every eviction it made reported and its bookkeeping whole, and the
  // call fails like one the policy refused.
  Status st = Status::OK();
  if (RanOutOfMemory([&] { st = s.policy->Access(keys, gens, is_prefill, &s.pins, &ar, call_rows); }))
    st = BareOutOfMemory();
  for (ObjectId v : ar.evicted) s.DropEntry(v, true);
  if (!st.ok()) {
    // Keys the policy took in before failing have no bytes: forget them.
    for (ObjectId k : keys)
      if (s.policy->Resident(k) && !s.entries[k]) s.policy->Erase(k);
    if (IsBareOutOfMemory(st.error())) return AcquireOutOfMemory("the expert store", layer);
    // A short wait that ended for another reason is not "held for 10 s".
    const bool waited_out = waited && std::chrono::steady_clock::now() >= deadline;
    return ExplainCannotEvict(st.error(), keys.size(), s.policy->capacity_bytes() / space.max_object_bytes(),
                              waited_out);
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    ObjectId k = keys[i];
    if (ar.hit[i] && s.entries[k]) {
      ++s.cache_hits;
      ++s.layer_hits[li];
      call_entries[i] = s.entries[k];
      if (call_entries[i]->prefetched && !call_entries[i]->used) {
        ++s.prefetch_useful;
        s.prefetch_useful_bytes += space.Cost(k);
      }
    } else {
      // A miss for the policy either way (staging never changes what the
      // cache holds); a staged object only saves the read.
      ++s.cache_misses;
      ++s.layer_misses[li];
      s.BecameResident(k);
      std::shared_ptr<Impl::Entry> staged = s.staged_mode ? s.TakeStaged(k) : nullptr;
      call_entries[i] = staged ? std::move(staged) : s.StartRead(k, false);
    }
    call_entries[i]->used = true;
    s.Pin(k);
  }
  // What this call's requests did not route to (a chunk of a front tier's
  // call leaves that to EndChunkedCall).
  if (s.staged_mode && !s.InChunkedCall(li)) s.EndStaged(li, request_ids);
  const std::thread::id owner = std::this_thread::get_id();
  if (RanOutOfMemory([&] { ++s.active_by_thread[owner]; })) {
    for (ObjectId k : keys) s.Unpin(k);
    s.cv.notify_all();
    return AcquireOutOfMemory("the expert store", layer);
  }
  ++s.active_acquisitions;
  s.cv.wait(lock, [&] {
    for (const auto& e : call_entries)
      if (e->state == Impl::Entry::kLoading) return false;
    return true;
  });
  auto release = [&] {
    for (ObjectId k : keys) s.Unpin(k);
    s.EndAcquisition(owner);
    s.cv.notify_all();
  };
  for (size_t i = 0; i < keys.size(); ++i) {
    if (call_entries[i]->state == Impl::Entry::kFailed) {
      release();  // first: making the error allocates
      return ExplainReadError(s.geo, keys[i], *call_entries[i]->error);
    }
  }
  Acquisition out;
  const bool out_of_memory = RanOutOfMemory([&] {
    out.layer = layer;
    out.owner = owner;
    out.store = this;
    out.distinct_objects = keys;
    out.routes.reserve(ids.size());
    s.live_tickets.insert(s.next_ticket + 1);
    out.ticket = ++s.next_ticket;  // set last: a ticket is live once it is in live_tickets
  });
  if (out_of_memory) {
    release();
    return AcquireOutOfMemory("the expert store", layer);
  }
  const auto& off = s.geo.role_offsets[li];
  const auto& rb = s.geo.role_bytes[li];
  for (int64_t e : ids) {
    ObjectId k = space.Id(li, static_cast<uint32_t>(e));
    size_t i = std::lower_bound(keys.begin(), keys.end(), k) - keys.begin();
    const auto& entry = call_entries[i];
    ExpertView v;
    v.layer = layer;
    v.expert = static_cast<uint32_t>(e);
    v.owner = entry->buffer;
    const uint8_t* base = entry->buffer.get();
    v.bytes = {base, space.object_bytes[li]};
    v.up = {base + off[0], rb[0]};
    v.gate = {base + off[1], rb[1]};
    v.down = {base + off[2], rb[2]};
    out.routes.push_back(std::move(v));
  }
  return out;
}

Status ExpertStore::MarkUsed(Acquisition& a) {
  Impl& s = *impl_;
  // Before the mutex, which a forked child may find held for good by a
  // parent's thread fork did not copy (the child hung in mark_used, and in
  // Python in the collection of an unreleased acquisition). The parent's
  // pins are not the child's to release; and no stats write from a copy.
  if (Status here = CheckOpenedHere(s.opened_pid); !here.ok()) return a.ticket == 0 ? Status::OK() : here;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (a.ticket == 0) return Status::OK();
    // Another store's ticket would unpin objects here that this store never
    // pinned and mark the call released, leaving the owner's pins held.
    if (a.store != this)
      return Error("this Acquisition belongs to another ExpertStore: release it through the store that "
                   "acquired it (in Python, acquisition.mark_used())");
    // A copy of an acquisition already released: nothing of it is held.
    const bool live = s.live_tickets.erase(a.ticket) != 0;
    a.ticket = 0;
    if (!live) return Status::OK();
    for (ObjectId k : a.distinct_objects) s.Unpin(k);
    s.EndAcquisition(a.owner);
    s.cv.notify_all();
    uint64_t calls = 0;
    for (uint64_t c : s.route_calls) calls += c;
    if (s.opt.stats_path.empty() || s.opt.stats_flush_interval <= 0 ||
        calls - s.last_flush_calls < static_cast<uint64_t>(s.opt.stats_flush_interval))
      return Status::OK();
    s.last_flush_calls = calls;
  }
  return s.WriteStatsJson();
}

namespace {

// A prediction's layer index and distinct objects, checked as a route is.
Status PredictedObjects(const ExpertStore::Impl& s, uint32_t layer, std::span<const int64_t> ids, uint32_t* li,
                        std::vector<ObjectId>* keys) {
  const ObjectSpace& space = s.geo.space;
  K3_RETURN_IF_ERROR(CheckOpenedHere(s.opened_pid));
  int64_t shape[2] = {1, static_cast<int64_t>(space.top_k)};
  if (space.LayerIndex(layer) < 0) return ValidateRoute(space, layer, shape, {});
  for (int64_t e : ids)
    if (e < 0 || e >= static_cast<int64_t>(space.num_experts)) return Error("route contains an out-of-range expert id");
  K3_RETURN_IF_ERROR(CheckOwnedRoutes(s.geo, layer, ids));
  *li = static_cast<uint32_t>(space.LayerIndex(layer));
  DistinctSorted(space, *li, ids.data(), ids.size(), keys);
  return Status::OK();
}

}  // namespace

void ExpertStore::BeginChunkedCall(uint32_t layer) {
  Impl& s = *impl_;
  const int32_t li = s.geo.space.LayerIndex(layer);
  if (li < 0) return;  // its acquires fail with SGLang's inactive-layer text
  std::lock_guard<std::mutex> lock(s.mu);
  s.chunked_calls.emplace_back(std::this_thread::get_id(), static_cast<uint32_t>(li));
}

void ExpertStore::EndChunkedCall(uint32_t layer, std::span<const uint64_t> request_ids) {
  Impl& s = *impl_;
  const int32_t li = s.geo.space.LayerIndex(layer);
  if (li < 0) return;
  std::lock_guard<std::mutex> lock(s.mu);
  // One entry: Begin() may nest for a layer, and an inner End() leaves the
  // outer call's chunks their staged reads.
  const auto it = std::find(s.chunked_calls.begin(), s.chunked_calls.end(),
                            std::make_pair(std::this_thread::get_id(), static_cast<uint32_t>(li)));
  if (it == s.chunked_calls.end()) return;
  s.chunked_calls.erase(it);
  if (s.staged_mode && !s.closed) s.EndStaged(static_cast<uint32_t>(li), request_ids);
}

Status ExpertStore::Keep(uint32_t layer, std::span<const int64_t> ids, std::optional<uint64_t> request_id) {
  Impl& s = *impl_;
  uint32_t li = 0;
  std::vector<ObjectId> keys;
  K3_RETURN_IF_ERROR(PredictedObjects(s, layer, ids, &li, &keys));
  K3_RETURN_IF_ERROR(CheckRequestId(request_id));
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.closed) return Error("expert store is closed", ErrorKind::kRuntime);
  if (!s.kept)
    return Error("keep hints are off in this store (keep_predicted = false, or prefetch_mode \"cache\")")
        .WithHint("open it with prefetch_mode \"staged\" and keep_predicted on (both the defaults)");
  std::erase_if(keys, [&](ObjectId k) { return !s.policy->Resident(k); });
  s.KeepResidents(li, request_id.value_or(NextCallHolds::kAnyRequest), keys);
  return Status::OK();
}

Status ExpertStore::Prefetch(uint32_t layer, std::span<const int64_t> ids, std::optional<uint64_t> request_id) {
  Impl& s = *impl_;
  const ObjectSpace& space = s.geo.space;
  uint32_t li = 0;
  std::vector<ObjectId> keys;
  K3_RETURN_IF_ERROR(PredictedObjects(s, layer, ids, &li, &keys));
  K3_RETURN_IF_ERROR(CheckRequestId(request_id));
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.closed) return Error("expert store is closed", ErrorKind::kRuntime);
  if (s.staged_mode) {
    Status staged = s.StagePrefetch(li, keys, request_id.value_or(NextCallHolds::kAnyRequest));
    if (!staged.ok() && IsBareOutOfMemory(staged.error()))
      return OutOfMemoryOn("the expert store's prefetch of layer " + std::to_string(layer) +
                           " (what it could stage is staged)");
    return staged;
  }
  std::vector<ObjectId> evicted;
  for (ObjectId k : keys) {
    if (!s.policy->Resident(k)) {
      evicted.clear();
      bool admitted = false;
      const bool out_of_memory =
          RanOutOfMemory([&] { admitted = s.policy->Admit(k, s.Generation(k), &s.pins, &evicted); });
      for (ObjectId v : evicted) s.DropEntry(v, true);
      if (out_of_memory) {
        s.policy->Erase(k);  // admitted or not: it has no entry
        return OutOfMemoryOn("the expert store's prefetch of layer " + std::to_string(layer) +
                             " (what it could prefetch is prefetched)");
      }
      if (!admitted) continue;  // everything is pinned: skip, the acquire will read it
      s.BecameResident(k);
      ++s.prefetch_issued;
      s.prefetch_issued_bytes += space.Cost(k);
      s.StartRead(k, true);
    }
    if (!s.prefetch_pinned[k]) {
      s.prefetch_by_layer[li].push_back(k);  // first: it may fail to allocate, and then nothing is pinned
      s.prefetch_pinned[k] = 1;
      s.Pin(k);
    }
  }
  return Status::OK();
}

Status ExpertStore::Close() {
  Impl& s = *impl_;
  if (ForkedFrom(s.opened_pid)) {
    // Reads in flight (if any) were the parent's: nothing here will finish
    // them, and the engine's threads are not ours to stop. The stats file is
    // the parent's too. Give up this copy's descriptors only.
    ForkSafeLock lock(s.mu, s.opened_pid);
    s.closed = true;
    s.fd = UniqueFd();
    s.direct_fd = UniqueFd();
    return Status::OK();
  }
  {
    std::unique_lock<std::mutex> lock(s.mu);
    if (s.closed) return Status::OK();
    s.closed = true;
    s.cv.notify_all();  // calls waiting for room: they give up now
    // Staged objects no acquire will take: queued reads are cancelled.
    for (ObjectId id = 0; id < s.staged.size(); ++id) s.DropStaged(id);
    s.spec_queue.clear();
    s.cv.wait(lock, [&] { return s.loading == 0; });
  }
  s.engine->Shutdown();
  // No read completes any more, so no check is queued: the checksum threads
  // go now, not when the (closed, maybe long-lived) store is destroyed.
  s.verify_pool.reset();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    for (auto& e : s.entries)
      if (e && e->prefetched && !e->used) {
        ++s.prefetch_wasted;
        s.prefetch_wasted_bytes += s.geo.space.Cost(e->id);
        e->used = true;  // counted once
      }
    // The cache's memory goes now, not when the store object is destroyed
    // (a closed Python store may live on for long); views handed out keep
    // their own buffers, which are freed when the last view drops.
    // The policy's residents with them: a closed store's stats said it
    // still held objects whose buffers were gone (resident_bytes against a
    // cache_entry_bytes of 0).
    for (ObjectId id = 0; id < s.entries.size(); ++id) s.ForgetObject(id);
    for (auto& e : s.staged) e.reset();
    s.pool->Drain();
  }
  Status st = s.opt.stats_path.empty() ? Status::OK() : s.WriteStatsJson();
  s.fd = UniqueFd();
  s.direct_fd = UniqueFd();
  return st;
}

}  // namespace k3pack::store
