// bench_device_tier: the optional GPU tier against raw CUDA copies measured
// in the same run, on Kimi-K3-sized objects (11,956,224 bytes):
//   1. cold fill: every route misses the device (the host store already holds
//      the objects), vs the raw DMA of the same bytes from one pinned buffer;
//      staged through pinned buffers by 1, 4 and 8 workers, handed to the
//      driver as pageable memory, and straight from pinned host-store buffers;
//   2. hot calls: one decode step (top-16) that hits entirely on the device.
// Without a GPU it prints why and exits 0 (the tier is optional).
// usage: bench_device_tier [objects (default 64)]
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "bench_args.h"
#include "k3pack/device_tier.h"
#include "k3pack/store.h"
#include "store/cuda_runtime.h"
#include "store/synthetic_pack.h"

using namespace k3pack;
using namespace k3pack::store;
using Clock = std::chrono::steady_clock;

namespace {

constexpr uint64_t kRole = 3985408;  // Kimi-K3's routed role bytes: 3 x 3,985,408 = 11,956,224
constexpr uint32_t kTopK = 16;

double Seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The floor: DMA of the same bytes from one pinned buffer into device memory.
double RawPinnedCopy(const cuda::Runtime& rt, uint64_t objects, uint64_t bytes) {
  void *host = nullptr, *dev = nullptr;
  cuda::Stream stream = nullptr;
  double best = 1e30;
  if (rt.HostAlloc(&host, bytes, 0) == 0 && rt.Malloc(&dev, objects * bytes) == 0 && rt.StreamCreate(&stream) == 0) {
    for (int rep = 0; rep < 3; ++rep) {
      auto t0 = Clock::now();
      for (uint64_t i = 0; i < objects; ++i)
        rt.MemcpyAsync(static_cast<uint8_t*>(dev) + i * bytes, host, bytes, cuda::kHostToDevice, stream);
      rt.StreamSynchronize(stream);
      best = std::min(best, Seconds(t0));
    }
  }
  if (stream) rt.StreamDestroy(stream);
  if (dev) rt.Free(dev);
  if (host) rt.FreeHost(host);
  return best;
}

// Fills a fresh tier with every object (calls of one decode step each); best of 3.
double ColdFill(const std::shared_ptr<ExpertStore>& host, uint64_t objects, uint32_t workers, bool stage,
                std::string* error) {
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    DeviceTierOptions o;
    o.device_bytes = (objects + 1) * 3 * kRole + (objects + 1) * 256;
    o.copy_workers = workers;
    o.stage_pageable = stage;
    auto tier = DeviceExpertTier::Open(host, o);
    if (!tier.ok()) {
      *error = tier.error().message();
      return -1;
    }
    auto t0 = Clock::now();
    for (uint64_t first = 0; first < objects; first += kTopK) {
      std::vector<int64_t> ids;
      for (uint64_t e = first; e < first + kTopK; ++e) ids.push_back(static_cast<int64_t>(e % objects));
      const int64_t shape[2] = {1, kTopK};
      auto a = (*tier)->Acquire(1, ids, shape);
      if (!a.ok()) {
        *error = a.error().message();
        return -1;
      }
      (void)(*tier)->Release(*a);
    }
    best = std::min(best, Seconds(t0));
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const char* usage = "bench_device_tier [objects (default 64, a multiple of 16)]";
  bench::ExitOnHelp(argc, argv, usage);
  if (argc > 2) bench::ExitUsage(usage);
  const uint64_t objects = argc > 1 ? bench::PositiveArg(argv[1], usage) : 64;
  if (objects < kTopK || objects % kTopK != 0) {
    std::fprintf(stderr, "objects must be a positive multiple of %u\n", kTopK);
    return 2;
  }
  auto rt = cuda::LoadRuntime();
  if (!rt.ok()) {
    std::printf("bench_device_tier: no GPU tier here (optional): %s\n", rt.error().message().c_str());
    return 0;
  }
  testing::TinySpec spec;
  spec.layers = {1};
  spec.num_hidden_layers = 2;
  spec.experts = static_cast<uint32_t>(objects);
  spec.top_k = kTopK;
  spec.role_bytes = {{kRole, kRole, kRole}};
  testing::TinyPack pack(spec, "device-bench");
  // Two host stores over the same pack: pageable buffers and pinned ones
  // (the second only once a tier opens, i.e. a GPU is there).
  std::shared_ptr<ExpertStore> hosts[2];
  for (int pinned = 0; pinned < 2; ++pinned) {
    if (pinned) {
      auto probe = DeviceExpertTier::Open(hosts[0]);
      if (!probe.ok()) {
        std::printf("bench_device_tier: no GPU tier here (optional): %s\n", probe.error().message().c_str());
        return 0;
      }
    }
    StoreOptions so;
    so.cache_bytes = (objects + 1) * 3 * kRole;
    if (pinned && !DeviceExpertTier::UsePinnedHostBuffers(so).ok()) return 1;
    auto host = ExpertStore::Open(pack.pack, pack.manifest, so);
    if (!host.ok()) return std::fprintf(stderr, "%s\n", host.error().message().c_str()), 1;
    // The host store holds every object, so the tier's timings are its own.
    std::vector<int64_t> all;
    for (uint64_t e = 0; e < objects; ++e) all.push_back(static_cast<int64_t>(e));
    const int64_t shape[2] = {static_cast<int64_t>(objects / kTopK), kTopK};
    auto a = (*host)->Acquire(1, all, shape);
    if (!a.ok()) return std::fprintf(stderr, "%s\n", a.error().message().c_str()), 1;
    (void)(*host)->MarkUsed(*a);
    hosts[pinned] = *host;
  }
  const uint64_t obj = 3 * kRole, total = objects * obj;
  const double gb = double(total) / 1e9;
  std::string error;
  struct Mode {
    const char* name;
    int pinned_host;
    uint32_t workers;
    bool stage;
  } modes[] = {{"staged, 1 worker", 0, 1, true},           {"staged, 4 workers", 0, 4, true},
               {"staged, 8 workers", 0, 8, true},          {"pageable to driver, 4 workers", 0, 4, false},
               {"pinned host store, 1 worker", 1, 1, true}, {"pinned host store, 4 workers", 1, 4, true}};
  const double raw = RawPinnedCopy(**rt, objects, obj);
  std::printf("cold fill of %llu objects x %llu bytes (%.2f GB), host store warm, best of 3:\n",
              static_cast<unsigned long long>(objects), static_cast<unsigned long long>(obj), gb);
  std::printf("  %-32s %8.2f GB/s\n", "raw pinned DMA (baseline)", gb / raw);
  for (const Mode& m : modes) {
    const double t = ColdFill(hosts[m.pinned_host], objects, m.workers, m.stage, &error);
    if (t < 0) {
      std::printf("bench_device_tier: no GPU tier here (optional): %s\n", error.c_str());
      return 0;
    }
    std::printf("  tier, %-26s %8.2f GB/s  %.2fx of raw\n", m.name, gb / t, raw / t);
  }
  auto host = hosts[0];
  DeviceTierOptions o;
  o.device_bytes = (objects + 1) * (obj + 256);
  auto tier = DeviceExpertTier::Open(host, o);
  if (!tier.ok()) return std::fprintf(stderr, "%s\n", tier.error().message().c_str()), 1;
  std::vector<int64_t> step;
  for (uint32_t e = 0; e < kTopK; ++e) step.push_back(e);
  const int64_t shape[2] = {1, kTopK};
  for (int warm = 0; warm < 2; ++warm) {
    auto a = (*tier)->Acquire(1, step, shape);
    if (!a.ok()) return std::fprintf(stderr, "%s\n", a.error().message().c_str()), 1;
    (void)(*tier)->Release(*a);
  }
  const int calls = 10000;
  auto t0 = Clock::now();
  for (int i = 0; i < calls; ++i) {
    auto a = (*tier)->Acquire(1, step, shape);
    (void)(*tier)->Release(*a);
  }
  std::printf("hot decode step (top-%u, all on device): %.2f us per acquire+release\n", kTopK,
              Seconds(t0) / calls * 1e6);
  std::printf("%s\n", (*tier)->Snapshot().dump().c_str());
  return 0;
}
