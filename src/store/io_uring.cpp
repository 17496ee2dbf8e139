// io_uring backend of IoEngine: one ring, `queue_depth` reads in flight.
// Callers only queue work; the ring's SQ side is driven by threads the engine
// owns (a submitter thread, and the reaper, which owns the CQ side and refills
// the ring as reads finish). That matters: the kernel cancels a request
// (-ECANCELED) whose submitting thread exits, so a read started from a
// caller's short-lived thread would fail for whoever waits on it. A partial
// completion (res < remaining, > 0) is resubmitted for the rest; res == 0
// before the end is EOF: a short read; -EAGAIN/-EINTR, and a few -ECANCELED
// (defence in depth), are resubmitted.
//
// io_uring_submit may take fewer entries than are queued, or refuse them all
// for now (-EAGAIN: the kernel is short of request memory; -EBUSY: the
// completion ring overflowed and must be reaped first). Entries it did not
// take stay in the SQ and are handed over again after the next completion
// or, when nothing is in flight to complete, after a back-off on the
// submitter. Any other error, or refusals that last kMaxRefusalNs, break the
// engine: reads the kernel never took, and every later one, fail with that
// error; those it took still complete. A failing completion wait breaks it
// too (see ReapBroken). The reaper of a broken engine leaves
// once the kernel holds nothing of ours (seen on its timed waits, 5.11+; on
// older kernels only the shutdown marker, which a broken ring may not take,
// ends its wait).
#include <liburing.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "store/io_engine.h"
#include "util/threads.h"

namespace k3pack::store {
namespace {

// A kernel that refuses io_uring leaves the store usable with pread: the
// hint says so and why the ring was refused, so the user need not know that
// containers block io_uring_setup by default.
Error RingSetupError(uint32_t entries, int err) {
  std::string why;
  switch (err) {
    case EPERM:
      why = "the kernel refuses io_uring to this process: a seccomp filter (a container's default profile) or "
            "sysctl kernel.io_uring_disabled";
      break;
    case ENOSYS:
      why = "this kernel has no io_uring (Linux 5.1 or later has it)";
      break;
    case ENOMEM:
      why = "the ring's memory could not be had (before Linux 5.12 it is locked memory: `ulimit -l`)";
      break;
    default:
      break;
  }
  const Error e = Error::FromErrno(
      "io_uring is unavailable: cannot set up a ring of " + std::to_string(entries) + " entries", err);
  const std::string use = "use the pread backend (--io pread, io_backend=\"pread\"), which needs no io_uring";
  // FromErrno's own hint (EMFILE) comes first.
  return e.WithHint(why.empty() ? use : why + "; " + use);
}

class UringEngine final : public IoEngine {
  // A FIFO of parts threaded through their own links. A part is in one list
  // at a time and moves between them without allocating: the engine's
  // threads must not allocate, because under `ulimit -v` any allocation may
  // fail and an exception leaving a thread ends the process.
  class PartList {
   public:
    bool empty() const { return head_ == nullptr; }
    uint32_t size() const { return size_; }
    void push_back(Part* p) { Link(p, tail_, nullptr); }
    void push_front(Part* p) { Link(p, nullptr, head_); }
    Part* pop_front() {
      Part* p = head_;
      if (p != nullptr) erase(p);
      return p;
    }
    // A part of another list (or of none) is left where it is.
    void erase(Part* p) {
      if (p->list != this) return;
      (p->prev ? p->prev->next : head_) = p->next;
      (p->next ? p->next->prev : tail_) = p->prev;
      p->prev = p->next = nullptr;
      p->list = nullptr;
      --size_;
    }
    void take_all(PartList& from) {
      while (Part* p = from.pop_front()) push_back(p);
    }

   private:
    void Link(Part* p, Part* before, Part* after) {
      p->list = this;
      p->prev = before;
      p->next = after;
      (before ? before->next : head_) = p;
      (after ? after->prev : tail_) = p;
      ++size_;
    }
    Part* head_ = nullptr;
    Part* tail_ = nullptr;
    uint32_t size_ = 0;
  };

 public:
  explicit UringEngine(RingFaults faults) : faults_(std::move(faults)) {}
  ~UringEngine() override {
    Shutdown();
    if (ring_ok_) io_uring_queue_exit(&ring_);
  }
  IoBackend backend() const override { return IoBackend::kUring; }

  Status Init(uint32_t depth) {
    // The kernel's IORING_MAX_ENTRIES. Past 2^31 the doubling below wrapped
    // to 0 and never ended (Open hung); past this the ring setup failed as
    // "io_uring is unavailable", which it is not.
    constexpr uint32_t kMaxRingEntries = 32768;
    if (depth > kMaxRingEntries) {
      return Error("queue_depth " + std::to_string(depth) + " is more reads in flight than an io_uring ring holds (" +
                   std::to_string(kMaxRingEntries) + " entries)")
          .WithHint("pass a queue_depth of at most " + std::to_string(kMaxRingEntries) +
                    " (64-256 keep a fast NVMe busy), or use the pread backend");
    }
    depth_ = depth;
    uint32_t entries = 1;
    while (entries < depth) entries <<= 1;
    int rc = io_uring_queue_init(entries, &ring_, 0);
    if (rc < 0) return RingSetupError(entries, -rc);
    // Completion waits that time out without submitting anything (5.11+):
    // a broken engine's reaper then leaves on its own.
    timed_waits_ = (ring_.features & IORING_FEAT_EXT_ARG) != 0;
    if (const std::error_code failed = TryStartThread([this] { reaper_ = std::thread([this] { Reap(); }); })) {
      io_uring_queue_exit(&ring_);
      return ThreadStartError(IoBackend::kUring, failed, 0, 2);
    }
    if (const std::error_code failed = TryStartThread([this] { submitter_ = std::thread([this] { SubmitLoop(); }); })) {
      // Stop the reaper with its shutdown marker (what SubmitLoop posts).
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      io_uring_prep_nop(sqe);
      io_uring_sqe_set_data(sqe, nullptr);
      io_uring_submit(&ring_);
      reaper_.join();
      io_uring_queue_exit(&ring_);
      return ThreadStartError(IoBackend::kUring, failed, 1, 2);
    }
    ring_ok_ = true;  // Shutdown() and the destructor now own the threads and the ring
    return Status::OK();
  }

  void Submit(std::unique_ptr<ObjectRead> read) override {
    auto job = StartJob(std::move(read));
    PartList parts;  // made before any is queued: a read is queued whole or not at all
    try {
      for (size_t i = 0; i < job->read->ranges.size(); ++i) parts.push_back(new Part{job, i, 0, 0});
    } catch (const std::bad_alloc&) {
      while (Part* p = parts.pop_front()) delete p;
      AbandonJob();
      throw;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.take_all(parts);
    }
    submit_cv_.notify_one();
  }

  void Shutdown() override {
    std::unique_lock<std::mutex> lock(mu_);
    if (stopped_ || !ring_ok_) return;
    idle_cv_.wait(lock, [&] { return pending_.empty() && sqes_ == 0; });
    stopped_ = true;
    lock.unlock();
    submit_cv_.notify_one();
    submitter_.join();  // it posts the reaper's shutdown marker on its way out
    reaper_.join();
    // The ring (its descriptor and mappings) goes now, not with the engine:
    // a closed store may live on long after Close().
    lock.lock();
    io_uring_queue_exit(&ring_);
    ring_ok_ = false;
  }

 private:
  static constexpr uint32_t kMaxCancelRetries = 3;
  // How long the kernel may refuse every queued entry before the engine
  // gives up on the ring (a hang would be worse than the error).
  static constexpr uint64_t kMaxRefusalNs = 10'000'000'000;
  // The submitter's back-off while entries wait for the kernel to take them.
  static constexpr std::chrono::microseconds kMinBackoff{200}, kMaxBackoff{50'000};
  // How often a reaper with timed waits looks whether it may leave.
  static constexpr long long kWaitTickNs = 100'000'000;
  // The most one SQE asks for: its length is 32 bits (a 4 GiB range read 0
  // bytes), and the kernel reads at most 2 GiB - 4 KiB at a time anyway. A
  // longer range goes in pieces, as a partial completion does; 1 GiB keeps
  // each piece's offsets 4096-aligned for O_DIRECT.
  static constexpr uint64_t kMaxSqeBytes = uint64_t{1} << 30;
  // After a failed completion wait: how long the reaper polls for reads the
  // kernel still holds (since the last one came back) before failing them.
  static constexpr uint64_t kLostGraceNs = 2'000'000'000;

  // The engine's submitting thread: turns queued parts into SQEs, hands
  // refused ones over again, and fails the parts of a broken engine.
  void SubmitLoop() {
    std::unique_lock<std::mutex> lock(mu_);
    auto backoff = kMinBackoff;
    auto work = [&] {
      return stopped_ || (!pending_.empty() && (broken_ != 0 || (queued_.empty() && sqes_ < depth_)));
    };
    for (;;) {
      if (queued_.empty()) {
        backoff = kMinBackoff;
        submit_cv_.wait(lock, work);
      } else {
        // Refused entries: a completion may bring them to the kernel first
        // (the reaper pumps after each), but none may be coming.
        submit_cv_.wait_for(lock, backoff, work);
        backoff = std::min(backoff * 2, kMaxBackoff);
      }
      if (stopped_) break;
      if (broken_ != 0) {
        FailPending(lock);
        continue;
      }
      Pump();
    }
    // The reaper's shutdown marker; a reaper with timed waits leaves without it too.
    for (int tries = 0; tries < 100; ++tries) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) break;
      io_uring_prep_nop(sqe);
      io_uring_sqe_set_data(sqe, nullptr);
      const int rc = RingSubmit();
      if (rc != -EAGAIN && rc != -EBUSY && rc != -EINTR) break;
      lock.unlock();
      std::this_thread::sleep_for(kMinBackoff);
      lock.lock();
    }
  }

  // mu_ held. Prepares SQEs for what fits, then hands the SQ to the kernel.
  void Pump() {
    if (broken_ != 0) {
      if (!pending_.empty()) submit_cv_.notify_one();  // the submitter fails them
      return;
    }
    while (sqes_ < depth_ && !pending_.empty()) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) break;
      Part* p = pending_.pop_front();
      const ObjectRead& r = *p->job->read;
      const ReadRange& range = r.ranges[p->range];
      if (p->done == 0) p->start_ns = NowNs();
      const uint64_t length = std::min(range.length - p->done, kMaxSqeBytes);
      io_uring_prep_read(sqe, r.fd, r.dst + range.start + p->done, static_cast<unsigned>(length),
                         r.file_offset + range.start + p->done);
      io_uring_sqe_set_data(sqe, p);
      // A buffered read that hits the page cache would otherwise be copied
      // inline by io_uring_submit, serializing all reads on the submitter;
      // IOSQE_ASYNC hands it to io-wq workers so copies run in parallel.
      if (!r.direct) io_uring_sqe_set_flags(sqe, IOSQE_ASYNC);
      p->sqe = sqe;
      queued_.push_back(p);
      NoteDeviceReads(++sqes_);
    }
    Flush();
  }

  // mu_ held. The kernel takes queued SQEs in order, as many as it returns.
  void Flush() {
    while (!queued_.empty() && broken_ == 0) {
      int rc = RingSubmit();
      if (rc > 0) {
        refused_since_ns_ = 0;
        for (int i = 0; i < rc && !queued_.empty(); ++i) {
          Part* p = queued_.pop_front();
          p->sqe = nullptr;
          in_kernel_.push_back(p);
        }
        continue;
      }
      if (rc == 0 || rc == -EAGAIN || rc == -EBUSY || rc == -EINTR) {
        const uint64_t now = NowNs();
        if (refused_since_ns_ == 0) refused_since_ns_ = now;
        if (now - refused_since_ns_ < kMaxRefusalNs) return;  // left queued: handed over again later
        if (rc == 0) rc = -EAGAIN;
      }
      Break(-rc);
    }
  }

  // mu_ held. The ring is unusable (`err`): parts the kernel never took go
  // back to pending_ for the submitter to fail, and their SQEs become no-ops
  // (a later submission must not start a read whose caller was told it failed).
  void Break(int err) {
    if (broken_ != 0) return;
    broken_ = err;
    sqes_ -= queued_.size();
    while (Part* p = queued_.pop_front()) {
      auto* sqe = static_cast<io_uring_sqe*>(std::exchange(p->sqe, nullptr));
      io_uring_prep_nop(sqe);
      io_uring_sqe_set_data(sqe, &kDropped);
      pending_.push_back(p);
    }
    submit_cv_.notify_one();
  }

  // Fails every pending part with the engine's error (callbacks run without mu_).
  void FailPending(std::unique_lock<std::mutex>& lock) {
    PartList doomed;
    doomed.take_all(pending_);
    const int64_t result = -static_cast<int64_t>(broken_);
    lock.unlock();
    while (Part* p = doomed.pop_front()) {
      FinishRange(*p, result, p->start_ns != 0 ? NowNs() - p->start_ns : 0);
      delete p;
    }
    lock.lock();
    if (pending_.empty() && sqes_ == 0) idle_cv_.notify_all();
  }

  void Reap() {
    for (;;) {
      io_uring_cqe* cqe = nullptr;
      int rc = RingWait(&cqe);
      if (rc == -EINTR) continue;
      if (rc == -ETIME) {
        std::lock_guard<std::mutex> lock(mu_);
        if ((broken_ != 0 || stopped_) && in_kernel_.empty()) return;  // nothing of ours left to complete
        continue;
      }
      if (rc < 0) {
        ReapBroken(-rc);
        return;
      }
      void* data = io_uring_cqe_get_data(cqe);
      int res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      if (data == nullptr) return;  // shutdown marker
      if (data == &kDropped) continue;
      if (Complete(static_cast<Part*>(data), res)) return;
    }
  }

  // The completion wait failed with `err`, so the ring cannot be waited on.
  // Reads the kernel never took fail now. Those it holds may still complete
  // into the CQ ring (its memory outlives a failing wait: an fd closed by
  // mistake), so the ring is polled for them without entering the kernel
  // until kLostGraceNs pass with none; the rest then fail with `err` too, so
  // every caller, and Shutdown(), gets an answer. (A read the kernel still
  // holds after that may yet write its buffer: the price of not hanging.)
  void ReapBroken(int err) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      Break(err);
    }
    for (uint64_t deadline = NowNs() + kLostGraceNs;;) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (in_kernel_.empty()) return;
      }
      io_uring_cqe* cqe = nullptr;
      if (io_uring_peek_cqe(&ring_, &cqe) == 0 && cqe != nullptr) {
        void* data = io_uring_cqe_get_data(cqe);
        const int res = cqe->res;
        io_uring_cqe_seen(&ring_, cqe);
        if (data != nullptr && data != &kDropped) Complete(static_cast<Part*>(data), res);
        deadline = NowNs() + kLostGraceNs;
        continue;
      }
      if (NowNs() > deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    PartList lost;
    {
      std::lock_guard<std::mutex> lock(mu_);
      lost.take_all(in_kernel_);
      sqes_ -= lost.size();
    }
    while (Part* p = lost.pop_front()) {
      FinishRange(*p, -static_cast<int64_t>(err), NowNs() - p->start_ns);
      delete p;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_.empty() && sqes_ == 0) idle_cv_.notify_all();
  }

  // A part's completion with `res`; true when the engine is broken and the
  // kernel holds nothing more of ours (the reaper may leave).
  bool Complete(Part* p, int res) {
    bool finished = true, leave = false;
    int64_t result = 0;
    {
      // The Part reached us through the kernel's completion ring, which
      // carries no happens-before edge a race detector can see; taking mu_
      // (under which Submit/Pump wrote it) before touching it provides one.
      std::lock_guard<std::mutex> lock(mu_);
      in_kernel_.erase(p);
      const ReadRange& range = p->job->read->ranges[p->range];
      --sqes_;
      if (res == -EAGAIN || res == -EINTR || (res == -ECANCELED && p->cancels++ < kMaxCancelRetries)) {
        pending_.push_front(p);
        finished = false;
      } else if (res > 0 && p->done + uint64_t(res) < range.length) {
        p->done += uint64_t(res);
        pending_.push_front(p);
        finished = false;
      } else {
        result = res < 0 ? res : static_cast<int64_t>(p->done + uint64_t(res));
      }
      Pump();
      leave = broken_ != 0 && in_kernel_.empty();
    }
    if (finished) {
      FinishRange(*p, result, NowNs() - p->start_ns);
      delete p;
      std::lock_guard<std::mutex> lock(mu_);
      if (pending_.empty() && sqes_ == 0) idle_cv_.notify_all();
    }
    return leave;
  }

  int RingSubmit() {
    if (faults_.submit)
      if (int rc = faults_.submit(); rc != 0) return rc;
    return io_uring_submit(&ring_);
  }
  int RingWait(io_uring_cqe** cqe) {
    if (faults_.wait)
      if (int rc = faults_.wait(); rc != 0) return rc;
    if (!timed_waits_) return io_uring_wait_cqe(&ring_, cqe);
    __kernel_timespec tick{0, kWaitTickNs};
    return io_uring_wait_cqe_timeout(&ring_, cqe, &tick);
  }

  static inline char kDropped = 0;  // user_data of an SQE turned into a no-op by Break
  const RingFaults faults_;
  io_uring ring_{};
  bool ring_ok_ = false, timed_waits_ = false;
  uint32_t depth_ = 1;
  std::mutex mu_;
  std::condition_variable idle_cv_, submit_cv_;
  PartList pending_;    // not yet in an SQE
  PartList queued_;     // in an SQE (Part::sqe) the kernel has not taken yet
  PartList in_kernel_;  // taken by the kernel, not completed
  uint32_t sqes_ = 0;                                // queued_ + in_kernel_
  uint64_t refused_since_ns_ = 0;                    // 0: the last submission was taken
  int broken_ = 0;                                   // errno that broke the engine
  bool stopped_ = false;
  std::thread reaper_, submitter_;
};

}  // namespace

Result<std::unique_ptr<IoEngine>> MakeUringEngine(uint32_t queue_depth, RingFaults faults) {
  auto e = std::make_unique<UringEngine>(std::move(faults));
  K3_RETURN_IF_ERROR(e->Init(queue_depth));
  return std::unique_ptr<IoEngine>(std::move(e));
}

}  // namespace k3pack::store
