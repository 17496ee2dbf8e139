// ParallelSha256: the one shard hasher of `build` (beside its copy) and
// `manifest` (on request).
#include "util/parallel_sha256.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "util/sha256.h"
#include "../scratch_dir.h"

namespace k3pack {
namespace {

class ParallelSha256Test : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing_scratch::ProcessScratchDir("parallel-sha256");
    // Sizes around the 8 MiB chunk: empty, one byte, one chunk and a bit.
    const size_t sizes[] = {0, 1, 4096, (8u << 20) + 3, 100000};
    for (size_t i = 0; i < std::size(sizes); ++i) {
      std::string bytes(sizes[i], '\0');
      for (size_t b = 0; b < bytes.size(); ++b) bytes[b] = static_cast<char>((b * 31 + i) & 0xff);
      const std::string path = dir_ + "/f" + std::to_string(i);
      std::ofstream(path, std::ios::binary) << bytes;
      paths_.push_back(path);
      expected_.push_back(Sha256Hex(bytes.data(), bytes.size()));
    }
  }
  std::string dir_;
  std::vector<std::string> paths_, expected_;
};

TEST_F(ParallelSha256Test, EveryDigestByIndexWhateverTheThreads) {
  for (int background : {0, 1, 3, 16}) {
    ParallelSha256 hasher(paths_, background);
    const std::thread::id caller = std::this_thread::get_id();
    std::set<size_t> announced;
    size_t last_done = 0, off_thread = 0;
    uint64_t last_bytes = 0;
    ParallelSha256::Wait wait;
    wait.file_done = [&](size_t index, size_t done) {
      if (std::this_thread::get_id() != caller) ++off_thread;
      EXPECT_TRUE(announced.insert(index).second) << index;
      EXPECT_EQ(done, last_done + 1);
      last_done = done;
    };
    wait.progress = [&](const Progress& p) {
      if (std::this_thread::get_id() != caller) ++off_thread;
      EXPECT_EQ(p.phase, "hash shards");
      EXPECT_GE(p.done_bytes, last_bytes);
      last_bytes = p.done_bytes;
      EXPECT_LE(p.done_objects, paths_.size());
    };
    auto digests = hasher.Finish(wait);
    ASSERT_TRUE(digests.ok()) << digests.error().message();
    EXPECT_EQ(*digests, expected_) << background << " background threads";
    EXPECT_EQ(announced.size(), paths_.size());
    EXPECT_EQ(off_thread, 0u);
    // The last report covers every byte of every file.
    uint64_t total = 0;
    for (const auto& p : paths_) total += std::filesystem::file_size(p);
    EXPECT_EQ(last_bytes, total);
  }
}

TEST_F(ParallelSha256Test, AMissingFileIsAnErrorThatNamesIt) {
  paths_.insert(paths_.begin() + 2, dir_ + "/missing");
  ParallelSha256 hasher(paths_, 2);
  auto digests = hasher.Finish({});
  ASSERT_FALSE(digests.ok());
  EXPECT_NE(digests.error().message().find(dir_ + "/missing"), std::string::npos) << digests.error().message();
}

TEST_F(ParallelSha256Test, TheInterruptCheckStopsItAndIsReturned) {
  ParallelSha256 hasher(paths_, 0);  // the calling thread hashes every chunk: polls come between chunks
  int polls = 0;
  ParallelSha256::Wait wait;
  wait.interrupt_check = [&]() -> Status { return ++polls >= 3 ? Status(Error("caller stopped it")) : Status::OK(); };
  auto digests = hasher.Finish(wait);
  ASSERT_FALSE(digests.ok());
  EXPECT_EQ(digests.error().message(), "caller stopped it");
  EXPECT_EQ(polls, 3);
}

TEST_F(ParallelSha256Test, CancelledBeforeFinishReturnsAnError) {
  ParallelSha256 hasher(paths_, 0);
  hasher.Cancel();
  EXPECT_FALSE(hasher.Finish({}).ok());
}

}  // namespace
}  // namespace k3pack
