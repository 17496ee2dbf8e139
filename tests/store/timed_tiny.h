// The hand-worked setting of the timed-replay tests: two layers (1, 2) of 4
// experts, top-1, 1,000-byte objects, an SSD moving 1e6 B/s (1 ms per
// object) with no latency and one read at a time.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "k3pack/trace.h"
#include "store/simulate.h"
#include "store/timed_sim.h"

namespace k3pack::store::timed_tiny {

// Two tokens routing L1 -> e0, L2 -> e1; L1's records predict
// `predicted_for_layer2` for L2 (the last layer carries no prediction).
inline trace::Trace Tiny(uint16_t predicted_for_layer2) {
  trace::Trace t;
  t.num_experts = 4;
  t.top_k = 1;
  t.layer_ids = {1, 2};
  t.predict_k = 1;
  for (int token = 0; token < 2; ++token) {
    uint16_t a[1] = {0}, b[1] = {1}, p[1] = {predicted_for_layer2};
    t.Append(1, 1, 0, false, a);
    t.SetPredictions(p);
    t.Append(2, 1, 0, false, b);
  }
  return t;
}

inline TimingOptions Opts(double compute_ms, bool prefetch, bool staged = false) {
  TimingOptions o;
  o.layer_compute_s = compute_ms * 1e-3;
  o.ssd_bytes_per_s = 1e6;
  o.ssd_latency_s = 0;
  o.queue_depth = 1;
  o.prefetch = prefetch;
  o.prefetch_staged = staged;
  return o;
}

// A device tier of `device_objects` objects (LRU) in front of the host, over
// a link taking 0.25 ms per object (4e6 B/s, no latency).
inline TimingOptions Device(TimingOptions o, uint64_t device_objects) {
  o.device_bytes = device_objects * 1000;
  o.device_policy = "lru";
  o.h2d_bytes_per_s = 4e6;
  o.h2d_latency_s = 0;
  return o;
}

inline TimedResult Timed(const trace::Trace& t, const std::string& policy, const TimingOptions& o,
                         uint64_t slots = 4) {
  ObjectSpace space = SpaceForTrace(t, 1000);
  auto seq = BuildCallSeq(t, space);
  EXPECT_TRUE(seq.ok());
  auto r = SimulateTimed(t, *seq, space, policy, slots * 1000, o);
  EXPECT_TRUE(r.ok()) << r.error().message();
  return *r;
}

}  // namespace k3pack::store::timed_tiny
