#include "pack/sidecar_upgrade.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <thread>

#include "pack/build_inputs.h"
#include "pack/copy.h"
#include "pack/sidecars.h"
#include "util/file.h"
#include "util/process_limits.h"
#include "util/threads.h"

namespace k3pack::pack {

namespace {

// Every payload of the pack hashed once, on `threads` threads: its SHA-256
// and CRC32C into `d` (sized index_count). Where `d` already holds SHA-256
// records (`check_sha`), a payload that differs from its record fails,
// naming it, and the rest are not read. The whole pack is read (hours for a
// full-scale one): the calling thread, one of the hashing ones, reports
// `progress` between its payloads.
Status HashEveryPayload(const std::string& pack_path, const PackLayout& layout, int threads, bool check_sha,
                        PackDigests& d, const ProgressFn& progress) {
  const std::string dpath = DigestsPathFor(pack_path);
  K3_ASSIGN_OR_RETURN(UniqueFd fd, OpenReadOnly(pack_path));
  d.entry_crc32c.assign(d.index_count, 0);
  if (!check_sha) d.entry_sha256.assign(d.index_count, {});
  std::mutex mu;
  std::optional<Error> error;
  std::atomic<uint64_t> next{0};
  std::atomic<bool> out_of_memory{false};
  std::atomic<uint64_t> done_bytes{0}, done_entries{0};
  uint64_t total_bytes = 0;
  for (uint64_t i = 0; i < d.index_count; ++i) total_bytes += layout.Entry(i).nbytes;
  const auto caller = std::this_thread::get_id();
  const auto t0 = std::chrono::steady_clock::now();
  auto last_report = t0 - std::chrono::hours(1);
  auto report = [&](bool last) {
    const auto now = std::chrono::steady_clock::now();
    if (!progress || (!last && now - last_report < std::chrono::milliseconds(100))) return;
    last_report = now;
    Progress p{"sidecar", done_bytes.load(), total_bytes, done_entries.load(), d.index_count,
               std::chrono::duration<double>(now - t0).count()};
    p.final = last;  // a stopped hash ends a bar's line before the error, never says done
    progress(p);
  };
  auto hash = [&] {
    auto buf = IoBuffer::Allocate(8u << 20);
    const bool reporter = std::this_thread::get_id() == caller;
    for (uint64_t i; (i = next.fetch_add(1)) < d.index_count;) {
      if (reporter) report(false);
      const EntrySlot e = layout.Entry(i);
      Result<std::array<uint8_t, 32>> sha =
          buf.ok() ? HashRange(fd.get(), e.offset, e.nbytes, *buf, nullptr, &d.entry_crc32c[i]) : buf.error();
      Status s = sha.ok() ? Status::OK() : Status(sha.error().WithContext(pack_path));
      if (sha.ok() && !check_sha) d.entry_sha256[i] = *sha;
      if (sha.ok() && check_sha && *sha != d.entry_sha256[i]) {
        s = Error("expert-pack payload does not match digest sidecar for layer " + std::to_string(e.layer) +
                  " expert " + std::to_string(e.expert) + " " + RoleName(e.role) + " (entry " + std::to_string(i) +
                  ", offset " + std::to_string(e.offset) + ") of " + pack_path + ", so no CRC32C records were added to " +
                  dpath)
                .WithHint("`k3pack verify --full` lists every damaged payload; rebuild the pack with --force");
      }
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = s.error();
        next.store(d.index_count);
        return;
      }
      done_bytes += e.nbytes;
      ++done_entries;
    }
  };
  RunOnThreads(static_cast<unsigned>(std::max(1, threads)), [&] {
    // Under `ulimit -v`: the other threads stop too, rather than read the
    // rest of the pack for a sidecar that has already failed.
    if (RanOutOfMemory(hash)) {
      out_of_memory.store(true);
      next.store(d.index_count);
    }
  });
  report(true);
  if (error) return *error;  // a damaged payload first: it is what the rerun would find too
  if (out_of_memory.load()) return OutOfMemoryOn("a hashing thread of the digest sidecar").WithContext(pack_path);
  return Status::OK();
}

}  // namespace

Status AddCrcRecordsToOldSidecar(const std::string& pack_path, const ExpertSet& experts, int threads,
                                 const std::function<void(const std::string&)>& note, const ProgressFn& progress) {
  const std::string dpath = DigestsPathFor(pack_path);
  if (!PathExists(dpath)) return Status::OK();
  auto read = ReadPackDigests(dpath);
  // Only a readable sidecar of this pack without CRCs (rank packs' always
  // have them); anything else is judged where the sidecar is used.
  if (!read.ok() || !read->entry_crc32c.empty() || read->ep) return Status::OK();
  PackDigests d = std::move(*read);
  K3_ASSIGN_OR_RETURN(PackLayout layout, LayoutOf(experts));
  if (d.index_count != layout.index_count() || d.index_sha256 != layout.IndexSha256()) return Status::OK();
  if (note) {
    note("digest sidecar " + dpath + " predates CRC32C records (an older k3pack wrote it), so the store could not "
         "check what it reads; checking every payload of " + pack_path +
         " against its SHA-256 records once to add them (reads the pack once)");
  }
  K3_RETURN_IF_ERROR(HashEveryPayload(pack_path, layout, threads, /*check_sha=*/true, d, progress));
  return WritePackDigests(dpath, d);
}

std::string WhySidecarIsUnusable(const std::string& pack_path, const ExpertSet& experts) {
  const std::string dpath = DigestsPathFor(pack_path);
  if (!PathExists(dpath)) return "";
  auto d = ReadPackDigests(dpath);
  if (!d.ok()) return IsProcessCannotRead(d.error().sys_errno()) ? "" : d.error().message();
  // The caller judges a full pack: a rank pack's sidecar copied beside it
  // made verify --full check that rank's entries only (a damaged payload of
  // another rank passed) and every store refuse the pack.
  if (std::string why = SidecarOfAnotherPackKind(dpath, d->ep, std::nullopt, experts.num_experts); !why.empty())
    return why;
  auto layout = LayoutOf(experts);
  auto size = FileSize(pack_path);
  if (!layout.ok() || !size.ok()) return "";
  if (!DigestsMatchPack(*d, *layout, *size))
    return "digest sidecar " + dpath + " is of another pack (its index count, index digest or pack size differ)";
  return "";
}

Status RewriteSidecarFromPack(const std::string& pack_path, const ExpertSet& experts, int threads,
                              const ProgressFn& progress) {
  K3_ASSIGN_OR_RETURN(PackLayout layout, LayoutOf(experts));
  PackDigests d;
  d.index_count = layout.index_count();
  d.index_sha256 = layout.IndexSha256();
  K3_ASSIGN_OR_RETURN(d.pack_size, FileSize(pack_path));
  d.data_start = layout.data_start();
  K3_RETURN_IF_ERROR(HashEveryPayload(pack_path, layout, threads, /*check_sha=*/false, d, progress));
  return WritePackDigests(DigestsPathFor(pack_path), d);
}

}  // namespace k3pack::pack
