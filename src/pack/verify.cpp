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

namespace k3pack::pack {

Result<VerifyResult> VerifyPayloads(const std::string& pack_path, const ExpertSet& ex, const VerifyOptions& o) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  K3_ASSIGN_OR_RETURN(PackLayout layout, LayoutOf(ex));
  K3_ASSIGN_OR_RETURN(UniqueFd pack_fd, OpenReadOnly(pack_path));
  struct stat st;
  if (::fstat(pack_fd.get(), &st) != 0) return Error::FromErrno("cannot stat " + pack_path, errno);

  std::optional<PackDigests> digests;
  if (o.against_digests) {
    const std::string dpath = DigestsPathFor(pack_path);
    if (!PathExists(dpath)) {
      return Error("digest sidecar " + dpath + " is missing", ErrorKind::kFileNotFound)
          .WithHint("it is written by `k3pack pack`; `--full --against-source` compares every payload with the GGUF "
                    "shards instead");
    }
    K3_ASSIGN_OR_RETURN(digests, ReadPackDigests(dpath));
    if (digests->index_count != layout.index_count() || digests->pack_size != static_cast<uint64_t>(st.st_size) ||
        digests->index_sha256 != layout.IndexSha256()) {
      return Error("digest sidecar " + dpath + " does not belong to " + pack_path +
                   " (index count, size or index digest differ)");
    }
  }
  std::vector<UniqueFd> src;
  if (o.against_source) {
    for (const auto& p : ex.shard_paths) {
      K3_ASSIGN_OR_RETURN(UniqueFd fd, OpenReadOnly(p));
      src.push_back(std::move(fd));
    }
  }
  // A rank pack (named by the caller or by its version-3 sidecar): the
  // entries of other ranks' experts are holes by design, counted not checked.
  std::optional<ep::Rank> rank = o.ep;
  if (!rank && digests) rank = digests->ep;
  if (rank && digests && digests->ep && (digests->ep->size != rank->size || digests->ep->rank != rank->rank)) {
    return Error("digest sidecar " + DigestsPathFor(pack_path) + " is for expert-parallel " +
                 ep::Describe(*digests->ep, ex.num_experts) + ", not " + ep::Describe(*rank, ex.num_experts));
  }
  if (rank) K3_RETURN_IF_ERROR(ep::CheckRank(*rank, ex.num_experts));
  const ep::ExpertRange owned = WrittenExperts(ex.num_experts, rank);
  std::vector<uint64_t> entries;
  uint64_t unowned_entries = 0, unowned_bytes = 0;
  auto select = [&](uint64_t i) -> Status {
    if (i >= layout.index_count()) return Error("entry " + std::to_string(i) + " is out of range");
    if (owned.contains(layout.Entry(i).expert)) {
      entries.push_back(i);
    } else {
      ++unowned_entries;
      unowned_bytes += layout.Entry(i).nbytes;
    }
    return Status::OK();
  };
  if (o.entries.empty()) {
    for (uint64_t i = 0; i < layout.index_count(); ++i) K3_RETURN_IF_ERROR(select(i));
  } else {
    for (uint64_t i : o.entries) K3_RETURN_IF_ERROR(select(i));
  }
  uint64_t total_bytes = 0;
  for (uint64_t i : entries) total_bytes += layout.Entry(i).nbytes;
  // Names an owned payload of a rank pack that is entirely unallocated: the
  // rank's bytes are missing, not altered.
  auto hole_note = [&](const EntrySlot& s) -> std::string {
    if (!rank) return "";
    const auto segs = MapRange(pack_fd.get(), s.offset, s.nbytes);
    if (segs.size() == 1 && segs[0].hole) {
      return ": it is a hole where the data of " + ep::Describe(*rank, ex.num_experts) + " should be";
    }
    return "";
  };

  // read_bytes: pack payload bytes that were data (not holes), the progress's
  // copied bytes, so a sparse pack's holes never show up as read speed (the
  // k3-structure pack verified at "189138.4 MB/s").
  std::atomic<uint64_t> next{0}, done_bytes{0}, done_entries{0}, hole_bytes{0}, read_bytes{0};
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::optional<std::pair<uint64_t, Error>> first_error;  // lowest failing position wins
  std::vector<std::pair<uint64_t, std::string>> mismatches;  // (position, text)
  auto fail = [&](uint64_t pos, Error e) {
    std::lock_guard<std::mutex> lock(mu);
    if (!first_error || pos < first_error->first) first_error.emplace(pos, std::move(e));
    stop.store(true);
  };
  auto mismatch = [&](uint64_t pos, std::string text) {
    std::lock_guard<std::mutex> lock(mu);
    mismatches.emplace_back(pos, std::move(text));
  };
  // The calling thread is one of the workers: between its payloads it reports
  // progress and polls interrupt_check, which may only run on that thread
  // (Python runs signal handlers on its main thread only).
  std::optional<Error> interrupted;
  auto last_report = Clock::now();
  auto report = [&] {
    if (!o.progress || Clock::now() - last_report < std::chrono::milliseconds(100)) return;
    last_report = Clock::now();
    o.progress({"verify", done_bytes.load(), total_bytes, done_entries.load(), entries.size(),
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
    IoBuffer &a = *buf_a, &b = *buf_b;
    CopyStats stats;
    while (!stop.load()) {
      if (calling_thread) {
        poll();
        if (stop.load()) break;
      }
      uint64_t pos = next.fetch_add(1);
      if (pos >= entries.size()) break;
      const EntrySlot s = layout.Entry(entries[pos]);
      const ExpertTensor& t = ex.by_layer[s.active_layer_index][static_cast<uint32_t>(s.role)];
      const std::string what = t.tensor.name + " expert " + std::to_string(s.expert);
      uint64_t entry_holes = 0;
      if (digests) {
        const uint64_t holes_before = stats.hole_bytes;
        auto d = HashRange(pack_fd.get(), s.offset, s.nbytes, a, &stats);
        entry_holes = stats.hole_bytes - holes_before;
        if (!d.ok()) return fail(pos, d.error().WithContext(pack_path));
        if (std::memcmp(d->data(), digests->entry_sha256[s.entry_index].data(), 32) != 0) {
          mismatch(pos, "expert-pack payload does not match digest sidecar for " + what + " (entry " +
                            std::to_string(s.entry_index) + ", offset " + std::to_string(s.offset) + ")" +
                            hole_note(s));
          continue;
        }
      }
      if (o.against_source) {
        const int sfd = src[t.tensor.shard_index].get();
        const uint64_t soff = t.tensor.data_offset + s.expert * t.expert_bytes;
        auto pm = MapRange(pack_fd.get(), s.offset, s.nbytes);
        auto sm = MapRange(sfd, soff, s.nbytes);
        const bool both_holes = pm.size() == 1 && pm[0].hole && sm.size() == 1 && sm[0].hole;
        if (!digests) {
          for (const Segment& sg : pm) entry_holes += sg.hole ? sg.length : 0;
        }
        if (!both_holes) {
          auto same = RangesEqual({pack_fd.get(), s.offset, pack_path},
                                  {sfd, soff, ex.shard_paths[t.tensor.shard_index]}, s.nbytes, a, b);
          if (!same.ok()) return fail(pos, same.error().WithContext("comparing " + what + " with its GGUF source"));
          if (!*same) {
            mismatch(pos, "expert-pack payload does not match GGUF source for " + what + hole_note(s));
            continue;
          }
        }
      }
      read_bytes += s.nbytes - std::min<uint64_t>(entry_holes, s.nbytes);
      done_bytes += s.nbytes;
      done_entries += 1;
    }
    hole_bytes += stats.hole_bytes;
  };
  const int threads = o.threads > 0 ? o.threads : 4;
  std::vector<std::thread> pool;
  std::atomic<int> running{0};
  for (int i = 1; i < threads; ++i) {
    running.fetch_add(1);
    try {
      pool.emplace_back([&] {
        worker(false);
        running.fetch_sub(1);
      });
    } catch (const std::system_error&) {
      running.fetch_sub(1);
      break;  // out of threads: the calling thread checks the rest
    }
  }
  worker(true);
  // Payloads other threads still check: keep reporting and polling.
  while (running.load() > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    poll();
  }
  for (auto& t : pool) t.join();
  if (interrupted) return *interrupted;
  if (first_error) return first_error->second;
  if (!mismatches.empty()) {
    // First line: the lowest damaged entry (the single-damage text), then
    // every other one, then the count.
    std::sort(mismatches.begin(), mismatches.end());
    constexpr size_t kListed = 256;
    std::string text;
    for (size_t i = 0; i < mismatches.size() && i < kListed; ++i) text += (i ? "\n" : "") + mismatches[i].second;
    if (mismatches.size() > kListed) text += "\n... and " + std::to_string(mismatches.size() - kListed) + " more";
    if (mismatches.size() > 1) {
      text += "\n" + std::to_string(mismatches.size()) + " of " + std::to_string(entries.size()) +
              " payloads are damaged";
    }
    return Error(text);
  }
  VerifyResult r;
  r.entries_checked = done_entries.load();
  r.bytes_checked = done_bytes.load();
  r.bytes_read = read_bytes.load();
  r.ep = rank;
  r.unowned_entries = unowned_entries;
  r.unowned_bytes = unowned_bytes;
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (o.progress) {
    o.progress({"verify", r.bytes_checked, total_bytes, r.entries_checked, entries.size(), r.seconds, r.bytes_read});
  }
  return r;
}

}  // namespace k3pack::pack
