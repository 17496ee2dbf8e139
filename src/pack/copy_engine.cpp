// The copy phase of BuildPack: worker threads copy whole objects (up, gate,
// down) in ascending order; the calling thread is the coordinator that
// advances the durable watermark, writes checkpoints and reports progress.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <system_error>
#include <thread>

#include "pack/batch_copy.h"
#include "pack/build_inputs.h"
#include "pack/checkpoint_file.h"
#include "pack/copy.h"
#include "util/process_limits.h"
#include "util/progress.h"
#include "util/threads.h"

namespace k3pack::pack {
namespace {
using Clock = std::chrono::steady_clock;

// SIGINT / SIGTERM during the copy: the handler only records the signal; the
// coordinator sees it within its 100 ms tick, lets the workers finish their
// batch, checkpoints what is durable and returns. The same stop told twice
// (GNU timeout signals the command and its process group: TakeStopSignal)
// is one stop; a second one a moment later takes the default action (the
// checkpoint on disk is valid at every moment, so nothing is lost but the
// last batch).
std::atomic<int> g_stop_signal{0};

extern "C" void OnStopSignal(int sig) {
  switch (TakeStopSignal()) {
    case StopSignalTurn::kFirst:
      g_stop_signal.store(sig);
      return;
    case StopSignalTurn::kRepeat:
      return;
    case StopSignalTurn::kInsist:
      ProgressEndLineForSignal();
      ::signal(sig, SIG_DFL);
      ::raise(sig);
      return;
  }
}

class StopSignals {
 public:
  StopSignals() {
    g_stop_signal.store(0);
    ForgetStopSignals();
    InstallUnlessIgnored(SIGINT, OnStopSignal, SA_RESTART, &old_int_);
    InstallUnlessIgnored(SIGTERM, OnStopSignal, SA_RESTART, &old_term_);
  }
  // A signal that came after the copy's last look at it (its last batch was
  // done) is not lost: once the handlers in place before the copy are back,
  // it is raised again for them (pack/build: the clean stop of
  // ExitOnStopSignals; elsewhere what the caller chose, or the default).
  ~StopSignals() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
    const int sig = g_stop_signal.load();
    if (sig != 0 && !reported_) {
      ForgetStopSignals();  // handed on, it is the stop, not a repeat of it
      ::raise(sig);
    }
  }
  // The copy returns an error for this run (the signal's own, or another):
  // the signal needs no second delivery.
  void Reported() { reported_ = true; }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction old_int_ {}, old_term_ {};
  bool reported_ = false;
};

// Starts writeback of objects [obj0, obj0+n) of the pack without waiting
// for it. Left alone, the kernel holds the dirty pages until its dirty
// threshold or the next fdatasync, so the disk idles while the sources are
// read and the closing fsync then writes everything at once (`cp` + sync
// works that way); started per batch, the writes stream out beside the
// reads and the checkpoints' fdatasync finds little left to do.
void StartWriteback(int fd, const PackLayout& layout, uint64_t obj0, uint32_t n) {
  const uint64_t lo = layout.Entry(obj0 * kRoleCount).offset;
  const EntrySlot last = layout.Entry((obj0 + n) * kRoleCount - 1);
  const uint64_t hi = last.offset + last.nbytes;
  if (hi > lo) ::sync_file_range(fd, static_cast<off_t>(lo), static_cast<off_t>(hi - lo), SYNC_FILE_RANGE_WRITE);
}

}  // namespace

int InterruptExitCode(const Error& e) {
  const int sig = g_stop_signal.load();
  return e.sys_errno() == EINTR && sig != 0 ? 128 + sig : 1;
}

Status RunCopy(const ExpertSet& ex, const PackLayout& layout, const BuildOptions& o, const PackPaths& p,
               const Checkpoint& base, int pack_fd, int journal_fd, const std::vector<UniqueFd>& src,
               std::vector<Digest>* digests, std::vector<uint32_t>* crcs, CheckpointFile* ckpt_file,
               BuildResult* result) {
  StopSignals stop_signals;
  const uint64_t total = layout.object_count();
  const uint64_t start = base.objects_done;
  const auto crash_after = EnvU64("K3PACK_CRASH_AFTER_OBJECTS");
  const uint64_t ckpt_bytes = EnvU64("K3PACK_CHECKPOINT_BYTES").value_or(1ull << 30);
  const auto ckpt_interval = std::chrono::milliseconds(EnvU64("K3PACK_CHECKPOINT_MS").value_or(5000));
  const uint64_t throttle_us = EnvU64("K3PACK_THROTTLE_US").value_or(0);
  // Bench seam: K3PACK_EARLY_WRITEBACK=0 leaves writeback to the kernel.
  const bool early_writeback = EnvU64("K3PACK_EARLY_WRITEBACK").value_or(1) != 0;
  // Test seam: a real SIGKILL once this run has written N objects (0: before
  // the first), wherever the checkpoints happen to be.
  const auto kill_after = EnvU64("K3PACK_TEST_KILL_AFTER_OBJECTS");
  if (kill_after && *kill_after == 0) ::raise(SIGKILL);
  // Test seam: std::bad_alloc on a copy thread once this run has written N
  // objects, as an allocation under `ulimit -v` throws at any moment.
  const auto bad_alloc_after = EnvU64("K3PACK_TEST_BAD_ALLOC_AFTER_OBJECTS");
  WriteBudget budget;
  budget.limit = WriteBudget::FromEnv();
  // The staged batches are written with O_DIRECT where the filesystem allows
  // it (see batch_copy.h); K3PACK_DIRECT_WRITE=0 writes them through the page
  // cache (bench seam), as does a filesystem without O_DIRECT.
  UniqueFd pack_direct;
  if (EnvU64("K3PACK_DIRECT_WRITE").value_or(1) != 0) {
    const int fd = ::open(p.partial.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
    if (fd >= 0) pack_direct = UniqueFd(fd);
  }
  const OutputFile pack_out(pack_fd, p.partial, &budget, pack_direct.get()),
      journal_out(journal_fd, p.journal, &budget);
  ckpt_file->set_budget(&budget);
  const uint64_t n_entries = layout.index_count();
  int threads = o.threads > 0 ? o.threads : 4;

  // A rank pack writes only the objects of its experts; the others count as
  // finished from the start (holes, records zero) and not in the progress.
  const ep::ExpertRange written_experts = WrittenExperts(ex.num_experts, o.ep);
  auto is_written = [&](uint64_t obj) { return written_experts.contains(static_cast<uint32_t>(obj % ex.num_experts)); };
  auto object_bytes = [&](uint64_t obj) -> uint64_t {
    if (!is_written(obj)) return 0;
    const auto& b = layout.layers()[obj / ex.num_experts].expert_bytes;
    return b[0] + b[1] + b[2];
  };
  uint64_t total_bytes = 0, done_bytes = 0;
  for (uint64_t li = 0; li < layout.num_layers(); ++li) {
    total_bytes += object_bytes(li * ex.num_experts + written_experts.first) * written_experts.count();
  }
  for (uint64_t obj = 0; obj < start; ++obj) done_bytes += object_bytes(obj);
  // Progress counts the objects this build writes: a rank's, not the
  // watermark's position among every rank's objects.
  const uint64_t written_total = static_cast<uint64_t>(layout.num_layers()) * written_experts.count();
  auto written_below = [&](uint64_t watermark) {
    const uint64_t in_layer = watermark % ex.num_experts;
    const uint64_t partial = in_layer > written_experts.first
                                 ? std::min<uint64_t>(in_layer, written_experts.end) - written_experts.first
                                 : 0;
    return watermark / ex.num_experts * written_experts.count() + partial;
  };

  // Work unit: a batch of consecutive experts of one layer, so each role is
  // read with one large sequential read (batch_bytes per role at most).
  const uint64_t batch_bytes = EnvU64("K3PACK_BATCH_BYTES").value_or(std::max<uint64_t>(o.chunk_bytes, 1));
  struct Batch {
    uint32_t ali, e0, n;
  };
  std::vector<Batch> batches;
  uint64_t max_batch_bytes = 0, max_stage_bytes = 0;
  for (uint32_t li = 0; li < layout.num_layers(); ++li) {
    const auto& eb = layout.layers()[li].expert_bytes;
    const uint64_t biggest = std::max({eb[0], eb[1], eb[2]});
    const auto per = static_cast<uint32_t>(std::clamp<uint64_t>(batch_bytes / biggest, 1, ex.num_experts));
    max_batch_bytes = std::max(max_batch_bytes, per * biggest);
    const uint64_t first = static_cast<uint64_t>(li) * ex.num_experts;
    uint32_t e = start > first ? static_cast<uint32_t>(std::min<uint64_t>(start - first, ex.num_experts)) : 0;
    e = std::max(e, written_experts.first);
    while (e < written_experts.end) {
      const uint32_t n = std::min(per, written_experts.end - e);
      const BatchSpan span = SpanOf(layout, li, e, n);
      max_stage_bytes = std::max(max_stage_bytes, (span.hi - span.lo + kDirectAlign - 1) / kDirectAlign * kDirectAlign);
      batches.push_back({li, e, n});
      e += n;
    }
  }
  // O_DIRECT views of the shards (see ReadSource). Not while the shard hasher
  // reads the same shards: it relies on the copy's reads filling the page
  // cache it then reads from. K3PACK_DIRECT_READ=0 reads through the page
  // cache (bench seam); so does a filesystem without O_DIRECT (tmpfs).
  std::vector<UniqueFd> direct(src.size());
  if (!o.hash_sources && EnvU64("K3PACK_DIRECT_READ").value_or(1) != 0) {
    for (size_t i = 0; i < src.size(); ++i) {
      auto fd = OpenReadOnly(ex.shard_paths[i], O_DIRECT);
      if (fd.ok()) direct[i] = std::move(*fd);
    }
  }
  std::vector<uint64_t> src_size(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    struct stat st;
    if (::fstat(src[i].get(), &st) != 0) return Error::FromErrno("cannot stat " + ex.shard_paths[i], errno);
    src_size[i] = static_cast<uint64_t>(st.st_size);
  }
  if (static_cast<uint64_t>(threads) > batches.size()) threads = static_cast<int>(std::max<size_t>(1, batches.size()));
  BatchIo io;
  io.ex = &ex;
  io.layout = &layout;
  io.out = &pack_out;
  for (size_t i = 0; i < src.size(); ++i) {
    io.src.push_back(src[i].get());
    io.direct_src.push_back(direct[i].get());
  }
  io.src_size = src_size;
  // The hashing runs on threads of its own, one per core (at most 4), so it
  // overlaps the reads and writes of the copy threads.
  const int hash_threads = static_cast<int>(EnvU64("K3PACK_HASH_THREADS").value_or(
      std::clamp<unsigned>(std::thread::hardware_concurrency(), 1, 4)));
  std::optional<TaskPool> hash_pool;
  try {
    hash_pool.emplace(hash_threads);
  } catch (const std::system_error& e) {
    return Error::FromErrno("cannot start the pack build's hashing threads", e.code().value())
        .WithHint(ThreadStartHint() + "; nothing was copied");
  }

  std::unique_ptr<std::atomic<uint8_t>[]> finished(new std::atomic<uint8_t>[total]);
  for (uint64_t i = 0; i < total; ++i) finished[i].store(i < start || !is_written(i) ? 1 : 0, std::memory_order_relaxed);
  std::atomic<uint64_t> next{0};
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::condition_variable cv;
  std::optional<Error> first_error;
  std::atomic<uint64_t> data_bytes{0}, hole_bytes{0};
  std::atomic<uint64_t> written{0};  // bytes actually written (holes excluded)
  std::atomic<uint64_t> objects_copied{0};
  double read_s = 0, write_s = 0, hash_s = 0, ckpt_s = 0;  // summed under mu

  auto stop_workers = [&] {
    stop.store(true);
    cv.notify_all();
  };
  // The first error stops every worker; the main loop reports it.
  auto fail = [&](const Error& e) {
    std::lock_guard<std::mutex> lock(mu);
    if (!first_error) first_error = e;
    stop_workers();
  };
  std::atomic<bool> out_of_memory{false};
  auto copy = [&]() {
    auto buffers = BatchBuffers::Allocate(max_batch_bytes, max_stage_bytes, pack_out.direct());
    if (!buffers.ok()) return fail(buffers.error());
    BatchBuffers& buf = *buffers;
    CopyStats stats;
    while (!stop.load()) {
      const uint64_t bi = next.fetch_add(1);
      if (bi >= batches.size()) break;
      const Batch bt = batches[bi];
      if (bad_alloc_after && objects_copied.load() >= *bad_alloc_after) throw std::bad_alloc();
      const uint64_t obj0 = static_cast<uint64_t>(bt.ali) * ex.num_experts + bt.e0;
      const uint64_t written_before = stats.data_bytes;
      Status st = CopyBatch(io, bt.ali, bt.e0, bt.n, buf, &*hash_pool, digests->data() + obj0 * kRoleCount,
                            crcs->data() + obj0 * kRoleCount, &stats);
      if (st.ok() && early_writeback && !pack_out.direct() && stats.data_bytes != written_before) StartWriteback(pack_fd, layout, obj0, bt.n);
      if (st.ok()) {
        st = journal_out.Write(digests->data() + obj0 * kRoleCount, bt.n * kRoleCount * kDigestBytes,
                               kDigestsHeaderBytes + obj0 * kRoleCount * kDigestBytes);
      }
      if (st.ok()) {
        // Host order is little-endian (x86-64/aarch64), the records' order.
        st = journal_out.Write(crcs->data() + obj0 * kRoleCount, bt.n * kRoleCount * kCrcBytes,
                               CrcRecordOffset(n_entries, obj0 * kRoleCount));
      }
      if (!st.ok()) {
        fail(st.error());
        break;
      }
      written.fetch_add(stats.data_bytes - written_before, std::memory_order_relaxed);
      if (throttle_us) std::this_thread::sleep_for(std::chrono::microseconds(throttle_us * bt.n));
      for (uint32_t i = 0; i < bt.n; ++i) finished[obj0 + i].store(1, std::memory_order_release);
      cv.notify_all();
      if (objects_copied.fetch_add(bt.n) + bt.n >= kill_after.value_or(UINT64_MAX)) ::raise(SIGKILL);
    }
    data_bytes += stats.data_bytes;
    hole_bytes += stats.hole_bytes;
    std::lock_guard<std::mutex> lock(mu);
    read_s += stats.read_s;
    write_s += stats.write_s;
    hash_s += stats.hash_s;
  };
  auto worker = [&]() {
    if (RanOutOfMemory(copy)) {
      out_of_memory.store(true);
      stop_workers();
    }
  };

  std::vector<std::thread> pool;
  const JoinedOnExit joined(pool, stop_workers);
  for (int i = 0; i < threads; ++i) {
    if (const std::error_code ec = TryStartThread([&] { pool.emplace_back(worker); })) {
      if (!pool.empty()) break;  // fewer copy threads take every batch all the same
      return Error::FromErrno("cannot start the pack build's copy threads", ec.value())
          .WithHint(ThreadStartHint() + "; nothing was copied");
    }
  }

  const auto t0 = Clock::now();
  auto last_ckpt_time = t0, last_progress = t0 - std::chrono::seconds(1);
  uint64_t watermark = start, ckpt_watermark = start, written_at_ckpt = 0;
  uint64_t durable_offset = start < total ? layout.Entry(start * kRoleCount).offset : layout.final_size();
  Checkpoint ckpt = base;
  Status status;

  auto advance = [&]() {
    while (watermark < total && finished[watermark].load(std::memory_order_acquire)) {
      done_bytes += object_bytes(watermark);
      ++watermark;
    }
  };
  auto checkpoint = [&]() -> Status {
    const auto c0 = Clock::now();
    if (::fdatasync(pack_fd) != 0) return Error::FromErrno("fdatasync failed for " + p.partial, errno);
    if (::fdatasync(journal_fd) != 0) return Error::FromErrno("fdatasync failed for " + p.journal, errno);
    ckpt.objects_done = watermark;
    ckpt.journal_sha256 = ToHex(Sha256Raw(digests->data(), watermark * kRoleCount * kDigestBytes).data(), 32);
    ckpt.journal_crc_sha256 = ToHex(Sha256Raw(crcs->data(), watermark * kRoleCount * kCrcBytes).data(), 32);
    K3_RETURN_IF_ERROR(ckpt_file->Write(ckpt));
    // The durable range is no longer needed in the page cache.
    uint64_t upto = watermark < total ? layout.Entry(watermark * kRoleCount).offset : layout.final_size();
    ::posix_fadvise(pack_fd, static_cast<off_t>(durable_offset), static_cast<off_t>(upto - durable_offset),
                    POSIX_FADV_DONTNEED);
    durable_offset = upto;
    ckpt_watermark = watermark;
    written_at_ckpt = written.load();
    last_ckpt_time = Clock::now();
    ckpt_s += std::chrono::duration<double>(last_ckpt_time - c0).count();
    if (crash_after && watermark >= *crash_after) ::_exit(86);  // test seam: simulated crash
    return Status::OK();
  };

  bool interrupted = false;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_for(lock, std::chrono::milliseconds(100));
      if (first_error || out_of_memory.load()) break;
    }
    if (g_stop_signal.load() != 0) {
      interrupted = true;
      break;
    }
    advance();
    const auto now = Clock::now();
    const bool all_done = watermark == total;
    if (watermark > ckpt_watermark && (all_done || written.load() - written_at_ckpt >= ckpt_bytes || now - last_ckpt_time >= ckpt_interval ||
                                       (crash_after && watermark >= *crash_after))) {
      status = checkpoint();
      if (!status.ok()) break;
    }
    if (o.progress && (all_done || now - last_progress >= std::chrono::milliseconds(100))) {
      last_progress = now;
      // copied_bytes: holes advance done_bytes but are not copy throughput.
      o.progress({"build", done_bytes, total_bytes, written_below(watermark), written_total,
                  std::chrono::duration<double>(now - t0).count(), written.load()});
    }
    if (all_done) break;
  }
  stop_workers();
  for (auto& t : pool) t.join();
  if (out_of_memory.load() && !first_error)
    first_error = OutOfMemoryOn("a copy thread of the pack build").WithContext(p.partial);
  // Test seam: the copy finished without a signal; stop here, after its last
  // look at one, so a test can deliver a real signal at this moment.
  if (!first_error && !interrupted && EnvU64("K3PACK_TEST_STOP_AFTER_COPY").value_or(0) == 1) ::raise(SIGSTOP);
  if (first_error || interrupted) {
    stop_signals.Reported();
    // Keep what is already written (the disk filled up, or the user stopped
    // the build): checkpoint the finished prefix so the rerun resumes there
    // instead of starting over. The checkpoint's space is reserved (see
    // CheckpointFile), so this works on a full disk; if it still fails, the
    // previous checkpoint stands.
    advance();
    if (watermark > ckpt_watermark) (void)checkpoint();
    if (o.progress) {
      // copied_bytes as in the loop: without it the holes were the rate.
      Progress last{"build", done_bytes, total_bytes, written_below(watermark), written_total,
                    std::chrono::duration<double>(Clock::now() - t0).count(), written.load()};
      last.final = true;  // ends a progress bar's line before the message
      o.progress(last);
    }
    const std::string resume_at = std::to_string(ckpt_watermark) + " of " + std::to_string(total);
    if (!first_error) {
      return Error("interrupted; rerun the same command to resume from object " + resume_at, ErrorKind::kOS, EINTR);
    }
    Error e = *first_error;
    if (e.sys_errno() == ENOMEM) {
      e = e.WithHint("the rerun resumes at object " + resume_at);
    } else if (e.sys_errno() == ENOSPC || e.sys_errno() == EDQUOT) {
      e = e.WithHint("free space on the filesystem of " + p.partial + " and rerun the same command; the build " +
                     "resumes at object " + resume_at);
    }
    return e;
  }
  K3_RETURN_IF_ERROR(status);
  result->copied_bytes = data_bytes.load();
  result->hole_bytes = hole_bytes.load();
  result->phases.copy_wall = std::chrono::duration<double>(Clock::now() - t0).count();
  result->phases.read = read_s;
  result->phases.write = write_s;
  result->phases.hash = hash_s;
  result->phases.checkpoint = ckpt_s;
  return Status::OK();
}

}  // namespace k3pack::pack
