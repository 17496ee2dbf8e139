// `k3pack trace gen|replay|sweep` end to end through the built CLI.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "k3pack/trace.h"
#include "store/replay.h"
#include "store/synthetic_pack.h"
#include "../cli_run.h"

namespace k3pack::store {
namespace {

using testing_cli::Cli;
using testing_cli::CliRun;

TEST(TraceCli, GenReplayOnStoreAndSimulate) {
  testing::TinyPack p(testing::TinySpec{}, "cli");
  std::string trace = p.dir + "/t.k3trace";
  CliRun g = Cli("trace gen --trace " + trace +
              " --layers 2 --experts 8 --top-k 2 --requests 2 --prompt-tokens 4 --decode-tokens 30 --json");
  ASSERT_EQ(g.code, 0) << g.out;
  auto gj = nlohmann::json::parse(g.out);
  EXPECT_EQ(gj["records"], 2 * 34 * 2);
  // Same trace, same capacity: the simulated policy and the real store agree.
  for (const char* policy : {"reuse-lfu-lru-v2", "quota-decay"}) {
    std::string common = " --trace " + trace + " --manifest " + p.manifest + " --policy " + policy + " --json";
    CliRun sim = Cli("trace replay --simulate --cache-mib 1" + common);
    ASSERT_EQ(sim.code, 0) << sim.out;
    // 1 MiB holds all 16 objects: only compulsory misses.
    auto sj = nlohmann::json::parse(sim.out);
    EXPECT_EQ(sj["misses"], 16);
    CliRun real = Cli("trace replay --cache-mib 1 --io uring --prefetch oracle-lookahead --stats " + p.dir + "/s.json" +
                   common);
    ASSERT_EQ(real.code, 0) << real.out;
    auto rj = nlohmann::json::parse(real.out);
    // The oracle prefetch stages each object before its first acquire: the
    // cache sees the same compulsory misses (staged prefetch never changes
    // what it holds), but each is served from staging without a second read.
    EXPECT_EQ(rj["hits"].get<int>() + rj["misses"].get<int>(), sj["hits"].get<int>() + sj["misses"].get<int>());
    EXPECT_EQ(rj["misses"], 16);
    EXPECT_EQ(rj["prefetch_useful"], 16);
    EXPECT_EQ(rj["prefetch_wasted"], 0);
    EXPECT_EQ(rj["bytes_read"], 16 * 12288);
    EXPECT_TRUE(std::filesystem::exists(p.dir + "/s.json"));
  }
}

TEST(TraceCli, SmallCacheSimulationMatchesStore) {
  testing::TinySpec spec;
  spec.experts = 64;
  spec.role_bytes.assign(2, {4096 * 4, 4096 * 4, 4096 * 8});  // 64 KiB objects: 16 per MiB
  testing::TinyPack p(spec, "cli2");
  std::string trace = p.dir + "/t.k3trace";
  ASSERT_EQ(Cli("trace gen --trace " + trace + " --layers 2 --experts 64 --top-k 2 --decode-tokens 60").code, 0);
  for (const char* policy : {"reuse-lfu-lru-v2", "lru", "decay-lfu", "quota-decay"}) {
    std::string common = " --cache-mib 1 --trace " + trace + " --manifest " + p.manifest + " --policy " + policy +
                         " --json";
    auto sj = nlohmann::json::parse(Cli("trace replay --simulate" + common).out);
    auto rj = nlohmann::json::parse(Cli("trace replay" + common).out);
    EXPECT_GT(sj["misses"].get<int>(), 128) << "the cache must be too small to hold everything";
    EXPECT_EQ(rj["hits"], sj["hits"]) << policy;
    EXPECT_EQ(rj["misses"], sj["misses"]) << policy;
  }
  // Requests decoded side by side (each row's request id recorded): the
  // request-aware policies too. The store told them of keep hints from open,
  // though no caller gave any, and its hits differed from the simulator's.
  const std::string side_by_side = p.dir + "/t2.k3trace";
  ASSERT_EQ(Cli("trace gen --trace " + side_by_side +
                " --layers 2 --experts 64 --top-k 2 --requests 6 --concurrent 3 --prompt-tokens 4 --decode-tokens 30")
                .code,
            0);
  for (const char* policy : {"request-aware", "adaptive", "quota-decay"}) {
    std::string common = " --cache-mib 1 --trace " + side_by_side + " --manifest " + p.manifest + " --policy " +
                         policy + " --json";
    auto sj = nlohmann::json::parse(Cli("trace replay --simulate" + common).out);
    auto rj = nlohmann::json::parse(Cli("trace replay" + common).out);
    EXPECT_GT(sj["misses"].get<int>(), 128) << "the cache must be too small to hold everything";
    EXPECT_EQ(rj["hits"], sj["hits"]) << policy;
    EXPECT_EQ(rj["misses"], sj["misses"]) << policy;
  }
}

TEST(TraceCli, SweepWritesTableAndSvg) {
  std::string dir = testing::TinyPack::TempDir("sweep");
  std::string trace = dir + "/t.k3trace";
  ASSERT_EQ(Cli("trace gen --trace " + trace + " --layers 4 --experts 64 --top-k 4 --decode-tokens 80").code, 0);
  CliRun r = Cli("trace sweep --trace " + trace + " --sizes 8,16,32 --svg " + dir + "/p.svg --json");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["capacity_objects"], (std::vector<int>{8, 16, 32}));
  for (const char* s : {"lru", "reuse-lfu-lru-v2", "decay-lfu", "quota-decay", "belady"})
    ASSERT_TRUE(j["hit_rate"].contains(s)) << s;
  for (int i = 0; i < 3; ++i)
    for (const char* s : {"lru", "reuse-lfu-lru-v2", "decay-lfu", "quota-decay"})
      EXPECT_LE(j["hit_rate"][s][i].get<double>(), j["hit_rate"]["belady"][i].get<double>() + 1e-12);
  // The counts behind the rates (session 14: the JSON had rates only, no
  // bytes): every series at every size sees the same accesses, misses read
  // one object each, and they are what replay --simulate counts.
  const uint64_t object_bytes = 11956224;  // --object-bytes' default
  const uint64_t accesses = j["hits"]["lru"][0].get<uint64_t>() + j["misses"]["lru"][0].get<uint64_t>();
  for (auto& [series, rates] : j["hit_rate"].items())
    for (int i = 0; i < 3; ++i) {
      const uint64_t hits = j["hits"][series][i], misses = j["misses"][series][i];
      EXPECT_EQ(hits + misses, accesses) << series << " " << i;
      EXPECT_DOUBLE_EQ(rates[i].get<double>(), double(hits) / double(accesses)) << series << " " << i;
      EXPECT_EQ(j["bytes_read"][series][i].get<uint64_t>(), misses * object_bytes) << series << " " << i;
    }
  const uint64_t mib_for_16 = (16 * object_bytes + (1 << 20) - 1) >> 20;
  auto sim = nlohmann::json::parse(Cli("trace replay --simulate --json --policy lru --cache-mib " +
                                       std::to_string(mib_for_16) + " --trace " + trace).out);
  ASSERT_EQ(sim["effective_capacity_experts"], 16) << sim;
  EXPECT_EQ(sim["misses"], j["misses"]["lru"][1]) << sim;
  EXPECT_EQ(sim["bytes_read"], j["bytes_read"]["lru"][1]) << sim;
  std::string svg = *ReadFileToString(dir + "/p.svg");
  EXPECT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("belady"), std::string::npos);
  CliRun text = Cli("trace sweep --trace " + trace + " --sizes 8,16 --svg " + dir + "/q.svg");
  EXPECT_EQ(text.code, 0);
  EXPECT_NE(text.out.find("quota-decay"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(TraceCli, UsageErrors) {
  EXPECT_EQ(Cli("trace").code, 2);
  EXPECT_EQ(Cli("trace bogus").code, 2);
  EXPECT_EQ(Cli("trace gen").code, 2);  // --trace is required
  EXPECT_EQ(Cli("trace replay --trace x --cache-mib 1").code, 1);  // unreadable trace
  CliRun h = Cli("trace replay --help");
  EXPECT_EQ(h.code, 0);
  EXPECT_NE(h.out.find("--prefetch"), std::string::npos);
}

}  // namespace
}  // namespace k3pack::store

namespace k3pack::store {
namespace {

// A full-scale replay reads ~190 MB per record (16 misses of 12 MB); the
// progress callback used to run every 1024th record only, so 8 tokens of the
// k3-structure model (736 records, 4 minutes on this machine) printed no
// progress line at all. The reporter throttles what it prints; the replay
// must report every record.
TEST(TraceReplay, ReportsProgressForEveryRecord) {
  testing::TinyPack p(testing::TinySpec{}, "progress");
  const std::string path = p.dir + "/t.k3trace";
  ASSERT_EQ(testing_cli::Cli("trace gen --trace " + path +
                             " --layers 2 --experts 8 --top-k 2 --requests 1 --prompt-tokens 2 --decode-tokens 40")
                .code,
            0);
  auto t = trace::ReadTrace(path);
  ASSERT_TRUE(t.ok()) << t.error().message();
  ASSERT_GT(t->records.size(), 50u);
  ReplayOptions o;
  o.manifest_path = p.manifest;
  o.pack_path = p.pack;
  o.store.cache_bytes = 1 << 20;
  std::vector<uint64_t> seen;
  o.progress = [&](uint64_t done, uint64_t total) {
    EXPECT_EQ(total, t->records.size());
    seen.push_back(done);
  };
  auto r = ReplayOnStore(*t, o);
  ASSERT_TRUE(r.ok()) << r.error().message();
  ASSERT_EQ(seen.size(), t->records.size());
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], i + 1);
}

}  // namespace
}  // namespace k3pack::store
