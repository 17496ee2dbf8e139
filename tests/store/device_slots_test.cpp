// The device tier's slot map (CPU only): LRU among unheld slots, holds
// protect a call's objects, refusals change nothing, failed copies are forgotten.
#include <gtest/gtest.h>

#include <vector>

#include "store/device_slots.h"

namespace k3pack::store {
namespace {

std::vector<DeviceSlots::Placement> PlaceOk(DeviceSlots& d, std::vector<ObjectId> keys) {
  auto r = d.Place(keys);
  EXPECT_TRUE(r.ok()) << r.error().message();
  return r.ok() ? *r : std::vector<DeviceSlots::Placement>{};
}

std::vector<uint32_t> SlotsOf(const std::vector<DeviceSlots::Placement>& p) {
  std::vector<uint32_t> s;
  for (const auto& x : p) s.push_back(x.slot);
  return s;
}

TEST(DeviceSlots, MissesLoadHitsDoNot) {
  DeviceSlots d(4, 16);
  auto a = PlaceOk(d, {10, 11});
  ASSERT_EQ(a.size(), 2u);
  EXPECT_TRUE(a[0].load && a[1].load);
  EXPECT_NE(a[0].slot, a[1].slot);
  d.Release(SlotsOf(a));
  auto b = PlaceOk(d, {11, 12});
  EXPECT_FALSE(b[0].load);
  EXPECT_EQ(b[0].slot, a[1].slot);
  EXPECT_TRUE(b[1].load);
  EXPECT_EQ(d.resident(), 3u);
  EXPECT_EQ(d.evictions(), 0u);
}

TEST(DeviceSlots, EvictsLeastRecentlyReleased) {
  DeviceSlots d(3, 16);
  for (ObjectId k : {1, 2, 3}) d.Release(SlotsOf(PlaceOk(d, {k})));
  d.Release(SlotsOf(PlaceOk(d, {1})));  // 1 becomes most recent: 2 is now the oldest
  auto p = PlaceOk(d, {4});
  ASSERT_TRUE(p[0].load);
  EXPECT_EQ(d.evictions(), 1u);
  d.Release(SlotsOf(p));
  EXPECT_FALSE(PlaceOk(d, {1})[0].load);
  EXPECT_FALSE(PlaceOk(d, {3})[0].load);
  EXPECT_TRUE(PlaceOk(d, {2})[0].load) << "key 2 should have been the one evicted";
}

TEST(DeviceSlots, HeldSlotsAreNeverTakenAndRefusalChangesNothing) {
  DeviceSlots d(3, 16);
  auto held = PlaceOk(d, {1, 2});  // not released
  d.Release(SlotsOf(PlaceOk(d, {3})));
  auto r = d.Place(std::vector<ObjectId>{4, 5});  // needs 2 free slots, 1 is free
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("cannot hold this call's working set"), std::string::npos) << r.error().message();
  EXPECT_EQ(d.resident(), 3u);
  EXPECT_EQ(d.held(), 2u);
  EXPECT_EQ(d.evictions(), 0u);
  // A hit on a free slot counts against the room for misses.
  EXPECT_FALSE(d.Place(std::vector<ObjectId>{3, 6}).ok());
  auto ok = PlaceOk(d, {6});
  EXPECT_TRUE(ok[0].load);
  EXPECT_EQ(d.KeyOf(ok[0].slot), 6u);
  for (const auto& h : held) EXPECT_NE(h.slot, ok[0].slot);
  // A held object placed again shares its slot and needs two releases.
  auto again = PlaceOk(d, {1});
  EXPECT_EQ(again[0].slot, held[0].slot);
  d.Release(SlotsOf(held));
  d.Release(SlotsOf(ok));
  EXPECT_EQ(d.held(), 1u);
  d.Release(SlotsOf(again));
  EXPECT_EQ(d.held(), 0u);
}

TEST(DeviceSlots, ForgottenSlotIsLoadedAgainAndReusedFirst) {
  DeviceSlots d(3, 16);
  d.Release(SlotsOf(PlaceOk(d, {1})));
  auto p = PlaceOk(d, {7});
  d.Forget(p[0].slot);
  d.Release(SlotsOf(p));
  EXPECT_EQ(d.resident(), 1u);
  auto again = PlaceOk(d, {7});
  EXPECT_TRUE(again[0].load);
  EXPECT_EQ(again[0].slot, p[0].slot) << "the emptied slot is taken before any free one";
  d.Release(SlotsOf(again));
  d.Release(SlotsOf(PlaceOk(d, {8})));
  EXPECT_EQ(d.evictions(), 0u) << "a never-used slot was still free";
  EXPECT_FALSE(PlaceOk(d, {1})[0].load);
}

// A miss placed before a hit of the same call took the least recently used
// free slot, which could be that very hit's: the hit was evicted and copied
// in again (a miss in the stats, an eviction and a wasted copy).
TEST(DeviceSlots, MissNeverTakesTheSlotOfAHitOfTheSameCall) {
  DeviceSlots d(2, 16);
  d.Release(SlotsOf(PlaceOk(d, {5})));  // 5 in the first slot
  d.Release(SlotsOf(PlaceOk(d, {7})));  // 7 in the second; 5 is now least recent
  auto p = PlaceOk(d, {3, 5});          // 3 sorts first and misses
  ASSERT_EQ(p.size(), 2u);
  EXPECT_TRUE(p[0].load);
  EXPECT_FALSE(p[1].load) << "5 is resident: a hit, not a copy";
  EXPECT_EQ(d.KeyOf(p[1].slot), 5u);
  EXPECT_EQ(d.KeyOf(p[0].slot), 3u);
  EXPECT_EQ(d.evictions(), 1u) << "only 7 makes room";
  d.Release(SlotsOf(p));
  EXPECT_EQ(d.held(), 0u);
}

}  // namespace
}  // namespace k3pack::store
