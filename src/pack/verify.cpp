// Full payload verification: every selected entry hashed against the digest
// sidecar and/or compared with the GGUF source, several entries in flight.
// A mismatch does not stop the run: every damaged entry is named (an I/O
// error does stop it).
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>

#include "k3pack/pack.h"
#include "pack/build_inputs.h"
#include "pack/copy.h"
#include "pack/sidecars.h"
#include "util/process_limits.h"
#include "util/threads.h"

namespace k3pack::pack {

namespace {

using Clock = std::chrono::steady_clock;

// What a verification reads and compares, opened and checked before any
// payload is.
struct VerifyInputs {
  PackLayout layout;
  UniqueFd pack_fd;
  std::optional<PackDigests> digests;  // o.against_digests
  bool against_source = false;         // each checker opens the shard it reads (PayloadChecker::SourceFd)
  std::optional<ep::Rank> rank;        // a rank pack: other ranks' entries are holes by design
  std::vector<uint64_t> entries;       // the entries to check, in order
  uint64_t unowned_entries = 0, unowned_bytes = 0, total_bytes = 0;
};

// The digest sidecar, which must belong to this pack.
Result<PackDigests> OpenDigestsOf(const std::string& pack_path, const PackLayout& layout, uint64_t pack_size) {
  const std::string dpath = DigestsPathFor(pack_path);
  if (!PathExists(dpath)) {
    return Error("digest sidecar " + dpath + " is missing", ErrorKind::kFileNotFound)
        .WithHint("it is written by `k3pack pack`; `--full --against-source` compares every payload with the GGUF "
                  "shards instead");
  }
  K3_ASSIGN_OR_RETURN(PackDigests digests, ReadPackDigests(dpath));
  if (!DigestsMatchPack(digests, layout, pack_size)) {
    return Error("digest sidecar " + dpath + " does not belong to " + pack_path +
                 " (index count, size or index digest differ)");
  }
  return digests;
}

Result<VerifyInputs> OpenVerifyInputs(const std::string& pack_path, const ExpertSet& ex, const VerifyOptions& o) {
  VerifyInputs in;
  K3_ASSIGN_OR_RETURN(in.layout, LayoutOf(ex));
  K3_ASSIGN_OR_RETURN(in.pack_fd, OpenReadOnly(pack_path));
  struct stat st;
  if (::fstat(in.pack_fd.get(), &st) != 0) return Error::FromErrno("cannot stat " + pack_path, errno);
  if (o.against_digests) {
    K3_ASSIGN_OR_RETURN(in.digests, OpenDigestsOf(pack_path, in.layout, static_cast<uint64_t>(st.st_size)));
  }
  in.against_source = o.against_source;
  // A rank named by the caller or by the pack's version-3 sidecar.
  in.rank = o.ep;
  if (!in.rank && in.digests) in.rank = in.digests->ep;
  const auto& sidecar_rank = in.digests ? in.digests->ep : std::nullopt;
  if (in.rank && sidecar_rank && (sidecar_rank->size != in.rank->size || sidecar_rank->rank != in.rank->rank)) {
    return Error("digest sidecar " + DigestsPathFor(pack_path) + " is for expert-parallel " +
                 ep::Describe(*sidecar_rank, ex.num_experts) + ", not " + ep::Describe(*in.rank, ex.num_experts));
  }
  if (o.full_pack && sidecar_rank) {
    return Error(SidecarOfAnotherPackKind(DigestsPathFor(pack_path), sidecar_rank, std::nullopt, ex.num_experts) +
                 " (" + pack_path + "): its other ranks' payloads would go unchecked")
        .WithHint("rerun the `k3pack build` (or `k3pack pack`) that made the pack: it compares the pack with the "
                  "shards and writes its own sidecar anew");
  }
  if (in.rank) K3_RETURN_IF_ERROR(ep::CheckRank(*in.rank, ex.num_experts));
  const ep::ExpertRange owned = WrittenExperts(ex.num_experts, in.rank);
  // The other ranks' entries are counted over the whole index, whatever is
  // checked: a sample is drawn from the rank's own entries, and counting
  // within it said "0 entries of the other ranks skipped" of every rank pack.
  if (in.rank) {
    for (uint64_t i = 0; i < in.layout.index_count(); ++i) {
      const EntrySlot e = in.layout.Entry(i);
      if (owned.contains(e.expert)) continue;
      ++in.unowned_entries;
      in.unowned_bytes += e.nbytes;
    }
  }
  auto select = [&](uint64_t i) -> Status {
    if (i >= in.layout.index_count()) return Error("entry " + std::to_string(i) + " is out of range");
    const EntrySlot e = in.layout.Entry(i);
    if (owned.contains(e.expert)) {
      in.entries.push_back(i);
      in.total_bytes += e.nbytes;
    }
    return Status::OK();
  };
  if (o.entries.empty()) {
    for (uint64_t i = 0; i < in.layout.index_count(); ++i) K3_RETURN_IF_ERROR(select(i));
  } else {
    for (uint64_t i : o.entries) K3_RETURN_IF_ERROR(select(i));
  }
  return in;
}

// Names an owned payload of a rank pack that is entirely unallocated: the
// rank's bytes are missing, not altered.
std::string HoleNote(const VerifyInputs& in, const ExpertSet& ex, const EntrySlot& s) {
  if (!in.rank) return "";
  const auto segs = MapRange(in.pack_fd.get(), s.offset, s.nbytes);
  if (segs.size() == 1 && segs[0].hole) {
    return ": it is a hole where the data of " + ep::Describe(*in.rank, ex.num_experts) + " should be";
  }
  return "";
}

// First line: the lowest damaged entry (the single-damage text), then every
// other one, then the count.
Error DamagedPayloadsError(std::vector<std::pair<uint64_t, std::string>> mismatches, size_t checked) {
  std::sort(mismatches.begin(), mismatches.end());
  constexpr size_t kListed = 256;
  std::string text;
  for (size_t i = 0; i < mismatches.size() && i < kListed; ++i) text += (i ? "\n" : "") + mismatches[i].second;
  if (mismatches.size() > kListed) text += "\n... and " + std::to_string(mismatches.size() - kListed) + " more";
  if (mismatches.size() > 1) {
    text += "\n" + std::to_string(mismatches.size()) + " of " + std::to_string(checked) + " payloads are damaged";
  }
  return Error(text);
}

// One worker's checks of single payloads, with its own buffers.
class PayloadChecker {
 public:
  struct Outcome {
    std::optional<Error> error;     // an I/O error: the run stops
    std::optional<std::string> mismatch;  // the payload is damaged: named, the run goes on
    uint64_t data_bytes = 0;        // bytes of the payload that were data, not holes
  };

  PayloadChecker(const std::string& pack_path, const ExpertSet& ex, const VerifyInputs& in, IoBuffer& a, IoBuffer& b)
      : pack_path_(pack_path), ex_(ex), in_(in), a_(a), b_(b) {}

  Outcome Check(const EntrySlot& s) {
    Outcome out;
    const ExpertTensor& t = ex_.by_layer[s.active_layer_index][static_cast<uint32_t>(s.role)];
    const std::string what = t.tensor.name + " expert " + std::to_string(s.expert);
    const int pack_fd = in_.pack_fd.get();
    uint64_t entry_holes = 0;
    if (in_.digests) {
      const uint64_t holes_before = stats_.hole_bytes;
      auto d = HashRange(pack_fd, s.offset, s.nbytes, a_, &stats_);
      entry_holes = stats_.hole_bytes - holes_before;
      if (!d.ok()) return Failed(d.error().WithContext(pack_path_));
      if (std::memcmp(d->data(), in_.digests->entry_sha256[s.entry_index].data(), 32) != 0) {
        return Damaged("expert-pack payload does not match digest sidecar for " + what + " (entry " +
                       std::to_string(s.entry_index) + ", offset " + std::to_string(s.offset) + ")" +
                       HoleNote(in_, ex_, s));
      }
    }
    if (in_.against_source) {
      auto opened = source_.Get(t.tensor.shard_index, ex_.shard_paths[t.tensor.shard_index]);
      if (!opened.ok()) return Failed(opened.error());
      const int sfd = *opened;
      const uint64_t soff = t.tensor.data_offset + s.expert * t.expert_bytes;
      auto pm = MapRange(pack_fd, s.offset, s.nbytes);
      auto sm = MapRange(sfd, soff, s.nbytes);
      const bool both_holes = pm.size() == 1 && pm[0].hole && sm.size() == 1 && sm[0].hole;
      if (!in_.digests) {
        for (const Segment& sg : pm) entry_holes += sg.hole ? sg.length : 0;
      }
      if (!both_holes) {
        auto same = RangesEqual({pack_fd, s.offset, pack_path_}, {sfd, soff, ex_.shard_paths[t.tensor.shard_index]},
                                s.nbytes, a_, b_);
        if (!same.ok()) return Failed(same.error().WithContext("comparing " + what + " with its GGUF source"));
        if (!*same) return Damaged("expert-pack payload does not match GGUF source for " + what + HoleNote(in_, ex_, s));
      }
    }
    out.data_bytes = s.nbytes - std::min<uint64_t>(entry_holes, s.nbytes);
    return out;
  }

 private:
  static Outcome Failed(Error e) {
    Outcome o;
    o.error = std::move(e);
    return o;
  }
  static Outcome Damaged(std::string text) {
    Outcome o;
    o.mismatch = std::move(text);
    return o;
  }

  const std::string& pack_path_;
  const ExpertSet& ex_;
  const VerifyInputs& in_;
  IoBuffer& a_;
  IoBuffer& b_;
  CopyStats stats_;
  // The source shard being read: the index is in layer, role, expert
  // order, so one tensor's experts follow one another.
  OneOpenFile source_;
};

}  // namespace

Result<VerifyResult> VerifyPayloads(const std::string& pack_path, const ExpertSet& ex, const VerifyOptions& o) {
  const auto t0 = Clock::now();
  K3_ASSIGN_OR_RETURN(const VerifyInputs in, OpenVerifyInputs(pack_path, ex, o));
  const std::vector<uint64_t>& entries = in.entries;

  // read_bytes: pack payload bytes that were data (not holes), the progress's
  // copied bytes, so a sparse pack's holes never show up as read speed (the
  // k3-structure pack verified at "189138.4 MB/s").
  std::atomic<uint64_t> next{0}, done_bytes{0}, done_entries{0}, read_bytes{0};
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::optional<std::pair<uint64_t, Error>> first_error;  // lowest failing position wins
  std::vector<std::pair<uint64_t, std::string>> mismatches;  // (position, text)
  auto fail = [&](uint64_t pos, Error e) {
    std::lock_guard<std::mutex> lock(mu);
    if (!first_error || pos < first_error->first) first_error.emplace(pos, std::move(e));
    stop.store(true);
  };
  // The calling thread is one of the workers: between its payloads it reports
  // progress and polls interrupt_check, which may only run on that thread
  // (Python runs signal handlers on its main thread only).
  std::optional<Error> interrupted;
  auto last_report = Clock::now();
  auto report = [&] {
    if (!o.progress || Clock::now() - last_report < std::chrono::milliseconds(100)) return;
    last_report = Clock::now();
    o.progress({"verify", done_bytes.load(), in.total_bytes, done_entries.load(), entries.size(),
                std::chrono::duration<double>(last_report - t0).count(), read_bytes.load()});
  };
  auto poll = [&] {
    report();
    if (!o.interrupt_check || interrupted) return;
    if (Status s = o.interrupt_check(); !s.ok()) {
      interrupted = s.error();
      stop.store(true);
    }
  };
  auto worker = [&](bool calling_thread) {
    auto buf_a = IoBuffer::Allocate(8 << 20), buf_b = IoBuffer::Allocate(8 << 20);
    if (!buf_a.ok()) return fail(0, buf_a.error());
    if (!buf_b.ok()) return fail(0, buf_b.error());
    PayloadChecker checker(pack_path, ex, in, *buf_a, *buf_b);
    while (!stop.load()) {
      if (calling_thread) {
        poll();
        if (stop.load()) break;
      }
      const uint64_t pos = next.fetch_add(1);
      if (pos >= entries.size()) break;
      const EntrySlot s = in.layout.Entry(entries[pos]);
      PayloadChecker::Outcome outcome = checker.Check(s);
      if (outcome.error) return fail(pos, std::move(*outcome.error));
      if (outcome.mismatch) {
        std::lock_guard<std::mutex> lock(mu);
        mismatches.emplace_back(pos, std::move(*outcome.mismatch));
        continue;
      }
      read_bytes += outcome.data_bytes;
      done_bytes += s.nbytes;
      done_entries += 1;
    }
  };
  const int threads = o.threads > 0 ? o.threads : 4;
  std::vector<std::thread> pool;
  std::atomic<int> running{0};
  std::atomic<bool> out_of_memory{false};
  auto checking = [&](bool calling_thread) {
    if (RanOutOfMemory([&] { worker(calling_thread); })) {
      out_of_memory.store(true);
      stop.store(true);
    }
  };
  // Progress and the interrupt check run on this thread between its own
  // payloads and while the others finish: they may throw too. Declared after
  // everything the threads use, so that it joins them before those go.
  const JoinedOnExit joined(pool, [&] { stop.store(true); });
  for (int i = 1; i < threads; ++i) {
    running.fetch_add(1);
    if (TryStartThread([&] {
          pool.emplace_back([&] {
            checking(false);
            running.fetch_sub(1);
          });
        })) {
      running.fetch_sub(1);
      break;  // out of threads: the calling thread checks the rest
    }
  }
  checking(true);
  // Payloads other threads still check: keep reporting and polling.
  while (running.load() > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    poll();
  }
  for (auto& t : pool) t.join();
  if (interrupted) return *interrupted;
  if (out_of_memory.load()) return OutOfMemoryOn("a checking thread of verify").WithContext(pack_path);
  if (first_error) return first_error->second;
  if (!mismatches.empty()) return DamagedPayloadsError(std::move(mismatches), entries.size());
  VerifyResult r;
  r.entries_checked = done_entries.load();
  r.bytes_checked = done_bytes.load();
  r.bytes_read = read_bytes.load();
  r.ep = in.rank;
  r.unowned_entries = in.unowned_entries;
  r.unowned_bytes = in.unowned_bytes;
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (o.progress) {
    o.progress({"verify", r.bytes_checked, in.total_bytes, r.entries_checked, entries.size(), r.seconds, r.bytes_read});
  }
  return r;
}

}  // namespace k3pack::pack
