// Reads must not depend on the lifetime of the thread that asked for them.
// The kernel cancels io_uring requests (-ECANCELED) that were submitted by a
// thread when that thread exits; so the engine submits only from threads it
// owns. Here short-lived threads each start reads and exit at once, while
// their reads are still in flight: every read must complete with the right
// bytes (engine level and through the store's Prefetch/Acquire).
#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>
#include <vector>

#include "k3pack/store.h"
#include "store/io_engine.h"
#include "store/synthetic_pack.h"

namespace k3pack::store {
namespace {

uint8_t FileByte(uint64_t i) { return static_cast<uint8_t>((i * 2654435761u) >> 13); }

TEST(StoreConcurrency, ReadsSurviveTheirSubmittingThreadsExit) {
  const std::string dir = testing::TinyPack::TempDir("thread-exit");
  const std::string path = dir + "/data.bin";
  constexpr uint64_t kObject = 1 << 20, kObjects = 48;
  {
    std::vector<uint8_t> bytes(kObject * kObjects);
    for (uint64_t i = 0; i < bytes.size(); ++i) bytes[i] = FileByte(i);
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
    ::close(fd);
  }
  int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  for (IoBackend backend : {IoBackend::kUring, IoBackend::kPread}) {
    SCOPED_TRACE(IoBackendName(backend));
    for (int round = 0; round < 4; ++round) {
      auto engine = IoEngine::Create(backend, 8);
      ASSERT_TRUE(engine.ok()) << engine.error().message();
      std::vector<std::vector<uint8_t>> dst(kObjects, std::vector<uint8_t>(kObject));
      std::mutex mu;
      std::condition_variable cv;
      uint64_t finished = 0;
      std::vector<std::string> errors;
      // One thread per object: submit, then exit without waiting.
      std::vector<std::thread> submitters;
      for (uint64_t o = 0; o < kObjects; ++o) {
        submitters.emplace_back([&, o] {
          auto r = std::make_unique<ObjectRead>();
          r->fd = fd;
          r->file_offset = o * kObject;
          r->dst = dst[o].data();
          r->ranges = ObjectReadRanges(kObject, 4);
          r->layer = 1;
          r->expert = static_cast<uint32_t>(o);
          r->done = [&](const ObjectReadResult& res) {
            std::lock_guard<std::mutex> lock(mu);
            if (!res.status.ok()) errors.push_back(res.status.error().message());
            ++finished;
            cv.notify_all();
          };
          (*engine)->Submit(std::move(r));
        });
        submitters.back().join();  // the submitting thread is gone before its reads can have finished
      }
      {
        std::unique_lock<std::mutex> lock(mu);
        ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return finished == kObjects; }));
      }
      (*engine)->Shutdown();
      EXPECT_TRUE(errors.empty()) << errors.size() << " of " << kObjects << " reads failed, first: " << errors[0];
      for (uint64_t o = 0; o < kObjects && errors.empty(); ++o) {
        for (uint64_t i = 0; i < kObject; i += 4093) ASSERT_EQ(dst[o][i], FileByte(o * kObject + i)) << o << " " << i;
      }
    }
  }
  ::close(fd);
  std::filesystem::remove_all(dir);
}

// The same through the store: threads that prefetch and exit; the objects are
// then acquired (waiting on reads that those threads started).
TEST(StoreConcurrency, PrefetchingThreadsExitBeforeTheirReadsFinish) {
  testing::TinySpec spec;
  spec.role_bytes.assign(spec.layers.size(), {256 << 10, 256 << 10, 256 << 10});
  testing::TinyPack p(spec);
  for (int round = 0; round < 4; ++round) {
    StoreOptions o;
    o.cache_bytes = 16ull * 3 * (256 << 10);
    o.io_backend = "uring";
    o.read_splits = 4;
    o.queue_depth = 4;
    auto opened = ExpertStore::Open(p.pack, p.manifest, o);
    ASSERT_TRUE(opened.ok()) << opened.error().message();
    auto s = *opened;
    for (uint32_t layer : {1u, 2u}) {
      for (int64_t e = 0; e < 8; ++e) {
        std::thread([&, layer, e] {
          const int64_t ids[1] = {e};
          ASSERT_TRUE(s->Prefetch(layer, ids).ok());
        }).join();
      }
      for (int64_t e = 0; e < 8; e += 2) {
        const int64_t ids[2] = {e, e + 1};
        const int64_t shape[2] = {1, 2};
        auto a = s->Acquire(layer, ids, shape);
        ASSERT_TRUE(a.ok()) << "round " << round << ": " << a.error().message();
        for (const auto& v : a->routes) {
          ASSERT_EQ(v.up[1000], testing::PatternByte(layer, v.expert, 0, 1000));
          ASSERT_EQ(v.down[5000], testing::PatternByte(layer, v.expert, 2, 5000));
        }
        ASSERT_TRUE(s->MarkUsed(*a).ok());
      }
    }
    auto j = s->Snapshot();
    EXPECT_EQ(j["io_errors"], 0);
    ASSERT_TRUE(s->Close().ok());
  }
}

}  // namespace
}  // namespace k3pack::store
