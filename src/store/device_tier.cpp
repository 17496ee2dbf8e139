#include "k3pack/device_tier.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <unordered_set>

#include "store/cuda_runtime.h"
#include "store/device_copier.h"
#include "store/device_slots.h"
#include "store/miss_rows.h"
#include "store/object_space.h"
#include "store/store_impl.h"
#include "util/process_limits.h"
#include "util/threads.h"

namespace k3pack::store {

namespace {

constexpr uint64_t kSlotAlignment = 256;  // cudaMalloc's own alignment: every slot starts aligned too

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Buffers handed out by UsePinnedHostBuffers(), so copies can tell pinned
// sources (DMA as they are) from pageable ones (staged).
class PinnedRegistry {
 public:
  void Add(const void* p, uint64_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    ranges_[reinterpret_cast<uintptr_t>(p)] = n;
  }
  void Remove(const void* p) {
    std::lock_guard<std::mutex> lock(mu_);
    ranges_.erase(reinterpret_cast<uintptr_t>(p));
  }
  bool Contains(const void* p, uint64_t n) const {
    const auto a = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = ranges_.upper_bound(a);
    if (it == ranges_.begin()) return false;
    --it;
    return a + n <= it->first + it->second;
  }
  static PinnedRegistry& Get() {
    static PinnedRegistry r;
    return r;
  }

 private:
  mutable std::mutex mu_;
  std::map<uintptr_t, uint64_t> ranges_;
};

ObjectSpace SpaceOf(const StoreInfo& info) {
  ObjectSpace s;
  s.active_layer_ids = info.active_layer_ids;
  s.num_experts = info.num_experts;
  s.top_k = info.top_k;
  s.object_bytes = info.object_bytes;
  s.num_layers_total = info.num_hidden_layers;
  return s;
}

}  // namespace

struct DeviceExpertTier::Impl {
  const cuda::Runtime* rt = nullptr;
  std::shared_ptr<ExpertStore> host;
  ObjectSpace space;
  DeviceTierOptions options;
  int runtime_version = 0, driver_version = 0;
  uint64_t slot_bytes = 0;
  uint8_t* device_base = nullptr;
  std::unique_ptr<DeviceCopier> copier;
  std::unique_ptr<DeviceSlots> slots;

  mutable std::mutex mu;
  uint64_t next_ticket = 1;
  // Tickets handed out and not yet released: a copy of a released
  // DeviceAcquisition must not drop the holds other calls have on its slots.
  std::unordered_set<uint64_t> live_tickets;
  uint64_t calls = 0, routes = 0, hits = 0, misses = 0, h2d_bytes = 0, h2d_pinned_bytes = 0;
  double h2d_seconds = 0, host_seconds = 0;

  ~Impl() {
    copier.reset();  // joins the workers after their last copy
    if (rt && device_base) rt->Free(device_base);
  }

  uint8_t* SlotAddress(uint32_t slot) const { return device_base + uint64_t{slot} * slot_bytes; }

  // Reads the missed objects through the host store and copies them into
  // their slots. `requests` (empty: unknown): each missed object's request;
  // the host calls then have rows of one request each. The host store holds
  // at most effective_capacity_objects at once (at least top_k: its open
  // checks that), so a call missing more (a prefill over many experts) goes
  // through it in chunks that fit, as SlotCache's host tier does; this
  // tier's lock is held, so none of its own calls holds host objects meanwhile.
  Status Load(uint32_t layer, std::span<const int64_t> experts, std::span<const uint32_t> target_slots,
              std::span<const uint64_t> requests) {
    const size_t chunk = std::max<size_t>(space.top_k, host->info().effective_capacity_objects);
    // One call for the host's staged prefetch: the first chunk's acquire
    // would drop what the later chunks take.
    const ChunkedHostCall one_call(*host, layer, experts.size() > chunk, requests);
    for (size_t first = 0; first < experts.size(); first += chunk) {
      const size_t n = std::min(chunk, experts.size() - first);
      K3_RETURN_IF_ERROR(LoadChunk(layer, experts.subspan(first, n), target_slots.subspan(first, n),
                                   requests.empty() ? requests : requests.subspan(first, n)));
    }
    return Status::OK();
  }

  Status LoadChunk(uint32_t layer, std::span<const int64_t> experts, std::span<const uint32_t> target_slots,
                   std::span<const uint64_t> requests) {
    const size_t top_k = space.top_k;
    std::vector<int64_t> ids;
    std::vector<uint64_t> row_requests;
    std::vector<size_t> route_of;  // missed object -> its route in the host call
    MissRows(experts, requests, top_k, &ids, &row_requests, &route_of);
    const int64_t shape[2] = {static_cast<int64_t>(ids.size() / top_k), static_cast<int64_t>(top_k)};
    std::vector<CopyJob> jobs(experts.size());  // before the host's objects are held
    auto t0 = std::chrono::steady_clock::now();
    K3_ASSIGN_OR_RETURN(Acquisition from_host, host->Acquire(layer, ids, shape, false, row_requests));
    host_seconds += SecondsSince(t0);

    for (size_t j = 0; j < jobs.size(); ++j) {
      const auto& bytes = from_host.routes[route_of[j]].bytes;
      jobs[j] = {bytes.data(), SlotAddress(target_slots[j]), bytes.size(),
                 PinnedRegistry::Get().Contains(bytes.data(), bytes.size())};
    }
    t0 = std::chrono::steady_clock::now();
    // Returns only when no copy still reads the host buffers; throws only
    // with nothing queued.
    Status copied = Status::OK();
    if (RanOutOfMemory([&] { copied = copier->CopyAll(jobs); })) copied = BareOutOfMemory();
    h2d_seconds += SecondsSince(t0);
    Status released = host->MarkUsed(from_host);
    if (!copied.ok()) return copied;
    for (const CopyJob& j : jobs) {
      h2d_bytes += j.size;
      if (j.src_pinned) h2d_pinned_bytes += j.size;
    }
    return released;
  }
};

DeviceExpertTier::DeviceExpertTier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeviceExpertTier::~DeviceExpertTier() = default;

Result<std::unique_ptr<DeviceExpertTier>> DeviceExpertTier::Open(std::shared_ptr<ExpertStore> host,
                                                                 const DeviceTierOptions& options) {
  if (!host) return Error("device expert tier needs an open expert store", ErrorKind::kValue);
  if (options.copy_workers == 0) return Error("device expert tier needs at least one copy worker");
  K3_ASSIGN_OR_RETURN(const cuda::Runtime* rt, cuda::LoadRuntime());
  auto impl = std::make_unique<Impl>();
  Impl& s = *impl;
  s.host = std::move(host);
  s.space = SpaceOf(s.host->info());
  s.options = options;

  int count = 0;
  Status st = cuda::Check(*rt, rt->GetDeviceCount(&count), "cudaGetDeviceCount");
  if (!st.ok()) return st.error().WithHint("the CUDA runtime " + rt->library + " loaded, but finds no usable GPU");
  if (options.device < 0 || options.device >= count)
    return Error("CUDA device " + std::to_string(options.device) + " does not exist: the runtime sees " +
                 std::to_string(count) + " device(s)");
  s.rt = rt;  // from here on, ~Impl releases what was created
  K3_RETURN_IF_ERROR(cuda::Check(*rt, rt->SetDevice(options.device), "cudaSetDevice"));
  (void)rt->RuntimeGetVersion(&s.runtime_version);
  (void)rt->DriverGetVersion(&s.driver_version);

  s.slot_bytes = (s.space.max_object_bytes() + kSlotAlignment - 1) / kSlotAlignment * kSlotAlignment;
  const uint64_t slot_count = std::min<uint64_t>(options.device_bytes / s.slot_bytes, 0xfffffffeull);
  // An EP rank's token never needs more than its owned experts (the host store's rank).
  const uint32_t working_set = std::min(s.space.top_k, s.host->info().owned_experts.count());
  if (slot_count < working_set)
    return Error("device budget holds " + std::to_string(slot_count) + " objects of " + std::to_string(s.slot_bytes) +
                     " bytes, fewer than one token's top_k=" + std::to_string(working_set) +
                     " working set: device_bytes=" + std::to_string(options.device_bytes),
                 ErrorKind::kMemory);
  void* base = nullptr;
  K3_RETURN_IF_ERROR(cuda::Check(*rt, rt->Malloc(&base, slot_count * s.slot_bytes),
                                 "cudaMalloc (" + std::to_string(slot_count * s.slot_bytes) + " bytes of slots)"));
  s.device_base = static_cast<uint8_t*>(base);
  K3_ASSIGN_OR_RETURN(s.copier, DeviceCopier::Open(rt, options.device, options.copy_workers, s.slot_bytes,
                                                   options.stage_pageable));
  s.slots = std::make_unique<DeviceSlots>(static_cast<uint32_t>(slot_count), s.space.num_objects());
  return std::unique_ptr<DeviceExpertTier>(new DeviceExpertTier(std::move(impl)));
}

Status DeviceExpertTier::UsePinnedHostBuffers(StoreOptions& options) {
  K3_ASSIGN_OR_RETURN(const cuda::Runtime* rt, cuda::LoadRuntime());
  options.buffer_alloc = [rt](uint64_t bytes) -> void* {
    void* p = nullptr;
    if (rt->HostAlloc(&p, bytes, 0) != 0) return nullptr;
    // The registry's entry allocates: without memory for it, the pinned
    // buffer goes back rather than leak (the read fails for want of memory).
    if (RanOutOfMemory([&] { PinnedRegistry::Get().Add(p, bytes); })) {
      rt->FreeHost(p);
      return nullptr;
    }
    return p;
  };
  options.buffer_free = [rt](void* p, uint64_t) {
    PinnedRegistry::Get().Remove(p);
    rt->FreeHost(p);
  };
  return Status::OK();
}

Result<DeviceAcquisition> DeviceExpertTier::Acquire(uint32_t layer, std::span<const int64_t> ids,
                                                    std::span<const int64_t> shape,
                                                    std::span<const uint64_t> request_ids) {
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lock(s.mu);
  // The host store's EP rank holds here too, before any slot is placed.
  const ep::Rank& rank = s.host->info().ep;
  K3_RETURN_IF_ERROR(ValidateRoute(s.space, layer, shape, ids, !rank.whole()));
  K3_RETURN_IF_ERROR(CheckOwnedRoutes(rank, s.space.num_experts, layer, ids));
  const uint32_t li = static_cast<uint32_t>(s.space.LayerIndex(layer));
  K3_RETURN_IF_ERROR(CheckRequestIds(request_ids, static_cast<uint64_t>(shape[0])));
  std::vector<ObjectId> keys;
  DistinctSorted(s.space, li, ids.data(), ids.size(), &keys);
  // Room for everything the call returns, before it holds any slot: an
  // allocation that failed after Place() left slots held (and placed
  // objects resident that were never copied) under `ulimit -v`.
  DeviceAcquisition a;
  a.layer = layer;
  a.slots.reserve(keys.size());
  a.routes.reserve(ids.size());
  std::vector<int64_t> missed_experts;
  std::vector<uint32_t> missed_slots;
  std::vector<uint64_t> missed_requests;
  missed_experts.reserve(keys.size());
  missed_slots.reserve(keys.size());
  missed_requests.reserve(keys.size());
  K3_ASSIGN_OR_RETURN(auto placed, s.slots->Place(keys));
  for (size_t i = 0; i < keys.size(); ++i) {
    a.slots.push_back(placed[i].slot);
    if (placed[i].load) {
      missed_experts.push_back(s.space.ExpertOf(keys[i]));
      missed_slots.push_back(placed[i].slot);
    }
  }
  if (!missed_experts.empty()) {
    Status st = Status::OK();
    if (RanOutOfMemory([&] {
          if (!request_ids.empty())
            FirstRowRequests(ids, static_cast<size_t>(shape[1]), request_ids,
                             std::span<const int64_t>(missed_experts), &missed_requests);
          st = s.Load(layer, missed_experts, missed_slots, missed_requests);
        })) {
      st = BareOutOfMemory();
    }
    if (!st.ok()) {
      for (uint32_t slot : missed_slots) s.slots->Forget(slot);  // never serve a slot whose copy failed
      s.slots->Release(a.slots);
      if (IsBareOutOfMemory(st.error())) return AcquireOutOfMemory("the device tier", layer);
      return st.error();
    }
  }
  if (RanOutOfMemory([&] { s.live_tickets.insert(s.next_ticket); })) {
    s.slots->Release(a.slots);  // copied and sound: they stay resident, unheld
    return AcquireOutOfMemory("the device tier", layer);
  }
  ++s.calls;
  s.routes += ids.size();
  s.misses += missed_experts.size();
  s.hits += keys.size() - missed_experts.size();

  const auto& info = s.host->info();
  const auto& offsets = info.role_offsets[li];
  const auto& sizes = info.role_bytes[li];
  for (int64_t e : ids) {
    const size_t k = static_cast<size_t>(
        std::lower_bound(keys.begin(), keys.end(), s.space.Id(li, static_cast<uint32_t>(e))) - keys.begin());
    const uint8_t* base = s.SlotAddress(a.slots[k]);
    DeviceExpertView v;
    v.layer = layer;
    v.expert = static_cast<uint32_t>(e);
    v.bytes = {base, s.space.object_bytes[li]};
    v.up = {base + offsets[0], sizes[0]};
    v.gate = {base + offsets[1], sizes[1]};
    v.down = {base + offsets[2], sizes[2]};
    a.routes.push_back(v);
  }
  a.ticket = s.next_ticket++;  // in live_tickets already
  a.tier = this;
  return a;
}

Status DeviceExpertTier::Release(DeviceAcquisition& a) {
  if (a.ticket == 0) return Status::OK();
  std::lock_guard<std::mutex> lock(impl_->mu);
  // Another tier's slot numbers would release slots here that other calls hold.
  if (a.tier != this)
    return Error("this DeviceAcquisition belongs to another DeviceExpertTier: release it through the tier that "
                 "acquired it");
  const bool live = impl_->live_tickets.erase(a.ticket) != 0;
  a.ticket = 0;
  if (live) impl_->slots->Release(a.slots);
  return Status::OK();
}

Status DeviceExpertTier::CopyToHost(const DeviceSpan& src, std::span<uint8_t> dst) const {
  const Impl& s = *impl_;
  const auto* p = static_cast<const uint8_t*>(src.data);
  const uint8_t* end = s.device_base + uint64_t{s.slots->slot_count()} * s.slot_bytes;
  if (p < s.device_base || p > end || dst.size() > src.size || dst.size() > static_cast<uint64_t>(end - p))
    return Error("CopyToHost: the span is not inside this tier's device slots");
  return cuda::Check(*s.rt, s.rt->Memcpy(dst.data(), p, dst.size(), cuda::kDeviceToHost),
                     "cudaMemcpy (device to host)");
}

nlohmann::json DeviceExpertTier::Snapshot() const {
  const Impl& s = *impl_;
  std::lock_guard<std::mutex> lock(s.mu);
  return {
      {"runtime_library", s.rt->library},
      {"runtime_version", s.runtime_version},
      {"driver_version", s.driver_version},
      {"device", s.options.device},
      {"slots", s.slots->slot_count()},
      {"slot_bytes", s.slot_bytes},
      {"copy_workers", s.copier->workers()},
      {"stage_pageable", s.copier->stages_pageable()},
      {"held_slots", s.slots->held()},
      {"resident_objects", s.slots->resident()},
      {"calls", s.calls},
      {"routes", s.routes},
      {"hits", s.hits},
      {"misses", s.misses},
      {"evictions", s.slots->evictions()},
      {"h2d_bytes", s.h2d_bytes},
      {"h2d_pinned_bytes", s.h2d_pinned_bytes},
      {"h2d_seconds", s.h2d_seconds},
      {"host_acquire_seconds", s.host_seconds},
  };
}

}  // namespace k3pack::store
