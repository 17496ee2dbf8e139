#include "store/io_engine.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <thread>

#include "util/all_or_none.h"
#include "util/process_limits.h"
#include "util/threads.h"

namespace k3pack::store {

uint64_t NowNs() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

Error ThreadStartError(IoBackend backend, std::error_code failed, size_t started, size_t wanted) {
  const std::string hint =
      (backend == IoBackend::kPread ? "lower queue_depth (the pread backend runs one thread per read in flight), or " : "") +
      ThreadStartHint();
  return Error("cannot start the expert store's I/O threads (" + std::to_string(started) + " of " +
                   std::to_string(wanted) + " started): " + failed.message(),
               ErrorKind::kOS, failed.value())
      .WithHint(hint);
}

const char* IoBackendName(IoBackend b) { return b == IoBackend::kUring ? "uring" : "pread"; }

Result<IoBackend> ParseIoBackend(const std::string& name) {
  if (name == "pread") return IoBackend::kPread;
  if (name == "uring" || name == "io_uring") return IoBackend::kUring;
  return Error("unknown I/O backend '" + name + "' (known: pread, uring)");
}

std::vector<ReadRange> ObjectReadRanges(uint64_t p, uint32_t splits) {
  if (splits == 0) splits = 1;
  const uint64_t alignment = p >= uint64_t{splits} * 4096 ? 4096 : 1;
  std::vector<uint64_t> b;
  for (uint32_t part = 0; part < splits; ++part) b.push_back(p * part / splits / alignment * alignment);
  b.push_back(p);
  std::vector<ReadRange> out;
  for (uint32_t i = 0; i < splits; ++i) out.push_back({b[i], b[i + 1] - b[i]});
  return out;
}

static std::string RouteTuple(const ObjectRead& r, const ReadRange& range) {
  return "(" + std::to_string(r.layer) + ", " + std::to_string(r.expert) + ", " + std::to_string(range.start) +
         ", " + std::to_string(range.length) + ")";
}

void IoEngine::AbandonJob() { inflight_.fetch_sub(1); }

std::shared_ptr<IoEngine::Job> IoEngine::StartJob(std::unique_ptr<ObjectRead> read) {
  auto job = std::make_shared<Job>();
  job->remaining = read->ranges.size();
  job->submit_ns = NowNs();
  job->read = std::move(read);
  inflight_.fetch_add(1);
  return job;
}

void IoEngine::FinishRange(const Part& part, int64_t result, uint64_t ns) {
  Job& job = *part.job;
  const ObjectRead& r = *job.read;
  const ReadRange& range = r.ranges[part.range];
  ApplyHook(r.file_offset + range.start, range.length, &result);
  if (result >= 0) job.bytes += static_cast<uint64_t>(result);
  uint64_t prev = job.max_ns.load();
  while (ns > prev && !job.max_ns.compare_exchange_weak(prev, ns)) {
  }
  if (result < 0 || static_cast<uint64_t>(result) != range.length) {
    // This runs on an engine thread: with no memory for the text, the read
    // still fails, with an error made without allocating.
    Error e = BareOutOfMemory();
    RanOutOfMemory([&] {
      e = result < 0
              ? Error("expert-pack read failed for " + RouteTuple(r, range) + ": " + std::strerror(int(-result)),
                      ErrorKind::kOS, int(-result))
              : Error("short expert-pack read for " + RouteTuple(r, range) + ": " + std::to_string(result) +
                          " != " + std::to_string(range.length),
                      ErrorKind::kOS);
    });
    std::lock_guard<std::mutex> lock(job.mu);
    if (!job.error) job.error = std::move(e);
  }
  if (--job.remaining != 0) return;
  ObjectReadResult out;
  if (job.error) out.status = std::move(*job.error);  // moved: a copy of the text could fail to allocate
  out.bytes = job.bytes;
  out.max_range_ns = job.max_ns;
  out.latency_ns = NowNs() - job.submit_ns;
  inflight_.fetch_sub(1);
  auto done = std::move(job.read->done);
  if (done) done(out);
}

namespace {

// Blocking pread on a pool of threads, at most `queue_depth` ranges in
// flight. The pool grows as ranges queue up, as SGLang's ThreadPoolExecutor
// does: read_splits 1024 with 16 stage slots asked for 16,384 threads at
// open (2.7 s) whether or not a call ever queued that many ranges. The first
// kThreadsAtOpen start at open, so the default depths never start a thread
// on the read path and a process that cannot start them fails at open.
class PreadEngine final : public IoEngine {
 public:
  static constexpr uint32_t kThreadsAtOpen = 64;

  ~PreadEngine() override { Shutdown(); }
  // Starts min(max_threads, kThreadsAtOpen) workers; when the process cannot
  // make them all, those already running are stopped and the open fails.
  Status Start(uint32_t max_threads) {
    max_threads_ = max_threads;
    const uint32_t threads = std::min(max_threads, kThreadsAtOpen);
    for (uint32_t i = 0; i < threads; ++i) {
      std::error_code failed;
      {
        std::lock_guard<std::mutex> lock(mu_);
        failed = StartWorker();
      }
      if (failed) {
        const size_t started = workers_.size();
        Shutdown();
        return ThreadStartError(IoBackend::kPread, failed, started, threads);
      }
    }
    return Status::OK();
  }
  IoBackend backend() const override { return IoBackend::kPread; }

  void Submit(std::unique_ptr<ObjectRead> read) override {
    auto job = StartJob(std::move(read));
    size_t n = job->read->ranges.size();
    {
      std::lock_guard<std::mutex> lock(mu_);
      try {
        AppendAllOrNone(queue_, n, [&](size_t i) { return Part{job, i, 0, 0}; });
      } catch (const std::bad_alloc&) {
        AbandonJob();
        throw;
      }
      GrowForQueuedRanges();
    }
    if (n == 1) cv_.notify_one(); else cv_.notify_all();
  }

  void Shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

 private:
  // Called with mu_ held. Every worker not reading a range will take a
  // queued one (waiting, just started, or just done with its last), so only
  // the ranges beyond them start threads; one that cannot start now is not
  // an error: the ranges wait for the threads running (at least one).
  void GrowForQueuedRanges() {
    const size_t ready = workers_.size() - std::min(workers_.size(), busy_.load());
    if (stopping_ || queue_.size() <= ready) return;
    const size_t wanted = std::min<size_t>(queue_.size() - ready, max_threads_ - workers_.size());
    for (size_t i = 0; i < wanted; ++i)
      if (StartWorker()) return;
  }

  // Called with mu_ held (workers_ grows under it).
  std::error_code StartWorker() {
    return TryStartThread([this] { workers_.emplace_back([this] { Work(); }); });
  }

  void Work() {
    for (;;) {
      Part part;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping and drained
        part = std::move(queue_.front());
        queue_.pop_front();
        NoteDeviceReads(++busy_);
      }
      const ObjectRead& r = *part.job->read;
      const ReadRange& range = r.ranges[part.range];
      uint64_t t0 = NowNs();
      int64_t result = 0;
      uint64_t done = 0;
      while (done < range.length) {
        ssize_t n = ::pread(r.fd, r.dst + range.start + done, range.length - done,
                            static_cast<off_t>(r.file_offset + range.start + done));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) { result = -errno; break; }
        if (n == 0) break;  // EOF: short read
        done += static_cast<uint64_t>(n);
      }
      if (result == 0) result = static_cast<int64_t>(done);
      FinishRange(part, result, NowNs() - t0);
      --busy_;
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Part> queue_;
  bool stopping_ = false;
  std::atomic<size_t> busy_{0};  // workers reading a range (taken under mu_)
  uint32_t max_threads_ = 0;
  std::vector<std::thread> workers_;
};

}  // namespace

Result<std::unique_ptr<IoEngine>> MakeUringEngine(uint32_t queue_depth, RingFaults faults);  // io_uring.cpp

Result<std::unique_ptr<IoEngine>> IoEngine::Create(IoBackend backend, uint32_t queue_depth, RingFaults ring_faults) {
  if (queue_depth == 0) return Error("I/O queue depth must be positive");
  if (backend == IoBackend::kUring) return MakeUringEngine(queue_depth, std::move(ring_faults));
  auto engine = std::make_unique<PreadEngine>();
  K3_RETURN_IF_ERROR(engine->Start(queue_depth));
  return std::unique_ptr<IoEngine>(std::move(engine));
}

}  // namespace k3pack::store
