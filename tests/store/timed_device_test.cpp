// The timed replay's device tier (`trace sweep --timing --device-mib`) on
// the hand-worked tiny trace of timed_tiny.h: two tokens, L1 -> e0 and
// L2 -> e1, 1,000-byte objects, an SSD taking 1 ms per object (one read at
// a time), and here a host-to-device link taking 0.25 ms per object
// (4e6 B/s, no latency). Every count below is worked out in the comments.
#include <gtest/gtest.h>

#include "k3pack/trace.h"
#include "store/simulate.h"
#include "store/timed_sim.h"
#include "timed_tiny.h"
#include "../cli_run.h"

#include <nlohmann/json.hpp>

namespace k3pack::store {
namespace {

using timed_tiny::Device;
using timed_tiny::Opts;
using timed_tiny::Tiny;
using timed_tiny::Timed;

TEST(TimedDevice, OneDeviceSlotCopiesEveryCallFromTheHost) {
  // Device: 1 object, host: 4. Compute 0.5 ms.
  // call0 (e0) t=0: device miss, host miss: read 0->1, copy 1->1.25; stall 1.25; compute to 1.75.
  // call1 (e1) t=1.75: device miss (e0 evicted), host miss: read 1.75->2.75, copy ->3.0; stall 1.25; to 3.5.
  // call2 (e0) t=3.5: device miss (e1 evicted), host hit (ready at 1): copy 3.5->3.75; stall 0.25; to 4.25.
  // call3 (e1) t=4.25: the same: copy 4.25->4.5; stall 0.25; to 5.0.
  TimedResult r = Timed(Tiny(1), "lru", Device(Opts(0.5, false), 1));
  EXPECT_EQ(r.device_policy, "lru");
  EXPECT_EQ(r.accesses, 4u);
  EXPECT_EQ(r.hits, 0u);
  EXPECT_EQ(r.host_hits, 2u);
  EXPECT_EQ(r.bytes_read, 2000u);
  EXPECT_EQ(r.bytes_copied, 4000u);
  EXPECT_NEAR(r.stall_s, 3.0e-3, 1e-12);
  EXPECT_NEAR(r.total_s, 5.0e-3, 1e-12);
  EXPECT_NEAR(r.copied_per_token(), 2000.0, 1e-9);
}

TEST(TimedDevice, DeviceHitsAreStallFree) {
  // Device: 2 objects. Calls 0 and 1 as above (stall 1.25 each, end at 3.5);
  // calls 2 and 3 hit the device: no stall, no copy. Total 2.5 + 4 x 0.5 = 4.5 ms.
  TimedResult r = Timed(Tiny(1), "lru", Device(Opts(0.5, false), 2));
  EXPECT_EQ(r.hits, 2u);
  EXPECT_EQ(r.host_hits, 0u);
  EXPECT_EQ(r.bytes_read, 2000u);
  EXPECT_EQ(r.bytes_copied, 2000u);
  EXPECT_NEAR(r.stall_s, 2.5e-3, 1e-12);
  EXPECT_NEAR(r.total_s, 4.5e-3, 1e-12);
  EXPECT_DOUBLE_EQ(r.stall_free_fraction(), 0.5);
}

TEST(TimedDevice, PrefetchCopiedInTimeIsAHit) {
  // Device 2, compute 1.5 ms, prediction right (e1).
  // call0 t=0: e0 read 0->1, copy 1->1.25; stall 1.25. Prefetch e1 at 1.25: host admit, read
  //   1.25->2.25; device admit (e0 pinned, one slot free), copy 2.25->2.5. Compute to 2.75.
  // call1 t=2.75: e1 on the device since 2.5: a hit (the host never sees it). Compute to 4.25.
  // call2 t=4.25: e0 hit; predicted e1 is on the device: nothing read. call3: e1 hit.
  TimedResult r = Timed(Tiny(1), "lru", Device(Opts(1.5, true), 2));
  EXPECT_EQ(r.hits, 3u);
  EXPECT_EQ(r.late_prefetches, 0u);
  EXPECT_NEAR(r.stall_s, 1.25e-3, 1e-12);
  EXPECT_EQ(r.bytes_read, 2000u);
  EXPECT_EQ(r.prefetch_bytes, 1000u);
  EXPECT_EQ(r.prefetch_useful_bytes, 1000u);  // used on the device
  EXPECT_EQ(r.prefetch_wasted_bytes, 0u);
  EXPECT_EQ(r.bytes_copied, 2000u);
  EXPECT_EQ(r.prefetch_copied_bytes, 1000u);
}

TEST(TimedDevice, PrefetchCopyLandingAfterAcquireIsAMiss) {
  // As above with 0.5 ms compute: the copy of e1 lands at 2.5, call1 starts at 1.75:
  // a late prefetch, stall 0.75. Then e0, e1 hit. Stall 1.25 + 0.75.
  TimedResult r = Timed(Tiny(1), "lru", Device(Opts(0.5, true), 2));
  EXPECT_EQ(r.hits, 2u);
  EXPECT_EQ(r.late_prefetches, 1u);
  EXPECT_NEAR(r.stall_s, 2.0e-3, 1e-12);
  EXPECT_EQ(r.bytes_copied, 2000u);
}

TEST(TimedDevice, StagedPrefetchStopsAtTheHostTier) {
  // Device 2, compute 1.5 ms, staged: as the store's Prefetch() behind a slot cache,
  // the guess is read into host staging only.
  // call0: e0 read 0->1, copy ->1.25, stall 1.25; e1 staged, read 1.25->2.25. Compute to 2.75.
  // call1 t=2.75: e1 device miss; the host takes it from staging (ready at 2.25: a host hit,
  //   no second read), copy 2.75->3.0; stall 0.25. Compute to 4.25.
  // calls 2, 3: device hits.
  TimedResult r = Timed(Tiny(1), "lru", Device(Opts(1.5, true, /*staged=*/true), 2));
  EXPECT_TRUE(r.staged);
  EXPECT_EQ(r.hits, 2u);
  EXPECT_EQ(r.host_hits, 1u);
  EXPECT_NEAR(r.stall_s, 1.5e-3, 1e-12);
  EXPECT_EQ(r.bytes_read, 2000u);
  EXPECT_EQ(r.bytes_copied, 2000u);
  EXPECT_EQ(r.prefetch_copied_bytes, 0u);
  EXPECT_EQ(r.prefetch_useful_bytes, 1000u);
  EXPECT_EQ(r.prefetch_wasted_bytes, 0u);
}

TEST(TimedDevice, BeladyPrefetchesTheTrueNextCallToTheDevice) {
  // The trace predicts e2 (wrong); Belady copies the true next call's e1: the timeline of
  // PrefetchCopiedInTimeIsAHit.
  TimedResult r = Timed(Tiny(2), "belady", Device(Opts(1.5, true), 2));
  EXPECT_EQ(r.device_policy, "belady");
  EXPECT_EQ(r.hits, 3u);
  EXPECT_NEAR(r.stall_s, 1.25e-3, 1e-12);
  EXPECT_EQ(r.prefetch_wasted_bytes, 0u);
}

TEST(TimedDevice, WrongPredictionCostsAReadAndACopy) {
  // Device 2 (LRU), compute 1.5 ms, prediction e2 (wrong).
  // call0 t=0: e0 read 0->1, copy ->1.25; stall 1.25. Prefetch e2: read 1.25->2.25, copy
  //   2.25->2.5 (device: e0, e2). Compute to 2.75.
  // call1 t=2.75: e1 device miss, evicting e0 (least recent); host miss: read 2.75->3.75, copy
  //   ->4.0; stall 1.25. No prediction after the last layer. Compute to 5.5.
  // call2 t=5.5: e0 device miss, evicting e2 (admitted at 1.25, before e1's use); host hit
  //   (ready at 1): copy 5.5->5.75, stall 0.25. Prefetch e2: on the host (ready at 2.25), not on
  //   the device: admitted there, evicting e1 (e0 is pinned), copy 5.75->6.0. Compute to 7.25.
  // call3 t=7.25: e1 device miss (evicting e0), host hit: copy 7.25->7.5, stall 0.25.
  // Stall 1.25 + 1.25 + 0.25 + 0.25 = 3.0; reads e0, e2, e1; copies e0, e2, e1, e0, e2, e1
  // (two of them prefetches); e2 is never used: its read is wasted.
  TimedResult r = Timed(Tiny(2), "lru", Device(Opts(1.5, true), 2));
  EXPECT_EQ(r.hits, 0u);
  EXPECT_EQ(r.host_hits, 2u);
  EXPECT_NEAR(r.stall_s, 3.0e-3, 1e-12);
  EXPECT_EQ(r.bytes_read, 3000u);
  EXPECT_EQ(r.bytes_copied, 6000u);
  EXPECT_EQ(r.prefetch_copied_bytes, 2000u);
  EXPECT_EQ(r.prefetch_wasted_bytes, 1000u);
}

// One layer of 4 experts, top-1: a batched call of two rows (e0, e1), then
// e2 alone, then e0 and e1 again.
trace::Trace TwoRowCalls() {
  trace::Trace t;
  t.num_experts = 4;
  t.top_k = 1;
  t.layer_ids = {1};
  const uint16_t both[2] = {0, 1}, e2[1] = {2};
  t.Append(1, 2, 0, false, both);
  t.Append(1, 1, 0, false, e2);
  t.Append(1, 2, 0, false, both);
  return t;
}

TEST(TimedDevice, DeviceMissesGoThroughASmallHostTierInChunks) {
  // Device 2 objects (LRU), host 1 object, compute 0.5 ms. As DeviceExpertTier::Load
  // does, a call's device misses go through the host in acquires of what it holds
  // (1 object here), each once the previous one's copies have landed. In one host
  // access the first call failed with "cannot evict the active top-k working set".
  // call0 t=0: e0, e1 device misses. Chunk e0: read 0->1, copy 1->1.25. Chunk e1
  //   at 1.25 (the host evicts e0): read 1.25->2.25, copy ->2.5. Stall 2.5; to 3.0.
  // call1 t=3.0: e2 device miss (evicting e0, the least recent); host miss (evicting
  //   e1): read 3.0->4.0, copy ->4.25. Stall 1.25; to 4.75.
  // call2 t=4.75: e1 device hit (landed at 2.5); e0 device miss (evicting e2), host
  //   miss: read 4.75->5.75, copy ->6.0. Stall 1.25; to 6.5.
  TimedResult r = Timed(TwoRowCalls(), "lru", Device(Opts(0.5, false), 2), /*slots=*/1);
  EXPECT_EQ(r.accesses, 5u);
  EXPECT_EQ(r.hits, 1u);
  EXPECT_EQ(r.host_hits, 0u);
  EXPECT_EQ(r.bytes_read, 4000u);
  EXPECT_EQ(r.bytes_copied, 4000u);
  EXPECT_NEAR(r.stall_s, 5.0e-3, 1e-12);
  EXPECT_NEAR(r.total_s, 6.5e-3, 1e-12);

  // A host of 2 objects takes call0's misses in one acquire: both reads are issued at
  // 0 (0->1, 1->2), copies 1->1.25 and 2->2.25; stall 2.25, to 2.75. call1 and call2
  // as above, 0.25 ms earlier (the host's LRU then evicts e0, then e1): stall 4.75.
  TimedResult one = Timed(TwoRowCalls(), "lru", Device(Opts(0.5, false), 2), /*slots=*/2);
  EXPECT_EQ(one.hits, 1u);
  EXPECT_EQ(one.bytes_read, 4000u);
  EXPECT_NEAR(one.stall_s, 4.75e-3, 1e-12);
  EXPECT_NEAR(one.total_s, 6.25e-3, 1e-12);
}

// Two 8-row prefill calls (layers 1, 2), 32 distinct experts each; layer
// 1's records predict layer 2's routes exactly, staged. Behind a device tier
// of 64 objects a host of 8 takes layer 2's 32 device misses in 4 chunks.
// The first chunk's acquire ended the staged holds of the call: the 24
// staged objects the later chunks would take were dropped (wasted) and read
// again. The holds end once, with the last chunk: every staged read is used
// and the bytes read are the host-only run's.
TEST(TimedDevice, StagedReadsOutliveTheFirstChunkOfTheirCall) {
  trace::Trace t;
  t.num_experts = 64;
  t.top_k = 4;
  t.layer_ids = {1, 2};
  t.predict_k = 4;
  std::vector<uint16_t> routes;
  for (uint16_t i = 0; i < 32; ++i) routes.push_back(i);
  t.Append(1, 8, 0, true, routes);
  t.SetPredictions(routes);
  t.Append(2, 8, 0, true, routes);
  const ObjectSpace space = SpaceForTrace(t, 1 << 20);
  auto seq = BuildCallSeq(t, space);
  ASSERT_TRUE(seq.ok());
  TimingOptions o;
  o.prefetch = true;
  o.prefetch_staged = true;
  auto host_only = SimulateTimed(t, *seq, space, "lru", 64 << 20, o);
  o.device_bytes = 64 << 20;
  auto tiered = SimulateTimed(t, *seq, space, "lru", 8 << 20, o);
  ASSERT_TRUE(host_only.ok() && tiered.ok());
  for (const TimedResult* r : {&*host_only, &*tiered}) {
    EXPECT_EQ(r->prefetch_bytes, 32u << 20);
    EXPECT_EQ(r->prefetch_useful_bytes, 32u << 20);
    EXPECT_EQ(r->prefetch_wasted_bytes, 0u);
    EXPECT_EQ(r->bytes_read, 64u << 20);
  }
}

TEST(TimedDevice, DemandOnlyDeviceHitsMatchTheUntimedSimulator) {
  // Without prefetch the device sees every call: its hits are the untimed
  // simulator's for the device policy and size, and every device miss is
  // either a host hit or one SSD read (and always one copy).
  trace::GenOptions g;
  g.layer_ids = {1, 2, 3, 4};
  g.num_experts = 32;
  g.top_k = 4;
  g.requests = 3;
  g.decode_tokens = 60;
  auto t = trace::Generate(g);
  ASSERT_TRUE(t.ok());
  ObjectSpace space = SpaceForTrace(*t, 4096);
  auto seq = BuildCallSeq(*t, space);
  ASSERT_TRUE(seq.ok());
  for (uint64_t dev : {8u, 20u}) {
    for (const char* p : {"lru", "quota-decay"}) {
      TimingOptions o;
      o.device_bytes = dev * 4096;
      o.device_policy = p;
      auto a = Simulate(*seq, space, p, dev * 4096);
      auto b = SimulateTimed(*t, *seq, space, "lru", 50 * 4096, o);
      ASSERT_TRUE(a.ok() && b.ok()) << (b.ok() ? "" : b.error().message());
      EXPECT_EQ(a->hits, b->hits) << p << " " << dev;
      EXPECT_EQ(b->accesses - b->hits, b->bytes_copied / 4096) << p << " " << dev;
      EXPECT_EQ(b->accesses - b->hits - b->host_hits, b->bytes_read / 4096) << p << " " << dev;
    }
  }
}

TEST(TimedDevice, TooSmallADeviceIsRefused) {
  // A call's working set is one object here; a device of 999 bytes cannot hold it.
  trace::Trace t = Tiny(1);
  ObjectSpace space = SpaceForTrace(t, 1000);
  auto seq = BuildCallSeq(t, space);
  ASSERT_TRUE(seq.ok());
  TimingOptions o = Opts(0.5, false);
  o.device_bytes = 999;
  auto r = SimulateTimed(t, *seq, space, "lru", 4000, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("device tier (999 bytes) cannot hold a call's working set of 1000 bytes"),
            std::string::npos)
      << r.error().message();
}

TEST(TimedDevice, CliReportsCopiesPerToken) {
  using testing_cli::Cli;
  const std::string gen = "trace sweep --timing --layers 2 --experts 16 --top-k 2 --requests 1 --prompt-tokens 0 "
                          "--decode-tokens 8 --object-bytes 4096 --sizes 8 --policies lru";
  // 0.03 MiB is not an integer: a usage error; so is an unknown device policy.
  EXPECT_EQ(Cli(gen + " --device-mib 0.03").code, 2);
  auto bad = Cli(gen + " --device-mib 1 --device-policy nope");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("--device-policy: unknown cache policy 'nope'"), std::string::npos) << bad.out;
  // The same rule for --policies, before the trace is generated.
  const std::string no_policies = gen.substr(0, gen.find(" --policies"));
  auto bad_list = Cli(no_policies + " --policies lru,nope");
  EXPECT_EQ(bad_list.code, 2) << bad_list.out;
  EXPECT_NE(bad_list.out.find("--policies: unknown cache policy 'nope'"), std::string::npos) << bad_list.out;
  // A 1 MiB device holds 256 objects of 4 KiB: all 32, so every route after
  // the first use of its object is a device hit.
  auto text = Cli(gen + " --device-mib 1");
  ASSERT_EQ(text.code, 0) << text.out;
  EXPECT_NE(text.out.find("device tier: 1 MiB = 256 objects"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("H2D MB/tok"), std::string::npos) << text.out;
  auto js = Cli(gen + " --device-mib 1 --json");
  ASSERT_EQ(js.code, 0) << js.out;
  auto j = nlohmann::json::parse(js.out.substr(js.out.find('{')));
  EXPECT_EQ(j["device"]["bytes"], 1u << 20);
  for (const auto& row : j["timing"]) {
    EXPECT_EQ(row["device_policy"], row["policy"] == "belady" ? "belady" : "lru");
    // Each distinct object is copied once (it never leaves the device), read once.
    EXPECT_DOUBLE_EQ(row["bytes_copied_per_token"].get<double>(), row["bytes_per_token"].get<double>());
  }
  // Without a device tier the JSON has no device fields and the text no H2D column.
  auto plain = Cli(gen);
  ASSERT_EQ(plain.code, 0) << plain.out;
  EXPECT_EQ(plain.out.find("H2D"), std::string::npos) << plain.out;
}

}  // namespace
}  // namespace k3pack::store
