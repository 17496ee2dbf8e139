// MergeRankPacks on rank packs whose header is damaged while their digest
// sidecars are intact.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <span>
#include <vector>

#include "../forked_child.h"
#include "k3pack/pack.h"
#include "pack/format.h"
#include "pack/sidecars.h"
#include "pack_fixture.h"
#include "util/file.h"

namespace k3pack::pack {
namespace {

// A rank pack's data_start is read before the index digest can vouch for the
// header; it was only bounded by the file's size, so a flipped high byte in a
// (terabyte) pack made the merge allocate the whole pack as its "prefix":
// std::bad_alloc out of MergeRankPacks. Here a 16 GiB sparse rank pack (the
// single rank of --ep-size 1) with data_start near its end, in a child whose
// address space may grow by 1 GiB only.
TEST(MergeHeader, DataStartPastTheIndexIsRefusedNotAllocated) {
#ifdef K3_TEST_UNDER_SANITIZER
  GTEST_SKIP() << "an address-space limit under a sanitizer runtime";
#endif
  const std::string dir = testing::TempDir("merge-header");
  const std::string rank = dir + "/rank0.pack";
  const uint64_t size = uint64_t{16} << 30;
  {
    UniqueFd fd(::open(rank.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644));
    ASSERT_TRUE(fd.valid());
    ASSERT_EQ(::ftruncate(fd.get(), static_cast<off_t>(size)), 0);
    PackHeader h;
    h.index_count = 3;
    h.data_start = size - kPackAlignment;  // the index ends at byte 496
    const auto head = EncodeHeader(h);
    ASSERT_TRUE(PwriteFull(fd.get(), head.data(), head.size(), 0).ok());
  }
  PackDigests d;
  d.index_count = 3;
  d.pack_size = size;
  d.data_start = kPackAlignment;
  d.index_sha256 = std::string(64, '0');
  d.entry_sha256.resize(3);
  d.entry_crc32c.resize(3);
  d.ep = ep::Rank{1, 0};
  d.num_experts = 1;
  ASSERT_TRUE(WritePackDigests(DigestsPathFor(rank), d).ok());

  const int status = k3test::InForkedChild([&] {
    if (!k3test::LimitAddressSpaceGrowth(uint64_t{1} << 30)) ::_exit(4);
    MergeOptions o;
    o.out_path = dir + "/merged.pack";
    try {
      auto r = MergeRankPacks({rank}, o);
      if (r.ok()) ::_exit(1);
      const bool refused = r.error().message().find("has a header that does not match its digest sidecar") !=
                           std::string::npos;
      ::_exit(refused ? 0 : 2);
    } catch (const std::bad_alloc&) {
      ::_exit(3);
    }
  });
  std::filesystem::remove_all(dir);
  EXPECT_EQ(status, 0) << "1: merged, 2: another error, 3: std::bad_alloc, 4: no limit";
}

// An index entry whose offset + nbytes wraps past 2^64 passed the merge's
// "inside the pack" test (the sum was compared with the file size), and the
// copy then read and wrote at offset 2^64 - 4096. Forged here with an index
// digest and sidecar to match, as a rank pack whose index was damaged before
// its sidecar was written would be.
TEST(MergeHeader, IndexEntryWhoseEndWrapsIsOutOfRange) {
  const std::string dir = testing::TempDir("merge-wrap");
  const std::string rank = dir + "/rank0.pack";
  const uint64_t size = 2 * kPackAlignment;
  std::vector<uint8_t> bytes(size, 0);
  PackHeader h;
  h.index_count = 1;
  h.data_start = kPackAlignment;
  const auto head = EncodeHeader(h);
  std::copy(head.begin(), head.end(), bytes.begin());
  PackEntry e;
  e.name = "blk.1.ffn_up_exps.weight";
  e.offset = ~uint64_t{0} - kPackAlignment + 1;  // 2^64 - 4096: with nbytes 8192 the end wraps to 4096
  e.nbytes = 2 * kPackAlignment;
  ASSERT_TRUE(EncodeEntryInto(e, std::span<uint8_t>(bytes).subspan(kHeaderBytes, kEntryBytes)).ok());
  {
    UniqueFd fd(::open(rank.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644));
    ASSERT_TRUE(fd.valid());
    ASSERT_TRUE(PwriteFull(fd.get(), bytes.data(), bytes.size(), 0).ok());
  }
  PackDigests d;
  d.index_count = 1;
  d.pack_size = size;
  d.data_start = kPackAlignment;
  d.index_sha256 = ToHex(Sha256Raw(bytes.data(), kHeaderBytes + kEntryBytes).data(), 32);
  d.entry_sha256.resize(1);
  d.entry_crc32c.resize(1);
  d.ep = ep::Rank{1, 0};
  d.num_experts = 1;
  ASSERT_TRUE(WritePackDigests(DigestsPathFor(rank), d).ok());

  MergeOptions o;
  o.out_path = dir + "/merged.pack";
  auto r = MergeRankPacks({rank}, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message(), "rank pack " + rank + ": index entry 0 is out of range");
  EXPECT_FALSE(std::filesystem::exists(o.out_path));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace k3pack::pack
