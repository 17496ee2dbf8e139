#include "pack/repair_damaged.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <tuple>

#include "pack/build_inputs.h"
#include "pack/copy.h"
#include "pack/inputs_record.h"
#include "pack/sidecars.h"
#include "util/file.h"
#include "util/format.h"

namespace k3pack::pack {

Result<RepairDamagedResult> RepairDamagedPayloads(const std::string& pack_path, const ExpertSet& ex,
                                                  const ProgressFn& progress, const std::optional<ep::Rank>& rank) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  K3_ASSIGN_OR_RETURN(LockFile lock, LockPack(pack_path));
  K3_ASSIGN_OR_RETURN(PackLayout layout, LayoutOf(ex));
  const std::string dpath = DigestsPathFor(pack_path);
  // Without a sidecar (a pack SGLang's writer made, or one copied without
  // it) the shards are the record: every payload is compared with its
  // source slice, and the sidecar is written from them once the pack holds
  // them, so the stores check its reads from then on.
  const bool have_sidecar = PathExists(dpath);
  // The shards are the record too where the sidecar is not this pack's:
  //  - the shards changed since the build (their record says so): the
  //    sidecar holds the old shards' digests, so a payload the edit touched
  //    matched it and was kept, and the rerun recorded the new shards;
  //  - it is another rank's, or a rank pack's beside a full pack (copied
  //    over it): only that rank's entries were checked.
  // Every payload is then compared with its source slice and the sidecar
  // is written anew.
  std::string why_source;
  bool foreign_sidecar = false;
  std::optional<ep::Rank> sidecar_rank;
  PackDigests digests;
  if (have_sidecar) {
    K3_ASSIGN_OR_RETURN(digests, ReadPackDigests(dpath));
    sidecar_rank = digests.ep;
    why_source = SidecarOfAnotherPackKind(dpath, sidecar_rank, rank, layout.num_experts());
    foreign_sidecar = !why_source.empty();
    if (!foreign_sidecar) why_source = WhyInputsChanged(pack_path, ex);
  }
  if (have_sidecar && rank && !sidecar_rank) {
    // A full pack at a rank pack's path: turning the other ranks' experts
    // into holes would destroy a whole pack, which is no repair.
    return Error("pack " + pack_path + " is a full pack (its digest sidecar " + dpath + " says so), not the pack of "
                 "expert-parallel " + ep::Describe(*rank, layout.num_experts()) + "; no payload was rewritten")
        .WithHint("repair it as the full pack (without --ep-size/--ep-rank, --pack " + ShellQuoted(pack_path) +
                  "), or rebuild the rank pack with --force");
  }
  const bool source_is_record = !have_sidecar || !why_source.empty();
  if (source_is_record) {
    digests = PackDigests{};
    digests.index_count = layout.index_count();
    digests.index_sha256 = layout.IndexSha256();
    digests.pack_size = layout.final_size();
    digests.data_start = layout.data_start();
    digests.entry_sha256.assign(layout.index_count(), {});
    digests.entry_crc32c.assign(layout.index_count(), 0);
    if (rank) {
      digests.ep = rank;
      digests.num_experts = layout.num_experts();
      K3_ASSIGN_OR_RETURN(digests.source_tag, SourceTag(ex));
    }
  }
  const int fd = ::open(pack_path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return Error::FromErrno("cannot open " + pack_path + " for repair", errno);
  UniqueFd pack_fd(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) return Error::FromErrno("cannot stat " + pack_path, errno);
  if (source_is_record && static_cast<uint64_t>(st.st_size) != layout.final_size()) {
    return Error("pack " + pack_path + " is " + std::to_string(st.st_size) + " bytes, the pack of these shards " +
                 std::to_string(layout.final_size()) + ": not a pack of these shards' layout (and " +
                 (have_sidecar ? why_source : "it has no digest sidecar " + dpath) + ")")
        .WithHint("rebuild the pack with --force");
  }
  if (!DigestsMatchPack(digests, layout, static_cast<uint64_t>(st.st_size))) {
    return Error("pack " + pack_path + " does not have the layout of these shards (index or size differ): its index "
                 "or header is damaged, not only payloads")
        .WithHint("rebuild the pack with --force");
  }
  std::vector<UniqueFd> src;
  for (const auto& p : ex.shard_paths) {
    K3_ASSIGN_OR_RETURN(UniqueFd s, OpenReadOnly(p));
    src.push_back(std::move(s));
  }
  auto slice_of = [&](uint64_t i) {
    const EntrySlot s = layout.Entry(i);
    const ExpertTensor& t = ex.by_layer[s.active_layer_index][static_cast<uint32_t>(s.role)];
    return std::tuple{s, &t, t.tensor.data_offset + s.expert * t.expert_bytes,
                      t.tensor.name + " expert " + std::to_string(s.expert) + " (entry " + std::to_string(i) + ")"};
  };

  // 1. Find every damaged payload: against its record, or without one
  // against its source slice (whose digests become the record).
  K3_ASSIGN_OR_RETURN(IoBuffer buf, IoBuffer::Allocate(8 << 20));
  CopyStats stats;
  std::vector<uint64_t> damaged;
  uint64_t total = 0, done = 0, held = 0;
  for (uint64_t i = 0; i < layout.index_count(); ++i) total += layout.Entry(i).nbytes;
  for (uint64_t i = 0; i < layout.index_count(); ++i) {
    const EntrySlot s = layout.Entry(i);
    if (!digests.present(i)) {  // a rank pack: another rank's object, a hole by design
      done += s.nbytes;
      continue;
    }
    ++held;
    if (source_is_record) {
      const auto [slot, t, soff, what] = slice_of(i);
      K3_ASSIGN_OR_RETURN(digests.entry_sha256[i], HashRange(src[t->tensor.shard_index].get(), soff, s.nbytes, buf,
                                                             &stats, &digests.entry_crc32c[i]));
    }
    K3_ASSIGN_OR_RETURN(auto d, HashRange(fd, s.offset, s.nbytes, buf, &stats));
    if (std::memcmp(d.data(), digests.entry_sha256[s.entry_index].data(), 32) != 0) damaged.push_back(i);
    done += s.nbytes;
    if (progress && (i % 256 == 0 || i + 1 == layout.index_count()))
      progress({"check", done, total, i + 1, layout.index_count(),
                std::chrono::duration<double>(Clock::now() - t0).count()});
  }

  // 1b. A pack whose payloads all match its own digests may still be the
  // pack of other shards (same layout, other weights): a sample of intact
  // payloads is compared with these shards before anything is rewritten,
  // or the repair would find nothing to do and report success. Without a
  // sidecar, a pack none of whose payloads matches these shards is such a
  // pack, not a damaged one: rewriting all of it in place is a --force.
  if (sidecar_rank && !rank) {
    // A rank pack at the full pack's path has none of the other ranks'
    // payloads (holes): filling them in is a rebuild, not a repair.
    const ep::ExpertRange owned = ep::OwnedExperts(*sidecar_rank, layout.num_experts());
    uint64_t others = 0, others_differ = 0;
    for (uint64_t i = 0; i < layout.index_count(); ++i) {
      if (owned.contains(layout.Entry(i).expert)) continue;
      ++others;
      others_differ += std::binary_search(damaged.begin(), damaged.end(), i) ? 1 : 0;
    }
    if (others > 0 && others_differ == others) {
      return Error("pack " + pack_path + " is the pack of expert-parallel " +
                   ep::Describe(*sidecar_rank, layout.num_experts()) + " (its digest sidecar " + dpath +
                   " says so, and none of the other ranks' payloads is in it), not a full pack; no payload was "
                   "rewritten")
          .WithHint("repair it as that rank's pack (--ep-size " + std::to_string(sidecar_rank->size) + " --ep-rank " +
                    std::to_string(sidecar_rank->rank) + " --pack " + ShellQuoted(pack_path) +
                    "), or rebuild the full pack with --force");
    }
  }
  if (source_is_record && held > 0 && damaged.size() == held) {
    return Error("pack " + pack_path + " was not built from these shards: none of its " + std::to_string(held) +
                 " payloads matches its slice of them (the pack of another model with the same layout, or shards "
                 "changed since), and " +
                 (have_sidecar ? why_source : "it has no digest sidecar to tell damage from another source") +
                 "; no payload was rewritten")
        .WithHint("rebuild it from these shards with --force, or pass the pack built from them");
  }
  if (!source_is_record && damaged.size() < layout.index_count()) {
    constexpr uint64_t kSamples = 6;
    std::vector<uint64_t> intact;
    for (uint64_t i = 0; i < layout.index_count(); ++i) {
      if (digests.present(i) && !std::binary_search(damaged.begin(), damaged.end(), i)) intact.push_back(i);
    }
    for (uint64_t k = 0; k < kSamples && k < intact.size(); ++k) {
      const uint64_t i = intact[k * intact.size() / std::min<uint64_t>(kSamples, intact.size())];
      const auto [s, t, soff, what] = slice_of(i);
      K3_ASSIGN_OR_RETURN(auto d, HashRange(src[t->tensor.shard_index].get(), soff, s.nbytes, buf, &stats));
      if (std::memcmp(d.data(), digests.entry_sha256[s.entry_index].data(), 32) == 0) continue;
      return Error("pack " + pack_path + " was not built from these shards: " + what +
                   " matches the digest recorded when the pack was built, but its slice of " +
                   ex.shard_paths[t->tensor.shard_index] + " differs (the pack of another model with the same "
                   "layout, or shards changed since); no payload was rewritten")
          .WithHint("rebuild it from these shards with --force, or pass the pack built from them");
    }
  }

  // 2. The header and index: SGLang's validator ignores some of their bytes
  // (a name's NUL padding), yet they change the index digest the manifest
  // records. The shards' layout gives the exact bytes (the sidecar's index
  // digest, or the payloads found to be these shards'), so a prefix that
  // differs is rewritten in place.
  RepairDamagedResult r;
  {
    const std::vector<uint8_t> want = layout.EncodePrefix();
    std::vector<uint8_t> have(want.size());
    K3_ASSIGN_OR_RETURN(size_t got, PreadFull(fd, have.data(), have.size(), 0));
    if (got != have.size() || have != want) {
      uint64_t first = 0;
      while (first < got && have[first] == want[first]) ++first;
      K3_RETURN_IF_ERROR(PwriteFull(fd, want.data(), want.size(), 0));
      if (::fsync(fd) != 0) return Error::FromErrno("cannot fsync " + pack_path, errno);
      r.repaired.push_back("the header/index (bytes from " + std::to_string(first) +
                           " differed from the layout of these shards)");
    }
  }

  // Shards changed under this pack's own sidecar: the new record goes first.
  // Killed after the payloads were rewritten and before it was, a rerun
  // found the pack to be the shards' (and recorded them) beside the old
  // record, which every store and verify --full then refused, and no repair
  // mended. Killed before the payloads, the rerun sees them differ from the
  // shards, still recorded as changed, and repairs again. A missing or
  // foreign sidecar is written last instead: until then the rerun still
  // finds it missing or foreign.
  const bool record_first = source_is_record && have_sidecar && !foreign_sidecar;
  if (record_first) K3_RETURN_IF_ERROR(WritePackDigests(dpath, digests));

  // 3. Rewrite each from its source slice; the copy must hash to the record.
  for (uint64_t i : damaged) {
    const auto [s, t_ptr, soff, what] = slice_of(i);
    const ExpertTensor& t = *t_ptr;
    // A write that fails (a full disk) names the pack and the payload: the
    // copy's own text named neither. A rerun finds what is left to do.
    auto in_pack = [&, &what = what](const Error& e) {
      return WithFreeSpaceHint(Error("cannot rewrite " + what + " in " + pack_path + ": " + e.message(), e.kind(),
                                     e.sys_errno()),
                               pack_path);
    };
    if (Status zeroed = ZeroRange(fd, s.offset, s.nbytes); !zeroed.ok()) return in_pack(zeroed.error());
    auto copied = CopyAndHash(src[t.tensor.shard_index].get(), soff, fd, s.offset, s.nbytes, buf, &stats);
    if (!copied.ok()) return in_pack(copied.error());
    const auto& d = *copied;
    if (std::memcmp(d.data(), digests.entry_sha256[s.entry_index].data(), 32) != 0) {
      return Error("source of " + what + " no longer matches the digest " +
                   (source_is_record ? "this repair read from it" : "recorded when the pack was built") + ": " +
                   ex.shard_paths[t.tensor.shard_index] + " changed")
          .WithHint("the pack cannot be repaired from these shards; rebuild it with --force");
    }
    r.repaired.push_back(what);
  }
  // A rank pack whose sidecar was another rank's (or a full pack's) may hold
  // other experts' bytes: they go back to holes, as a fresh rank build has.
  if (rank && foreign_sidecar) {
    const ep::ExpertRange owned = ep::OwnedExperts(*rank, layout.num_experts());
    for (uint64_t i = 0; i < layout.index_count(); ++i) {
      const EntrySlot e = layout.Entry(i);
      if (owned.contains(e.expert)) continue;
      if (Status zeroed = ZeroRange(fd, e.offset, e.nbytes); !zeroed.ok()) {
        return WithFreeSpaceHint(Error("cannot clear another rank's entry " + std::to_string(i) + " of " + pack_path +
                                           ": " + zeroed.error().message(),
                                       zeroed.error().kind(), zeroed.error().sys_errno()),
                                 pack_path);
      }
    }
  }
  if ((!damaged.empty() || (rank && foreign_sidecar)) && ::fsync(fd) != 0)
    return Error::FromErrno("cannot fsync " + pack_path, errno);

  // 4. Verify the repaired entries against the sidecar and the source.
  if (!damaged.empty()) {
    VerifyOptions vo;
    vo.against_digests = !source_is_record;  // else the shards are the record (the file may hold the old one)
    vo.against_source = true;
    vo.entries = damaged;
    vo.ep = digests.ep;
    K3_RETURN_IF_ERROR(VerifyPayloads(pack_path, ex, vo).status());
  }
  if (source_is_record) {
    if (!record_first) K3_RETURN_IF_ERROR(WritePackDigests(dpath, digests));
    r.sidecar_written = dpath;
    r.why_source = why_source;
    // Last: until here a rerun still compares every payload with the shards.
    K3_RETURN_IF_ERROR(RecordCurrentInputs(pack_path, ex));
  }
  r.entries_checked = layout.index_count();
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

}  // namespace k3pack::pack
