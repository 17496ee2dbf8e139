// The pread backend's pool grows with the ranges queued, up to queue_depth
// threads, as SGLang's ThreadPoolExecutor does; it used to start all
// queue_depth threads at open (16,384 for the drop-in's stage_slots 16 with
// read_splits 1024: 2.7 s before the first call).
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "../forked_child.h"
#include "store/io_engine.h"
#include "store/synthetic_pack.h"

namespace k3pack::store {
namespace {

constexpr uint64_t kFileBytes = 1 << 20;
constexpr uint32_t kRanges = 1024;  // 1 KiB each: more ranges than threads at open
constexpr uint32_t kDepth = 4096;

uint8_t FileByte(uint64_t i) { return static_cast<uint8_t>((i * 2654435761u) >> 11); }

size_t ThreadsOfThisProcess() {
  size_t n = 0;
  DIR* d = ::opendir("/proc/self/task");
  if (d == nullptr) return 0;
  while (const dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') ++n;
  ::closedir(d);
  return n;
}

class PreadPool : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TinyPack::TempDir("pread-pool");
    const std::string path = dir_ + "/data.bin";
    std::vector<uint8_t> bytes(kFileBytes);
    for (uint64_t i = 0; i < bytes.size(); ++i) bytes[i] = FileByte(i);
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    ::close(fd);
    fd_ = ::open(path.c_str(), O_RDONLY);
    ASSERT_GE(fd_, 0);
  }
  void TearDown() override {
    if (fd_ >= 0) ::close(fd_);
    std::filesystem::remove_all(dir_);
  }

  // Reads the whole file as one object of kRanges ranges; the read's error
  // text, empty when every byte came back right.
  std::string ReadWholeFile(IoEngine& engine) {
    std::vector<uint8_t> dst(kFileBytes);
    std::mutex mu;
    std::condition_variable cv;
    bool finished = false;
    std::string error;
    auto r = std::make_unique<ObjectRead>();
    r->fd = fd_;
    r->dst = dst.data();
    r->ranges = ObjectReadRanges(kFileBytes, kRanges);
    r->done = [&](const ObjectReadResult& res) {
      std::lock_guard<std::mutex> lock(mu);
      if (!res.status.ok()) error = res.status.error().message();
      finished = true;
      cv.notify_all();
    };
    engine.Submit(std::move(r));
    {
      std::unique_lock<std::mutex> lock(mu);
      if (!cv.wait_for(lock, std::chrono::seconds(120), [&] { return finished; })) return "the read never finished";
    }
    if (!error.empty()) return error;
    for (uint64_t i = 0; i < kFileBytes; ++i)
      if (dst[i] != FileByte(i)) return "wrong byte at " + std::to_string(i);
    return "";
  }

  std::string dir_;
  int fd_ = -1;
};

TEST_F(PreadPool, OpensWithAFewThreadsAndGrowsWithTheRangesQueued) {
  ASSERT_EQ(ObjectReadRanges(kFileBytes, kRanges).size(), kRanges);
  const size_t before = ThreadsOfThisProcess();
  ASSERT_GT(before, 0u) << "/proc/self/task cannot be read";
  auto engine = IoEngine::Create(IoBackend::kPread, kDepth);
  ASSERT_TRUE(engine.ok()) << engine.error().message();
  const size_t at_open = ThreadsOfThisProcess() - before;
  EXPECT_GE(at_open, 1u);
  EXPECT_LE(at_open, 64u) << "threads started at open for a queue depth of " << kDepth;
  EXPECT_EQ(ReadWholeFile(**engine), "");
  // One submission queued kRanges ranges while at most at_open threads
  // waited: the pool grew so that every range had a thread, and no further.
  const size_t after_read = ThreadsOfThisProcess() - before;
  EXPECT_GE(after_read, kRanges);
  EXPECT_LE(after_read, at_open + kRanges);
  // The same read again finds the threads it needs: the workers done with
  // their last range take the new ones (counting only waiting workers as
  // free started one more thread for each worker not yet back to waiting).
  for (int again = 0; again < 3; ++again) EXPECT_EQ(ReadWholeFile(**engine), "");
  EXPECT_LE(ThreadsOfThisProcess() - before, after_read + 64);
  (*engine)->Shutdown();
  EXPECT_EQ(ThreadsOfThisProcess(), before);
}

// Threads that cannot be started after open are not an error: the ranges
// wait for the threads already running.
TEST_F(PreadPool, ReadsFinishOnTheThreadsRunningWhenNoMoreCanStart) {
#ifdef K3_TEST_UNDER_SANITIZER
  GTEST_SKIP() << "an address-space limit under a sanitizer runtime";
#endif
  const int rc = k3test::InForkedChild([&] {
    auto engine = IoEngine::Create(IoBackend::kPread, kDepth);
    if (!engine.ok()) ::_exit(3);
    const size_t at_open = ThreadsOfThisProcess();
    // 64 MiB more address space: a few of the next 1,000 thread stacks at most.
    if (!k3test::LimitAddressSpaceGrowth(uint64_t{64} << 20)) ::_exit(4);
    if (!ReadWholeFile(**engine).empty()) ::_exit(2);
    if (ThreadsOfThisProcess() >= at_open + kRanges / 2) ::_exit(5);  // the limit did not bite
    ::_exit(0);
  });
  if (rc == 5) GTEST_SKIP() << "the thread stacks fit under the address-space limit here";
  EXPECT_EQ(rc, 0) << "child exit code (2: the read failed or came back wrong; 134: aborted)";
}

}  // namespace
}  // namespace k3pack::store
