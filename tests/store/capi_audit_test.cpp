// Faults a C++ integrator's audit of the public store headers found
// (docs/RELIABILITY.md, "Faults from a C++ integrator's audit (session 15)"):
// a routing shape whose row count times top-k wraps around, and copies of an
// acquisition released twice.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "emulated_cuda.h"
#include "k3pack/device_tier.h"
#include "k3pack/store.h"
#include "open_ok.h"
#include "store/synthetic_pack.h"

namespace k3pack::store {
namespace {

using testing::OpenOk;
using testing::ScopedEmulatedCuda;
using testing::TinyPack;
using testing::TinySpec;

// 2^62 rows of top-k 4 is 2^64 routes: the old check multiplied, which is
// signed overflow (UB), and here wraps to 0 == the empty id list, so the
// call was accepted as 2^62 tokens (counted in the stats, taken as prefill).
TEST(CppIntegratorAudit, HugeRowCountIsRefusedNotWrapped) {
  TinySpec spec;
  spec.top_k = 4;
  TinyPack p(spec);
  auto s = OpenOk(p, testing::SmallStore());
  ASSERT_TRUE(s);
  const int64_t huge[2] = {int64_t{1} << 62, 4};
  auto r = s->Acquire(1, {}, huge);
  ASSERT_FALSE(r.ok()) << "a 2^62-row call with no ids was accepted";
  EXPECT_EQ(r.error().message(), "route id count 0 does not match shape (4611686018427387904, 4)");
  EXPECT_EQ(s->Snapshot()["route_tokens_by_layer"][1].get<uint64_t>(), 0u);
  // Negative rows are refused too; a consistent empty call still works.
  const int64_t negative[2] = {-1, 4};
  EXPECT_FALSE(s->Acquire(1, {}, negative).ok());
  const int64_t empty[2] = {0, 4};
  auto none = s->Acquire(1, {}, empty);
  ASSERT_TRUE(none.ok()) << none.error().message();
  EXPECT_TRUE(s->MarkUsed(*none).ok());

  // The GPU tier validates routes with the same rule.
  ScopedEmulatedCuda emulation;
  DeviceTierOptions o;
  o.device_bytes = 4 * 12288;
  o.copy_workers = 1;
  auto tier = DeviceExpertTier::Open(s, o);
  ASSERT_TRUE(tier.ok()) << tier.error().message();
  auto d = (*tier)->Acquire(1, {}, huge);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ((*tier)->Snapshot()["calls"].get<uint64_t>(), 0u);
}

// Acquisition is a copyable struct. Releasing a copy of an acquisition
// already released unpinned its objects a second time, dropping the pins of
// another call still holding them (their objects were evicted under it), and
// wrapped the store's count of active acquisitions.
TEST(CppIntegratorAudit, ReleasingACopyOfAReleasedAcquisitionKeepsOtherCallsPins) {
  TinyPack p(TinySpec{});
  StoreOptions o;
  o.cache_bytes = 4 * 3 * 4096;  // four objects
  o.policy = "lru";
  auto s = OpenOk(p, o);
  ASSERT_TRUE(s);
  const std::vector<int64_t> first = {0, 1};
  auto a = s->AcquireToken(1, first);
  ASSERT_TRUE(a.ok()) << a.error().message();
  Acquisition copy = *a;
  auto held = s->AcquireToken(1, first);  // another call holding the same objects
  ASSERT_TRUE(held.ok()) << held.error().message();
  ASSERT_TRUE(s->MarkUsed(*a).ok());
  ASSERT_TRUE(s->MarkUsed(copy).ok()) << "releasing a copy stays a no-op";
  EXPECT_EQ(copy.ticket, 0u);
  // Two calls that need room: only experts 2 and 3 may be evicted for 4, 5.
  for (const std::vector<int64_t>& ids : {std::vector<int64_t>{2, 3}, std::vector<int64_t>{4, 5}}) {
    auto r = s->AcquireToken(1, ids);
    ASSERT_TRUE(r.ok()) << r.error().message();
    ASSERT_TRUE(s->MarkUsed(*r).ok());
  }
  const uint64_t hits = s->Snapshot()["cache_hits"].get<uint64_t>();
  auto again = s->AcquireToken(1, first);
  ASSERT_TRUE(again.ok()) << again.error().message();
  EXPECT_EQ(s->Snapshot()["cache_hits"].get<uint64_t>(), hits + 2) << "the held call's objects were evicted";
  ASSERT_TRUE(s->MarkUsed(*again).ok());
  ASSERT_TRUE(s->MarkUsed(*held).ok());
}

// The same for the GPU tier: a copy of a released DeviceAcquisition dropped
// the holds of another call on its slots, so the next call could overwrite
// a slot that call was still reading; and another tier's acquisition
// released slots here by number.
TEST(CppIntegratorAudit, ReleasingACopyOfADeviceAcquisitionKeepsOtherCallsSlots) {
  ScopedEmulatedCuda emulation;
  TinyPack p(TinySpec{});
  StoreOptions so;
  so.cache_bytes = 6 * 12288;
  auto host = OpenOk(p, so);
  ASSERT_TRUE(host);
  DeviceTierOptions o;
  o.device_bytes = 2 * 12288;  // two slots: one call's working set
  o.copy_workers = 1;
  auto t = DeviceExpertTier::Open(host, o);
  ASSERT_TRUE(t.ok()) << t.error().message();
  auto other = DeviceExpertTier::Open(host, o);
  ASSERT_TRUE(other.ok()) << other.error().message();
  const int64_t shape[2] = {1, 2};
  const std::vector<int64_t> first = {0, 1};
  auto a = (*t)->Acquire(1, first, shape);
  ASSERT_TRUE(a.ok()) << a.error().message();
  DeviceAcquisition copy = *a;
  auto held = (*t)->Acquire(1, first, shape);
  ASSERT_TRUE(held.ok()) << held.error().message();
  auto foreign = (*other)->Acquire(1, first, shape);
  ASSERT_TRUE(foreign.ok()) << foreign.error().message();
  EXPECT_FALSE((*t)->Release(*foreign).ok()) << "another tier's acquisition was taken";
  ASSERT_TRUE((*t)->Release(*a).ok());
  ASSERT_TRUE((*t)->Release(copy).ok());
  EXPECT_EQ((*t)->Snapshot()["held_slots"].get<uint64_t>(), 2u) << "the held call lost its slots";
  const std::vector<int64_t> next = {2, 3};
  EXPECT_FALSE((*t)->Acquire(1, next, shape).ok()) << "a held slot was handed to another call";
  ASSERT_TRUE((*t)->Release(*held).ok());
  auto after = (*t)->Acquire(1, next, shape);
  EXPECT_TRUE(after.ok()) << after.error().message();
  ASSERT_TRUE((*other)->Release(*foreign).ok());
}

}  // namespace
}  // namespace k3pack::store
