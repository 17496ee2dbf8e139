// Behind the timed replay's device tier, the host policy sees the device
// misses with their requests (as the device tier passes them on): its host
// hits equal a hand-driven replay of the same misses through MissRows.
#include <gtest/gtest.h>

#include "k3pack/trace.h"
#include "store/miss_rows.h"
#include "store/policy.h"
#include "store/simulate.h"
#include "store/timed_sim.h"

namespace k3pack::store {
namespace {

// Host hits of `host_policy` fed the device misses of an LRU device tier,
// call by call, with or without the misses' requests.
uint64_t HostHitsBehindLru(const CallSeq& seq, const ObjectSpace& space, uint64_t device_objects,
                           uint64_t host_objects, bool with_requests) {
  auto device = std::move(MakePolicy("lru", space, device_objects * 4096)).value();
  auto host = std::move(MakePolicy("request-aware", space, host_objects * 4096)).value();
  AccessResult dar, har;
  std::vector<uint64_t> gens, miss_requests, row_requests;
  std::vector<ObjectId> misses, routes;
  std::vector<size_t> route_of;
  uint64_t hits = 0;
  for (size_t i = 0; i < seq.calls.size(); ++i) {
    const auto& c = seq.calls[i];
    std::span<const ObjectId> keys(seq.keys.data() + c.begin, c.end - c.begin);
    gens.assign(keys.size(), 1);
    EXPECT_TRUE(device->Access(keys, gens, c.is_prefill, nullptr, &dar).ok());
    misses.clear();
    for (size_t j = 0; j < keys.size(); ++j)
      if (!dar.hit[j]) misses.push_back(keys[j]);
    if (misses.empty()) continue;
    CallRows rows, host_rows;
    const CallRows* r = with_requests ? RowsOf(seq, i, &rows) : nullptr;
    if (r != nullptr) {
      FirstRowRequests(r->keys, r->width, r->requests, std::span<const ObjectId>(misses), &miss_requests);
      MissRows(std::span<const ObjectId>(misses), std::span<const uint64_t>(miss_requests), r->width, &routes,
               &row_requests, &route_of);
      host_rows = {routes, row_requests, r->width};
      r = &host_rows;
    }
    gens.assign(misses.size(), 1);
    EXPECT_TRUE(host->Access(misses, gens, c.is_prefill, nullptr, &har, r).ok());
    for (uint8_t h : har.hit) hits += h;
  }
  return hits;
}

TEST(TimedDeviceRequests, HostBehindTheDeviceLearnsPerRequest) {
  trace::GenOptions g;
  ASSERT_TRUE(trace::ApplyFamily("interleaved", &g));
  g.layer_ids = {1, 2, 3, 4};
  g.num_experts = 32;
  g.top_k = 4;
  auto t = trace::Generate(g);
  ASSERT_TRUE(t.ok()) << t.error().message();
  ObjectSpace space = SpaceForTrace(*t, 4096);
  auto seq = BuildCallSeq(*t, space);
  ASSERT_TRUE(seq.ok());
  ASSERT_TRUE(seq->has_rows());
  uint64_t differ = 0;
  for (uint64_t host_objects : {12u, 24u, 40u}) {
    TimingOptions o;
    o.device_bytes = 8 * 4096;
    o.device_policy = "lru";
    auto timed = SimulateTimed(*t, *seq, space, "request-aware", host_objects * 4096, o);
    ASSERT_TRUE(timed.ok()) << timed.error().message();
    const uint64_t want = HostHitsBehindLru(*seq, space, 8, host_objects, true);
    EXPECT_EQ(timed->host_hits, want) << host_objects << " host objects";
    differ += want != HostHitsBehindLru(*seq, space, 8, host_objects, false);
  }
  EXPECT_GT(differ, 0u) << "the requests changed no host hit: the check above could not fail";
}

}  // namespace
}  // namespace k3pack::store
