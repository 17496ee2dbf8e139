// io_uring backend of IoEngine: one ring, `queue_depth` reads in flight.
// Callers only queue work; the ring's SQ side is driven by threads the engine
// owns (a submitter thread, and the reaper, which owns the CQ side and refills
// the ring as reads finish). That matters: the kernel cancels a request
// (-ECANCELED) whose submitting thread exits, so a read started from a
// caller's short-lived thread would fail for whoever waits on it. A partial
// completion (res < remaining, > 0) is resubmitted for the rest; res == 0
// before the end is EOF: a short read; -EAGAIN/-EINTR, and a few -ECANCELED
// (defence in depth), are resubmitted.
#include <liburing.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <thread>

#include "store/io_engine.h"

namespace k3pack::store {
namespace {

class UringEngine final : public IoEngine {
 public:
  ~UringEngine() override {
    Shutdown();
    if (ring_ok_) io_uring_queue_exit(&ring_);
  }
  IoBackend backend() const override { return IoBackend::kUring; }

  Status Init(uint32_t depth) {
    depth_ = depth;
    uint32_t entries = 1;
    while (entries < depth) entries <<= 1;
    int rc = io_uring_queue_init(entries, &ring_, 0);
    if (rc < 0) return Error(std::string("io_uring is unavailable: ") + std::strerror(-rc), ErrorKind::kOS, -rc);
    try {
      reaper_ = std::thread([this] { Reap(); });
    } catch (const std::system_error& e) {
      io_uring_queue_exit(&ring_);
      return ThreadStartError(e, 0, 2);
    }
    try {
      submitter_ = std::thread([this] { SubmitLoop(); });
    } catch (const std::system_error& e) {
      // Stop the reaper with its shutdown marker (what SubmitLoop posts).
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      io_uring_prep_nop(sqe);
      io_uring_sqe_set_data(sqe, nullptr);
      io_uring_submit(&ring_);
      reaper_.join();
      io_uring_queue_exit(&ring_);
      return ThreadStartError(e, 1, 2);
    }
    ring_ok_ = true;  // Shutdown() and the destructor now own the threads and the ring
    return Status::OK();
  }

  void Submit(std::unique_ptr<ObjectRead> read) override {
    auto job = StartJob(std::move(read));
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i = 0; i < job->read->ranges.size(); ++i) pending_.push_back(new Part{job, i, 0, 0});
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
  }

 private:
  // The engine's submitting thread: turns queued parts into SQEs.
  void SubmitLoop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      submit_cv_.wait(lock, [&] { return stopped_ || (!pending_.empty() && sqes_ < depth_); });
      if (stopped_) break;
      Pump();
    }
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    io_uring_prep_nop(sqe);
    io_uring_sqe_set_data(sqe, nullptr);
    io_uring_submit(&ring_);
  }

  // mu_ held.
  void Pump() {
    bool any = false;
    while (sqes_ < depth_ && !pending_.empty()) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) break;
      Part* p = pending_.front();
      pending_.pop_front();
      const ObjectRead& r = *p->job->read;
      const ReadRange& range = r.ranges[p->range];
      if (p->done == 0) p->start_ns = NowNs();
      io_uring_prep_read(sqe, r.fd, r.dst + range.start + p->done, static_cast<unsigned>(range.length - p->done),
                         r.file_offset + range.start + p->done);
      io_uring_sqe_set_data(sqe, p);
      // A buffered read that hits the page cache would otherwise be copied
      // inline by io_uring_submit, serializing all reads on the submitter;
      // IOSQE_ASYNC hands it to io-wq workers so copies run in parallel.
      if (!r.direct) io_uring_sqe_set_flags(sqe, IOSQE_ASYNC);
      ++sqes_;
      any = true;
    }
    if (any) io_uring_submit(&ring_);
  }

  void Reap() {
    for (;;) {
      io_uring_cqe* cqe = nullptr;
      int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) return;  // ring broken; Shutdown waits would hang, but this does not happen in practice
      auto* p = static_cast<Part*>(io_uring_cqe_get_data(cqe));
      int res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      if (p == nullptr) return;  // shutdown marker
      bool finished = true;
      int64_t result = 0;
      {
        // The Part reached us through the kernel's completion ring, which
        // carries no happens-before edge a race detector can see; taking mu_
        // (under which Submit/Pump wrote it) before touching it provides one.
        std::lock_guard<std::mutex> lock(mu_);
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
      }
      if (finished) {
        FinishRange(*p, result, NowNs() - p->start_ns);
        delete p;
        std::lock_guard<std::mutex> lock(mu_);
        if (pending_.empty() && sqes_ == 0) idle_cv_.notify_all();
      }
    }
  }

  io_uring ring_{};
  bool ring_ok_ = false;
  uint32_t depth_ = 1;
  std::mutex mu_;
  static constexpr uint32_t kMaxCancelRetries = 3;
  std::condition_variable idle_cv_, submit_cv_;
  std::deque<Part*> pending_;
  uint32_t sqes_ = 0;
  bool stopped_ = false;
  std::thread reaper_, submitter_;
};

}  // namespace

Result<std::unique_ptr<IoEngine>> MakeUringEngine(uint32_t queue_depth) {
  auto e = std::make_unique<UringEngine>();
  K3_RETURN_IF_ERROR(e->Init(queue_depth));
  return std::unique_ptr<IoEngine>(std::move(e));
}

}  // namespace k3pack::store
