// The device tier passes an acquire's request ids on to the host store's
// acquire of its misses (emulated CUDA runtime, so this runs everywhere).
#include <gtest/gtest.h>

#include <vector>

#include "emulated_cuda.h"
#include "k3pack/device_tier.h"
#include "k3pack/store.h"
#include "open_ok.h"
#include "store/synthetic_pack.h"

namespace k3pack::store {
namespace {

using testing::ScopedEmulatedCuda;
using testing::TinyPack;
using testing::TinySpec;

std::shared_ptr<ExpertStore> RequestAwareHost(const TinyPack& p) {
  StoreOptions o;
  o.cache_bytes = 4 * 12288;  // four objects
  o.policy = "request-aware";
  return testing::OpenOk(p, o);
}

std::unique_ptr<DeviceExpertTier> TwoSlotTier(std::shared_ptr<ExpertStore> host) {
  DeviceTierOptions o;
  o.device_bytes = 2 * 12288;  // one token's top-2: every call below misses both objects
  auto t = DeviceExpertTier::Open(std::move(host), o);
  EXPECT_TRUE(t.ok()) << t.error().message();
  return t.ok() ? std::move(*t) : nullptr;
}

uint64_t HostHits(ExpertStore& s) { return s.Snapshot()["cache_hits"].get<uint64_t>(); }

// Request 0 returns to experts {0, 1} at every token; request 1, two tokens
// per round of request 0's one, cycles through three other pairs (so with
// four host slots plain recency drops request 0's pair every round). The
// two-slot tier misses every call, so the host sees each call whole, as the
// twin store below is driven directly.
TEST(DeviceTierRequests, HostAcquireCarriesThemAsTheTwinStoreGetsThem) {
  ScopedEmulatedCuda emulation;
  TinyPack p(TinySpec{});  // layers 1, 2; 8 experts; top-2; 12 KiB objects
  auto host = RequestAwareHost(p), twin = RequestAwareHost(p), blind_host = RequestAwareHost(p);
  ASSERT_TRUE(host && twin && blind_host);
  auto tier = TwoSlotTier(host), blind = TwoSlotTier(blind_host);
  ASSERT_TRUE(tier && blind);
  const int64_t shape[2] = {1, 2};
  int b_token = 0;
  for (int round = 0; round < 20; ++round) {
    for (uint64_t request : {0u, 1u, 1u}) {
      const int64_t first = request == 0 ? 0 : 2 + 2 * (b_token++ % 3);
      std::vector<int64_t> ids = {first + 1, first};  // route order; the host gets them ascending
      const uint64_t req[] = {request};
      auto a = tier->Acquire(1, ids, shape, req);
      ASSERT_TRUE(a.ok()) << a.error().message();
      ASSERT_TRUE(tier->Release(*a).ok());
      auto b = blind->Acquire(1, ids, shape);
      ASSERT_TRUE(b.ok()) << b.error().message();
      ASSERT_TRUE(blind->Release(*b).ok());
      std::vector<int64_t> sorted = {first, first + 1};
      auto t = twin->Acquire(1, sorted, shape, false, req);
      ASSERT_TRUE(t.ok()) << t.error().message();
      ASSERT_TRUE(twin->MarkUsed(*t).ok());
      ASSERT_EQ(HostHits(*host), HostHits(*twin)) << "round " << round << " request " << request;
    }
  }
  EXPECT_EQ(tier->Snapshot()["hits"].get<uint64_t>(), 0u) << "the scenario needs every call to reach the host";
  // Request 0's pair stays in the host (all but its first token hit), which
  // the same policy cannot tell without the ids.
  EXPECT_GE(HostHits(*host), 2u * 19u);
  EXPECT_LT(HostHits(*blind_host), HostHits(*host));
}

// Several requests in one call: each missed object goes to the host in a
// row of the first row's request that routed to it, rows grouped by request.
TEST(DeviceTierRequests, RowsOfSeveralRequestsAndTheCountRule) {
  ScopedEmulatedCuda emulation;
  TinyPack p(TinySpec{});
  auto host = RequestAwareHost(p);
  ASSERT_TRUE(host);
  DeviceTierOptions o;
  o.device_bytes = 4 * 12288;
  auto tier = DeviceExpertTier::Open(host, o);
  ASSERT_TRUE(tier.ok()) << tier.error().message();
  // Rows: request 9 {5, 1}, request 4 {1, 2}, request 9 {3, 5}: expert 1 is
  // request 9's (its first row), 2 is request 4's, 3 and 5 request 9's.
  const std::vector<int64_t> ids = {5, 1, 1, 2, 3, 5};
  const int64_t shape[2] = {3, 2};
  const uint64_t per_row[] = {9, 4, 9};
  auto a = (*tier)->Acquire(2, ids, shape, per_row);
  ASSERT_TRUE(a.ok()) << a.error().message();
  // The host's call was request 4's row {2, 2}, then request 9's {1, 3} and
  // {5, 5}: every route still gets its own object's bytes.
  ASSERT_EQ(a->routes.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const auto& v = a->routes[i];
    ASSERT_EQ(v.expert, ids[i]);
    std::vector<uint8_t> back(v.down.size);
    ASSERT_TRUE((*tier)->CopyToHost(v.down, back).ok());
    for (uint64_t b = 0; b < back.size(); b += 97)
      ASSERT_EQ(back[b], testing::PatternByte(2, v.expert, 2, b)) << "route " << i << " byte " << b;
  }
  ASSERT_TRUE((*tier)->Release(*a).ok());
  EXPECT_EQ(host->Snapshot()["cache_misses"].get<uint64_t>(), 4u);

  const uint64_t two[] = {1, 2};
  auto bad = (*tier)->Acquire(2, ids, shape, two);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().kind(), ErrorKind::kValue);
  EXPECT_EQ(bad.error().message(), "request_ids must hold one id for the call or one per row; received 2 for 3 rows");
  // The store's "no request id" is refused here as by the host store.
  const uint64_t reserved[] = {9, UINT64_MAX, 9};
  auto refused = (*tier)->Acquire(2, ids, shape, reserved);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().kind(), ErrorKind::kValue);
  EXPECT_TRUE(refused.error().message().starts_with("request id 18446744073709551615 (2^64-1) is reserved"))
      << refused.error().message();
}

// A host store of two objects behind an eight-slot tier: a call over eight
// experts reaches the host in four acquires of two. All eight were staged
// by one Prefetch(); the first chunk's acquire ended the staged holds and
// dropped the six the later chunks then read again (wasted). The tier now
// makes the four acquires one call for staging: every staged read is used.
TEST(DeviceTierRequests, StagedReadsOutliveTheFirstChunkOfACall) {
  ScopedEmulatedCuda emulation;
  TinyPack p(TinySpec{});
  StoreOptions so;
  so.cache_bytes = 2 * 12288;
  so.prefetch_budget_bytes = 8 * 12288;
  auto host = testing::OpenOk(p, so);
  ASSERT_TRUE(host);
  ASSERT_EQ(host->info().effective_capacity_objects, 2u);
  DeviceTierOptions o;
  o.device_bytes = 8 * 12288;
  auto tier = DeviceExpertTier::Open(host, o);
  ASSERT_TRUE(tier.ok()) << tier.error().message();
  const std::vector<int64_t> ids = {0, 1, 2, 3, 4, 5, 6, 7};
  ASSERT_TRUE(host->Prefetch(1, ids, 5).ok());
  const int64_t shape[2] = {4, 2};
  const uint64_t request[] = {5};
  auto a = (*tier)->Acquire(1, ids, shape, request);
  ASSERT_TRUE(a.ok()) << a.error().message();
  ASSERT_TRUE((*tier)->Release(*a).ok());
  const auto prefetch = host->Snapshot()["k3pack"]["prefetch"];
  EXPECT_EQ(prefetch["useful"].get<uint64_t>(), 8u) << prefetch.dump();
  EXPECT_EQ(prefetch["wasted"].get<uint64_t>(), 0u) << prefetch.dump();
}

}  // namespace
}  // namespace k3pack::store
