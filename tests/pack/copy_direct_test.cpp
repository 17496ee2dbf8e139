// ReadSource (the builder's read of a batch) through O_DIRECT gives exactly
// the bytes, digests and CRCs of the buffered path: unaligned source offsets
// and slice sizes, a hole inside the range, and a range ending at an
// unaligned EOF.
#include <fcntl.h>
#include <linux/falloc.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "pack/copy.h"
#include "util/file.h"

namespace k3pack::pack {
namespace {

struct Copied {
  std::vector<uint8_t> bytes;
  std::vector<std::array<uint8_t, 32>> digests;
  std::vector<uint32_t> crcs;
  CopyStats stats;
};

class CopyDirectTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/k3pack-copy-direct-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Reads n slices of `slice` bytes from src_off of `src` and hashes each,
  // as the builder does.
  Copied Copy(const std::string& src, uint64_t src_off, uint64_t slice, uint32_t n, bool direct) {
    Copied c;
    auto in = OpenReadOnly(src);
    EXPECT_TRUE(in.ok());
    UniqueFd in_direct;
    if (direct) {
      auto d = OpenReadOnly(src, O_DIRECT);
      EXPECT_TRUE(d.ok());
      if (d.ok()) in_direct = std::move(*d);
    }
    auto allocated = IoBuffer::Allocate(slice * n + kDirectSlack);
    EXPECT_TRUE(allocated.ok());
    if (!allocated.ok()) return c;
    IoBuffer& buf = *allocated;
    c.digests.resize(n);
    c.crcs.resize(n);
    const auto size = std::filesystem::file_size(src);
    auto got = ReadSource(in->get(), size, src_off, slice * n, buf, &c.stats, direct ? in_direct.get() : -1);
    EXPECT_TRUE(got.ok()) << (got.ok() ? "" : got.error().message());
    if (!got.ok() || !got->bytes) return c;
    c.bytes.assign(got->bytes, got->bytes + slice * n);
    for (uint32_t i = 0; i < n; ++i) HashSlice(got->bytes + i * slice, slice, &c.digests[i], &c.crcs[i]);
    return c;
  }

  std::string dir_;
};

TEST_F(CopyDirectTest, SameBytesDigestsAndCrcsAsBuffered) {
  const std::string src = dir_ + "/src.bin";
  const uint64_t size = 5 * 1048576 + 777;  // unaligned EOF
  {
    std::vector<uint8_t> data(size);
    std::mt19937 rng(16);
    for (auto& b : data) b = static_cast<uint8_t>(rng());
    const int fd = ::open(src.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(PwriteFull(fd, data.data(), data.size(), 0).ok());
    // A hole in the middle of slice 1 (zeros when the filesystem cannot punch).
    if (::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 2 * 1048576, 1048576) != 0) {
      std::vector<uint8_t> zeros(1048576, 0);
      ASSERT_TRUE(PwriteFull(fd, zeros.data(), zeros.size(), 2 * 1048576).ok());
    }
    ASSERT_EQ(::fsync(fd), 0);
    ::close(fd);
  }
  {
    const int probe = ::open(src.c_str(), O_RDONLY | O_DIRECT);
    if (probe < 0) GTEST_SKIP() << "no O_DIRECT on the filesystem of " << src;
    ::close(probe);
  }
  // Unaligned start and slice size; the last slice ends exactly at EOF.
  const uint64_t slice = 1234567;
  const uint32_t n = 4;
  const uint64_t src_off = size - slice * n;
  ASSERT_NE(src_off % 4096, 0u);
  const Copied buffered = Copy(src, src_off, slice, n, false);
  const Copied direct = Copy(src, src_off, slice, n, true);
  EXPECT_EQ(direct.bytes, buffered.bytes);
  EXPECT_EQ(direct.digests, buffered.digests);
  EXPECT_EQ(direct.crcs, buffered.crcs);
  EXPECT_EQ(direct.stats.data_bytes, buffered.stats.data_bytes);
  EXPECT_EQ(direct.stats.hole_bytes, buffered.stats.hole_bytes);
  EXPECT_EQ(direct.stats.data_bytes + direct.stats.hole_bytes, slice * n);
  // Every data byte went through O_DIRECT (not the buffered fallback).
  EXPECT_EQ(direct.stats.direct_bytes, direct.stats.data_bytes);
  EXPECT_EQ(buffered.stats.direct_bytes, 0u);
  // The copy holds the source's bytes (hole = zeros).
  std::vector<uint8_t> want(slice);
  auto in = OpenReadOnly(src);
  ASSERT_TRUE(in.ok());
  for (uint32_t i = 0; i < n; ++i) {
    ASSERT_TRUE(PreadFull(in->get(), want.data(), slice, src_off + i * slice).ok());
    EXPECT_TRUE(std::equal(want.begin(), want.end(), direct.bytes.begin() + static_cast<ptrdiff_t>(i * slice)))
        << "slice " << i;
  }
}

}  // namespace
}  // namespace k3pack::pack
