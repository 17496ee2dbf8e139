// MergeRankPacks: the full pack from the N rank packs of one EP group (see
// k3pack/pack.h). A rank pack already has the full pack's header, index,
// size and offsets, so the merge is: write that prefix once, then copy every
// payload from the rank that owns its expert, checking it against that
// rank's digest sidecar on the way. Padding and other ranks' holes stay
// holes, so the result is the direct build's bytes.
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "k3pack/pack.h"
#include "pack/build_inputs.h"
#include "pack/copy.h"
#include "pack/format.h"
#include "pack/merge.h"
#include "pack/sidecar_kinds.h"
#include "pack/sidecars.h"
#include "util/file.h"
#include "util/sha256.h"

namespace k3pack::pack {
namespace {

struct RankInput {
  std::string path;
  UniqueFd fd;
  uint64_t size = 0;
  PackDigests digests;
};

// Removes `path` if it is there, durably (before the next rename).
Status RemoveFile(const std::string& path) {
  K3_RETURN_IF_ERROR(RemoveIfExists(path));
  return FsyncParentDir(path);
}

Result<RankInput> OpenRankPack(const std::string& path) {
  RankInput in;
  in.path = path;
  K3_ASSIGN_OR_RETURN(in.fd, OpenReadOnly(path));
  struct stat st;
  if (::fstat(in.fd.get(), &st) != 0) return Error::FromErrno("cannot stat " + path, errno);
  in.size = static_cast<uint64_t>(st.st_size);
  const std::string dpath = DigestsPathFor(path);
  if (!PathExists(dpath)) {
    return Error("rank pack " + path + " has no digest sidecar " + dpath, ErrorKind::kFileNotFound)
        .WithHint("the merge needs each rank pack's .digests (written by `k3pack pack --ep-size N --ep-rank R`) to "
                  "know its rank and to check its payloads");
  }
  K3_ASSIGN_OR_RETURN(in.digests, ReadPackDigests(dpath));
  if (!in.digests.ep) {
    return Error(path + " is not an expert-parallel rank pack: its digest sidecar " + dpath + " records no rank")
        .WithHint("pass the N rank packs written by `k3pack pack --ep-size N --ep-rank R|all`");
  }
  if (in.digests.pack_size != in.size) {
    // Both sizes, so a truncated copy is told from a sidecar of another pack.
    return Error("rank pack " + path + " is " + std::to_string(in.size) + " bytes, but its digest sidecar " + dpath +
                 " records a pack of " + std::to_string(in.digests.pack_size) +
                 " bytes: the pack is truncated or the sidecar is another pack's")
        .WithHint("rebuild that rank pack (`k3pack pack --ep-size N --ep-rank R --force`) or copy it again");
  }
  if (in.digests.entry_crc32c.empty()) {
    return Error("digest sidecar " + dpath + " of rank pack " + path + " holds no CRC32C records");
  }
  return in;
}

// The rank packs of one group, checked: each rank once, one header and
// index (the full pack's prefix, read from the first).
struct Group {
  std::vector<RankInput> in;
  std::vector<int> by_rank;
  uint32_t n = 0;
  uint32_t num_experts = 0;
  PackHeader header;
  std::vector<uint8_t> prefix;  // [0, data_start)
  std::string index_sha;
};

Result<Group> OpenGroup(const std::vector<std::string>& rank_packs) {
  if (rank_packs.empty()) return Error("--ep-merge needs the rank packs to merge");
  Group g;
  std::vector<RankInput>& in = g.in;
  for (const auto& p : rank_packs) {
    K3_ASSIGN_OR_RETURN(RankInput r, OpenRankPack(p));
    in.push_back(std::move(r));
  }
  // One group: same size, same rank count, each rank exactly once.
  const uint32_t n = g.n = in[0].digests.ep->size;
  const uint32_t num_experts = g.num_experts = in[0].digests.num_experts;
  std::vector<int>& by_rank = g.by_rank;
  by_rank.assign(n, -1);
  for (size_t i = 0; i < in.size(); ++i) {
    const ep::Rank rk = *in[i].digests.ep;
    if (rk.size != n || in[i].digests.num_experts != num_experts) {
      return Error("rank pack " + in[i].path + " is " + ep::Describe(rk, in[i].digests.num_experts) + " but " +
                   in[0].path + " is " + ep::Describe(*in[0].digests.ep, num_experts) +
                   ": the rank packs of one merge must come from one --ep-size");
    }
    if (by_rank[rk.rank] >= 0) {
      return Error("rank " + std::to_string(rk.rank) + " of " + std::to_string(n) + " is given twice: " +
                   in[by_rank[rk.rank]].path + " and " + in[i].path);
    }
    by_rank[rk.rank] = static_cast<int>(i);
  }
  // One checkpoint: rank packs of two sources with one layout share header,
  // index and size, and each payload matches its own sidecar, so only the
  // recorded source tags tell them apart (0: an older sidecar, not compared).
  const RankInput* ref = nullptr;
  for (const RankInput& r : in) {
    if (!ref && r.digests.source_tag != 0) ref = &r;
    if (ref && r.digests.source_tag != 0 && r.digests.source_tag != ref->digests.source_tag) {
      char tags[40];
      std::snprintf(tags, sizeof tags, "%08x vs %08x", r.digests.source_tag, ref->digests.source_tag);
      return Error("rank pack " + r.path + " was built from other GGUF shards than " + ref->path +
                   " (source tags " + tags + " in their digest sidecars): the rank packs of one merge must " +
                   "come from one checkpoint")
          .WithHint("rebuild the odd rank(s) from the same shards as the others (`k3pack pack --ep-size " +
                    std::to_string(n) + " --ep-rank R`)");
    }
  }
  std::string missing;
  for (uint32_t r = 0; r < n; ++r) {
    if (by_rank[r] < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  }
  if (!missing.empty()) {
    return Error("the rank packs do not cover all " + std::to_string(num_experts) + " experts: rank(s) " + missing +
                 " of " + std::to_string(n) + " missing");
  }

  // The prefix (header + index + zero fill): read from the first, identical in all.
  std::array<uint8_t, kHeaderBytes> hb{};
  K3_ASSIGN_OR_RETURN(size_t hgot, PreadFull(in[0].fd.get(), hb.data(), hb.size(), 0));
  if (hgot != hb.size()) return Error("rank pack " + in[0].path + " is shorter than the pack header");
  K3_ASSIGN_OR_RETURN(g.header, DecodeHeader(hb));
  const PackHeader& header = g.header;
  // data_start sizes the prefix read into memory before the index digest can
  // vouch for the header: it must be where the writer puts it (the index's
  // end, aligned), not merely inside the (terabyte) file.
  if (header.magic != kPackMagic || header.index_count != in[0].digests.index_count ||
      header.data_start != AlignUp(kHeaderBytes + header.index_count * kEntryBytes, kPackAlignment) ||
      header.data_start > in[0].size) {
    return Error("rank pack " + in[0].path + " has a header that does not match its digest sidecar");
  }
  std::vector<uint8_t>& prefix = g.prefix;
  prefix.resize(header.data_start);
  K3_ASSIGN_OR_RETURN(size_t pgot, PreadFull(in[0].fd.get(), prefix.data(), prefix.size(), 0));
  if (pgot != prefix.size()) return Error("short read of " + in[0].path);
  const uint64_t index_end = kHeaderBytes + header.index_count * kEntryBytes;
  const std::string& index_sha = g.index_sha = ToHex(Sha256Raw(prefix.data(), index_end).data(), 32);
  // Each file is held to its own sidecar first: a damaged first pack was
  // "not of the same pack as" itself, and a damaged later one was told only
  // to differ from the first, which named no culprit.
  const auto damaged = [&](const RankInput& r, const std::string& actual) {
    return Error("rank pack " + r.path + " is damaged: its header and index hash to " + actual +
                 ", not to the index digest its .digests sidecar recorded (" + r.digests.index_sha256 + ")")
        .WithHint("rebuild that rank pack (`k3pack pack MODEL --ep-size " + std::to_string(r.digests.ep->size) +
                  " --ep-rank " + std::to_string(r.digests.ep->rank) + " --force`) or copy it again");
  };
  if (in[0].digests.index_sha256 != index_sha) return damaged(in[0], index_sha);
  std::vector<uint8_t> other(prefix.size());
  for (auto& r : in) {
    if (r.size != in[0].size || r.digests.index_sha256 != index_sha) {
      return Error("rank pack " + r.path + " is not of the same pack as " + in[0].path +
                   " (size or index digest differ)");
    }
    K3_ASSIGN_OR_RETURN(size_t got, PreadFull(r.fd.get(), other.data(), other.size(), 0));
    if (got != other.size() || other != prefix)
      return damaged(r, ToHex(Sha256Raw(other.data(), std::min<uint64_t>(got, index_end)).data(), 32));
  }
  return g;
}

// The index entries of the group's pack, each expert in range of the rank
// packs' experts and each payload inside the pack.
Result<std::vector<PackEntry>> EntriesOf(const Group& g) {
  std::vector<PackEntry> entries(g.header.index_count);
  for (uint64_t i = 0; i < entries.size(); ++i) {
    K3_ASSIGN_OR_RETURN(entries[i], DecodeEntry({g.prefix.data() + kHeaderBytes + i * kEntryBytes, kEntryBytes}));
    // offset + nbytes could wrap past 2^64 (the index digest vouches only
    // that the rank packs agree, not that the index is sane).
    const uint64_t size = g.in[0].size;
    if (entries[i].expert < 0 || static_cast<uint32_t>(entries[i].expert) >= g.num_experts ||
        entries[i].nbytes > size || entries[i].offset > size - entries[i].nbytes) {
      return Error("rank pack " + g.in[0].path + ": index entry " + std::to_string(i) + " is out of range");
    }
  }
  return entries;
}

// The rank pack that owns an entry's expert.
const RankInput& OwnerOf(const Group& g, const PackEntry& e) {
  return g.in[g.by_rank[ep::OwnerOf(static_cast<uint32_t>(e.expert), g.num_experts, g.n)]];
}

// The merged pack's digest sidecar (a direct build's, version 2): every
// entry's records are its owner's, so the rank packs alone determine it.
PackDigests MergedDigests(const Group& g, const std::vector<PackEntry>& entries) {
  PackDigests merged;
  merged.index_count = g.header.index_count;
  merged.pack_size = g.in[0].size;
  merged.data_start = g.header.data_start;
  merged.index_sha256 = g.index_sha;
  for (uint64_t i = 0; i < entries.size(); ++i) {
    const RankInput& owner = OwnerOf(g, entries[i]);
    merged.entry_sha256.push_back(owner.digests.entry_sha256[i]);
    merged.entry_crc32c.push_back(owner.digests.entry_crc32c[i]);
  }
  return merged;
}

// Why `pack_path` is not the pack whose digests are `d` ("" when it is): its
// size, its header/index, and its payloads hashed: `samples` evenly spaced
// ones (0: every one).
Result<std::string> WhyNotPackOf(const Group& g, const std::vector<PackEntry>& entries, const PackDigests& d,
                                 const std::string& pack_path, uint64_t samples) {
  auto size = FileSize(pack_path);
  if (!size.ok() || *size != g.in[0].size) return std::string("its size differs from the rank packs'");
  K3_ASSIGN_OR_RETURN(UniqueFd fd, OpenReadOnly(pack_path));
  std::vector<uint8_t> prefix(g.prefix.size());
  K3_ASSIGN_OR_RETURN(size_t got, PreadFull(fd.get(), prefix.data(), prefix.size(), 0));
  if (got != prefix.size() || prefix != g.prefix) return std::string("its header/index differs from the rank packs'");
  const uint64_t count = entries.size();
  const uint64_t n = samples == 0 || samples > count ? count : samples;
  for (uint64_t k = 0; k < n; ++k) {
    const uint64_t i = n == count ? k : n == 1 ? 0 : k * (count - 1) / (n - 1);
    K3_ASSIGN_OR_RETURN(std::string sha, Sha256FileRange(pack_path, entries[i].offset, entries[i].nbytes));
    if (sha != ToHex(d.entry_sha256[i].data(), 32)) {
      return "payload " + entries[i].name + " expert " + std::to_string(entries[i].expert) + " (entry " +
             std::to_string(i) + ") does not match its digest";
    }
  }
  return std::string();
}

// SIGINT and SIGTERM held back on this thread (a merge runs on one) while
// the merged files are put in place: a Ctrl-C lands before the first step or
// after the last, never between, where it left the old pack without its
// sidecar, the new pack without its own, or a sidecar without its pack,
// each told as "no merged pack was written". A kill -9 can still land
// between; the rerun finishes that (see MergeRankPacks).
class StopSignalsHeld {
 public:
  StopSignalsHeld() {
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    ::pthread_sigmask(SIG_BLOCK, &stop, &old_);
  }
  ~StopSignalsHeld() { ::pthread_sigmask(SIG_SETMASK, &old_, nullptr); }
  StopSignalsHeld(const StopSignalsHeld&) = delete;
  StopSignalsHeld& operator=(const StopSignalsHeld&) = delete;

 private:
  sigset_t old_;
};

// Every payload from the rank that owns it into `out`, each checked against
// that rank's digest sidecar as it is copied.
Status CopyRankPayloads(const Group& g, const std::vector<PackEntry>& entries, AtomicFile& out, const MergeOptions& o,
                        std::chrono::steady_clock::time_point t0, CopyStats* stats) {
  uint64_t total = 0, done = 0;
  for (const PackEntry& e : entries) total += e.nbytes;
  auto allocated = IoBuffer::Allocate(8 << 20);
  if (!allocated.ok()) return out.Fail(allocated.error());
  IoBuffer& buf = *allocated;
  for (uint64_t i = 0; i < g.header.index_count; ++i) {
    const PackEntry& e = entries[i];
    const RankInput& src = OwnerOf(g, e);
    auto sha = CopyAndHash(src.fd.get(), e.offset, out.fd(), e.offset, e.nbytes, buf, stats);
    if (!sha.ok()) return out.Fail(sha.error().WithContext("copying from " + src.path));
    if (*sha != src.digests.entry_sha256[i]) {
      return Error("rank pack " + src.path + ": payload " + e.name + " expert " + std::to_string(e.expert) +
                        " (entry " + std::to_string(i) + ", offset " + std::to_string(e.offset) +
                        ") does not match its digest sidecar")
          .WithHint("run `k3pack verify --full` on that rank's manifest and rebuild the rank pack");
    }
    done += e.nbytes;
    if (o.progress && (i % 256 == 0 || i + 1 == g.header.index_count)) {
      o.progress({"merge", done, total, i + 1, g.header.index_count,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), stats->data_bytes});
    }
  }
  return Status::OK();
}

// Renames the merged pack into place beside its sidecar, in the order that
// never pairs a pack with another's digests. K3PACK_TEST_KILL_IN_MERGE=1
// raises SIGKILL between the two renames (a test seam).
Status PublishMergedPack(const PackPaths& p, AtomicFile& out, const PackDigests& merged) {
  const bool kill_between = EnvU64("K3PACK_TEST_KILL_IN_MERGE").value_or(0) == 1;
  if (PathExists(p.out)) {
    // Replacing a pack (--force): its sidecar goes first, then the new pack,
    // then the new sidecar. A reader sees the old pair, a pack without
    // sidecar (readers take it as unchecked, not damaged) or the new pair;
    // the new sidecar first gave the old pack the new digests, and the good
    // old pack read as damaged throughout.
    K3_RETURN_IF_ERROR(RemoveFile(p.digests));
    // A build's record of its shards does not describe a merged pack.
    K3_RETURN_IF_ERROR(RemoveFile(InputsRecordPathFor(p.out)));
    K3_RETURN_IF_ERROR(out.Commit());
    if (kill_between) ::raise(SIGKILL);
    K3_RETURN_IF_ERROR(WritePackDigests(p.digests, merged));
  } else {
    // No pack yet: the sidecar first, then the pack. A crash between the two
    // leaves no pack (a rerun merges again and replaces the sidecar); the
    // other order left a pack without its sidecar, which a rerun refuses as
    // not this merge. A record of shards left from a pack deleted by hand
    // would vouch for the merged one.
    K3_RETURN_IF_ERROR(RemoveFile(InputsRecordPathFor(p.out)));
    K3_RETURN_IF_ERROR(WritePackDigests(p.digests, merged));
    if (kill_between) ::raise(SIGKILL);
    K3_RETURN_IF_ERROR(out.Commit());
  }
  return Status::OK();
}

}  // namespace

Result<MergeResult> MergeRankPacks(const std::vector<std::string>& rank_packs, const MergeOptions& o) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  if (o.out_path.empty()) return Error("MergeRankPacks: no output path");
  K3_ASSIGN_OR_RETURN(Group g, OpenGroup(rank_packs));
  const std::vector<RankInput>& in = g.in;
  const uint32_t n = g.n;
  const std::vector<uint8_t>& prefix = g.prefix;
  const std::string& index_sha = g.index_sha;

  // Output under the build's lock (no build or merge of the same path runs beside it).
  PackPaths p{o.out_path, PartialPathFor(o.out_path), "", "", DigestsPathFor(o.out_path), LockPathFor(o.out_path)};
  K3_ASSIGN_OR_RETURN(LockFile lock, LockPack(p.out));
  K3_RETURN_IF_ERROR(CheckSidecarsAreOurs("--pack", p.out, "--force", /*building=*/false));
  K3_ASSIGN_OR_RETURN(std::vector<PackEntry> entries, EntriesOf(g));
  const PackDigests merged = MergedDigests(g, entries);
  MergeResult r;
  r.pack_path = p.out;
  r.digests_path = p.digests;
  r.ep_size = n;
  r.pack_bytes = in[0].size;
  r.index_sha256 = index_sha;
  auto log = [&](const std::string& line) {
    if (o.log) o.log(line);
  };
  if (PathExists(p.out) && !PathExists(p.digests)) {
    // A merge killed between renaming the pack into place and writing its
    // sidecar left the complete merge without it, which every rerun refused
    // ("its digest sidecar is missing"), and --force merged again. Without a
    // sidecar only the bytes tell it from an old pack whose sidecar went
    // first (the other window of a --force), so every payload is compared;
    // as the build's finalize is finished by its rerun, this writes the
    // sidecar only.
    log(p.out + " has no digest sidecar: comparing every payload with the rank packs");
    K3_ASSIGN_OR_RETURN(std::string why_not, WhyNotPackOf(g, entries, merged, p.out, /*samples=*/0));
    if (why_not.empty()) {
      const StopSignalsHeld held;
      K3_RETURN_IF_ERROR(RemoveFile(InputsRecordPathFor(p.out)));
      K3_RETURN_IF_ERROR(WritePackDigests(p.digests, merged));
      if (o.on_published) o.on_published();
      log("finished an interrupted merge: " + p.out);
      r.finished_interrupted = true;
      r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      return r;
    }
    if (!o.replace_existing) {
      return Error("refusing to overwrite existing " + p.out + " (--pack): it is not the merge of these rank packs: "
                       "its digest sidecar " + p.digests + " is missing and " + why_not,
                   ErrorKind::kFileExists)
          .WithHint("pass --force to merge again, or write the merged pack to another --pack path");
    }
  }
  if (PathExists(p.out) && !o.replace_existing) {
    return Error("refusing to overwrite existing Expert Pack: " + p.out, ErrorKind::kFileExists)
        .WithHint("pass --force to replace it, or write the merged pack to another --pack path");
  }
  // Written beside the output and renamed into place; dropped on any error.
  K3_ASSIGN_OR_RETURN(AtomicFile out, AtomicFile::Create(p.out));
  if (::ftruncate(out.fd(), static_cast<off_t>(in[0].size)) != 0) {
    return out.Fail(Error::FromErrno("cannot size the file", errno));
  }
  K3_RETURN_IF_ERROR(out.Write(prefix.data(), prefix.size(), 0));

  CopyStats stats;
  K3_RETURN_IF_ERROR(CopyRankPayloads(g, entries, out, o, t0, &stats));
  // The merged bytes are made durable before anything of an old pack is
  // touched: this fsync is the merge's longest wait after the copy, and run
  // inside the replacement (by Commit) it was where a Ctrl-C left the old
  // pack without its sidecar and threw the merged bytes away.
  if (::fsync(out.fd()) != 0) return out.Fail(Error::FromErrno("fsync failed", errno));
  // Test seam: K3PACK_TEST_STOP_IN_MERGE=1 stops (SIGSTOP) just before the
  // renames, so a test delivers a real signal while they are made.
  const StopSignalsHeld held;
  if (EnvU64("K3PACK_TEST_STOP_IN_MERGE").value_or(0) == 1) ::raise(SIGSTOP);
  K3_RETURN_IF_ERROR(PublishMergedPack(p, out, merged));
  if (o.on_published) o.on_published();
  (void)lock;
  r.copied_bytes = stats.data_bytes;
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

Status CheckRankPacksMerge(const std::vector<std::string>& rank_packs) {
  K3_ASSIGN_OR_RETURN(Group g, OpenGroup(rank_packs));
  return EntriesOf(g).status();  // entries in range of the rank packs' experts
}

Result<std::string> WhyNotMergedPack(const std::vector<std::string>& rank_packs, const std::string& pack_path) {
  K3_ASSIGN_OR_RETURN(Group g, OpenGroup(rank_packs));
  const std::string dpath = DigestsPathFor(pack_path);
  auto d = ReadPackDigests(dpath);
  if (!d.ok()) return "its digest sidecar " + dpath + " is missing or unreadable";
  const uint64_t count = g.header.index_count;
  if (d->ep || d->pack_size != g.in[0].size || d->index_sha256 != g.index_sha || d->entry_sha256.size() != count) {
    return "its digest sidecar " + dpath + " is not the full pack's of these rank packs";
  }
  // Every payload's recorded digest is its owner's; a few payloads are hashed
  // (evenly spaced, as the build's already-built check samples them).
  K3_ASSIGN_OR_RETURN(std::vector<PackEntry> entries, EntriesOf(g));
  for (uint64_t i = 0; i < count; ++i) {
    const RankInput& owner = OwnerOf(g, entries[i]);
    if (d->entry_sha256[i] != owner.digests.entry_sha256[i]) {
      return "its digest sidecar differs from rank pack " + owner.path + " at entry " + std::to_string(i);
    }
  }
  return WhyNotPackOf(g, entries, *d, pack_path, /*samples=*/6);
}

}  // namespace k3pack::pack
