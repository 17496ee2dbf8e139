// Expert-parallel rank packs (issue 15, pack side), through the library:
// BuildPack with BuildOptions::ep, the version-3 digest sidecar,
// VerifyPayloads on a rank pack, MergeRankPacks. The tiny model has 16
// experts per layer, so N in {1, 2, 4, 8} all divide it.
#include <fcntl.h>
#include <linux/falloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "k3pack/ep.h"
#include "pack/build_inputs.h"
#include "pack/copy.h"
#include "pack/sidecars.h"
#include "pack_fixture.h"
#include "util/file.h"

namespace k3pack::pack {
namespace {

using testing::ReadAll;

struct EpModel {
  static constexpr const char* kName = "ep";
  static constexpr uint64_t kSeed = 15;
};

class EpPack : public testing::SharedModelTest<EpModel> {
 protected:
  static BuildOptions Opts(const std::string& out, std::optional<ep::Rank> rank = std::nullopt) {
    BuildOptions o;
    o.out_path = out;
    o.safety_margin_gib = 0;
    o.threads = 2;
    o.ep = rank;
    return o;
  }
  // The full pack, built once for the suite.
  static const std::string& FullPack() {
    static std::string* path = nullptr;
    if (!path) {
      path = new std::string(*root_ + "/full/m.pack");
      auto r = BuildPack(model_->experts, Opts(*path));
      EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message());
    }
    return *path;
  }
  static std::string BuildRank(const std::string& dir, ep::Rank rank) {
    const std::string out = RankPackPath(*root_ + "/" + dir + "/m.pack", rank);
    auto r = BuildPack(model_->experts, Opts(out, rank));
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message());
    return out;
  }
  static uint64_t Allocated(const std::string& path) {
    struct stat st;
    EXPECT_EQ(::stat(path.c_str(), &st), 0);
    return static_cast<uint64_t>(st.st_blocks) * 512;
  }
  static PackLayout Layout() { return *LayoutOf(model_->experts); }
};

TEST_F(EpPack, RankPathsDoNotCollideWithTheFullPack) {
  EXPECT_EQ(RankPackPath("/d/x.expert-major.pack", {4, 2}), "/d/x.expert-major.ep2-of-4.pack");
  EXPECT_EQ(RankPackPath("/d/x.bin", {2, 0}), "/d/x.bin.ep0-of-2");
  // A path that already names a rank's file is tagged once (it was
  // x.ep1-of-4.ep1-of-4.pack), whichever rank it named.
  EXPECT_EQ(RankPackPath("/d/x.ep1-of-4.pack", {4, 1}), "/d/x.ep1-of-4.pack");
  EXPECT_EQ(RankPackPath("/d/x.ep1-of-4.pack", {4, 3}), "/d/x.ep3-of-4.pack");
  EXPECT_EQ(RankPackPath("/d/x.ep1-of-4.pack", {8, 3}), "/d/x.ep3-of-8.pack");
  // Only a whole tag is one: these stay in the name.
  EXPECT_EQ(RankPackPath("/d/x.ep1-of-.pack", {2, 1}), "/d/x.ep1-of-.ep1-of-2.pack");
  EXPECT_EQ(RankPackPath("/d/x.deep.pack", {2, 1}), "/d/x.deep.ep1-of-2.pack");
}

// For N in {1, 2, 4, 8}, every rank pack: the full pack's size, header and
// index byte for byte; its experts' payloads identical; every other payload
// reads as zero and is a hole; disk use about 1/N of the full pack's; the
// sidecar records the rank and zero records for absent objects; verify
// passes and counts the other ranks' entries; the merge of the N is the full
// pack byte for byte, its digest sidecar too.
TEST_F(EpPack, RankPacksForOneTwoFourEightRanks) {
  const std::string full = ReadAll(FullPack());
  ASSERT_EQ(full, *expected_);
  const PackLayout layout = Layout();
  const uint64_t full_alloc = Allocated(FullPack());
  const uint32_t E = model_->experts.num_experts;
  ASSERT_EQ(E, 16u);
  for (uint32_t n : {1u, 2u, 4u, 8u}) {
    SCOPED_TRACE("ep_size " + std::to_string(n));
    const std::string dir = "n" + std::to_string(n);
    std::vector<std::string> ranks;
    uint64_t sum_alloc = 0;
    for (uint32_t r = 0; r < n; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      const std::string path = BuildRank(dir, {n, r});
      ranks.push_back(path);
      const std::string bytes = ReadAll(path);
      ASSERT_EQ(bytes.size(), full.size());
      EXPECT_EQ(bytes.substr(0, layout.data_start()), full.substr(0, layout.data_start()));
      const ep::ExpertRange owned = ep::OwnedExperts({n, r}, E);
      auto opened = OpenReadOnly(path);
      ASSERT_TRUE(opened.ok());
      UniqueFd fd = std::move(*opened);
      for (uint64_t i = 0; i < layout.index_count(); ++i) {
        const EntrySlot s = layout.Entry(i);
        if (owned.contains(s.expert)) {
          ASSERT_EQ(bytes.compare(s.offset, s.nbytes, full, s.offset, s.nbytes), 0) << "entry " << i;
        } else {
          ASSERT_EQ(bytes.substr(s.offset, s.nbytes), std::string(s.nbytes, '\0')) << "entry " << i;
          const auto segs = MapRange(fd.get(), s.offset, s.nbytes);
          ASSERT_TRUE(segs.size() == 1 && segs[0].hole) << "unowned entry " << i << " is allocated";
        }
      }
      // Disk: the prefix plus 1/N of the payloads (4096-granular, a few
      // blocks of slack for the filesystem).
      const uint64_t alloc = Allocated(path);
      sum_alloc += alloc;
      const uint64_t ideal = (full_alloc - layout.data_start()) / n + layout.data_start();
      EXPECT_LE(alloc, ideal + 64 * 1024) << "allocated " << alloc << ", full " << full_alloc;
      EXPECT_GE(alloc + 64 * 1024, ideal) << "allocated " << alloc << ", full " << full_alloc;
      // Sidecar: version 3, the rank, zero records for absent objects.
      auto d = ReadPackDigests(DigestsPathFor(path));
      ASSERT_TRUE(d.ok()) << d.error().message();
      ASSERT_TRUE(d->ep.has_value());
      EXPECT_EQ(d->ep->size, n);
      EXPECT_EQ(d->ep->rank, r);
      EXPECT_EQ(d->num_experts, E);
      EXPECT_EQ(d->index_sha256, layout.IndexSha256());
      const std::string sidecar = ReadAll(DigestsPathFor(path));
      EXPECT_EQ(static_cast<uint8_t>(sidecar[16]), kDigestsRankVersion);
      auto full_d = ReadPackDigests(DigestsPathFor(FullPack()));
      ASSERT_TRUE(full_d.ok());
      for (uint64_t i = 0; i < layout.index_count(); ++i) {
        EXPECT_EQ(d->present(i), owned.contains(layout.Entry(i).expert));
        if (d->present(i)) {
          EXPECT_EQ(d->entry_sha256[i], full_d->entry_sha256[i]) << "entry " << i;
          EXPECT_EQ(d->entry_crc32c[i], full_d->entry_crc32c[i]) << "entry " << i;
        } else {
          EXPECT_EQ(d->entry_sha256[i], Digest{}) << "entry " << i;
          EXPECT_EQ(d->entry_crc32c[i], 0u) << "entry " << i;
        }
      }
      VerifyOptions vo;
      auto v = VerifyPayloads(path, model_->experts, vo);
      ASSERT_TRUE(v.ok()) << v.error().message();
      EXPECT_EQ(v->entries_checked, layout.index_count() / n);
      EXPECT_EQ(v->unowned_entries, layout.index_count() - layout.index_count() / n);
      ASSERT_TRUE(v->ep.has_value());
      // A sample of the entries (sampled `verify`) reports the same count:
      // it said 0 (session 39).
      vo.entries = {0, layout.index_count() - 1};
      auto sampled = VerifyPayloads(path, model_->experts, vo);
      ASSERT_TRUE(sampled.ok()) << sampled.error().message();
      EXPECT_EQ(sampled->unowned_entries, v->unowned_entries);
      EXPECT_EQ(sampled->unowned_bytes, v->unowned_bytes);
      // ValidatePack samples only the rank's entries.
      ValidateOptions val;
      val.ep = ep::Rank{n, r};
      auto section = ValidatePack(path, model_->experts, val);
      ASSERT_TRUE(section.ok()) << section.error().message();
      EXPECT_EQ((*section)["index_sha256"], layout.IndexSha256());
    }
    EXPECT_LE(sum_alloc, full_alloc + n * 64 * 1024);
    // Merge, ranks given in reverse order.
    std::vector<std::string> reversed(ranks.rbegin(), ranks.rend());
    MergeOptions mo;
    mo.out_path = *root_ + "/" + dir + "/merged.pack";
    auto m = MergeRankPacks(reversed, mo);
    ASSERT_TRUE(m.ok()) << m.error().message();
    EXPECT_EQ(m->ep_size, n);
    EXPECT_TRUE(ReadAll(mo.out_path) == full) << "merged pack differs from the direct build";
    EXPECT_TRUE(ReadAll(DigestsPathFor(mo.out_path)) == ReadAll(DigestsPathFor(FullPack())))
        << "merged digest sidecar differs from the direct build's";
    EXPECT_FALSE(PathExists(PartialPathFor(mo.out_path)));
  }
}

TEST_F(EpPack, MergeRefusesIncompleteMixedOrDamagedGroups) {
  const std::string a0 = BuildRank("mg", {4, 0}), a1 = BuildRank("mg", {4, 1}), a2 = BuildRank("mg", {4, 2}),
                    a3 = BuildRank("mg", {4, 3});
  const std::string b1 = BuildRank("mg2", {2, 1});
  MergeOptions mo;
  mo.out_path = *root_ + "/mg/out.pack";
  auto missing = MergeRankPacks({a0, a1, a3}, mo);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message().find("rank(s) 2 of 4 missing"), std::string::npos) << missing.error().message();
  auto twice = MergeRankPacks({a0, a1, a2, a3, a1}, mo);
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.error().message().find("rank 1 of 4 is given twice"), std::string::npos);
  auto mixed = MergeRankPacks({a0, a1, a2, b1}, mo);
  ASSERT_FALSE(mixed.ok());
  EXPECT_NE(mixed.error().message().find("must come from one --ep-size"), std::string::npos);
  // A truncated rank pack: both sizes named (session 13: "(size differs)").
  {
    const std::string cut = *root_ + "/mg/cut.ep3-of-4.pack";
    std::filesystem::copy_file(a3, cut);
    std::filesystem::copy_file(DigestsPathFor(a3), DigestsPathFor(cut));
    const uint64_t size = std::filesystem::file_size(a3);
    std::filesystem::resize_file(cut, size - 1000);
    auto truncated = MergeRankPacks({a0, a1, a2, cut}, mo);
    ASSERT_FALSE(truncated.ok());
    EXPECT_NE(truncated.error().message().find("rank pack " + cut + " is " + std::to_string(size - 1000) +
                                               " bytes, but its digest sidecar " + DigestsPathFor(cut) +
                                               " records a pack of " + std::to_string(size) + " bytes"),
              std::string::npos)
        << truncated.error().message();
  }
  // A damaged index byte is named in the pack that holds it, first or not:
  // the first was "not of the same pack as" itself, a later one "differs
  // from" the first.
  for (const std::string& original : {a0, a2}) {
    const std::string copy = *root_ + "/mg/bad" + original.substr(original.rfind(".ep"));
    std::filesystem::copy_file(original, copy, std::filesystem::copy_options::overwrite_existing);
    std::filesystem::copy_file(DigestsPathFor(original), DigestsPathFor(copy),
                               std::filesystem::copy_options::overwrite_existing);
    int fd = ::open(copy.c_str(), O_RDWR);
    char c = 0;
    ASSERT_EQ(::pread(fd, &c, 1, 200), 1);  // inside the index
    c ^= 0x01;
    ASSERT_EQ(::pwrite(fd, &c, 1, 200), 1);
    ::close(fd);
    std::vector<std::string> group = {a0, a1, a2, a3};
    std::replace(group.begin(), group.end(), original, copy);
    auto bad = MergeRankPacks(group, mo);
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.error().message().find("rank pack " + copy + " is damaged: its header and index hash to "),
              std::string::npos)
        << bad.error().message();
    EXPECT_NE(bad.error().hint().find("--ep-rank " + std::string(original == a0 ? "0" : "2") + " --force"),
              std::string::npos)
        << bad.error().hint();
    std::filesystem::remove(copy);
  }
  auto full = MergeRankPacks({FullPack()}, mo);
  ASSERT_FALSE(full.ok());
  EXPECT_NE(full.error().message().find("is not an expert-parallel rank pack"), std::string::npos);
  // A damaged owned payload of rank 2 stops the merge, naming it; no output.
  const EntrySlot s = Layout().Slot(1, 9, Role::kDown);  // expert 9: rank 2 of 4
  {
    int fd = ::open(a2.c_str(), O_RDWR);
    char c = 0;
    ASSERT_EQ(::pread(fd, &c, 1, s.offset + 7), 1);
    c ^= 0x40;
    ASSERT_EQ(::pwrite(fd, &c, 1, s.offset + 7), 1);
    ::close(fd);
  }
  auto damaged = MergeRankPacks({a0, a1, a2, a3}, mo);
  ASSERT_FALSE(damaged.ok());
  EXPECT_NE(damaged.error().message().find("expert 9 (entry " + std::to_string(s.entry_index) + ", offset " +
                                           std::to_string(s.offset) + ") does not match its digest sidecar"),
            std::string::npos)
      << damaged.error().message();
  EXPECT_FALSE(PathExists(mo.out_path));
  EXPECT_FALSE(PathExists(PartialPathFor(mo.out_path)));
}

// Rank packs of two checkpoints with one layout (here: another seed) share
// header, index and size, and each payload matches its own sidecar; the merge
// must still refuse them, naming both files, and write nothing (session 13:
// it produced a pack mixing the two checkpoints' experts).
TEST_F(EpPack, MergeRefusesRankPacksOfTwoCheckpoints) {
  const testing::Model other = testing::MakeModel(*root_ + "/model-other", EpModel::kSeed + 1);
  const std::string a0 = BuildRank("src", {4, 0}), a1 = BuildRank("src", {4, 1});
  auto build_other = [&](ep::Rank rank) {
    const std::string out = RankPackPath(*root_ + "/src/m.pack", rank);
    auto r = BuildPack(other.experts, Opts(out, rank));
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message());
    return out;
  };
  const std::string b2 = build_other({4, 2}), b3 = build_other({4, 3});
  auto d0 = ReadPackDigests(DigestsPathFor(a0)), d2 = ReadPackDigests(DigestsPathFor(b2));
  ASSERT_TRUE(d0.ok() && d2.ok());
  EXPECT_EQ(d0->index_sha256, d2->index_sha256);  // same layout: the index cannot tell them apart
  EXPECT_NE(d0->source_tag, 0u);
  EXPECT_EQ(d0->source_tag, ReadPackDigests(DigestsPathFor(a1))->source_tag);
  MergeOptions mo;
  mo.out_path = *root_ + "/src/out.pack";
  auto mixed = MergeRankPacks({a0, a1, b2, b3}, mo);
  ASSERT_FALSE(mixed.ok());
  EXPECT_NE(mixed.error().message().find("rank pack " + b2 + " was built from other GGUF shards than " + a0),
            std::string::npos)
      << mixed.error().message();
  EXPECT_NE(mixed.error().message().find("must come from one checkpoint"), std::string::npos);
  EXPECT_FALSE(PathExists(mo.out_path));
  // The same four from one checkpoint merge (the tag is the source's, not the rank's).
  const std::string a2 = BuildRank("src2", {4, 2}), a3 = BuildRank("src2", {4, 3});
  auto ok = MergeRankPacks({a0, a1, a2, a3}, mo);
  ASSERT_TRUE(ok.ok()) << ok.error().message();
  EXPECT_EQ(ReadAll(mo.out_path), ReadAll(FullPack()));
}

// verify on a rank pack: a flipped byte in an owned payload and an owned
// payload punched to a hole both fail, each named (layer tensor, expert,
// entry, offset), the hole said to be one; the other ranks' holes are not damage.
TEST_F(EpPack, VerifyNamesDamagedAndHoledOwnedObjects) {
  const std::string path = BuildRank("dmg", {4, 1});  // experts 4..7
  const PackLayout layout = Layout();
  const EntrySlot flipped = layout.Slot(0, 5, Role::kGate);
  const EntrySlot holed = layout.Slot(1, 6, Role::kUp);
  int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char c = 0;
  ASSERT_EQ(::pread(fd, &c, 1, flipped.offset + 100), 1);
  c ^= 1;
  ASSERT_EQ(::pwrite(fd, &c, 1, flipped.offset + 100), 1);
  ASSERT_EQ(::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(holed.offset),
                        static_cast<off_t>(holed.nbytes)),
            0);
  ::close(fd);
  auto v = VerifyPayloads(path, model_->experts, VerifyOptions{});
  ASSERT_FALSE(v.ok());
  const std::string msg = v.error().message();
  const auto& ex = model_->experts;
  EXPECT_NE(msg.find(ex.by_layer[0][1].tensor.name + " expert 5 (entry " + std::to_string(flipped.entry_index) +
                     ", offset " + std::to_string(flipped.offset) + ")"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find(ex.by_layer[1][0].tensor.name + " expert 6 (entry " + std::to_string(holed.entry_index) +
                     ", offset " + std::to_string(holed.offset) + "): it is a hole where the data of rank 1 of 4 " +
                     "(experts 4..7) should be"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("2 of " + std::to_string(layout.index_count() / 4) + " payloads are damaged"),
            std::string::npos)
      << msg;
  // Against the source too (no sidecar needed), with the rank given.
  VerifyOptions src;
  src.against_digests = false;
  src.against_source = true;
  src.ep = ep::Rank{4, 1};
  auto vs = VerifyPayloads(path, model_->experts, src);
  ASSERT_FALSE(vs.ok());
  EXPECT_NE(vs.error().message().find("does not match GGUF source for " + ex.by_layer[1][0].tensor.name +
                                      " expert 6: it is a hole"),
            std::string::npos)
      << vs.error().message();
}

// The rank is part of the checkpoint's input fingerprint: a rank pack's
// checkpoint is never taken for the full pack's or another rank's.
TEST_F(EpPack, FingerprintIncludesTheRank) {
  const PackLayout layout = Layout();
  auto full = InputFingerprint(model_->experts, layout);
  auto r0 = InputFingerprint(model_->experts, layout, ep::Rank{4, 0});
  auto r1 = InputFingerprint(model_->experts, layout, ep::Rank{4, 1});
  auto r1of2 = InputFingerprint(model_->experts, layout, ep::Rank{2, 1});
  ASSERT_TRUE(full.ok() && r0.ok() && r1.ok() && r1of2.ok());
  EXPECT_NE(*full, *r0);
  EXPECT_NE(*r0, *r1);
  EXPECT_NE(*r1, *r1of2);
}

TEST_F(EpPack, InvalidRankIsRefusedWithEpsText) {
  auto r = BuildPack(model_->experts, Opts(*root_ + "/bad/m.pack", ep::Rank{3, 0}));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message().rfind("EP size 3 does not divide the 16 routed experts", 0), 0u)
      << r.error().message();
  auto r2 = BuildPack(model_->experts, Opts(*root_ + "/bad/m.pack", ep::Rank{4, 4}));
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.error().message().find("EP rank 4 is out of range for EP size 4"), std::string::npos);
}

// Without sparse-file support the other ranks' objects are zeros on disk:
// the bytes are the same and the build says so once.
TEST_F(EpPack, WithoutSparseFilesTheBuildSaysSoOnce) {
  ::setenv("K3PACK_TEST_NO_SPARSE", "1", 1);
  const std::string out = RankPackPath(*root_ + "/nosparse/m.pack", {2, 0});
  std::vector<std::string> lines;
  BuildOptions o = Opts(out, ep::Rank{2, 0});
  o.log = [&](const std::string& s) { lines.push_back(s); };
  auto r = BuildPack(model_->experts, o);
  ::unsetenv("K3PACK_TEST_NO_SPARSE");
  ASSERT_TRUE(r.ok()) << r.error().message();
  int said = 0;
  for (const auto& l : lines) said += l.find("does not support sparse files") != std::string::npos;
  EXPECT_EQ(said, 1);
  EXPECT_EQ(ReadAll(out), ReadAll(BuildRank("sparse", {2, 0})));
}

// Old sidecars still read: version 2 has no rank and every entry present.
TEST_F(EpPack, FullPackSidecarStaysVersionTwo) {
  const std::string sidecar = ReadAll(DigestsPathFor(FullPack()));
  EXPECT_EQ(static_cast<uint8_t>(sidecar[16]), 2);
  auto d = ReadPackDigests(DigestsPathFor(FullPack()));
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->ep.has_value());
  EXPECT_TRUE(d->present(0));
}

}  // namespace
}  // namespace k3pack::pack
