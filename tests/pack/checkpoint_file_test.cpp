// CheckpointFile (pack/checkpoint_file.h): every update replaces the
// checkpoint atomically without allocating: the same two inodes trade names,
// both stay 4096 bytes, and the content decodes to the latest checkpoint.
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "pack/checkpoint_file.h"
#include "pack_fixture.h"
#include "util/file.h"

namespace k3pack::pack {
namespace {

ino_t Inode(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_ino;
}

TEST(CheckpointFile, UpdatesSwapTwoReservedFilesAndAlwaysDecode) {
  const std::string dir = testing::TempDir("ckpt-file");
  const std::string path = dir + "/x.pack.partial.checkpoint";
  Checkpoint c;
  c.fingerprint = std::string(64, 'f');
  c.pack_size = 1 << 20;
  c.index_count = 30;
  c.objects_total = 10;
  c.journal_sha256 = std::string(64, '0');
  c.journal_crc_sha256 = std::string(64, '1');
  c.index_sha256 = std::string(64, 'a');
  auto f = CheckpointFile::Create(path, c, nullptr);
  ASSERT_TRUE(f.ok()) << f.error().message();
  const std::string spare = CheckpointSparePathFor(path);
  ASSERT_TRUE(PathExists(spare)) << "RENAME_EXCHANGE unsupported here?";
  const std::set<ino_t> inodes = {Inode(path), Inode(spare)};
  ASSERT_EQ(inodes.size(), 2u);
  for (uint64_t done = 1; done <= 10; ++done) {
    c.objects_done = done;
    ASSERT_TRUE(f->Write(c).ok());
    EXPECT_EQ(*FileSize(path), kCheckpointFileBytes);
    EXPECT_EQ(*FileSize(spare), kCheckpointFileBytes);
    EXPECT_EQ(std::set<ino_t>({Inode(path), Inode(spare)}), inodes) << "an update allocated a new file";
    auto back = DecodeCheckpoint(path, *ReadFileToString(path));
    ASSERT_TRUE(back.ok()) << back.error().message();
    EXPECT_EQ(back->objects_done, done);
    EXPECT_EQ(back->journal_crc_sha256, c.journal_crc_sha256);
    // The spare holds the previous checkpoint (a valid one, too).
    auto prev = DecodeCheckpoint(spare, *ReadFileToString(spare));
    ASSERT_TRUE(prev.ok()) << prev.error().message();
    EXPECT_EQ(prev->objects_done, done - 1);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace k3pack::pack
