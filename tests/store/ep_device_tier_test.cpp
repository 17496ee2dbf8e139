// Issue 15: the GPU tier over a rank store (on the host-memory emulation of
// the CUDA runtime, so it runs everywhere): the host store's EP rank holds
// for the tier too, with the same refusal before any slot is placed, rows of
// a token's share, and a device budget sized to the rank's working set.
#include <gtest/gtest.h>

#include "emulated_cuda.h"
#include "k3pack/device_tier.h"
#include "k3pack/store.h"
#include "store/synthetic_pack.h"

namespace k3pack::store {
namespace {

using testing::PatternByte;
using testing::ScopedEmulatedCuda;
using testing::TinyPack;
using testing::TinySpec;

TEST(EpDeviceTier, RankHostStoreRulesHoldForTheTier) {
  ScopedEmulatedCuda emulation;
  TinyPack p(TinySpec{});  // layers 1, 2; 8 experts; top-2; 12 KiB objects
  StoreOptions o;
  o.cache_bytes = 6 * 12288;
  o.ep = ep::Rank{8, 5};  // owns expert 5 only: a token needs one slot here
  auto host = ExpertStore::Open(p.pack, p.manifest, o);
  ASSERT_TRUE(host.ok()) << host.error().message();
  DeviceTierOptions d;
  d.device_bytes = 1 * 12288;
  auto t = DeviceExpertTier::Open(*host, d);
  ASSERT_TRUE(t.ok()) << t.error().message();
  const int64_t one[2] = {1, 1};
  std::vector<int64_t> stray{4};
  auto bad = (*t)->Acquire(2, stray, one);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message(),
            "layer 2 expert 4 is not served by this EP rank store, rank 5 of 8 (experts 5..5): rank 4 owns it; "
            "SGLang's EP never routes it here: a routing bug");
  EXPECT_EQ((*t)->Snapshot()["misses"].get<uint64_t>(), 0u);
  EXPECT_EQ((*host)->Snapshot()["pack_reads"].get<uint64_t>(), 0u);
  std::vector<int64_t> mine{5};
  auto a = (*t)->Acquire(2, mine, one);
  ASSERT_TRUE(a.ok()) << a.error().message();
  ASSERT_EQ(a->routes.size(), 1u);
  std::vector<uint8_t> back(a->routes[0].down.size);
  ASSERT_TRUE((*t)->CopyToHost(a->routes[0].down, back).ok());
  for (uint64_t i = 0; i < back.size(); ++i) ASSERT_EQ(back[i], PatternByte(2, 5, 2, i)) << "byte " << i;
  ASSERT_TRUE((*t)->Release(*a).ok());
  // The full host store keeps SGLang's exact width and top-k budget.
  StoreOptions full = o;
  full.ep.reset();
  auto whole = ExpertStore::Open(p.pack, p.manifest, full);
  ASSERT_TRUE(whole.ok());
  auto small = DeviceExpertTier::Open(*whole, d);
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.error().message().find("fewer than one token's top_k=2"), std::string::npos)
      << small.error().message();
}

}  // namespace
}  // namespace k3pack::store
