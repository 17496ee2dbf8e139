// Asynchronous whole-object reads with several requests in flight.
//
// An object read is split into ranges (SGLang's read_splits, §7.5); every
// range is one positioned read into the caller's buffer. Two backends:
//   - kPread: a pool of `queue_depth` threads, each doing blocking pread;
//   - kUring: one io_uring with `queue_depth` reads in flight; any thread
//     queues reads, engine-owned threads submit them (a request dies with
//     the thread that submitted it) and one thread reaps completions.
// Both work buffered or with O_DIRECT (then buffers, offsets and lengths
// must be 4096-aligned; the store checks that before reading).
//
// A read that ends early (EOF) is SGLang's OSError
//   `short expert-pack read for {(layer, expert, start, length)}: {read} != {length}`
// and never reaches the caller as data. A fault hook lets tests replace a
// read's result (a short count, or -errno) without a broken disk.
#pragma once

#include <cstdint>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "k3pack/error.h"

namespace k3pack::store {

enum class IoBackend { kPread, kUring };
const char* IoBackendName(IoBackend b);  // "pread", "uring"
Result<IoBackend> ParseIoBackend(const std::string& name);

struct ReadRange {
  uint64_t start = 0;   // within the object
  uint64_t length = 0;
};

// SGLang's _object_read_ranges: `splits` parts, boundaries rounded down to
// 4096 when the object is at least splits*4096 bytes, else to 1.
std::vector<ReadRange> ObjectReadRanges(uint64_t object_bytes, uint32_t splits);

struct ObjectReadResult {
  Status status;
  uint64_t bytes = 0;         // bytes read (sum over ranges)
  uint64_t max_range_ns = 0;  // SGLang's pack_read_ns contribution (max over splits)
  uint64_t latency_ns = 0;    // submit -> last range done (what a waiter sees)
};

struct ObjectRead {
  int fd = -1;
  uint64_t file_offset = 0;  // object start in the file
  uint8_t* dst = nullptr;    // object_bytes long
  std::vector<ReadRange> ranges;
  uint32_t layer = 0, expert = 0;  // for error texts
  bool direct = false;             // fd is O_DIRECT (io_uring: native async; buffered: punted to workers)
  // Called once, from an engine thread, and must not throw: an exception
  // leaving an engine thread ends the process.
  std::function<void(const ObjectReadResult&)> done;
};

// Called once per range after it finished, with the range's result (bytes
// read before EOF, or -errno); may change it. Arguments: the range's file
// offset and length.
using FaultHook = std::function<void(uint64_t file_offset, uint64_t length, int64_t* result)>;

// A test seam for the io_uring backend's own calls into its ring: before each
// io_uring_submit and each completion wait, the hook set for it is called; a
// negative errno it returns stands for that call's result (the call is not
// made), 0 lets the call run. Hooks are called on the engine's threads. The
// pread backend has no ring and ignores them.
struct RingFaults {
  std::function<int()> submit, wait;
};

class IoEngine {
 public:
  static Result<std::unique_ptr<IoEngine>> Create(IoBackend backend, uint32_t queue_depth,
                                                  RingFaults ring_faults = {});
  virtual ~IoEngine() = default;
  virtual IoBackend backend() const = 0;
  // Queues a read. Throws std::bad_alloc (under `ulimit -v`) with nothing
  // queued and `done` never to be called.
  virtual void Submit(std::unique_ptr<ObjectRead> read) = 0;
  // Stops accepting work, waits for everything submitted, joins threads.
  virtual void Shutdown() = 0;
  // Not thread-safe with in-flight reads; set it before submitting.
  void SetFaultHook(FaultHook hook) { hook_ = std::move(hook); }

  // Objects submitted but not finished right now.
  uint64_t inflight() const { return inflight_.load(std::memory_order_relaxed); }
  // The most reads at the device at once (a pread running, an SQE given to
  // the ring): never past the queue depth, where objects handed over at once
  // were (they wait in the engine's queue).
  uint64_t max_device_reads() const { return max_device_reads_.load(std::memory_order_relaxed); }

 protected:
  struct Job {
    std::unique_ptr<ObjectRead> read;
    std::atomic<size_t> remaining{0};
    std::atomic<uint64_t> bytes{0}, max_ns{0};
    uint64_t submit_ns = 0;
    std::mutex mu;
    std::optional<Error> error;  // first failure
  };
  struct Part {
    std::shared_ptr<Job> job;
    size_t range = 0;
    uint64_t done = 0;      // bytes of the range already read (short reads are retried)
    uint64_t start_ns = 0;
    uint32_t cancels = 0;   // -ECANCELED completions resubmitted (io_uring)
    // io_uring: the engine's list the part is in, its links there, and its
    // SQE while the kernel has not taken it (io_uring.cpp's PartList).
    const void* list = nullptr;
    Part* prev = nullptr;
    Part* next = nullptr;
    void* sqe = nullptr;
  };
  // A range finished with `result` (its total bytes, or -errno) after `ns`;
  // completes the job when it is the last range.
  void FinishRange(const Part& part, int64_t result, uint64_t ns);
  std::shared_ptr<Job> StartJob(std::unique_ptr<ObjectRead> read);
  // Undoes StartJob for a job none of whose ranges could be queued.
  void AbandonJob();
  void ApplyHook(uint64_t offset, uint64_t length, int64_t* result) const {
    if (hook_) hook_(offset, length, result);
  }
  // `now` reads are at the device.
  void NoteDeviceReads(uint64_t now) {
    uint64_t prev = max_device_reads_.load();
    while (now > prev && !max_device_reads_.compare_exchange_weak(prev, now)) {
    }
  }

 private:
  FaultHook hook_;
  std::atomic<uint64_t> inflight_{0}, max_device_reads_{0};
};

uint64_t NowNs();

// The error for `backend`'s threads that could not be started (`started` of
// `wanted`; the process's thread or address-space limit, named with its
// value): std::thread throws, and an escaping exception (or a joinable
// thread destroyed while unwinding) used to abort the whole process from
// Open().
Error ThreadStartError(IoBackend backend, std::error_code failed, size_t started, size_t wanted);

}  // namespace k3pack::store
