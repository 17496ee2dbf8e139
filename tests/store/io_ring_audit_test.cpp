// Faults a code-reading audit of the io_uring engine found (docs/RELIABILITY.md,
// "Faults from a code-reading audit of the store (session 29)"): ranges too
// long for one SQE, submissions the kernel refuses, and a ring whose
// completion wait fails. The ring's own calls are faulted through
// RingFaults; a fault that used to hang runs in a forked child with an alarm.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "../forked_child.h"
#include "store/io_engine.h"
#include "store/synthetic_pack.h"

namespace k3pack::store {
namespace io_ring_audit {

uint64_t MemAvailableBytes() {
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);)
    if (line.rfind("MemAvailable:", 0) == 0) return std::stoull(line.substr(13)) << 10;
  return 0;
}

// One read's outcome, waited for with a bound (a read that never finishes
// is the fault, not a reason to hang the suite).
struct Outcome {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  ObjectReadResult result;

  std::function<void(const ObjectReadResult&)> Callback() {
    return [this](const ObjectReadResult& r) {
      std::lock_guard<std::mutex> lock(mu);
      result = r;
      done = true;
      cv.notify_all();
    };
  }
  bool Wait(std::chrono::seconds limit = std::chrono::seconds(20)) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, limit, [&] { return done; });
  }
};

// A file of `bytes` bytes, each FileByte(offset).
uint8_t FileByte(uint64_t i) { return static_cast<uint8_t>((i * 2654435761u) >> 11); }

struct SmallFile {
  std::string dir, path;
  int fd = -1;
  explicit SmallFile(const char* tag, uint64_t bytes) {
    dir = testing::TinyPack::TempDir(tag);
    path = dir + "/data.bin";
    std::vector<uint8_t> b(bytes);
    for (uint64_t i = 0; i < bytes; ++i) b[i] = FileByte(i);
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
    fd = ::open(path.c_str(), O_RDONLY);
  }
  ~SmallFile() {
    if (fd >= 0) ::close(fd);
    std::filesystem::remove_all(dir);
  }
};

std::unique_ptr<ObjectRead> ReadOf(int fd, uint8_t* dst, uint64_t bytes, uint32_t splits, Outcome* out) {
  auto r = std::make_unique<ObjectRead>();
  r->fd = fd;
  r->dst = dst;
  r->ranges = ObjectReadRanges(bytes, splits);
  r->layer = 1;
  r->expert = 7;
  r->done = out->Callback();
  return r;
}

// io_uring_prep_read took the range's remaining length cast to unsigned: a
// range of 4 GiB + 8 KiB read its first 8 KiB, then asked for 0 bytes (EOF:
// a "short expert-pack read"). Now such a range goes in pieces.
TEST(IoRingAudit, RangeOfFourGibibytesAndMoreIsReadWhole) {
  constexpr uint64_t kBytes = (uint64_t{4} << 30) + 8192;
  if (MemAvailableBytes() < (uint64_t{10} << 30)) GTEST_SKIP() << "needs about 9 GiB of free memory";
  const std::string dir = testing::TinyPack::TempDir("ring-4g");
  const std::string path = dir + "/sparse.bin";
  const uint64_t marks[] = {0, (uint64_t{1} << 32) - 1, uint64_t{1} << 32, kBytes - 1};
  {
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(kBytes)), 0);  // holes read as zeros
    for (uint64_t at : marks) {
      const uint8_t b = static_cast<uint8_t>(0x5a ^ (at >> 28));
      ASSERT_EQ(::pwrite(fd, &b, 1, static_cast<off_t>(at)), 1);
    }
    ::close(fd);
  }
  // O_DIRECT where the filesystem has it: holes are zeroed straight into the
  // buffer, without first filling 4 GiB of page cache (seconds less).
  bool direct = true;
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  if (fd < 0) {
    direct = false;
    fd = ::open(path.c_str(), O_RDONLY);
  }
  ASSERT_GE(fd, 0);
  void* mem = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  auto* dst = static_cast<uint8_t*>(mem);
  std::memset(dst + (uint64_t{1} << 32) - 4096, 0xee, 8192);  // bytes a cut read would leave as they were
  auto engine = IoEngine::Create(IoBackend::kUring, 4);
  ASSERT_TRUE(engine.ok()) << engine.error().message();
  Outcome out;
  auto read = ReadOf(fd, dst, kBytes, 1, &out);
  read->direct = direct;
  (*engine)->Submit(std::move(read));
  ASSERT_TRUE(out.Wait(std::chrono::seconds(120)));
  (*engine)->Shutdown();
  EXPECT_TRUE(out.result.status.ok()) << out.result.status.message();
  EXPECT_EQ(out.result.bytes, kBytes);
  for (uint64_t at : marks) EXPECT_EQ(dst[at], static_cast<uint8_t>(0x5a ^ (at >> 28))) << at;
  EXPECT_EQ(dst[(uint64_t{1} << 32) - 2], 0) << "the hole before the 4 GiB mark";
  EXPECT_EQ(dst[(uint64_t{1} << 32) + 1], 0) << "the hole after the 4 GiB mark";
  ::munmap(mem, kBytes);
  ::close(fd);
  std::filesystem::remove_all(dir);
}

// In a forked child (a hang ends it with SIGALRM: 142): one read of a 64 KiB
// file in 4 ranges through an io_uring engine with `faults`, then a second
// read, then Shutdown(). `want_error`: the errno text each read must fail
// with ("": both must succeed with the file's bytes).
int ReadTwiceInChild(const SmallFile& f, uint32_t depth, RingFaults faults, const std::function<void()>& arm,
                     const std::string& want_error) {
  return k3test::InForkedChild([&] {
    ::alarm(20);
    auto engine = IoEngine::Create(IoBackend::kUring, depth, faults);
    if (!engine.ok()) ::_exit(2);
    arm();
    for (int round = 0; round < 2; ++round) {
      std::vector<uint8_t> dst(65536);
      Outcome out;
      (*engine)->Submit(ReadOf(f.fd, dst.data(), dst.size(), 4, &out));
      if (!out.Wait()) ::_exit(3);
      if (want_error.empty()) {
        if (!out.result.status.ok()) {
          std::fprintf(stderr, "read failed: %s\n", out.result.status.message().c_str());
          ::_exit(4);
        }
        for (uint64_t i = 0; i < dst.size(); ++i)
          if (dst[i] != FileByte(i)) ::_exit(5);
      } else if (out.result.status.ok() || out.result.status.message().find(want_error) == std::string::npos) {
        std::fprintf(stderr, "round %d: %s\n", round, out.result.status.message().c_str());
        ::_exit(6);
      }
    }
    (*engine)->Shutdown();
    ::_exit(0);
  });
}

// Pump ignored io_uring_submit's result. Entries the kernel refused for now
// (-EAGAIN: short of request memory; -EBUSY: its completion ring
// overflowed) stayed queued, counted as in flight: with nothing else in
// flight no completion came to submit them again, and the read, then
// Shutdown(), waited forever. Now they are handed over again after a
// back-off (or the next completion).
TEST(IoRingAudit, SubmissionsRefusedForNowAreSubmittedAgain) {
  SmallFile f("ring-refused", 65536);
  ASSERT_GE(f.fd, 0);
  for (int refusal : {EAGAIN, EBUSY}) {
    SCOPED_TRACE(std::strerror(refusal));
    auto refused = std::make_shared<std::atomic<int>>(0);
    RingFaults faults;
    faults.submit = [refused, refusal] { return refused->fetch_add(1) < 3 ? -refusal : 0; };
    const int rc = ReadTwiceInChild(f, 8, faults, [] {}, "");
    EXPECT_EQ(rc, 0) << "child exit status (142: hung; 3: a read never finished; 4-5: failed or wrong bytes)";
  }
}

// Any other submission error left the reads queued forever too. Now it
// fails every read the kernel did not take, and every later one, with that
// error, and Shutdown() returns.
TEST(IoRingAudit, SubmissionErrorFailsTheReadsAndShutdownReturns) {
  SmallFile f("ring-submit-error", 65536);
  ASSERT_GE(f.fd, 0);
  RingFaults faults;
  faults.submit = [] { return -EINVAL; };
  const int rc = ReadTwiceInChild(f, 8, faults, [] {}, std::strerror(EINVAL));
  EXPECT_EQ(rc, 0) << "child exit status (142: hung; 3: a read never finished; 6: another outcome)";
}

// When waiting for completions failed (other than EINTR), the reaper
// returned: reads in flight or queued never finished, and Shutdown() waited
// for them forever. Now they fail with the wait's error (those the kernel
// already holds get a moment to complete), later reads fail at once, and
// Shutdown() returns.
TEST(IoRingAudit, CompletionWaitErrorFailsOutstandingReadsAndShutdownReturns) {
  SmallFile f("ring-wait-error", 65536);
  ASSERT_GE(f.fd, 0);
  auto armed = std::make_shared<std::atomic<bool>>(false);
  RingFaults faults;
  faults.wait = [armed] { return armed->load() ? -EBADF : 0; };
  // Queue depth 1: a read's four ranges go one after another, so when a wait
  // fails one range is in the kernel's hands and the others are queued.
  const int rc = ReadTwiceInChild(f, 1, faults, [armed] { armed->store(true); }, std::strerror(EBADF));
  EXPECT_EQ(rc, 0) << "child exit status (142: hung; 3: a read never finished; 6: another outcome)";
}

}  // namespace io_ring_audit
}  // namespace k3pack::store
