// FileStamp / HowFileChanged (util/file.h): the witness the build uses for
// "a shard changed while it was read" and the manifest for "the pack changed
// while its manifest was made". A rewrite in place with the same size is seen
// only through the modification time, so the stamp must keep every
// nanosecond the kernel records: since Linux 6.13 (multigrain timestamps on
// ext4, xfs, btrfs, tmpfs) a write after a stat always gets a new time, and
// the stamp must see each of those.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include <gtest/gtest.h>

#include "../scratch_dir.h"
#include "util/file.h"

namespace k3pack {
namespace {

std::string Scratch(const std::string& name) {
  return testing_scratch::ProcessScratchDir("file-stamp") + "/" + name;
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
  ASSERT_EQ(std::fclose(f), 0);
}

TEST(FileStamp, NamesEachWayAFileCanChange) {
  const std::string path = Scratch("a");
  ASSERT_NO_FATAL_FAILURE(WriteBytes(path, "abcd"));
  auto stamp = StampFile(path);
  ASSERT_TRUE(stamp.ok()) << stamp.error().message();
  EXPECT_EQ(HowFileChanged(path, *stamp), "");

  ASSERT_NO_FATAL_FAILURE(WriteBytes(path + ".new", "abcd"));
  ASSERT_EQ(std::rename((path + ".new").c_str(), path.c_str()), 0);
  EXPECT_EQ(HowFileChanged(path, *stamp), "another file was put in its place");

  stamp = StampFile(path);
  ASSERT_TRUE(stamp.ok());
  ASSERT_NO_FATAL_FAILURE(WriteBytes(path, "abcdef"));  // truncated and rewritten: the same inode
  EXPECT_EQ(HowFileChanged(path, *stamp), "its size went from 4 to 6 bytes");

  ASSERT_EQ(std::remove(path.c_str()), 0);
  EXPECT_EQ(HowFileChanged(path, *stamp).rfind("it is gone (", 0), 0u) << HowFileChanged(path, *stamp);
}

// Same inode, same size, one byte rewritten right after the stamp: whenever
// the kernel's own stat shows a new modification time, the stamp must call the
// file written to. On a kernel whose timestamps are coarse (before 6.13, or a
// filesystem without multigrain times) most rewrites land in the same tick;
// those are the gap docs/RELIABILITY.md names, and the test counts only the
// rewrites the kernel dated.
TEST(FileStamp, EveryRewriteTheKernelDatesIsSeen) {
  const std::string path = Scratch("b");
  ASSERT_NO_FATAL_FAILURE(WriteBytes(path, "abcd"));
  const int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  int dated = 0;
  constexpr int kRewrites = 2000;
  for (int i = 0; i < kRewrites; ++i) {
    auto stamp = StampFile(path);
    ASSERT_TRUE(stamp.ok());
    struct stat before {};
    ASSERT_EQ(::fstat(fd, &before), 0);
    const char c = static_cast<char>('a' + i % 26);
    ASSERT_EQ(::pwrite(fd, &c, 1, i % 4), 1);
    struct stat after {};
    ASSERT_EQ(::fstat(fd, &after), 0);
    ASSERT_EQ(after.st_size, 4);
    if (after.st_mtim.tv_sec == before.st_mtim.tv_sec && after.st_mtim.tv_nsec == before.st_mtim.tv_nsec) continue;
    ++dated;
    EXPECT_EQ(HowFileChanged(path, *stamp), "it was written to (its modification time changed)") << "rewrite " << i;
  }
  ::close(fd);
  if (dated == 0) GTEST_SKIP() << "this kernel and filesystem dated none of " << kRewrites << " rewrites (coarse timestamps)";
  RecordProperty("rewrites_dated", dated);
}

}  // namespace
}  // namespace k3pack
