// ExpertStore::Open: every §6.7 start-up error provoked by a corrupted pack
// or manifest, in SGLang's order and with its exact text.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>

#include "k3pack/slot_cache.h"
#include "k3pack/store.h"
#include "store/store_impl.h"
#include "open_ok.h"
#include "store/synthetic_pack.h"

namespace k3pack::store {
namespace {

using testing::K3Model;
using testing::TinyPack;
using testing::TinySpec;

StoreOptions Small() { return testing::SmallStore(); }

using testing::OpenError;

// SGLang's line: the first of the message (k3pack's hint follows it).
std::string Headline(const std::string& message) { return message.substr(0, message.find('\n')); }

TEST(StoreOpen, ValidTinyPackOpens) {
  TinyPack p(TinySpec{});
  auto s = ExpertStore::Open(p.pack, p.manifest, Small());
  ASSERT_TRUE(s.ok()) << s.error().message();
  const StoreInfo& info = (*s)->info();
  EXPECT_EQ(info.profile, "scaled");
  EXPECT_EQ(info.active_layer_ids, (std::vector<uint32_t>{1, 2}));
  EXPECT_EQ(info.object_bytes, (std::vector<uint64_t>{12288, 12288}));
  EXPECT_EQ(info.effective_capacity_objects, (1u << 20) / 12288);
  EXPECT_EQ(info.index_count, 2u * 8 * 3);
}

TEST(StoreOpen, MissingFiles) {
  TinyPack p(TinySpec{});
  ErrorKind kind{};
  auto s = ExpertStore::Open(p.pack + ".nope", p.manifest, Small());
  ASSERT_FALSE(s.ok());
  // SGLang's text, then which of the two is the problem.
  EXPECT_EQ(s.error().message(), "Kimi expert-pack or manifest is missing: " + p.pack + ".nope, " + p.manifest +
                                     "\nhint: the pack " + p.pack + ".nope does not exist");
  EXPECT_EQ(s.error().kind(), ErrorKind::kFileNotFound);
  (void)kind;
}

TEST(StoreOpen, IncompleteOrUnsupportedManifest) {
  TinyPack p(TinySpec{});
  p.json["complete"] = false;
  p.Save();
  // SGLang's text, then a hint naming the file and what it lacks.
  const std::string text = "Kimi expert-pack manifest is incomplete or unsupported\nhint: " + p.manifest + ": ";
  EXPECT_EQ(OpenError(p).rfind(text + "its \"complete\" is false (", 0), 0u) << OpenError(p);
  p.json["complete"] = true;
  p.json["format"] = "SGLANG-EXPERTPACK-v1";
  p.Save();
  EXPECT_EQ(OpenError(p).rfind(text + "its \"format\" is \"SGLANG-EXPERTPACK-v1\", not \"SGLANG-KIMI-GGMLMOEPACK-ADAPTER-v1\"", 0), 0u)
      << OpenError(p);
}

TEST(StoreOpen, HardConstraints) {
  TinyPack p(TinySpec{});
  p.json["hard_constraints"]["expert_pruning_allowed"] = true;
  p.Save();
  EXPECT_EQ(OpenError(p), "Kimi manifest hard constraints do not match runtime policy");
  p.json["hard_constraints"] = p.MakeManifest()["hard_constraints"];
  p.json["hard_constraints"]["extra"] = 1;
  p.Save();
  EXPECT_EQ(OpenError(p), "Kimi manifest hard constraints do not match runtime policy");
}

TEST(StoreOpen, KimiProfileDimensions) {
  TinySpec spec;
  spec.kimi_profile = true;
  TinyPack p(spec);
  EXPECT_EQ(OpenError(p), "Kimi expert-pack dimensions (3, 8, 2) != (93, 896, 16); Top-K is immutable at 16");
  // Right dimensions, wrong active layers.
  K3Model(p, 91);
  p.Save();
  EXPECT_EQ(OpenError(p), "Kimi active routed MoE layers must be exactly 1..92");
  // A caller expecting another top-k: still immutable at 16.
  StoreOptions o = Small();
  o.expected_top_k = 8;
  EXPECT_EQ(OpenError(p, o), "Kimi expert-pack dimensions (93, 896, 16) != (93, 896, 8); Top-K is immutable at 16");
}

TEST(StoreOpen, ScaledProfileUsesExpectedDimensionsWhenGiven) {
  TinyPack p(TinySpec{});
  StoreOptions o = Small();
  o.expected_experts = 16;
  EXPECT_EQ(OpenError(p, o), "Kimi expert-pack dimensions (3, 8, 2) != (3, 16, 2); Top-K is immutable at 16");
}

TEST(StoreOpen, PathSizeAndRoleOrder) {
  TinyPack p(TinySpec{});
  p.json["expert_pack"]["path"] = p.dir + "/other.pack";
  p.Save();
  const std::string e = OpenError(p);
  EXPECT_EQ(e.substr(0, e.find('\n')), "Kimi manifest expert-pack path does not match pack_path");
  // The hint names both paths.
  EXPECT_NE(e.find(p.dir + "/other.pack"), std::string::npos) << e;
  EXPECT_NE(e.find(p.pack), std::string::npos) << e;
  // The same file through a symlink resolves equal.
  std::filesystem::create_symlink(p.pack, p.dir + "/link.pack");
  p.json["expert_pack"]["path"] = p.dir + "/link.pack";
  p.Save();
  EXPECT_EQ(OpenError(p), "OK");
  const uint64_t size = p.json["expert_pack"]["size"].get<uint64_t>();
  p.json["expert_pack"]["size"] = size + 1;
  p.Save();
  EXPECT_EQ(OpenError(p).rfind("Kimi expert-pack size does not match its manifest\nhint: " + p.pack + " is " +
                                   std::to_string(size) + " bytes, the manifest " + p.manifest + " records " +
                                   std::to_string(size + 1) + ": ",
                               0),
            0u)
      << OpenError(p);
  p.json = p.MakeManifest();
  p.json["expert_pack"]["physical_role_order"] = {"gate", "up", "down"};
  p.Save();
  EXPECT_EQ(OpenError(p), "Kimi expert-pack physical role order is unsupported");
}

TEST(StoreOpen, QuantTypesAndRoleSizes) {
  TinySpec spec;
  spec.kimi_profile = true;
  TinyPack k(spec);
  // Reach check 9 on the strict profile: K3 dimensions and layers.
  K3Model(k);
  k.json["expert_pack"]["roles"]["gate"]["dtype"] = "Q4_K";
  k.Save();
  EXPECT_EQ(OpenError(k), "Kimi expert-pack gate quant type is unsupported");
  k.json["expert_pack"]["roles"]["gate"]["dtype"] = "Q2_K";
  k.json["expert_pack"]["roles"]["down"]["dtype_id"] = 10;
  k.Save();
  EXPECT_EQ(OpenError(k), "Kimi expert-pack down quant type is unsupported");
  k.json["expert_pack"]["roles"]["down"]["dtype_id"] = 11;
  k.json["expert_pack"]["object_bytes"] = 4096;
  k.Save();
  EXPECT_EQ(OpenError(k), "Kimi expert-pack role sizes do not match object bytes");

  TinyPack p(TinySpec{});
  p.json["k3pack"]["layer_roles"][1]["up"]["dtype_id"] = 11;  // Q2_K is 10
  p.Save();
  EXPECT_EQ(OpenError(p).substr(0, 46), "Kimi expert-pack up quant type is unsupported\n");  // + hint
  p.json = p.MakeManifest();
  p.json["k3pack"]["layer_roles"][0]["object_bytes"] = 4096;
  p.Save();
  EXPECT_EQ(OpenError(p).substr(0, 54), "Kimi expert-pack role sizes do not match object bytes\n");  // + hint
}

// LoadRoles added the roles' expert_bytes in int64 unchecked (undefined on
// overflow), and a k3pack.layer_roles entry's in uint64: sizes whose sum
// wraps round to object_bytes passed check 10 and failed later as another
// fault. Python's exact sum never matches: SGLang's text, and a hint naming
// the manifest, the layer and the rule.
TEST(StoreOpen, RoleSizesWhoseSumOverflowsAreRefused) {
  TinySpec spec;
  spec.kimi_profile = true;
  TinyPack k(spec);
  K3Model(k);
  const int64_t object_bytes = k.json["expert_pack"]["object_bytes"].get<int64_t>();
  k.json["expert_pack"]["roles"]["up"]["expert_bytes"] = INT64_MAX;
  k.json["expert_pack"]["roles"]["gate"]["expert_bytes"] = INT64_MAX;
  k.json["expert_pack"]["roles"]["down"]["expert_bytes"] = object_bytes + 2;  // wraps round to object_bytes
  k.Save();
  std::string e = OpenError(k);
  EXPECT_EQ(e.substr(0, 54), "Kimi expert-pack role sizes do not match object bytes\n") << e;
  EXPECT_NE(e.find(k.manifest), std::string::npos) << e;
  EXPECT_NE(e.find("expert_pack.roles"), std::string::npos) << e;
  EXPECT_NE(e.find("every active layer"), std::string::npos) << e;
  EXPECT_NE(e.find("overflow"), std::string::npos) << e;

  TinyPack p(TinySpec{});
  auto& lr = p.json["k3pack"]["layer_roles"][1];
  const uint64_t half = uint64_t{1} << 63;
  lr["up"]["expert_bytes"] = lr["up"]["expert_bytes"].get<uint64_t>() + half;
  lr["gate"]["expert_bytes"] = lr["gate"]["expert_bytes"].get<uint64_t>() + half;  // the sum wraps by 2^64
  p.Save();
  e = OpenError(p);
  EXPECT_EQ(e.substr(0, 54), "Kimi expert-pack role sizes do not match object bytes\n") << e;
  EXPECT_NE(e.find(p.manifest), std::string::npos) << e;
  EXPECT_NE(e.find("k3pack.layer_roles entry for layer " + std::to_string(lr["layer"].get<uint32_t>())),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("overflow"), std::string::npos) << e;
}

TEST(StoreOpen, HeaderChecks) {
  TinyPack p(TinySpec{});
  p.json["expert_pack"]["data_start"] = p.layout.data_start() + 4096;
  p.Save();
  EXPECT_EQ(Headline(OpenError(p)), "Kimi expert-pack header does not match its manifest");
  p.json = p.MakeManifest();
  p.Save();
  p.Patch(0, "X", 1);
  EXPECT_EQ(Headline(OpenError(p)), "Kimi expert-pack header does not match its manifest");
  // The hint names the file and the field (SGLang's line names neither).
  EXPECT_NE(OpenError(p).find("the header of " + p.pack + ": its magic is not GGMLMOEPACKv1"), std::string::npos)
      << OpenError(p);
  std::filesystem::resize_file(p.pack, 20);
  p.SetSizeFromFile();
  EXPECT_EQ(OpenError(p), "Kimi expert-pack header is truncated");
}

TEST(StoreOpen, IndexTruncated) {
  // SGLang reads the index entry by entry: a cut inside entry 0 is the
  // truncation text; after complete entries, entry 0's range check fails
  // first (its payload lies past the end of the file).
  TinyPack p(TinySpec{});
  std::filesystem::resize_file(p.pack, 40 + 100);
  p.SetSizeFromFile();
  std::string e = OpenError(p);
  EXPECT_EQ(e.substr(0, e.find('\n')), "Kimi expert-pack index is truncated");
  TinyPack q(TinySpec{});
  std::filesystem::resize_file(q.pack, 40 + 152 * 10);
  q.SetSizeFromFile();
  EXPECT_EQ(Headline(OpenError(q)), "Kimi expert-pack range mismatch at index 0");
}

TEST(StoreOpen, EntryIdentity) {
  TinyPack p(TinySpec{});
  p.Patch(p.EntryOffset(3), "blk.2", 5);  // entry 3 is layer 1 expert 1 up
  EXPECT_EQ(Headline(OpenError(p)), "Kimi expert-pack identity mismatch at index 3");
  EXPECT_NE(OpenError(p).find(") should name blk.1.ffn_up_exps.weight expert 1"), std::string::npos) << OpenError(p);
  p.WritePack();
  int32_t wrong = 5;
  p.Patch(p.EntryOffset(0) + 128, &wrong, 4);
  EXPECT_EQ(Headline(OpenError(p)), "Kimi expert-pack identity mismatch at index 0");
  p.WritePack();
  uint32_t reserved = 1;
  p.Patch(p.EntryOffset(7) + 132, &reserved, 4);
  EXPECT_EQ(Headline(OpenError(p)), "Kimi expert-pack identity mismatch at index 7");
  p.WritePack();
  p.Patch(p.EntryOffset(4), "blk.1.ffn_up_exps.weight\0", 25);  // entry 4 must be gate
  EXPECT_EQ(Headline(OpenError(p)), "Kimi expert-pack identity mismatch at index 4");
  p.WritePack();
  p.Patch(p.EntryOffset(2), "\xff\xfe", 2);  // not UTF-8: SGLang's strict decode fails first
  const std::string not_utf8 = OpenError(p);
  EXPECT_EQ(not_utf8.substr(0, not_utf8.find('\n')),
            "'utf-8' codec can't decode byte 0xff in position 0: invalid start byte");
  p.WritePack();
  // A name Python's regex accepts too (leading zero) is the same identity.
  const char name[] = "blk.01.ffn_up_exps.weight";
  std::vector<char> field(128, 0);
  std::copy(name, name + sizeof(name) - 1, field.begin());
  p.Patch(p.EntryOffset(0), field.data(), 128);
  p.RehashIndex();
  EXPECT_EQ(OpenError(p), "OK");
}

TEST(StoreOpen, EntryRangesAndContiguity) {
  TinyPack p(TinySpec{});
  uint64_t v = 4097;  // SGLang's own test: an unaligned entry-0 offset
  p.Patch(p.EntryOffset(0) + 136, &v, 8);
  EXPECT_EQ(Headline(OpenError(p)), "Kimi expert-pack range mismatch at index 0");
  p.WritePack();
  v = 100;
  p.Patch(p.EntryOffset(5) + 144, &v, 8);  // nbytes
  EXPECT_EQ(OpenError(p).substr(0, 43), "Kimi expert-pack range mismatch at index 5\n");  // + hint
  p.WritePack();
  // gate of object 0 moved one page further: aligned, increasing, not contiguous.
  v = p.layout.data_start() + 8192;
  p.Patch(p.EntryOffset(1) + 136, &v, 8);
  const uint64_t moved = v;
  const std::string contiguity = OpenError(p);
  EXPECT_EQ(contiguity.substr(0, contiguity.find('\n')), "Kimi expert object is not contiguous at index 1");
  EXPECT_NE(contiguity.find("\nhint: entry 1 starts at byte " + std::to_string(moved) +
                            "; its object's first role, index entry 0, starts at byte " +
                            std::to_string(p.layout.data_start())),
            std::string::npos)
      << contiguity;
  p.WritePack();
  // Entry 2's offset moved back into entry 1's bytes: SGLang's text names entry 2, the hint both.
  v = p.layout.data_start() + 4096;
  p.Patch(p.EntryOffset(2) + 136, &v, 8);
  const std::string overlap = OpenError(p);
  EXPECT_EQ(overlap.substr(0, overlap.find('\n')), "Kimi expert-pack range mismatch at index 2");
  EXPECT_NE(overlap.find("before the end of index entry 1 (byte " + std::to_string(p.layout.data_start() + 8192) + ")"),
            std::string::npos)
      << overlap;
  p.WritePack();
  v = p.layout.final_size();  // last entry past EOF
  p.Patch(p.EntryOffset(p.layout.index_count() - 1) + 136, &v, 8);
  EXPECT_EQ(Headline(OpenError(p)), "Kimi expert-pack range mismatch at index " + std::to_string(p.layout.index_count() - 1));
}

TEST(StoreOpen, TrailingBytesAndDigests) {
  TinyPack p(TinySpec{});
  std::filesystem::resize_file(p.pack, p.layout.final_size() + 4096);
  p.SetSizeFromFile();
  EXPECT_EQ(OpenError(p), "Kimi expert-pack file has trailing or missing bytes");
  p.WritePack();
  p.json = p.MakeManifest();
  p.json["expert_pack"]["index_sha256"] = std::string(64, '0');
  p.Save();
  // SGLang's text, then the files and where the damage is: here not in the pack.
  const std::string digest = OpenError(p).substr(OpenError(p).find(" hashes to ") + 11, 64);
  EXPECT_EQ(OpenError(p),
            "Kimi expert-pack index SHA-256 does not match manifest\n"
            "hint: the index of " + p.pack + " hashes to " + digest + ", " + p.manifest + " records " +
                std::string(64, '0') +
                "; the header and every index entry are in canonical form: the manifest's index_sha256 belongs to "
                "other bytes");
  p.json = p.MakeManifest();
  p.Save();
  StoreOptions o = Small();
  o.verify_pack_sha256 = true;
  EXPECT_EQ(OpenError(p, o), "full pack verification requested, but manifest has no full SHA-256");
  p.json["expert_pack"]["sha256"] = std::string(64, '1');
  p.Save();
  EXPECT_EQ(OpenError(p, o), "Kimi expert-pack SHA-256 does not match manifest");
  p.json["expert_pack"]["sha256"] = *Sha256File(p.pack);
  p.Save();
  EXPECT_EQ(OpenError(p, o), "OK");
  EXPECT_EQ(OpenError(p), "OK");  // opt-in only
}

TEST(StoreOpen, MissingKeysAreKeyErrors) {
  TinyPack p(TinySpec{});
  p.json["source"].erase("inventory_sha256");
  p.Save();
  ErrorKind kind{};
  EXPECT_EQ(OpenError(p, Small(), &kind), "'inventory_sha256'");
  EXPECT_EQ(kind, ErrorKind::kKey);
  p.json = p.MakeManifest();
  p.json["expert_pack"].erase("alignment");
  p.Save();
  EXPECT_EQ(OpenError(p, Small(), &kind), "'alignment'");
}

TEST(StoreOpen, RuntimeBudgets) {
  TinyPack p(TinySpec{});
  // SGLang's one text for all three; the hint says which and its value
  // (before: the lumped text alone, naming none).
  const std::string budgets = "expert cache and staging budgets, and read splits, must be positive\nhint: ";
  StoreOptions o = Small();
  o.queue_depth = 0;
  EXPECT_EQ(OpenError(p, o), budgets + "queue_depth must be at least 1, got 0");
  o = Small();
  o.read_splits = -3;
  EXPECT_EQ(OpenError(p, o), budgets + "read_splits must be at least 1, got -3");
  o = Small();
  o.cache_bytes = 0;
  EXPECT_EQ(OpenError(p, o), budgets + "cache_bytes must be at least 1, got 0");
  SlotCacheOptions neg;
  neg.store = Small();
  neg.store.read_splits = -1;
  auto refused = SlotCache::Open(p.pack, p.manifest, neg);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().message(), budgets + "read_splits must be at least 1, got -1");
  o = Small();
  o.stats_flush_interval = -1;
  EXPECT_EQ(OpenError(p, o), "expert-pack stats flush interval cannot be negative");
  // Counts past the engine's 32 bits were cut: 2^32 said "I/O queue depth
  // must be positive", 2^32 + 1 opened with one read in flight.
  for (int64_t big : {int64_t{1} << 32, (int64_t{1} << 32) + 1}) {
    o = Small();
    o.queue_depth = big;
    EXPECT_EQ(OpenError(p, o), "queue_depth must be at most 4294967295 (k3pack's limit), got " + std::to_string(big));
    o = Small();
    o.read_splits = big;
    EXPECT_EQ(OpenError(p, o), "read_splits must be at most 1024 (k3pack's limit), got " + std::to_string(big));
    SlotCacheOptions so;
    so.store = Small();
    so.store.queue_depth = big;
    auto cache = SlotCache::Open(p.pack, p.manifest, so);
    ASSERT_FALSE(cache.ok());
    EXPECT_EQ(cache.error().message(),
              "queue_depth must be at most 4294967295 (k3pack's limit), got " + std::to_string(big));
  }
  // 10^7 ranges per read took minutes and GBs in the range plan before the
  // first read; 1024 is the most.
  for (int64_t splits : {int64_t{1025}, int64_t{10000000}}) {
    o = Small();
    o.read_splits = splits;
    EXPECT_EQ(OpenError(p, o), "read_splits must be at most 1024 (k3pack's limit), got " + std::to_string(splits));
  }
  o = Small();
  o.read_splits = 1024;
  EXPECT_NE(testing::OpenOk(p, o), nullptr);
  o = Small();
  o.cache_bytes = 12288 * 2 - 1;  // top_k = 2 objects do not fit
  ErrorKind kind{};
  std::string msg = OpenError(p, o, &kind);
  EXPECT_EQ(msg.substr(0, msg.find('\n')),
            "insufficient expert cache budget for one top-k expert working set: budget=24575, object=12288");
  EXPECT_EQ(kind, ErrorKind::kMemory);
  o.cache_bytes = 12288 * 2;
  EXPECT_EQ(OpenError(p, o), "OK");
  o = Small();
  o.direct_io = true;
  o.read_splits = 4;  // 12288-byte objects < 4*4096: byte-granular ranges
  EXPECT_EQ(OpenError(p, o), "expert-pack direct I/O requires aligned read ranges");
  o.policy = "mru";
  o.direct_io = false;
  o.read_splits = 1;
  EXPECT_NE(OpenError(p, o).find("unknown cache policy 'mru'"), std::string::npos);
}

TEST(StoreOpen, MixedLayerSizes) {
  TinySpec spec;
  spec.role_bytes = {{4096, 4096, 8192}, {8192, 8192, 12288}};
  TinyPack p(spec);
  auto s = ExpertStore::Open(p.pack, p.manifest, Small());
  ASSERT_TRUE(s.ok()) << s.error().message();
  EXPECT_EQ((*s)->info().object_bytes, (std::vector<uint64_t>{16384, 28672}));
  EXPECT_EQ((*s)->info().role_offsets[1], (std::array<uint64_t, 3>{0, 8192, 16384}));
  EXPECT_EQ((*s)->info().effective_capacity_objects, (1u << 20) / 28672);
}

TEST(StoreOpen, Generation) {
  // Values computed with Python: int.from_bytes(sha256(s).digest()[:8], "little").
  EXPECT_EQ(ObjectGeneration("abc", 1, 0), 13874299092536332582ull);
  EXPECT_EQ(ObjectGeneration("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", 92, 895),
            13550499283198172874ull);
}

}  // namespace
}  // namespace k3pack::store

namespace k3pack::store {
namespace {

TEST(StoreOpenFullScale, KimiK3GeometryOpensAndServes) {
  // Real K3 dimensions (247,296 entries, ~918 GiB) with payloads as holes.
  TinySpec spec;
  spec.layers.clear();
  for (uint32_t l = 1; l <= 92; ++l) spec.layers.push_back(l);
  spec.num_hidden_layers = 93;
  spec.experts = 896;
  spec.top_k = 16;
  spec.role_bytes.assign(92, {3612672, 3612672, 4730880});
  spec.kimi_profile = true;
  spec.sparse = true;
  TinyPack p(spec, "full");
  ASSERT_EQ(p.layout.final_size(), 985613049856ull);
  ASSERT_EQ(p.layout.data_start(), 37593088u);
  StoreOptions o;
  o.cache_bytes = 16ull * 11956224;
  auto s = ExpertStore::Open(p.pack, p.manifest, o);
  ASSERT_TRUE(s.ok()) << s.error().message();
  const StoreInfo& info = (*s)->info();
  EXPECT_EQ(info.profile, "kimi-k3");
  EXPECT_EQ(info.index_count, 247296u);
  EXPECT_EQ(info.effective_capacity_objects, 16u);
  EXPECT_EQ(info.role_offsets[0], (std::array<uint64_t, 3>{0, 3612672, 7225344}));
  std::printf("full-scale open: %.3f s (target <= 0.25 s)\n", info.open_seconds);
  std::vector<int64_t> ids;
  for (int e = 0; e < 16; ++e) ids.push_back(880 + e);
  auto a = (*s)->AcquireToken(92, ids);
  ASSERT_TRUE(a.ok()) << a.error().message();
  EXPECT_EQ(a->routes[15].expert, 895u);
  EXPECT_EQ(a->routes[15].down.size(), 4730880u);
  auto snap = (*s)->Snapshot();
  EXPECT_EQ(snap["route_calls_by_layer"].size(), 93u);
  EXPECT_EQ(snap["active_moe_layers"], 92);
  EXPECT_EQ(snap["pack_read_bytes"], 16ull * 11956224);
}

// One random byte of the header or the index changed (seeded; K3_FAULT_SEED=N
// replays): the store refuses every one before serving anything, and the
// message names what is damaged: the header, or the entry (`at index i`) for
// a field the per-entry checks read, or else the index digest (name padding
// bytes, which no per-entry check reads, are covered by the index SHA-256).
TEST(StoreOpen, RandomHeaderAndIndexByteFlipsAreRefused) {
  uint64_t seed = std::random_device{}();
  if (const char* s = std::getenv("K3_FAULT_SEED"); s && *s) seed = std::strtoull(s, nullptr, 10);
  std::cout << "[   SEED   ] K3_FAULT_SEED=" << seed << "\n";
  std::mt19937_64 rng(seed);
  TinyPack p(TinySpec{});
  const uint64_t n = p.layout.index_count();
  const uint64_t index_end = pack::kHeaderBytes + n * pack::kEntryBytes;
  int named_entry = 0, named_digest = 0;
  for (int trial = 0; trial < 64; ++trial) {
    const bool header = trial < 16;
    const uint64_t at =
        header ? rng() % pack::kHeaderBytes : pack::kHeaderBytes + rng() % (index_end - pack::kHeaderBytes);
    const auto mask = static_cast<uint8_t>(1 + rng() % 255);
    SCOPED_TRACE("seed " + std::to_string(seed) + ", byte " + std::to_string(at) + " ^= " + std::to_string(mask));
    p.WritePack();
    std::ifstream f(p.pack, std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    char c = 0;
    f.get(c);
    c = static_cast<char>(c ^ mask);
    p.Patch(at, &c, 1);
    const std::string e = OpenError(p);
    ASSERT_NE(e, "OK");
    if (header) {
      EXPECT_NE(e.find("Kimi expert-pack header"), std::string::npos) << e;
      continue;
    }
    const uint64_t entry = (at - pack::kHeaderBytes) / pack::kEntryBytes;
    // Entries are checked in order, so a damaged offset can surface at a later
    // entry of the same run (SGLang's text names that one); the hint then
    // names the damaged entry.
    const size_t first_line = e.find('\n');
    // A name made invalid UTF-8 is Python's decode error (SGLang decodes
    // strictly), the entry named in the hint.
    const bool named_here = e.find(" at index " + std::to_string(entry)) < first_line ||
                            (e.rfind("'utf-8' codec can't decode ", 0) == 0 &&
                             e.find("index entry " + std::to_string(entry) + " (") != std::string::npos);
    const bool named_later = (e.find(" at index " + std::to_string(entry + 1)) < first_line ||
                              e.find(" at index " + std::to_string(entry + 2)) < first_line) &&
                             e.find("index entry " + std::to_string(entry) + " ") != std::string::npos;
    if (named_here || named_later) {
      ++named_entry;
    } else {
      // Bytes SGLang's checks do not read (a name's NUL padding): the digest
      // catches them, and the hint line names the entry.
      EXPECT_EQ(e.substr(0, e.find('\n')), "Kimi expert-pack index SHA-256 does not match manifest");
      EXPECT_NE(e.find("index entry " + std::to_string(entry) + " ("), std::string::npos) << e;
      ++named_digest;
    }
  }
  std::cout << "[   SEED   ] index flips: " << named_entry << " named by the entry checks, " << named_digest
            << " by the index digest with the entry in its hint\n";
}

}  // namespace
}  // namespace k3pack::store
