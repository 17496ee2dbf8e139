// Issue 15, rank stores: an ExpertStore or SlotCache serving one EP rank
// reads, caches and prefetches only the experts SGLang's EP gives that rank,
// refuses routes to any other before any I/O, and together N rank stores
// serve exactly what one full store serves.
//
// Rank packs are made here the way they are defined: the full synthetic pack
// with k3pack.ep in its manifest and every unowned object punched to a hole
// (the digest sidecar is the full pack's, so reading a hole would fail its
// CRC32C check).
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <vector>

#include "k3pack/ep.h"
#include "k3pack/pack.h"
#include "k3pack/slot_cache.h"
#include "k3pack/store.h"
#include "open_ok.h"
#include "store/synthetic_pack.h"
#include "util/sha256.h"

namespace k3pack::store {
namespace {

using testing::PatternByte;
using testing::Get;
using testing::OpenOk;
using testing::TinyPack;
using testing::TinySpec;

TinySpec Spec() {
  TinySpec spec;
  spec.layers = {1, 2};
  spec.num_hidden_layers = 3;
  spec.experts = 16;
  spec.top_k = 4;
  return spec;
}

// Turns `p` into rank `r`'s pack: the sidecar of the full pack, k3pack.ep in
// the manifest, every unowned object a hole.
void MakeRankPack(TinyPack& p, ep::Rank r) {
  ASSERT_TRUE(p.WriteDigestSidecar(true).ok());
  const uint32_t experts = p.spec().experts;
  const ep::ExpertRange owned = ep::OwnedExperts(r, experts);
  UniqueFd fd(::open(p.pack.c_str(), O_RDWR));
  ASSERT_GE(fd.get(), 0);
  for (uint32_t li = 0; li < p.layout.num_layers(); ++li)
    for (uint32_t e = 0; e < experts; ++e) {
      if (owned.contains(e)) continue;
      ASSERT_EQ(::fallocate(fd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                              static_cast<off_t>(p.layout.ObjectOffset(li, e)),
                              static_cast<off_t>(p.layout.ObjectBytes(li))),
                  0)
          << "fallocate(PUNCH_HOLE) failed";
    }
  if (!p.json.contains("k3pack")) p.json["k3pack"] = {{"profile", "kimi-k3"}};
  p.json["k3pack"]["ep"] = {{"size", r.size}, {"rank", r.rank}, {"first_expert", owned.first},
                            {"end_expert", owned.end}};
  p.Save();
}

StoreOptions EpOpts(std::optional<ep::Rank> rank = std::nullopt) {
  StoreOptions o;
  o.cache_bytes = 64ull * 12288;
  o.policy = "lru";
  o.queue_depth = 4;
  o.ep = rank;
  return o;
}

std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

// Every byte of the view is the full pack's object (layer, expert).
::testing::AssertionResult HoldsObject(const ExpertView& v) {
  const std::span<const uint8_t> roles[3] = {v.up, v.gate, v.down};
  for (uint32_t r = 0; r < 3; ++r)
    for (uint64_t i = 0; i < roles[r].size(); ++i)
      if (roles[r][i] != PatternByte(v.layer, v.expert, r, i))
        return ::testing::AssertionFailure() << "layer " << v.layer << " expert " << v.expert << " role " << r
                                             << " byte " << i << " differs from the full pack";
  return ::testing::AssertionSuccess();
}

TEST(EpStore, RankPackOpensAsItsRankAndReportsIt) {
  TinyPack p(Spec(), "ep-open");
  MakeRankPack(p, {4, 1});
  auto s = OpenOk(p, EpOpts());
  ASSERT_TRUE(s);
  EXPECT_EQ(s->info().ep.size, 4u);
  EXPECT_EQ(s->info().ep.rank, 1u);
  EXPECT_EQ(s->info().owned_experts.first, 4u);
  EXPECT_EQ(s->info().owned_experts.end, 8u);
  const auto ep = s->Snapshot()["k3pack"]["ep"];
  EXPECT_EQ(ep["size"], 4);
  EXPECT_EQ(ep["rank"], 1);
  EXPECT_EQ(ep["first_expert"], 4);
  EXPECT_EQ(ep["end_expert"], 8);
  EXPECT_EQ(ep["owned_objects"], 8);  // 2 layers x 4 experts
  EXPECT_EQ(ep["owned_bytes"], 8 * 12288);
  EXPECT_EQ(ep["source"], "manifest");
  // A full store says so.
  TinyPack f(Spec(), "ep-open-full");
  auto whole = OpenOk(f, EpOpts());
  ASSERT_TRUE(whole);
  EXPECT_EQ(whole->Snapshot()["k3pack"]["ep"]["size"], 1);
  EXPECT_EQ(whole->Snapshot()["k3pack"]["ep"]["owned_objects"], 32);
}

TEST(EpStore, UnownedAcquireAndPrefetchAreRefusedBeforeAnyRead) {
  TinyPack p(Spec(), "ep-refuse");
  MakeRankPack(p, {4, 1});
  auto s = OpenOk(p, EpOpts());
  ASSERT_TRUE(s);
  std::vector<uint64_t> reads;
  s->SetReadFaultHook([&](uint64_t off, uint64_t, int64_t*) { reads.push_back(off); });
  const std::string want =
      "layer 2 expert 13 is not served by this EP rank store, rank 1 of 4 (experts 4..7): rank 3 owns it; "
      "SGLang's EP never routes it here: a routing bug";
  // An owned expert next to the stray one is not read either: the check runs first.
  auto a = Get(*s, 2, {5, 13});
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.error().message(), want);
  EXPECT_EQ(a.error().kind(), ErrorKind::kValue);
  const int64_t ids[] = {6, 13};
  Status pf = s->Prefetch(2, ids);
  ASSERT_FALSE(pf.ok());
  EXPECT_EQ(pf.error().message(), want);
  auto low = Get(*s, 1, {0});
  ASSERT_FALSE(low.ok());
  EXPECT_EQ(low.error().message(),
            "layer 1 expert 0 is not served by this EP rank store, rank 1 of 4 (experts 4..7): rank 0 owns it; "
            "SGLang's EP never routes it here: a routing bug");
  EXPECT_TRUE(reads.empty());
  const auto snap = s->Snapshot();
  EXPECT_EQ(snap["pack_reads"], 0);
  EXPECT_EQ(snap["cache_misses"], 0);
  EXPECT_EQ(snap["k3pack"]["prefetch_issued"], 0);
  // A refused call is not a route call (like SGLang's route checks).
  EXPECT_EQ(snap["route_calls_by_layer"][2], 0);
}

TEST(EpStore, ExplicitRankMustAgreeWithTheRankPack) {
  TinyPack p(Spec(), "ep-mismatch");
  MakeRankPack(p, {4, 1});
  auto other = ExpertStore::Open(p.pack, p.manifest, EpOpts(ep::Rank{4, 2}));
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(FirstLine(other.error().message()), "EP rank mismatch: the store was opened as rank 2 of 4 (experts 8..11), but " +
                                         p.manifest + " describes a rank pack of rank 1 of 4 (experts 4..7)");
  auto size = ExpertStore::Open(p.pack, p.manifest, EpOpts(ep::Rank{2, 0}));
  ASSERT_FALSE(size.ok());
  EXPECT_NE(size.error().message().find("opened as rank 0 of 2 (experts 0..7)"), std::string::npos)
      << size.error().message();
  auto same = ExpertStore::Open(p.pack, p.manifest, EpOpts(ep::Rank{4, 1}));
  ASSERT_TRUE(same.ok()) << same.error().message();
  EXPECT_EQ((*same)->Snapshot()["k3pack"]["ep"]["source"], "manifest and option");
  auto bad = ExpertStore::Open(p.pack, p.manifest, EpOpts(ep::Rank{3, 0}));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message().rfind("EP size 3 does not divide the 16 routed experts", 0), 0u)
      << bad.error().message();
}

// A rank pack opened with the full pack's manifest (no k3pack.ep): its
// version-3 digest sidecar still says which experts the file holds, so the
// store refuses to serve the holes instead of calling them damage later.
TEST(EpStore, RankSidecarRefusesAStoreThatWouldServeOtherRanks) {
  TinyPack p(Spec(), "ep-sidecar");
  MakeRankPack(p, {4, 1});
  const std::string sidecar = pack::DigestsPathFor(p.pack);
  auto d = pack::ReadPackDigests(sidecar);
  ASSERT_TRUE(d.ok()) << d.error().message();
  d->ep = ep::Rank{4, 1};
  d->num_experts = p.spec().experts;
  for (uint64_t i = 0; i < d->index_count; ++i) {
    if (d->present(i)) continue;
    d->entry_sha256[i] = {};
    d->entry_crc32c[i] = 0;
  }
  ASSERT_TRUE(pack::WritePackDigests(sidecar, *d).ok());
  p.json["k3pack"].erase("ep");  // the full pack's manifest
  p.Save();
  auto whole = ExpertStore::Open(p.pack, p.manifest, EpOpts());
  ASSERT_FALSE(whole.ok());
  EXPECT_NE(whole.error().message().find(" holds only the experts of EP rank 1 of 4 (experts 4..7)"), std::string::npos)
      << whole.error().message();
  EXPECT_NE(whole.error().message().find("but this store would serve every expert"), std::string::npos);
  EXPECT_NE(whole.error().message().find("ep_rank=1 and ep_size=4"), std::string::npos);
  auto other = ExpertStore::Open(p.pack, p.manifest, EpOpts(ep::Rank{4, 2}));
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.error().message().find("would serve EP rank 2 of 4"), std::string::npos) << other.error().message();
  // Its own rank (or a finer rank inside the same block) opens.
  EXPECT_TRUE(ExpertStore::Open(p.pack, p.manifest, EpOpts(ep::Rank{4, 1})).ok());
  EXPECT_TRUE(ExpertStore::Open(p.pack, p.manifest, EpOpts(ep::Rank{8, 3})).ok());
}

TEST(EpStore, ManifestRangeMustBeTheRanksBlock) {
  TinyPack p(Spec(), "ep-range");
  MakeRankPack(p, {4, 1});
  // A block shape the manifest parser accepts, but not rank 1 of 4's for 16 experts.
  p.json["k3pack"]["ep"]["first_expert"] = 1;
  p.json["k3pack"]["ep"]["end_expert"] = 2;
  p.Save();
  auto r = ExpertStore::Open(p.pack, p.manifest, EpOpts());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message(), p.manifest +
                                     ": k3pack.ep records experts [1, 2) for rank 1 of 4, but that rank owns [4, 8) "
                                     "of 16 experts: the manifest was edited");
}

TEST(EpStore, OwnedBytesEqualTheFullPackAndHolesAreNeverRead) {
  for (uint32_t n : {1u, 2u, 4u, 8u}) {
    for (uint32_t rank = 0; rank < n; rank += (n > 2 ? n - 1 : 1)) {  // first and last rank
      SCOPED_TRACE("rank " + std::to_string(rank) + " of " + std::to_string(n));
      TinyPack p(Spec(), "ep-bytes");
      MakeRankPack(p, {n, rank});
      auto s = OpenOk(p, EpOpts());
      ASSERT_TRUE(s);
      const ep::ExpertRange owned = ep::OwnedExperts({n, rank}, 16);
      for (uint32_t layer : {1u, 2u}) {
        for (uint32_t e = owned.first; e < owned.end; ++e) {
          // Rank 0 of 1 is the whole model: SGLang's full rows (duplicates kept).
          std::vector<int64_t> row(n == 1 ? 4 : 1, int64_t{e});
          auto a = Get(*s, layer, row);
          ASSERT_TRUE(a.ok()) << a.error().message();
          ASSERT_EQ(a->routes.size(), row.size());
          EXPECT_TRUE(HoldsObject(a->routes[0]));
          ASSERT_TRUE(s->MarkUsed(*a).ok());
        }
      }
      const auto snap = s->Snapshot();
      const uint64_t objects = 2ull * owned.count();
      EXPECT_EQ(snap["pack_reads"], objects);
      EXPECT_EQ(snap["pack_read_bytes"], objects * 12288);
      EXPECT_EQ(snap["k3pack"]["checksum_errors"], 0);
      EXPECT_EQ(snap["k3pack"]["checksum_verified_objects"], objects);
    }
  }
}

TEST(EpStore, ExplicitRankOverTheFullPack) {
  TinyPack p(Spec(), "ep-full");
  ASSERT_TRUE(p.WriteDigestSidecar(true).ok());
  auto s = OpenOk(p, EpOpts(ep::Rank{2, 1}));
  ASSERT_TRUE(s);
  EXPECT_EQ(s->Snapshot()["k3pack"]["ep"]["source"], "option");
  auto a = Get(*s, 1, {8, 15, 8});
  ASSERT_TRUE(a.ok()) << a.error().message();
  ASSERT_EQ(a->routes.size(), 3u);
  for (const auto& v : a->routes) EXPECT_TRUE(HoldsObject(v));
  ASSERT_TRUE(s->MarkUsed(*a).ok());
  auto b = Get(*s, 1, {7});
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.error().message().find("rank 0 owns it"), std::string::npos);
}

TEST(EpStore, RowsHoldATokensShareOfItsRoutes) {
  TinyPack p(Spec(), "ep-width");
  auto full = OpenOk(p, EpOpts());
  auto rank = OpenOk(p, EpOpts(ep::Rank{4, 0}));
  ASSERT_TRUE(full && rank);
  // SGLang's full store: exactly top_k per row.
  auto f = Get(*full, 1, {1});
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.error().message(), "runtime top-k must be exactly 4; received shape (1, 1)");
  // A rank store: 1..top_k (the token's routes to this rank).
  for (std::vector<int64_t> ids : {std::vector<int64_t>{1}, {0, 3}, {0, 1, 2, 3}}) {
    auto a = Get(*rank, 1, ids);
    ASSERT_TRUE(a.ok()) << a.error().message();
    ASSERT_TRUE(rank->MarkUsed(*a).ok());
  }
  auto wide = Get(*rank, 1, {0, 1, 2, 3, 0});
  ASSERT_FALSE(wide.ok());
  EXPECT_EQ(wide.error().message(), "an EP rank's routes must be 1..4 per token; received shape (1, 5)");
}

TEST(EpStore, CacheBudgetCountsTheOwnedWorkingSet) {
  TinyPack p(Spec(), "ep-budget");
  StoreOptions o = EpOpts();
  o.cache_bytes = 2 * 12288;  // two objects; top_k is 4
  auto full = ExpertStore::Open(p.pack, p.manifest, o);
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.error().kind(), ErrorKind::kMemory);
  o.ep = ep::Rank{8, 3};  // owns 2 experts: a token never needs more than 2 resident
  auto rank = ExpertStore::Open(p.pack, p.manifest, o);
  ASSERT_TRUE(rank.ok()) << rank.error().message();
  auto a = Get(**rank, 2, {6, 7});
  ASSERT_TRUE(a.ok()) << a.error().message();
}

TEST(EpStore, SlotCacheServesOnlyItsRank) {
  TinyPack p(Spec(), "ep-slots");
  MakeRankPack(p, {2, 1});
  SlotCacheOptions o;
  auto opened = SlotCache::Open(p.pack, p.manifest, o);
  ASSERT_TRUE(opened.ok()) << opened.error().message();
  auto& cache = *opened;
  EXPECT_EQ(cache->info().ep.size, 2u);
  const uint64_t bytes = cache->slot_bytes();
  std::vector<uint8_t> raw(8 * bytes + 4096);
  uint8_t* base = raw.data() + ((4096 - reinterpret_cast<uintptr_t>(raw.data()) % 4096) % 4096);
  ASSERT_TRUE(cache->AttachHost(base, 8).ok());
  const int64_t stray[] = {9, 3};
  const int64_t shape[] = {1, 2};
  auto bad = cache->Acquire(2, stray, shape, std::nullopt);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message(),
            "layer 2 expert 3 is not served by this EP rank store, rank 1 of 2 (experts 8..15): rank 0 owns it; "
            "SGLang's EP never routes it here: a routing bug");
  EXPECT_EQ(cache->Snapshot()["pack_reads"], 0);
  const int64_t ids[] = {9, 15};
  auto slots = cache->Acquire(2, ids, shape, std::nullopt);
  ASSERT_TRUE(slots.ok()) << slots.error().message();
  for (size_t i = 0; i < 2; ++i) {
    ExpertView v;
    v.layer = 2;
    v.expert = static_cast<uint32_t>(ids[i]);
    const uint8_t* slot = base + uint64_t((*slots)[i]) * bytes;
    v.up = {slot, 4096};
    v.gate = {slot + 4096, 4096};
    v.down = {slot + 8192, 4096};
    EXPECT_TRUE(HoldsObject(v));
  }
  EXPECT_EQ(cache->Snapshot()["k3pack"]["checksum_errors"], 0);
  // The slot count a rank needs is its working set too.
  auto small = SlotCache::Open(p.pack, p.manifest, o);
  ASSERT_TRUE(small.ok());
  std::vector<uint8_t> raw2(4 * bytes + 4096);
  uint8_t* base2 = raw2.data() + ((4096 - reinterpret_cast<uintptr_t>(raw2.data()) % 4096) % 4096);
  EXPECT_TRUE((*small)->AttachHost(base2, 4).ok());
}

// ---------------------------------------------------------------- 4 processes

struct Route {
  uint32_t layer;
  std::vector<int64_t> experts;  // one token's top-k, distinct
};

// A deterministic trace: `tokens` tokens through every active layer.
std::vector<Route> MakeTrace(uint32_t tokens, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Route> out;
  for (uint32_t t = 0; t < tokens; ++t) {
    for (uint32_t layer : {1u, 2u}) {
      std::vector<int64_t> all(16);
      for (int64_t e = 0; e < 16; ++e) all[e] = e;
      std::shuffle(all.begin(), all.end(), rng);
      out.push_back({layer, {all.begin(), all.begin() + 4}});
    }
  }
  return out;
}

// Replays the routes `rank` owns (all of them for a whole store), one call
// per token per layer, and returns "layer expert sha256" per acquired route
// plus the store's pack_read_bytes.
Result<std::pair<std::set<std::string>, uint64_t>> Replay(const std::string& pack, const std::string& manifest,
                                                          ep::Rank rank, const std::vector<Route>& trace) {
  K3_ASSIGN_OR_RETURN(auto s, ExpertStore::Open(pack, manifest, EpOpts()));
  if (s->info().ep.size != rank.size || s->info().ep.rank != rank.rank) return Error("opened the wrong rank");
  std::set<std::string> seen;
  for (const Route& r : trace) {
    std::vector<int64_t> mine;
    for (int64_t e : r.experts)
      if (ep::OwnerOf(static_cast<uint32_t>(e), 16, rank.size) == rank.rank) mine.push_back(e);
    if (mine.empty()) continue;
    const int64_t shape[2] = {1, static_cast<int64_t>(mine.size())};
    K3_ASSIGN_OR_RETURN(Acquisition a, s->Acquire(r.layer, mine, shape));
    for (const ExpertView& v : a.routes)
      seen.insert(std::to_string(v.layer) + " " + std::to_string(v.expert) + " " +
                  Sha256Hex(v.bytes.data(), v.bytes.size()));
    K3_RETURN_IF_ERROR(s->MarkUsed(a));
  }
  const uint64_t read = s->Snapshot()["pack_read_bytes"].get<uint64_t>();
  K3_RETURN_IF_ERROR(s->Close());
  return std::make_pair(seen, read);
}

TEST(EpStore, FourProcessesTogetherAcquireWhatOneFullStoreAcquires) {
  TinyPack full(Spec(), "ep-4p-full");
  ASSERT_TRUE(full.WriteDigestSidecar(true).ok());
  std::vector<std::unique_ptr<TinyPack>> ranks;
  for (uint32_t r = 0; r < 4; ++r) {
    ranks.push_back(std::make_unique<TinyPack>(Spec(), "ep-4p-rank"));
    MakeRankPack(*ranks.back(), {4, r});
  }
  const std::vector<Route> trace = MakeTrace(48, 15);
  const std::string out_dir = TinyPack::TempDir("ep-4p-out");
  std::vector<pid_t> children;
  for (uint32_t r = 0; r < 4; ++r) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // The child: its own store over its own rank pack, its share of the trace.
      auto got = Replay(ranks[r]->pack, ranks[r]->manifest, {4, r}, trace);
      std::ofstream f(out_dir + "/rank" + std::to_string(r) + ".txt");
      if (!got.ok()) {
        f << "error " << got.error().message() << "\n";
        ::_exit(1);
      }
      f << "read " << got->second << "\n";
      for (const std::string& line : got->first) f << line << "\n";
      f.close();
      ::_exit(f ? 0 : 2);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "a rank process failed";
  }
  std::set<std::string> united;
  std::map<std::string, int> owners;  // "layer expert" -> ranks that acquired it
  uint64_t rank_reads = 0;
  for (uint32_t r = 0; r < 4; ++r) {
    std::ifstream f(out_dir + "/rank" + std::to_string(r) + ".txt");
    std::string line;
    ASSERT_TRUE(std::getline(f, line));
    ASSERT_EQ(line.rfind("read ", 0), 0u) << line;
    rank_reads += std::stoull(line.substr(5));
    size_t lines = 0;
    while (std::getline(f, line)) {
      ++lines;
      united.insert(line);
      std::istringstream in(line);
      std::string layer, expert;
      in >> layer >> expert;
      ++owners[layer + " " + expert];
      EXPECT_EQ(ep::OwnerOf(std::stoul(expert), 16, 4), r) << line;
    }
    EXPECT_GT(lines, 0u);
  }
  std::filesystem::remove_all(out_dir);
  auto single = Replay(full.pack, full.manifest, {1, 0}, trace);
  ASSERT_TRUE(single.ok()) << single.error().message();
  EXPECT_EQ(united, single->first);
  for (const auto& [key, n] : owners) EXPECT_EQ(n, 1) << key << " acquired by " << n << " ranks";
  // The cache holds every object: each distinct object is read once, by its rank alone.
  EXPECT_EQ(rank_reads, single->second);
}

}  // namespace
}  // namespace k3pack::store
