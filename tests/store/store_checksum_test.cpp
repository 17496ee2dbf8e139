// Issue 17 item 13: the store checks every object it reads against the
// CRC32Cs of the digest sidecar. A damaged object is an error naming layer,
// expert and file offset, counted in stats, and never cached; a sidecar
// without CRCs (written before them) or no sidecar still opens, unchecked,
// and the stats say so.
#include <gtest/gtest.h>

#include <vector>

#include "k3pack/pack.h"
#include "k3pack/store.h"
#include "pack/sidecars.h"
#include "store/synthetic_pack.h"
#include "open_ok.h"
#include "util/crc32c.h"

namespace k3pack::store {
namespace {

using testing::Get;
using testing::TinyPack;
using testing::TinySpec;

void WriteSidecar(const TinyPack& p, bool with_crcs) {
  Status st = p.WriteDigestSidecar(with_crcs);
  ASSERT_TRUE(st.ok()) << st.error().message();
}

StoreOptions ChecksumOpts() {
  StoreOptions o;
  o.cache_bytes = 16 * 12288;
  o.policy = "lru";
  o.queue_depth = 4;
  return o;
}

TEST(StoreChecksums, DamagedObjectIsAnErrorNamingItAndIsNeverCached) {
  for (const char* io : {"pread", "uring"}) {
    SCOPED_TRACE(io);
    TinyPack p(TinySpec{});
    WriteSidecar(p, true);
    // One byte of (layer 2, expert 3)'s gate payload.
    const pack::EntrySlot gate = p.layout.Slot(1, 3, pack::Role::kGate);
    const uint64_t at = gate.offset + 1000;
    const std::string bytes = *ReadFileToString(p.pack);
    const char flipped = static_cast<char>(bytes[at] ^ 0x10);
    p.Patch(at, &flipped, 1);

    StoreOptions o = ChecksumOpts();
    o.io_backend = io;
    auto opened = ExpertStore::Open(p.pack, p.manifest, o);
    ASSERT_TRUE(opened.ok()) << opened.error().message();
    auto s = *opened;
    EXPECT_EQ(s->Snapshot()["k3pack"]["checksums"].get<std::string>().rfind("crc32c (", 0), 0u);
    for (int attempt = 0; attempt < 2; ++attempt) {
      auto a = Get(*s, 2, {3, 4});
      ASSERT_FALSE(a.ok()) << "a damaged object was served";
      const std::string& msg = a.error().message();
      EXPECT_NE(msg.find("expert-pack object (layer 2, expert 3) is damaged: gate payload at file offset " +
                         std::to_string(gate.offset)),
                std::string::npos)
          << msg;
    }
    // Undamaged neighbours are fine; the damaged one was read again each
    // time (never cached) and counted.
    auto ok = Get(*s, 2, {4, 5});
    ASSERT_TRUE(ok.ok()) << ok.error().message();
    ASSERT_TRUE(s->MarkUsed(*ok).ok());
    auto j = s->Snapshot();
    EXPECT_EQ(j["k3pack"]["checksum_errors"], 2);
    EXPECT_EQ(j["io_errors"], 0);
    EXPECT_EQ(j["k3pack"]["checksum_verified_objects"], 2);  // experts 4 and 5
    // Repaired on disk: now it is served (nothing stale was kept).
    p.Patch(at, bytes.data() + at, 1);
    auto fixed = Get(*s, 2, {3, 4});
    ASSERT_TRUE(fixed.ok()) << fixed.error().message();
    EXPECT_EQ(fixed->routes[0].gate[1000], testing::PatternByte(2, 3, 1, 1000));
    ASSERT_TRUE(s->MarkUsed(*fixed).ok());
    ASSERT_TRUE(s->Close().ok());
  }
}

TEST(StoreChecksums, SidecarWithoutCrcsOrNoSidecarOpensUncheckedAndSaysSo) {
  TinyPack p(TinySpec{});
  const std::string bytes = *ReadFileToString(p.pack);
  const pack::EntrySlot up = p.layout.Slot(0, 1, pack::Role::kUp);
  const char flipped = static_cast<char>(bytes[up.offset] ^ 1);
  p.Patch(up.offset, &flipped, 1);
  struct Case {
    const char* what;
    int sidecar;  // 0 none, 1 version 1 (no CRCs)
    bool verify;
    const char* mode_prefix;
  };
  for (const Case& c : {Case{"no sidecar", 0, true, "unavailable: no digest sidecar"},
                        Case{"version-1 sidecar", 1, true, "unavailable: digest sidecar"},
                        Case{"checks turned off", 1, false, "off"}}) {
    SCOPED_TRACE(c.what);
    std::filesystem::remove(pack::DigestsPathFor(p.pack));
    if (c.sidecar == 1) WriteSidecar(p, false);
    StoreOptions o = ChecksumOpts();
    o.verify_checksums = c.verify;
    auto opened = ExpertStore::Open(p.pack, p.manifest, o);
    ASSERT_TRUE(opened.ok()) << opened.error().message();
    auto a = Get(**opened, 1, {1, 2});
    ASSERT_TRUE(a.ok()) << a.error().message();  // unchecked: served as SGLang would
    auto j = (*opened)->Snapshot();
    EXPECT_EQ(j["k3pack"]["checksums"].get<std::string>().rfind(c.mode_prefix, 0), 0u) << j["k3pack"]["checksums"];
    EXPECT_EQ(j["k3pack"]["checksum_errors"], 0);
    ASSERT_TRUE((*opened)->MarkUsed(*a).ok());
  }
}

TEST(StoreChecksums, SidecarOfAnotherPackIsIgnoredNotTrusted) {
  TinyPack p(TinySpec{});
  TinySpec other_spec;
  other_spec.experts = 4;
  TinyPack other(other_spec, "other");
  WriteSidecar(other, true);
  std::filesystem::copy_file(pack::DigestsPathFor(other.pack), pack::DigestsPathFor(p.pack));
  auto opened = ExpertStore::Open(p.pack, p.manifest, ChecksumOpts());
  ASSERT_TRUE(opened.ok()) << opened.error().message();
  auto a = Get(**opened, 1, {1, 2});
  ASSERT_TRUE(a.ok()) << a.error().message();
  EXPECT_NE((*opened)->Snapshot()["k3pack"]["checksums"].get<std::string>().find("belongs to another pack"),
            std::string::npos);
  ASSERT_TRUE((*opened)->MarkUsed(*a).ok());
}

}  // namespace
}  // namespace k3pack::store
