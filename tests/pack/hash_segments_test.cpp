// CopyAndHash (the repair's and ep-merge's copy) and HashRange (verify's and
// the repair's check) read a range segment by segment: the digest is of the
// bytes, holes included as zeros; the copy leaves the destination's holes
// alone; a range the file does not hold is an end-of-file error saying where.
#include <fcntl.h>
#include <linux/falloc.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "pack/copy.h"
#include "util/file.h"
#include "util/sha256.h"

namespace k3pack::pack {
namespace {

class HashSegmentsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/k3pack-hash-segments-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A file of random bytes with [hole_at, +hole_len) zero (punched where
  // the filesystem can).
  std::vector<uint8_t> WriteSource(const std::string& path, uint64_t size, uint64_t hole_at, uint64_t hole_len) {
    std::vector<uint8_t> data(size);
    std::mt19937 rng(7);
    for (auto& b : data) b = static_cast<uint8_t>(rng());
    std::fill(data.begin() + static_cast<ptrdiff_t>(hole_at), data.begin() + static_cast<ptrdiff_t>(hole_at + hole_len), 0);
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
    EXPECT_GE(fd, 0);
    EXPECT_TRUE(PwriteFull(fd, data.data(), data.size(), 0).ok());
    (void)::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(hole_at),
                      static_cast<off_t>(hole_len));
    ::close(fd);
    return data;
  }

  std::string dir_;
};

std::string Hex(const std::array<uint8_t, 32>& d) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (uint8_t b : d) s += {digits[b >> 4], digits[b & 15]};
  return s;
}

TEST_F(HashSegmentsTest, CopyAndHashCopiesTheBytesAndDigestsThemHolesIncluded) {
  const std::string src = dir_ + "/src.bin", dst = dir_ + "/dst.bin";
  const uint64_t size = 3 * 1048576 + 333, hole_at = 1048576, hole_len = 1048576;
  const std::vector<uint8_t> data = WriteSource(src, size, hole_at, hole_len);
  auto in = OpenReadOnly(src);
  ASSERT_TRUE(in.ok());
  const int out = ::open(dst.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(out, 0);
  ASSERT_EQ(::ftruncate(out, static_cast<off_t>(size + 100)), 0);
  auto buf = IoBuffer::Allocate(65536);  // smaller than a segment: several reads each
  ASSERT_TRUE(buf.ok());
  const uint64_t off = 77, n = size - off;
  CopyStats stats;
  auto sha = CopyAndHash(in->get(), off, out, 100, n, *buf, &stats);
  ASSERT_TRUE(sha.ok()) << sha.error().message();
  EXPECT_EQ(Hex(*sha), Sha256Hex(data.data() + off, n));
  std::vector<uint8_t> copied(n);
  ASSERT_TRUE(PreadFull(out, copied.data(), n, 100).ok());
  ::close(out);
  EXPECT_TRUE(std::equal(copied.begin(), copied.end(), data.begin() + off));
  EXPECT_EQ(stats.data_bytes + stats.hole_bytes, n);

  CopyStats hashed;
  auto again = HashRange(in->get(), off, n, *buf, &hashed);
  ASSERT_TRUE(again.ok()) << again.error().message();
  EXPECT_EQ(*again, *sha);
  EXPECT_EQ(hashed.data_bytes, stats.data_bytes);
  EXPECT_EQ(hashed.hole_bytes, stats.hole_bytes);
}

TEST_F(HashSegmentsTest, ARangeTheFileDoesNotHoldIsAnEndOfFileErrorSayingWhere) {
  const std::string src = dir_ + "/src.bin", dst = dir_ + "/dst.bin";
  WriteSource(src, 10000, 4096, 4096);
  auto in = OpenReadOnly(src);
  ASSERT_TRUE(in.ok());
  const int out = ::open(dst.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(out, 0);
  auto buf = IoBuffer::Allocate(4096);
  ASSERT_TRUE(buf.ok());
  auto copied = CopyAndHash(in->get(), 9000, out, 0, 2000, *buf, nullptr);
  ::close(out);
  ASSERT_FALSE(copied.ok());
  EXPECT_EQ(copied.error().kind(), ErrorKind::kEOF);
  EXPECT_EQ(copied.error().message(), "short GGUF read at offset 10000; 1000 bytes remain");
  // A range wholly inside the hole still has to exist.
  auto hashed = HashRange(in->get(), 5000, 6000, *buf, nullptr);
  ASSERT_FALSE(hashed.ok());
  EXPECT_EQ(hashed.error().kind(), ErrorKind::kEOF);
  EXPECT_EQ(hashed.error().message(), "short read at offset 10000; 1000 bytes remain");
}

}  // namespace
}  // namespace k3pack::pack
