// `trace sweep --ep-size N`: a trace split by SGLang's expert-parallel
// ownership (k3pack/ep.h), each rank with its own cache. Every count below
// is worked out by hand from the six-token trace in the comments.
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "k3pack/ep.h"
#include "k3pack/trace.h"
#include "store/ep_sweep.h"
#include "store/synthetic_pack.h"
#include "../cli_run.h"

namespace k3pack::store {
namespace {

using testing_cli::Cli;
using testing_cli::CliRun;

constexpr uint64_t kObjectBytes = 1000;

// One routed layer (id 1), 8 experts, top-2, one decode record per token:
//   t1 {0,4}  t2 {1,5}  t3 {2,4}  t4 {0,1}  t5 {4,5}  t6 {0,6}
// With --ep-size 2, rank 0 owns experts 0..3 and rank 1 owns 4..7:
//   rank 0 gets t1 {0}  t2 {1}  t3 {2}  t4 {0,1}  t6 {0}   (nothing at t5)
//   rank 1 gets t1 {4}  t2 {5}  t3 {4}  t5 {4,5}  t6 {6}   (nothing at t4)
trace::Trace HandTrace() {
  trace::Trace t;
  t.num_experts = 8;
  t.top_k = 2;
  t.layer_ids = {1};
  const uint16_t tokens[6][2] = {{0, 4}, {1, 5}, {2, 4}, {0, 1}, {4, 5}, {0, 6}};
  for (const auto& ids : tokens) t.Append(1, 1, 0, false, ids);
  return t;
}

TEST(EpSweep, RankCallSeqKeepsOnlyOwnedExpertsRenumbered) {
  trace::Trace t = HandTrace();
  ObjectSpace space = SpaceForTrace(t, kObjectBytes);
  auto seq = BuildCallSeq(t, space);
  ASSERT_TRUE(seq.ok());
  CallSeq r0 = RankCallSeq(*seq, space, 2, 0), r1 = RankCallSeq(*seq, space, 2, 1);
  EXPECT_EQ(r0.calls.size(), 5u);  // t5 routes nothing to rank 0
  EXPECT_EQ(r0.keys, (std::vector<ObjectId>{0, 1, 2, 0, 1, 0}));
  EXPECT_EQ(r1.calls.size(), 5u);  // t4 routes nothing to rank 1
  EXPECT_EQ(r1.keys, (std::vector<ObjectId>{0, 1, 0, 0, 1, 2}));  // experts 4, 5, 6 are rank 1's 0, 1, 2
  EXPECT_EQ(r0.tokens, 6u);
  EXPECT_EQ(RankSpace(space, 2).num_objects(), 4u);
}

TEST(EpSweep, HandWorkedLruAndBelady) {
  trace::Trace t = HandTrace();
  ObjectSpace space = SpaceForTrace(t, kObjectBytes);
  auto seq = BuildCallSeq(t, space);
  ASSERT_TRUE(seq.ok());
  auto table = EpSweep(*seq, space, {"lru"}, {1, 2}, 2, /*belady=*/true, 2);
  ASSERT_TRUE(table.ok()) << table.error().message();
  ASSERT_EQ(table->series, (std::vector<std::string>{"lru", "belady"}));
  // Size 1: t4 needs experts 0 and 1 on rank 0 at once, so one slot per rank
  // (and on one machine, where every call has two objects) cannot serve it.
  for (size_t s = 0; s < 2; ++s) {
    EXPECT_EQ(table->ranks[s][0][0].capacity_bytes, 0u) << "unavailable";
    EXPECT_EQ(table->single[s][0].capacity_bytes, 0u);
  }
  // LRU, two slots per rank.
  // rank 0: t1 miss 0 [0]; t2 miss 1 [0,1]; t3 miss 2, evicts 0 [1,2];
  //         t4 miss 0, evicts 2 (1 is in the call) [1,0], hit 1 [0,1]; t6 hit 0.
  //         -> 2 hits, 4 misses.
  // rank 1: t1 miss 4; t2 miss 5; t3 hit 4 [5,4]; t5 hit 4, hit 5 [4,5];
  //         t6 miss 6, evicts 4. -> 3 hits, 3 misses.
  const SimResult& l0 = table->ranks[0][1][0];
  const SimResult& l1 = table->ranks[0][1][1];
  EXPECT_EQ(l0.hits, 2u);
  EXPECT_EQ(l0.misses, 4u);
  EXPECT_EQ(l0.bytes_read, 4 * kObjectBytes);
  EXPECT_EQ(l1.hits, 3u);
  EXPECT_EQ(l1.misses, 3u);
  // One machine with two slots: every token's pair evicts the previous
  // token's pair, and no token repeats its predecessor's experts: 12 misses.
  EXPECT_EQ(table->single[0][1].hits, 0u);
  EXPECT_EQ(table->single[0][1].misses, 12u);
  // Belady per rank: rank 0 must drop 0 or 1 at t3 (both return at t4), so
  // t4 has one miss: 2 hits; rank 1 as LRU: 3 hits. One machine: every call
  // brings two objects the previous call did not have, so with two slots
  // nothing survives a call: 0 hits.
  EXPECT_EQ(table->ranks[1][1][0].hits, 2u);
  EXPECT_EQ(table->ranks[1][1][1].hits, 3u);
  EXPECT_EQ(table->single[1][1].hits, 0u);

  const std::string text = EpSweepText(*table);
  EXPECT_NE(text.find("ep-size 2: each rank owns 4 of the 8 experts"), std::string::npos) << text;
  auto j = EpSweepJson(*table);
  EXPECT_TRUE(j["series"]["lru"]["hit_rate"][0].is_null());
  EXPECT_DOUBLE_EQ(j["series"]["lru"]["hit_rate"][1].get<double>(), 5.0 / 12.0);
  EXPECT_DOUBLE_EQ(j["series"]["lru"]["bytes_per_token"][1].get<double>(), 7.0 * kObjectBytes / 6.0);
  EXPECT_DOUBLE_EQ(j["series"]["lru"]["max_rank_bytes_per_token"][1].get<double>(), 4.0 * kObjectBytes / 6.0);
  EXPECT_DOUBLE_EQ(j["series"]["lru"]["one_machine"]["bytes_per_token"][1].get<double>(), 12.0 * kObjectBytes / 6.0);
  EXPECT_EQ(j["series"]["lru"]["ranks"][1]["experts"], (std::vector<int>{4, 8}));
}

TEST(EpSweep, SizeThatDoesNotDivideTheExpertsIsRefused) {
  trace::Trace t = HandTrace();
  ObjectSpace space = SpaceForTrace(t, kObjectBytes);
  auto seq = BuildCallSeq(t, space);
  ASSERT_TRUE(seq.ok());
  auto bad = EpSweep(*seq, space, {"lru"}, {2}, 3, false, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message(), ep::CheckRank(ep::Rank{3, 0}, 8).error().message());
}

TEST(EpSweep, CliTextJsonAndBadSize) {
  std::string dir = testing::TinyPack::TempDir("ep-sweep");
  const std::string path = dir + "/hand.k3trace";
  ASSERT_TRUE(trace::WriteTrace(path, HandTrace()).ok());
  const std::string common = "trace sweep --trace " + path + " --object-bytes 1000 --policies lru --sizes 1,2";
  CliRun r = Cli(common + " --ep-size 2 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["ep_size"], 2);
  EXPECT_EQ(j["capacity_objects_per_rank"], (std::vector<int>{1, 2}));
  const auto& ranks = j["series"]["lru"]["ranks"];
  EXPECT_EQ(ranks[0]["hits"][1], 2);
  EXPECT_EQ(ranks[0]["misses"][1], 4);
  EXPECT_EQ(ranks[1]["hits"][1], 3);
  EXPECT_EQ(ranks[1]["misses"][1], 3);
  EXPECT_EQ(j["series"]["belady"]["ranks"][0]["hits"][1], 2);
  CliRun text = Cli(common + " --ep-size 2");
  ASSERT_EQ(text.code, 0) << text.out;
  EXPECT_NE(text.out.find("sizes are per rank"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("41.7%"), std::string::npos) << "5 of 12 over both ranks\n" << text.out;
  CliRun bad = Cli(common + " --ep-size 3");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("--ep-size 3 does not divide the 8 routed experts per layer"), std::string::npos) << bad.out;
  // Session 13: --ep-size 0 ran a plain (one-machine) sweep, exit 0.
  CliRun zero = Cli(common + " --ep-size 0 --json");
  EXPECT_EQ(zero.code, 2) << zero.out;
  EXPECT_NE(zero.out.find("--ep-size must be at least 1, got 0"), std::string::npos) << zero.out;
  CliRun huge = Cli(common + " --ep-size 99999999999 --json");
  EXPECT_EQ(huge.code, 2) << huge.out;
  EXPECT_NE(huge.out.find("--ep-size must be at most 4294967295, got 99999999999"), std::string::npos) << huge.out;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace k3pack::store
