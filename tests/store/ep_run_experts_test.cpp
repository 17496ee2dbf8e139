// Issue 15, `run-experts --ep-size N`: a layer's routed block run as N EP
// ranks (one thread and rank store each), whose partial outputs summed in the
// fixed order (ranks 0..N-1) equal the single store's output bit for bit; a
// rank pack serving a wrong byte breaks that equality.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "k3pack/ep.h"
#include "k3pack/gguf.h"
#include "k3pack/pack.h"
#include "k3pack/run_experts.h"
#include "pack/format.h"
#include "util/file.h"
#include "../cli_run.h"
#include "../forked_child.h"
#include "built_tiny_model.h"

namespace k3pack::store {
namespace {

namespace fs = std::filesystem;
using testing_cli::Cli;
using testing_cli::CliRun;

class EpRunExpertsTest : public testing_model::BuiltTinyModelTest {
 protected:
  static void SetUpTestSuite() { BuildModel("k3-ep-run-experts"); }

  static std::shared_ptr<ExpertStore> Open(const std::string& pack, const std::string& manifest,
                                           std::optional<ep::Rank> rank = std::nullopt) {
    StoreOptions o;
    o.ep = rank;
    auto st = ExpertStore::Open(pack, manifest, o);
    EXPECT_TRUE(st.ok()) << st.error().message();
    return st.ok() ? *st : nullptr;
  }

  // Rank `r` of `n`'s pack: the full pack with every unowned object a hole,
  // k3pack.ep in its manifest; no digest sidecar (so damage shows in outputs).
  // `corrupt_expert` >= 0: also invert 4 KiB of that owned expert's down
  // projection in every layer.
  static std::string MakeRankPack(uint32_t n, uint32_t r, int corrupt_expert = -1) {
    const std::string tag = dir_ + "/rank" + std::to_string(r) + "of" + std::to_string(n) +
                            (corrupt_expert >= 0 ? "-bad" : "");
    const std::string pack = tag + ".expert-major.pack", manifest = tag + ".manifest.json";
    fs::copy_file(pack_, pack, fs::copy_options::overwrite_existing);
    nlohmann::json m = nlohmann::json::parse(std::ifstream(manifest_));
    const uint32_t experts = m["model"]["num_experts"].get<uint32_t>();
    const ep::ExpertRange owned = ep::OwnedExperts({n, r}, experts);
    UniqueFd fd(::open(pack.c_str(), O_RDWR));
    std::vector<uint8_t> hb(pack::kHeaderBytes);
    EXPECT_EQ(*PreadFull(fd.get(), hb.data(), hb.size(), 0), hb.size());
    const auto h = *pack::DecodeHeader(hb);
    for (uint64_t i = 0; i < h.index_count; ++i) {
      std::vector<uint8_t> eb(pack::kEntryBytes);
      EXPECT_EQ(*PreadFull(fd.get(), eb.data(), eb.size(), pack::kHeaderBytes + i * pack::kEntryBytes), eb.size());
      const auto e = *pack::DecodeEntry(eb);
      const uint32_t expert = static_cast<uint32_t>(e.expert);
      if (!owned.contains(expert)) {
        // Whole 4096-byte blocks inside the payload become holes; the rest is zeroed.
        std::vector<uint8_t> zeros(e.nbytes, 0);
        EXPECT_TRUE(PwriteFull(fd.get(), zeros.data(), zeros.size(), e.offset).ok());
        const uint64_t first = (e.offset + 4095) / 4096 * 4096, end = (e.offset + e.nbytes) / 4096 * 4096;
        if (end > first) {
          EXPECT_EQ(::fallocate(fd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(first),
                                static_cast<off_t>(end - first)),
                    0);
        }
      } else if (static_cast<int>(expert) == corrupt_expert && e.name.find("ffn_down_exps") != std::string::npos) {
        std::vector<uint8_t> bytes(4096);
        const uint64_t at = e.offset + e.nbytes / 2;
        EXPECT_EQ(*PreadFull(fd.get(), bytes.data(), bytes.size(), at), bytes.size());
        for (uint8_t& c : bytes) c = static_cast<uint8_t>(~c);
        EXPECT_TRUE(PwriteFull(fd.get(), bytes.data(), bytes.size(), at).ok());
      }
    }
    m["expert_pack"]["path"] = pack;
    m["k3pack"]["ep"] = {{"size", n}, {"rank", r}, {"first_expert", owned.first}, {"end_expert", owned.end}};
    std::ofstream(manifest) << m.dump(2);
    return manifest;
  }


};

TEST_F(EpRunExpertsTest, RanksSumToTheSingleStoreBitForBit) {
  auto single = Open(pack_, manifest_);
  ASSERT_TRUE(single);
  gguf::ShardSet source = Source();
  for (uint32_t n : {1u, 2u, 4u, 8u}) {
    for (uint32_t layer : single->info().active_layer_ids) {
      SCOPED_TRACE("--ep-size " + std::to_string(n) + " layer " + std::to_string(layer));
      std::vector<std::shared_ptr<ExpertStore>> ranks;
      for (uint32_t r = 0; n > 1 && r < n; ++r) ranks.push_back(Open(pack_, manifest_, ep::Rank{n, r}));
      ExpertRunOptions o;
      o.layer = layer;
      o.tokens = 6;
      o.seed = 3 + layer;
      o.ep_size = n;
      auto run = RunRoutedExperts(*single, source, o, ranks);
      ASSERT_TRUE(run.ok()) << run.error().message();
      EXPECT_EQ(run->mismatched_values, 0u) << "the single store differs from the source";
      if (n == 1) {
        EXPECT_TRUE(run->ranks.empty());
        continue;
      }
      ASSERT_EQ(run->from_ranks.size(), run->from_store.size());
      EXPECT_EQ(run->rank_mismatched_values, 0u);
      EXPECT_EQ(run->ranks_sha256, run->store_sha256);
      EXPECT_TRUE(run->matches());
      // Every route went to its owner, and only there.
      uint64_t routes = 0;
      ASSERT_EQ(run->ranks.size(), n);
      for (const EpRankRun& k : run->ranks) {
        routes += k.routes;
        EXPECT_EQ(k.first_expert, k.rank * (16 / n));
      }
      EXPECT_EQ(routes, uint64_t{6} * run->top_k);
    }
  }
}

TEST_F(EpRunExpertsTest, RankPacksServeTheSameAndDamageShows) {
  auto single = Open(pack_, manifest_);
  ASSERT_TRUE(single);
  gguf::ShardSet source = Source();
  const uint32_t layer = single->info().active_layer_ids.front();
  ExpertRunOptions o;
  o.layer = layer;
  o.tokens = 8;
  o.seed = 5;
  o.ep_size = 4;
  // First find a routed expert of rank 2 to damage later.
  std::vector<std::shared_ptr<ExpertStore>> ranks;
  for (uint32_t r = 0; r < 4; ++r) {
    const std::string m = MakeRankPack(4, r);
    ranks.push_back(Open(nlohmann::json::parse(std::ifstream(m))["expert_pack"]["path"], m));
    ASSERT_TRUE(ranks.back());
  }
  auto run = RunRoutedExperts(*single, source, o, ranks);
  ASSERT_TRUE(run.ok()) << run.error().message();
  EXPECT_EQ(run->rank_mismatched_values, 0u);
  int victim = -1;
  for (const auto& experts : run->routed)
    for (uint32_t e : experts)
      if (ep::OwnerOf(e, 16, 4) == 2) victim = static_cast<int>(e);
  ASSERT_GE(victim, 0) << "no token routed to rank 2";
  uint64_t read = 0;
  for (const EpRankRun& k : run->ranks) read += k.bytes_read;
  EXPECT_EQ(read, run->bytes_read) << "each rank reads its own distinct objects, all of them";

  const std::string bad = MakeRankPack(4, 2, victim);
  ranks[2] = Open(nlohmann::json::parse(std::ifstream(bad))["expert_pack"]["path"], bad);
  ASSERT_TRUE(ranks[2]);
  auto damaged = RunRoutedExperts(*single, source, o, ranks);
  ASSERT_TRUE(damaged.ok()) << damaged.error().message();
  EXPECT_GT(damaged->rank_mismatched_values, 0u);
  EXPECT_FALSE(damaged->matches());

  // Ranks in the wrong order are refused.
  std::swap(ranks[0], ranks[1]);
  auto swapped = RunRoutedExperts(*single, source, o, ranks);
  ASSERT_FALSE(swapped.ok());
  EXPECT_NE(swapped.error().message().find("rank store 0"), std::string::npos) << swapped.error().message();
}

// The EP run started one std::thread per rank in a loop: when the process
// could not start one (a pids or address-space limit) after others had
// started, the vector of joinable threads was destroyed while unwinding and
// std::terminate aborted the process. Now the ranks run on the threads the
// process gives (the caller's included), and the outputs are the same.
TEST_F(EpRunExpertsTest, RanksRunOnTheThreadsTheProcessGives) {
#ifdef K3_TEST_UNDER_SANITIZER
  GTEST_SKIP() << "an address-space limit under a sanitizer runtime";
#endif
  gguf::ShardSet source = Source();
  int rc = k3test::InForkedChild([&] {
    ::alarm(60);
    auto single = Open(pack_, manifest_);
    if (!single) ::_exit(2);
    constexpr uint32_t n = 16;  // one expert per rank: 15 threads besides the caller
    std::vector<std::shared_ptr<ExpertStore>> ranks;
    for (uint32_t r = 0; r < n; ++r) {
      ranks.push_back(Open(pack_, manifest_, ep::Rank{n, r}));
      if (!ranks.back()) ::_exit(2);
    }
    ExpertRunOptions o;
    o.layer = single->info().active_layer_ids.front();
    o.tokens = 6;
    o.seed = 11;
    o.ep_size = n;
    // A first run fills the stores' caches, so the second one needs memory
    // for little besides thread stacks.
    auto warm = RunRoutedExperts(*single, source, o, ranks);
    if (!warm.ok() || !warm->matches()) ::_exit(3);
    // 16 MiB more address space: one or two 8 MiB thread stacks (and those
    // glibc keeps from exited threads, at most 40 MiB of them).
    if (!k3test::LimitAddressSpaceGrowth(uint64_t{16} << 20)) ::_exit(4);
    auto run = RunRoutedExperts(*single, source, o, ranks);
    if (!run.ok()) {
      std::fprintf(stderr, "%s\n", run.error().message().c_str());
      ::_exit(5);
    }
    if (!run->matches() || run->ranks_sha256 != warm->ranks_sha256 || run->ranks.size() != n) ::_exit(6);
    ::_exit(0);
  });
  EXPECT_EQ(rc, 0) << "child exit code (134: aborted; 5: an error; 6: other outputs)";
}

TEST_F(EpRunExpertsTest, CliReportsRanksAndTheCheck) {
  CliRun r = Cli("run-experts --manifest " + manifest_ + " --tokens 4 --ep-size 4 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  ASSERT_TRUE(j["all_match"].get<bool>());
  const auto& ep = j["layers"][0]["ep"];
  EXPECT_EQ(ep["ep_size"], 4);
  EXPECT_EQ(ep["ranks"].size(), 4u);
  EXPECT_TRUE(ep["matches_single_store"].get<bool>());
  EXPECT_EQ(ep["ranks_output_sha256"], j["layers"][0]["store_output_sha256"]);
  CliRun text = Cli("run-experts --manifest " + manifest_ + " --tokens 2 --ep-size 2");
  ASSERT_EQ(text.code, 0) << text.out;
  EXPECT_NE(text.out.find("rank 1 (experts 8..15)"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("the 2 ranks' summed partials equal the single store's output"), std::string::npos)
      << text.out;
  // Over rank packs.
  const std::string m0 = MakeRankPack(2, 0), m1 = MakeRankPack(2, 1);
  CliRun packs = Cli("run-experts --manifest " + manifest_ + " --tokens 3 --ep-size 2 --json --rank-manifests " + m0 +
                     "," + m1);
  ASSERT_EQ(packs.code, 0) << packs.out;
  auto pj = nlohmann::json::parse(packs.out.substr(packs.out.find('{')));
  const auto& pr = pj["layers"][0]["ep"]["ranks"];
  EXPECT_EQ(pr[1]["pack"], nlohmann::json::parse(std::ifstream(m1))["expert_pack"]["path"]);
  EXPECT_TRUE(pj["layers"][0]["ep"]["matches_single_store"].get<bool>());
  CliRun swapped = Cli("run-experts --manifest " + manifest_ + " --ep-size 2 --rank-manifests " + m1 + "," + m0);
  // A usage error naming the entry (session 42: it was the store's "EP rank
  // mismatch" with the library's advice, exit 1).
  EXPECT_EQ(swapped.code, 2) << swapped.out;
  EXPECT_NE(swapped.out.find("is the manifest of rank 1 of 2: list them rank 0 first"), std::string::npos)
      << swapped.out;
  // Session 13: a rank manifest of another checkpoint (same layout, other
  // bytes: its shards' SHA-256 differ) ran and only reported a MISMATCH.
  {
    nlohmann::json other = nlohmann::json::parse(std::ifstream(m1));
    ASSERT_TRUE(other["source"]["shards"][0].contains("sha256")) << "the fixture's manifests record shard SHA-256s";
    other["source"]["shards"][0]["sha256"] = std::string(64, 'e');
    const std::string m1_other = dir_ + "/rank1of2-other.manifest.json";
    std::ofstream(m1_other) << other.dump(2);
    CliRun foreign = Cli("run-experts --manifest " + manifest_ + " --ep-size 2 --rank-manifests " + m0 + "," + m1_other);
    EXPECT_EQ(foreign.code, 1) << foreign.out;
    EXPECT_NE(foreign.out.find("EP rank 1: --rank-manifests " + m1_other + " records another source than " +
                               manifest_ + ": shard 0 differs in source.shards[0].sha256"),
              std::string::npos)
        << foreign.out;
  }
  CliRun count = Cli("run-experts --manifest " + manifest_ + " --ep-size 4 --rank-manifests " + m0 + "," + m1);
  EXPECT_EQ(count.code, 2) << count.out;
  EXPECT_NE(count.out.find("--rank-manifests lists 2 manifests for --ep-size 4"), std::string::npos) << count.out;
  // A rank pack's manifest in place of the full one: refused up front with
  // the way to run through rank packs, not at the first foreign route.
  CliRun rank_only = Cli("run-experts --manifest " + m1 + " --tokens 2");
  EXPECT_EQ(rank_only.code, 2) << rank_only.out;
  EXPECT_NE(rank_only.out.find("is the manifest of a rank pack"), std::string::npos) << rank_only.out;
  EXPECT_NE(rank_only.out.find("--ep-size 2 --rank-manifests"), std::string::npos) << rank_only.out;
  const std::string trace = dir_ + "/whole.k3trace";
  ASSERT_EQ(Cli("trace gen --manifest " + manifest_ + " --trace " + trace +
                " --requests 1 --prompt-tokens 1 --decode-tokens 4").code, 0);
  CliRun replay = Cli("trace replay --trace " + trace + " --manifest " + m1 + " --cache-mib 64");
  EXPECT_EQ(replay.code, 1) << replay.out;
  EXPECT_NE(replay.out.find("is the manifest of a rank pack"), std::string::npos) << replay.out;
  EXPECT_NE(replay.out.find("which another rank serves"), std::string::npos) << replay.out;
  CliRun bad = Cli("run-experts --manifest " + manifest_ + " --ep-size 3");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("--ep-size 3 does not divide the 16 routed experts"), std::string::npos) << bad.out;
  // Session 13: a value past an upper bound was called not positive.
  CliRun huge = Cli("run-experts --manifest " + manifest_ + " --ep-size 99999999999");
  EXPECT_EQ(huge.code, 2) << huge.out;
  EXPECT_NE(huge.out.find("--ep-size must be at most 65536, got 99999999999"), std::string::npos) << huge.out;
  CliRun zero = Cli("run-experts --manifest " + manifest_ + " --ep-size 0");
  EXPECT_EQ(zero.code, 2) << zero.out;
  EXPECT_NE(zero.out.find("--ep-size must be at least 1, got 0"), std::string::npos) << zero.out;
}

}  // namespace
}  // namespace k3pack::store
