// The optional GPU tier. Every test runs twice: on the real CUDA runtime
// (skipped where there is no GPU) and on a host-memory emulation of it
// (tests/store/emulated_cuda.h), so the tier's logic is checked on every
// machine and under the sanitizers. Device bytes are read back and compared
// with the pack's; hits, misses and evictions must add up; held objects
// survive pressure; budgets are enforced; a failed copy is reported and
// its slot is never served.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>
#include <optional>
#include <random>
#include <set>

#include "../forked_child.h"
#include "emulated_cuda.h"
#include "k3pack/device_tier.h"
#include "k3pack/store.h"
#include "store/synthetic_pack.h"

namespace k3pack::store {
namespace {

using testing::EmulatedCuda;
using testing::PatternByte;
using testing::ScopedEmulatedCuda;
using testing::TinyPack;
using testing::TinySpec;

std::shared_ptr<ExpertStore> Host(const TinyPack& p, bool pinned = false) {
  StoreOptions o;
  o.cache_bytes = 6 * 12288;
  if (pinned && !DeviceExpertTier::UsePinnedHostBuffers(o).ok()) return nullptr;
  auto s = ExpertStore::Open(p.pack, p.manifest, o);
  EXPECT_TRUE(s.ok()) << s.error().message();
  return s.ok() ? *s : nullptr;
}

Result<std::unique_ptr<DeviceExpertTier>> Tier(std::shared_ptr<ExpertStore> host, uint64_t slots,
                                                bool stage_pageable = true) {
  DeviceTierOptions o;
  o.device_bytes = slots * 12288;
  o.copy_workers = 3;
  o.stage_pageable = stage_pageable;
  return DeviceExpertTier::Open(std::move(host), o);
}

#define OPEN_TIER_OR_SKIP(var, ...)                                                     \
  auto var##_r = Tier(__VA_ARGS__);                                                     \
  if (!var##_r.ok()) GTEST_SKIP() << "no GPU tier here: " << var##_r.error().message(); \
  auto& var = *var##_r

void ExpectDeviceBytes(const DeviceExpertTier& t, const DeviceExpertView& v) {
  const DeviceSpan roles[3] = {v.up, v.gate, v.down};
  for (uint32_t r = 0; r < 3; ++r) {
    std::vector<uint8_t> back(roles[r].size);
    ASSERT_TRUE(t.CopyToHost(roles[r], back).ok());
    for (uint64_t i = 0; i < back.size(); ++i)
      ASSERT_EQ(back[i], PatternByte(v.layer, v.expert, r, i)) << v.layer << "/" << v.expert << " role " << r << " byte " << i;
  }
}

const int64_t kOneToken[2] = {1, 2};

Result<DeviceAcquisition> Get(DeviceExpertTier& t, uint32_t layer, std::vector<int64_t> ids) {
  const int64_t shape[2] = {static_cast<int64_t>(ids.size() / 2), 2};
  return t.Acquire(layer, ids, shape);
}

TEST(DeviceTier, OpenWithoutGpuSaysWhy) {
  TinyPack p(TinySpec{});
  auto t = Tier(Host(p), 4);
  if (t.ok()) GTEST_SKIP() << "a GPU is present: covered by the other DeviceTier tests";
  const std::string m = t.error().message();
  const bool no_runtime = m.find("no CUDA runtime could be loaded") != std::string::npos &&
                          m.find("libcudart.so") != std::string::npos && m.find("K3PACK_CUDART") != std::string::npos;
  const bool no_device = m.find("CUDA error in cudaGetDeviceCount") != std::string::npos ||
                         m.find("does not exist") != std::string::npos;
  EXPECT_TRUE(no_runtime || no_device) << m;
}

// Parameter: the runtime ("real" GPU or "emulated").
class DeviceTierOn : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "emulated") emulation_.emplace();
  }
  std::optional<ScopedEmulatedCuda> emulation_;
};

std::string RuntimeName(const ::testing::TestParamInfo<std::string>& info) { return info.param; }

// Staged copies, driver-staged pageable copies, zero-copy from pinned host buffers.
void RunRandomRoutes(int mode) {
  TinyPack p(TinySpec{});  // layers 1, 2; 8 experts; top-2; 12 KiB objects
  auto host = Host(p, /*pinned=*/mode == 2);
  if (!host) GTEST_SKIP() << "no CUDA runtime for pinned host buffers";
  OPEN_TIER_OR_SKIP(t, host, 5, /*stage_pageable=*/mode == 0);
  std::mt19937 rng(7 + mode);
  uint64_t distinct_total = 0;
  for (int call = 0; call < 60; ++call) {
    const uint32_t layer = 1 + rng() % 2;
    std::vector<int64_t> ids(static_cast<size_t>(2 * (1 + rng() % 2)));
    for (auto& e : ids) e = rng() % 8;
    auto a = Get(*t, layer, ids);
    ASSERT_TRUE(a.ok()) << a.error().message();
    ASSERT_EQ(a->routes.size(), ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      ASSERT_EQ(a->routes[i].expert, ids[i]);
      ASSERT_EQ(a->routes[i].bytes.size, 12288u);
      ASSERT_EQ(a->routes[i].up.data, a->routes[i].bytes.data);
      ExpectDeviceBytes(*t, a->routes[i]);
    }
    distinct_total += std::set<int64_t>(ids.begin(), ids.end()).size();
    ASSERT_TRUE(t->Release(*a).ok());
  }
  const auto j = t->Snapshot();
  EXPECT_EQ(j["hits"].get<uint64_t>() + j["misses"].get<uint64_t>(), distinct_total);
  EXPECT_EQ(j["h2d_bytes"].get<uint64_t>(), j["misses"].get<uint64_t>() * 12288);
  EXPECT_EQ(j["misses"].get<uint64_t>(), j["evictions"].get<uint64_t>() + j["resident_objects"].get<uint64_t>());
  EXPECT_GT(j["hits"].get<uint64_t>(), 0u);
  EXPECT_GT(j["evictions"].get<uint64_t>(), 0u);
  EXPECT_EQ(j["h2d_pinned_bytes"].get<uint64_t>(), mode == 2 ? j["h2d_bytes"].get<uint64_t>() : 0u);
}

TEST_P(DeviceTierOn, StagedCopiesMatchPackBytesAndCountsAddUp) { RunRandomRoutes(0); }
TEST_P(DeviceTierOn, DriverStagedCopiesMatchPackBytesAndCountsAddUp) { RunRandomRoutes(1); }
TEST_P(DeviceTierOn, PinnedHostBuffersAreCopiedWithoutStaging) { RunRandomRoutes(2); }

TEST_P(DeviceTierOn, HeldObjectsSurvivePressureAndBudgetIsEnforced) {
  TinyPack p(TinySpec{});
  OPEN_TIER_OR_SKIP(t, Host(p), 4);
  auto held = Get(*t, 1, {3, 4});
  ASSERT_TRUE(held.ok()) << held.error().message();
  for (std::vector<int64_t> ids : {std::vector<int64_t>{0, 1}, {2, 6}, {7, 5}, {0, 2}}) {  // churn the two free slots
    auto a = Get(*t, 2, ids);
    ASSERT_TRUE(a.ok()) << a.error().message();
    ASSERT_TRUE(t->Release(*a).ok());
  }
  EXPECT_GT(t->Snapshot()["evictions"].get<uint64_t>(), 0u);
  for (const auto& v : held->routes) ExpectDeviceBytes(*t, v);
  auto refused = Get(*t, 1, {0, 1, 2, 5, 6, 7});  // 6 distinct objects, 2 slots free
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message().find("cannot hold this call's working set"), std::string::npos);
  for (const auto& v : held->routes) ExpectDeviceBytes(*t, v);
  ASSERT_TRUE(t->Release(*held).ok());
  ASSERT_TRUE(t->Release(*held).ok());  // idempotent
  EXPECT_TRUE(Get(*t, 1, {0, 1, 2, 5}).ok()) << "released slots are free again";
}

TEST_P(DeviceTierOn, RouteErrorsAreTheHostStoresAndTooSmallBudgetIsRefused) {
  TinyPack p(TinySpec{});
  auto host = Host(p);
  auto small = Tier(host, 1);
  if (!small.ok() && small.error().message().find("fewer than one token's top_k") == std::string::npos)
    GTEST_SKIP() << "no GPU tier here: " << small.error().message();
  ASSERT_FALSE(small.ok());
  OPEN_TIER_OR_SKIP(t, host, 4);
  auto a = Get(*t, 1, {0, 8});
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.error().message(), "route contains an out-of-range expert id");
  auto b = Get(*t, 0, {0, 1});
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.error().message(), "layer 0 is not an active routed MoE layer");
  std::vector<int64_t> three{0, 1, 2};
  auto c = t->Acquire(1, three, std::vector<int64_t>{1, 3});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().message(), "runtime top-k must be exactly 2; received shape (1, 3)");
  std::vector<uint8_t> out(16);
  EXPECT_FALSE(t->CopyToHost(DeviceSpan{out.data(), out.size()}, out).ok()) << "host memory is not a device slot";
}

INSTANTIATE_TEST_SUITE_P(Runtimes, DeviceTierOn, ::testing::Values("real", "emulated"), RuntimeName);

// Emulation only: faults and resource accounting a real GPU cannot be made to show on demand.
TEST(DeviceTierEmulated, FailedCopyIsReportedAndItsSlotNeverServed) {
  ScopedEmulatedCuda emulation;
  TinyPack p(TinySpec{});
  auto host = Host(p);
  auto t = Tier(host, 4);
  ASSERT_TRUE(t.ok()) << t.error().message();
  EmulatedCuda::fail_h2d_copy = EmulatedCuda::h2d_copies.load() + 1;  // the second copy of the next call
  auto a = Get(**t, 1, {2, 5});
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.error().message().find("CUDA error in cudaMemcpyAsync"), std::string::npos) << a.error().message();
  EXPECT_NE(a.error().message().find("illegal memory access"), std::string::npos) << a.error().message();
  auto j = (*t)->Snapshot();
  EXPECT_EQ(j["resident_objects"].get<uint64_t>(), 0u) << "neither object of the failed call may stay resident";
  EXPECT_EQ(j["held_slots"].get<uint64_t>(), 0u);
  EXPECT_EQ(j["calls"].get<uint64_t>(), 0u);
  auto again = Get(**t, 1, {2, 5});
  ASSERT_TRUE(again.ok()) << again.error().message();
  for (const auto& v : again->routes) ExpectDeviceBytes(**t, v);
  EXPECT_EQ((*t)->Snapshot()["misses"].get<uint64_t>(), 2u) << "both objects are copied again";
  EXPECT_TRUE(host->Snapshot().is_object());
}

TEST(DeviceTierEmulated, ReleasesEveryDeviceResourceAndRefusesAMissingDevice) {
  ScopedEmulatedCuda emulation;
  const int device0 = EmulatedCuda::live_device, pinned0 = EmulatedCuda::live_pinned;
  const int streams0 = EmulatedCuda::live_streams, events0 = EmulatedCuda::live_events;
  {
    TinyPack p(TinySpec{});
    StoreOptions o;
    o.cache_bytes = 6 * 12288;
    ASSERT_TRUE(DeviceExpertTier::UsePinnedHostBuffers(o).ok());
    auto host = ExpertStore::Open(p.pack, p.manifest, o);
    ASSERT_TRUE(host.ok());
    auto t = Tier(*host, 4);
    ASSERT_TRUE(t.ok()) << t.error().message();
    auto a = Get(**t, 2, {1, 6});
    ASSERT_TRUE(a.ok()) << a.error().message();
    EXPECT_GT(EmulatedCuda::live_pinned.load(), pinned0);
    EXPECT_GT(EmulatedCuda::live_streams.load(), streams0);
    DeviceTierOptions bad;
    bad.device = 3;
    auto missing = DeviceExpertTier::Open(*host, bad);
    ASSERT_FALSE(missing.ok());
    EXPECT_EQ(missing.error().message(), "CUDA device 3 does not exist: the runtime sees 1 device(s)");
  }
  EXPECT_EQ(EmulatedCuda::live_device.load(), device0);
  EXPECT_EQ(EmulatedCuda::live_pinned.load(), pinned0);
  EXPECT_EQ(EmulatedCuda::live_streams.load(), streams0);
  EXPECT_EQ(EmulatedCuda::live_events.load(), events0);
}

// In the TSan stage (StoreConcurrency.*): callers on four threads, copy
// workers on three more, every byte checked after each acquire.
TEST(StoreConcurrency, DeviceTierAcquiresFromFourThreads) {
  ScopedEmulatedCuda emulation;
  TinyPack p(TinySpec{});
  auto host = Host(p, /*pinned=*/false);
  auto t = Tier(host, 12);
  ASSERT_TRUE(t.ok()) << t.error().message();
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int th = 0; th < 4; ++th) {
    threads.emplace_back([&, th] {
      std::mt19937 rng(100 + th);
      for (int call = 0; call < 40; ++call) {
        auto a = Get(**t, 1 + rng() % 2, {int64_t(rng() % 8), int64_t(rng() % 8)});
        if (!a.ok()) {
          ++failures;
          continue;
        }
        for (const auto& v : a->routes) {
          std::vector<uint8_t> back(v.down.size);
          if (!(*t)->CopyToHost(v.down, back).ok()) ++failures;
          for (uint64_t i = 0; i < back.size(); i += 61)
            if (back[i] != PatternByte(v.layer, v.expert, 2, i)) ++failures;
        }
        if (!(*t)->Release(*a).ok()) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ((*t)->Snapshot()["calls"].get<uint64_t>(), 160u);
}

// A call's device misses went to the host store in one acquire: a call
// missing more objects than the host store holds (a prefill over many
// experts) failed with "expert cache cannot evict the active top-k working
// set" although the device slots had room. They now go through the host
// store in chunks it holds, as SlotCache's host tier does; with request ids
// too (each chunk keeps a row per request).
TEST(DeviceTierEmulated, MissesBeyondTheHostStoreGoThroughItInChunks) {
  ScopedEmulatedCuda emulation;
  TinyPack p(TinySpec{});
  auto host = Host(p);  // holds 6 objects
  auto t = Tier(host, 8);
  ASSERT_TRUE(t.ok()) << t.error().message();
  const std::vector<int64_t> ids = {0, 1, 2, 3, 4, 5, 6, 7};  // 4 tokens, 8 distinct experts
  const int64_t shape[2] = {4, 2};
  const std::vector<uint64_t> none, per_row = {40, 41, 40, 42};
  for (uint32_t layer : {1u, 2u}) {
    SCOPED_TRACE(layer);
    auto a = (*t)->Acquire(layer, ids, shape, layer == 1 ? none : per_row);
    ASSERT_TRUE(a.ok()) << a.error().message();
    ASSERT_EQ(a->routes.size(), ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      ASSERT_EQ(a->routes[i].expert, ids[i]);
      ExpectDeviceBytes(**t, a->routes[i]);
    }
    ASSERT_TRUE((*t)->Release(*a).ok());
  }
  const auto j = (*t)->Snapshot();
  EXPECT_EQ(j["misses"].get<uint64_t>(), 16u);
  EXPECT_EQ(j["h2d_bytes"].get<uint64_t>(), 16u * 12288);
  EXPECT_EQ(host->Snapshot()["cache_misses"].get<uint64_t>(), 16u);
}

// DeviceCopier::Open let std::thread's exception out of a Result function
// when the process could not start a copy worker (a pids or address-space
// limit): DeviceExpertTier::Open threw std::system_error. Now the copies
// run on the workers that did start.
TEST(DeviceTierEmulated, CopiesRunOnTheWorkersTheProcessGives) {
#ifdef K3_TEST_UNDER_SANITIZER
  GTEST_SKIP() << "an address-space limit under a sanitizer runtime";
#endif
  ScopedEmulatedCuda emulation;
  TinyPack p(TinySpec{});
  int rc = k3test::InForkedChild([&] {
    ::alarm(60);
    auto host = Host(p);
    if (!host) ::_exit(2);
    // 256 MiB more address space: 1024 thread stacks (8 MiB each) do not fit.
    if (!k3test::LimitAddressSpaceGrowth(uint64_t{256} << 20)) ::_exit(4);
    DeviceTierOptions o;
    o.device_bytes = 4 * 12288;
    o.copy_workers = 1024;
    auto t = DeviceExpertTier::Open(host, o);
    if (!t.ok()) {
      std::fprintf(stderr, "%s\n", t.error().message().c_str());
      ::_exit(5);
    }
    const uint64_t workers = (*t)->Snapshot()["copy_workers"].get<uint64_t>();
    if (workers == 1024) ::_exit(7);  // the limit did not bite: nothing shown
    if (workers == 0) ::_exit(6);
    auto a = Get(**t, 1, {2, 5});
    if (!a.ok()) ::_exit(8);
    for (const auto& v : a->routes) {
      std::vector<uint8_t> back(v.down.size);
      if (!(*t)->CopyToHost(v.down, back).ok() || back[100] != PatternByte(1, v.expert, 2, 100)) ::_exit(9);
    }
    ::_exit(0);
  });
  if (rc == 7) GTEST_SKIP() << "1024 threads fit under the address-space limit here";
  EXPECT_EQ(rc, 0) << "child exit code (134: aborted; 5: an error; 8-9: the copy)";
}

TEST(DeviceTierEmulated, StoreRefusesHalfAnAllocator) {
  TinyPack p(TinySpec{});
  StoreOptions o;
  o.buffer_alloc = [](uint64_t) -> void* { return nullptr; };
  auto s = ExpertStore::Open(p.pack, p.manifest, o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message().find("buffer_alloc and buffer_free must be set together"), std::string::npos);
}

}  // namespace
}  // namespace k3pack::store
