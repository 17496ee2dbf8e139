#include "pack/sidecar_upgrade.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>
#include <optional>

#include "pack/build_inputs.h"
#include "pack/copy.h"
#include "pack/sidecars.h"
#include "util/file.h"
#include "util/process_limits.h"
#include "util/threads.h"

namespace k3pack::pack {

Status AddCrcRecordsToOldSidecar(const std::string& pack_path, const ExpertSet& experts, int threads,
                                 const std::function<void(const std::string&)>& note) {
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
  K3_ASSIGN_OR_RETURN(UniqueFd fd, OpenReadOnly(pack_path));
  d.entry_crc32c.assign(d.index_count, 0);
  std::mutex mu;
  std::optional<Error> error;
  std::atomic<uint64_t> next{0};
  std::atomic<bool> out_of_memory{false};
  auto check = [&] {
    auto buf = IoBuffer::Allocate(8u << 20);
    for (uint64_t i; (i = next.fetch_add(1)) < d.index_count;) {
      const EntrySlot e = layout.Entry(i);
      Result<std::array<uint8_t, 32>> sha =
          buf.ok() ? HashRange(fd.get(), e.offset, e.nbytes, *buf, nullptr, &d.entry_crc32c[i]) : buf.error();
      Status s = sha.ok() ? Status::OK() : Status(sha.error().WithContext(pack_path));
      if (sha.ok() && *sha != d.entry_sha256[i]) {
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
    }
  };
  RunOnThreads(static_cast<unsigned>(std::max(1, threads)), [&] {
    // Under `ulimit -v`: the other threads stop too, rather than read the
    // rest of the pack for an upgrade that has already failed.
    if (RanOutOfMemory(check)) {
      out_of_memory.store(true);
      next.store(d.index_count);
    }
  });
  if (error) return *error;  // a damaged payload first: it is what the rerun would find too
  if (out_of_memory.load())
    return OutOfMemoryOn("a hashing thread of the digest-sidecar upgrade").WithContext(pack_path);
  return WritePackDigests(dpath, d);
}

}  // namespace k3pack::pack
