// The stats' read-latency percentiles follow the most recent reads (the
// store used to keep only its first 1M samples, so a long-serving store
// reported the latencies of its first minutes).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "store/latency_window.h"

namespace k3pack::store {
namespace {

constexpr uint64_t kMs = 1000000;

TEST(LatencyWindow, NearestRankPercentilesInMilliseconds) {
  // 1..101 ms: ranks 0.5*100, 0.9*100, 0.99*100 are samples 51, 91 and 100.
  std::vector<uint64_t> ms(101);
  std::iota(ms.begin(), ms.end(), 1);
  std::shuffle(ms.begin(), ms.end(), std::mt19937(7));  // arrival order does not matter
  LatencyWindow w;
  for (uint64_t m : ms) w.Add(m * kMs);
  const auto p = w.PercentilesMs();
  EXPECT_DOUBLE_EQ(p["p50"].get<double>(), 51.0);
  EXPECT_DOUBLE_EQ(p["p90"].get<double>(), 91.0);
  EXPECT_DOUBLE_EQ(p["p99"].get<double>(), 100.0);
  EXPECT_DOUBLE_EQ(p["max"].get<double>(), 101.0);
}

TEST(LatencyWindow, EmptyIsAllZero) {
  const auto p = LatencyWindow().PercentilesMs();
  for (const char* k : {"p50", "p90", "p99", "max"}) EXPECT_DOUBLE_EQ(p[k].get<double>(), 0.0) << k;
}

TEST(LatencyWindow, FollowsTheMostRecentReads) {
  LatencyWindow w(1000);
  for (int i = 0; i < 5000; ++i) w.Add(1 * kMs);  // the first minutes: fast
  for (int i = 0; i < 999; ++i) w.Add(5 * kMs);   // now: the SSD is slower
  w.Add(9 * kMs);
  EXPECT_EQ(w.size(), 1000u);
  EXPECT_EQ(w.total(), 6000u);
  const auto p = w.PercentilesMs();
  EXPECT_DOUBLE_EQ(p["p50"].get<double>(), 5.0);
  EXPECT_DOUBLE_EQ(p["p99"].get<double>(), 5.0);
  EXPECT_DOUBLE_EQ(p["max"].get<double>(), 9.0);
}

TEST(LatencyWindow, KeepsExactlyTheLastWindowOfSamples) {
  // Samples 1..2500 ns into a window of 1000: it holds 1501..2500.
  LatencyWindow w(1000);
  for (uint64_t i = 1; i <= 2500; ++i) w.Add(i * kMs);
  const auto p = w.PercentilesMs();
  // Ranks 0.5*999+0.5 -> 500, 0.9*999+0.5 -> 899, 0.99*999+0.5 -> 989 of 1501..2500.
  EXPECT_DOUBLE_EQ(p["p50"].get<double>(), 2001.0);
  EXPECT_DOUBLE_EQ(p["p90"].get<double>(), 2400.0);
  EXPECT_DOUBLE_EQ(p["p99"].get<double>(), 2490.0);
  EXPECT_DOUBLE_EQ(p["max"].get<double>(), 2500.0);
}

}  // namespace
}  // namespace k3pack::store
