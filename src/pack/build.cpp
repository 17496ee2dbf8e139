// The crash-safe, resumable pack writer (see BuildPack in k3pack/pack.h).
//
// Durability protocol. Objects (layer, expert) are copied by several threads
// in ascending order; a coordinator advances a watermark W over the leading
// run of finished objects and, every checkpoint interval: fdatasync(partial),
// fdatasync(digest journal), then atomically replaces the checkpoint with W.
// So the checkpoint never claims bytes that are not on disk. A restart
// re-copies objects >= W (their ranges are zeroed first, keeping holes).
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>

#include "pack/build_inputs.h"
#include "pack/checkpoint_file.h"
#include "pack/copy.h"
#include "pack/inputs_record.h"
#include "pack/sidecars.h"
#include "util/threads.h"
#include "util/crc32c.h"
#include "util/file.h"
#include "util/parallel_sha256.h"
#include "util/sha256.h"

namespace k3pack::pack {
namespace {

using Clock = std::chrono::steady_clock;
using Paths = PackPaths;

std::string JournalSha(const std::vector<Digest>& d, uint64_t entries) {
  return ToHex(Sha256Raw(d.data(), entries * kDigestBytes).data(), 32);
}

Result<UniqueFd> OpenRw(const std::string& path, int flags) {
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | flags, kNewFileMode);
  if (fd < 0) return Error::FromErrno("cannot open " + path, errno);
  return UniqueFd(fd);
}

Error RestartHint(Error e) { return e.WithHint("pass --restart to discard the partial build and start over"); }

// Initializes a fresh partial pack (sparse, prefix written) and journal.
Status CreateFresh(const Paths& p, const PackLayout& layout, UniqueFd* pack_fd, UniqueFd* journal_fd) {
  K3_RETURN_IF_ERROR(RemoveIfExists(p.partial));
  K3_RETURN_IF_ERROR(RemoveIfExists(p.journal));
  K3_ASSIGN_OR_RETURN(*pack_fd, OpenRw(p.partial, O_CREAT | O_EXCL));
  if (::ftruncate(pack_fd->get(), static_cast<off_t>(layout.final_size())) != 0) {
    return Error::FromErrno("cannot size " + p.partial, errno);
  }
  auto prefix = layout.EncodePrefix();
  K3_RETURN_IF_ERROR(WriteFileAt(pack_fd->get(), p.partial, prefix.data(), prefix.size(), 0));
  if (::fsync(pack_fd->get()) != 0) return Error::FromErrno("fsync failed for " + p.partial, errno);
  K3_ASSIGN_OR_RETURN(*journal_fd, OpenRw(p.journal, O_CREAT | O_EXCL));
  if (::ftruncate(journal_fd->get(), static_cast<off_t>(DigestsFileBytes(layout.index_count()))) != 0) {
    return Error::FromErrno("cannot size " + p.journal, errno);
  }
  if (::fsync(journal_fd->get()) != 0) return Error::FromErrno("fsync failed for " + p.journal, errno);
  return FsyncParentDir(p.partial);
}

// Opens an existing partial build at checkpoint `c`; loads the journal's
// digests and CRCs of the checkpointed objects (*have_crcs: false when the
// checkpoint predates the journal's CRCs).
Status OpenResume(const Paths& p, const PackLayout& layout, const Checkpoint& c, UniqueFd* pack_fd,
                  UniqueFd* journal_fd, std::vector<Digest>* digests, std::vector<uint32_t>* crcs, bool* have_crcs) {
  K3_ASSIGN_OR_RETURN(*pack_fd, OpenRw(p.partial, 0));
  struct stat st;
  if (::fstat(pack_fd->get(), &st) != 0) return Error::FromErrno("cannot stat " + p.partial, errno);
  if (static_cast<uint64_t>(st.st_size) != layout.final_size()) {
    return RestartHint(Error("partial Expert Pack " + p.partial + " has size " + std::to_string(st.st_size) +
                             ", expected " + std::to_string(layout.final_size())));
  }
  auto prefix = layout.EncodePrefix();
  std::vector<uint8_t> have(prefix.size());
  K3_ASSIGN_OR_RETURN(size_t got, PreadFull(pack_fd->get(), have.data(), have.size(), 0));
  if (got != have.size() || have != prefix) {
    return RestartHint(Error("partial Expert Pack " + p.partial + " has a header/index that does not match the inputs"));
  }
  K3_ASSIGN_OR_RETURN(*journal_fd, OpenRw(p.journal, 0));
  const uint64_t entries = c.objects_done * kRoleCount, n = layout.index_count();
  std::vector<uint8_t> raw(entries * kDigestBytes);
  K3_ASSIGN_OR_RETURN(size_t jgot, PreadFull(journal_fd->get(), raw.data(), raw.size(), kDigestsHeaderBytes));
  if (jgot != raw.size() || ToHex(Sha256Raw(raw.data(), raw.size()).data(), 32) != c.journal_sha256) {
    return RestartHint(Error("digest journal " + p.journal + " does not match checkpoint " + p.checkpoint));
  }
  for (uint64_t i = 0; i < entries; ++i) std::memcpy((*digests)[i].data(), raw.data() + i * kDigestBytes, 32);
  // A journal from before CRC records is shorter: make room for them.
  if (::fstat(journal_fd->get(), &st) != 0) return Error::FromErrno("cannot stat " + p.journal, errno);
  if (static_cast<uint64_t>(st.st_size) < DigestsFileBytes(n) &&
      ::ftruncate(journal_fd->get(), static_cast<off_t>(DigestsFileBytes(n))) != 0) {
    return Error::FromErrno("cannot size " + p.journal, errno);
  }
  *have_crcs = !c.journal_crc_sha256.empty();
  if (*have_crcs) {
    raw.assign(entries * kCrcBytes, 0);
    K3_ASSIGN_OR_RETURN(size_t cgot, PreadFull(journal_fd->get(), raw.data(), raw.size(), CrcRecordOffset(n, 0)));
    if (cgot != raw.size() || ToHex(Sha256Raw(raw.data(), raw.size()).data(), 32) != c.journal_crc_sha256) {
      return RestartHint(Error("digest journal " + p.journal + " does not match checkpoint " + p.checkpoint));
    }
    std::memcpy(crcs->data(), raw.data(), raw.size());
  }
  return Status::OK();
}

// What a resume finds in the checkpointed prefix of the partial file.
struct PrefixCheck {
  uint64_t first_bad = 0;  // == objects_done when every object matches
  std::string detail;      // what differs in the first bad object
};

// Re-reads every checkpointed object of the partial pack and compares each
// payload's CRC32C with the journal's (or, for a checkpoint without CRCs, its
// SHA-256, filling in the CRC). A byte changed between the kill and the rerun
// (a disk error, a stray write) must not be published: the resume restarts at
// the first object that differs. Several threads; holes are not read.
Result<PrefixCheck> CheckPrefix(const PackLayout& layout, int fd, uint64_t objects_done,
                                const std::vector<Digest>& digests, std::vector<uint32_t>* crcs, bool have_crcs,
                                int threads, const std::string& path, ep::ExpertRange written,
                                const ProgressFn& progress) {
  std::atomic<uint64_t> first_bad{objects_done}, next{0};
  std::mutex mu;
  // Minutes for a large prefix, on every resume: shown as its own phase.
  uint64_t checked = 0;
  const auto started = std::chrono::steady_clock::now();
  auto report_locked = [&](uint64_t done) {
    if (!progress) return;
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    progress(Progress("resume check", 0, 0, done, objects_done, elapsed));
  };
  std::optional<Error> error;
  std::string detail;
  constexpr uint64_t kChunk = 8u << 20;
  auto worker = [&] {
    auto allocated = IoBuffer::Allocate(kChunk);
    if (!allocated.ok()) {
      std::lock_guard<std::mutex> lock(mu);
      if (!error) error = allocated.error();
      return;
    }
    IoBuffer& buf = *allocated;
    for (uint64_t obj; (obj = next.fetch_add(1)) < objects_done && obj < first_bad.load();) {
      // Another rank's object: a hole by design, its records zero.
      if (!written.contains(static_cast<uint32_t>(obj % layout.num_experts()))) continue;
      for (uint64_t r = 0; r < kRoleCount; ++r) {
        const EntrySlot e = layout.Entry(obj * kRoleCount + r);
        uint32_t crc = 0;
        Sha256 sha;
        const std::vector<Segment> segs = MapRange(fd, e.offset, e.nbytes);
        const bool all_hole = segs.size() == 1 && segs[0].hole;  // sparse packs: nothing to read
        if (all_hole) crc = ZeroCrc32c(e.nbytes);
        for (const Segment& sg : all_hole ? std::vector<Segment>{} : segs) {
          for (uint64_t done = 0; done < sg.length;) {
            const size_t k = static_cast<size_t>(std::min<uint64_t>(kChunk, sg.length - done));
            if (sg.hole) {
              std::memset(buf.data(), 0, k);
            } else {
              auto got = PreadFull(fd, buf.data(), k, sg.offset + done);
              if (!got.ok() || *got != k) {
                std::lock_guard<std::mutex> lock(mu);
                if (!error) error = got.ok() ? Error("short read of " + path + " at offset " +
                                                     std::to_string(sg.offset + done), ErrorKind::kEOF)
                                             : got.error().WithContext(path);
                return;
              }
            }
            crc = Crc32c(buf.data(), k, crc);
            if (!have_crcs) sha.Update(buf.data(), k);
            done += k;
          }
        }
        const uint64_t i = obj * kRoleCount + r;
        const bool ok = have_crcs ? crc == (*crcs)[i]
                                  : (all_hole ? ZeroSha256(e.nbytes) == digests[i]
                                              : sha.HexDigest() == ToHex(digests[i].data(), 32));
        if (!have_crcs) (*crcs)[i] = crc;
        if (!ok) {
          std::lock_guard<std::mutex> lock(mu);
          if (obj < first_bad.load()) {
            first_bad.store(obj);
            detail = "layer " + std::to_string(e.layer) + " expert " + std::to_string(e.expert) + " " +
                     RoleName(e.role) + " (entry " + std::to_string(i) + ", offset " + std::to_string(e.offset) +
                     ")";
          }
          break;
        }
      }
      std::lock_guard<std::mutex> lock(mu);
      report_locked(++checked);
    }
  };
  const int n = std::max(1, std::min<int>(threads > 0 ? threads : 4, static_cast<int>(std::max<uint64_t>(1, objects_done))));
  RunOnThreads(static_cast<unsigned>(n), worker);
  if (error) return *error;
  report_locked(objects_done);  // a bad object ends the check early: it is over all the same
  return PrefixCheck{first_bad.load(), detail};
}

// Disk bytes still to be written: non-hole source bytes of objects >= from_object.
uint64_t RemainingDataBytes(const ExpertSet& ex, const std::vector<UniqueFd>& src, uint64_t from_object,
                            ep::ExpertRange written) {
  uint64_t total = 0;
  for (size_t li = 0; li < ex.layers.size(); ++li) {
    uint64_t first = li * ex.num_experts;
    uint64_t e0 = from_object > first ? std::min<uint64_t>(from_object - first, ex.num_experts) : 0;
    e0 = std::max<uint64_t>(e0, written.first);
    if (e0 >= written.end) continue;
    for (const auto& t : ex.by_layer[li]) {
      uint64_t off = t.tensor.data_offset + e0 * t.expert_bytes;
      uint64_t len = (written.end - e0) * t.expert_bytes;
      for (const auto& s : MapRange(src[t.tensor.shard_index].get(), off, len)) {
        if (!s.hole) total += s.length;
      }
    }
  }
  return total;
}

// Bytes `path` occupies on disk in [from, end of file) (its data segments);
// 0 when it does not exist.
uint64_t HeldBytes(const std::string& path, uint64_t from) {
  auto fd = OpenReadOnly(path);
  if (!fd.ok()) return 0;
  struct stat st;
  if (::fstat(fd->get(), &st) != 0 || static_cast<uint64_t>(st.st_size) <= from) return 0;
  uint64_t held = 0;
  for (const auto& s : MapRange(fd->get(), from, static_cast<uint64_t>(st.st_size) - from)) {
    if (!s.hole) held += s.length;
  }
  return held;
}

// Whether the filesystem keeps the unwritten payload area of `fd` as holes:
// SEEK_HOLE from the first payload must land there (payloads are 4096-aligned
// and nothing past the prefix is written yet on a fresh file; on a resumed one
// the last object is a hole or the file's end). Test seam:
// K3PACK_TEST_NO_SPARSE=1 answers no.
bool SupportsHoles(int fd, const PackLayout& layout) {
  if (EnvU64("K3PACK_TEST_NO_SPARSE").value_or(0) != 0) return false;
  const off_t from = static_cast<off_t>(layout.data_start());
  const off_t h = ::lseek(fd, from, SEEK_HOLE);
  return h >= 0 && static_cast<uint64_t>(h) < layout.final_size();
}

// Seals the journal, renames it to <pack>.digests, renames the partial onto
// the pack, removes the checkpoint. Each step is idempotent on rerun.
// Test seam: K3PACK_TEST_KILL_IN_FINALIZE=k raises SIGKILL after step k (1:
// journal sealed, 2: pack renamed, 3: digests renamed, checkpoint still there).
Status Finalize(const Paths& p, const PackLayout& layout, int pack_fd, int journal_fd,
                const std::vector<Digest>& digests, const std::vector<uint32_t>& crcs,
                const std::optional<ep::Rank>& ep, uint32_t source_tag) {
  const uint64_t kill_step = EnvU64("K3PACK_TEST_KILL_IN_FINALIZE").value_or(0);
  auto maybe_kill = [&](uint64_t step) {
    if (kill_step == step) ::raise(SIGKILL);
  };
  if (::fsync(pack_fd) != 0) return Error::FromErrno("fsync failed for " + p.partial, errno);
  struct stat st;
  if (::fstat(pack_fd, &st) != 0) return Error::FromErrno("cannot stat " + p.partial, errno);
  if (static_cast<uint64_t>(st.st_size) != layout.final_size()) {
    return Error("generated Expert Pack size " + std::to_string(st.st_size) + " != " +
                     std::to_string(layout.final_size()),
                 ErrorKind::kRuntime);
  }
  DigestsHeader h;
  h.index_count = layout.index_count();
  h.pack_size = layout.final_size();
  h.data_start = layout.data_start();
  if (ep) {
    h.version = kDigestsRankVersion;
    h.ep_size = ep->size;
    h.ep_rank = ep->rank;
    h.num_experts = layout.num_experts();
    h.source_tag = source_tag;
  }
  FromHex(layout.IndexSha256(), h.index_sha256.data(), 32);
  // Records: the SHA-256s, then the CRC32Cs (little-endian, the host order).
  std::vector<uint8_t> records(digests.size() * (kDigestBytes + kCrcBytes));
  std::memcpy(records.data(), digests.data(), digests.size() * kDigestBytes);
  std::memcpy(records.data() + digests.size() * kDigestBytes, crcs.data(), crcs.size() * kCrcBytes);
  h.records_sha256 = Sha256Raw(records.data(), records.size());
  auto head = EncodeDigestsHeader(h);
  K3_RETURN_IF_ERROR(WriteFileAt(journal_fd, p.journal, head.data(), head.size(), 0));
  K3_RETURN_IF_ERROR(WriteFileAt(journal_fd, p.journal, records.data(), records.size(), kDigestsHeaderBytes));
  if (::fsync(journal_fd) != 0) return Error::FromErrno("fsync failed for " + p.journal, errno);
  maybe_kill(1);
  // A pack being replaced loses its sidecar first: between the renames a
  // reader then sees a pack without sidecar (unchecked), never the new pack
  // with the old digests (read as damaged throughout).
  if (PathExists(p.digests)) {
    K3_RETURN_IF_ERROR(RemoveIfExists(p.digests));
    K3_RETURN_IF_ERROR(FsyncParentDir(p.out));
  }
  if (::rename(p.partial.c_str(), p.out.c_str()) != 0) {
    return Error::FromErrno("cannot rename " + p.partial + " to " + p.out, errno);
  }
  K3_RETURN_IF_ERROR(FsyncParentDir(p.out));
  maybe_kill(2);
  if (::rename(p.journal.c_str(), p.digests.c_str()) != 0) {
    return Error::FromErrno("cannot rename " + p.journal + " to " + p.digests, errno);
  }
  K3_RETURN_IF_ERROR(FsyncParentDir(p.out));
  maybe_kill(3);
  // The spare first: a kill between the two leaves the checkpoint, which the
  // rerun finishes (CompleteInterruptedFinalize); the other order left a
  // spare nothing ever removed.
  K3_RETURN_IF_ERROR(RemoveIfExists(CheckpointSparePathFor(p.checkpoint)));
  K3_RETURN_IF_ERROR(RemoveIfExists(p.checkpoint));
  return FsyncParentDir(p.out);
}

// A crash between renaming the pack and removing the checkpoint leaves a
// finished pack, a sealed journal and a checkpoint: finish those steps.
Result<bool> CompleteInterruptedFinalize(const Paths& p, const std::string& fingerprint) {
  if (!PathExists(p.checkpoint) || PathExists(p.partial)) return false;
  K3_ASSIGN_OR_RETURN(std::string text, ReadFileToString(p.checkpoint));
  auto c = DecodeCheckpoint(p.checkpoint, text);
  if (!c.ok() || c->fingerprint != fingerprint || c->objects_done != c->objects_total) return false;
  if (PathExists(p.journal)) {
    if (!ReadPackDigests(p.journal).ok()) return false;
    if (::rename(p.journal.c_str(), p.digests.c_str()) != 0) {
      return Error::FromErrno("cannot rename " + p.journal + " to " + p.digests, errno);
    }
  }
  if (!PathExists(p.digests)) return false;
  K3_RETURN_IF_ERROR(RemoveIfExists(CheckpointSparePathFor(p.checkpoint)));
  K3_RETURN_IF_ERROR(RemoveIfExists(p.checkpoint));
  K3_RETURN_IF_ERROR(FsyncParentDir(p.out));
  return true;
}

void Log(const BuildOptions& o, const std::string& line) {
  if (o.log) o.log(line);
}

// A partial build's checkpoint, when it is one of these inputs with work to
// resume: replaces `ckpt` (the fresh one) and returns true. Anything else
// left at the partial's paths is refused with what to do.
Result<bool> TakeCheckpoint(const Paths& p, Checkpoint* ckpt) {
  const bool have_partial = PathExists(p.partial);
  const bool have_ckpt = PathExists(p.checkpoint);
  if (have_partial && !have_ckpt) {
    return Error("partial Expert Pack already exists: " + p.partial, ErrorKind::kFileExists)
        .WithHint("it has no k3pack checkpoint, so it cannot be resumed; pass --restart to discard it");
  }
  if (!have_ckpt) return false;
  K3_ASSIGN_OR_RETURN(std::string text, ReadFileToString(p.checkpoint));
  K3_ASSIGN_OR_RETURN(Checkpoint old, DecodeCheckpoint(p.checkpoint, text));
  if (old.fingerprint != ckpt->fingerprint || old.pack_size != ckpt->pack_size ||
      old.index_count != ckpt->index_count) {
    return RestartHint(Error("the partial Expert Pack " + p.partial +
                             " was started from different inputs (checkpoint " + p.checkpoint +
                             " does not match the GGUF shards / config given now)"));
  }
  // The resume sizes its reads of the journal and its loops by objects_done,
  // its vectors by the pack's entries: a count past the pack's (a damaged or
  // edited checkpoint whose other fields agree) ran off their ends.
  if (old.objects_total != ckpt->objects_total) {
    return RestartHint(Error("checkpoint " + p.checkpoint + " records " + std::to_string(old.objects_total) +
                             " objects, but the pack of these inputs has " + std::to_string(ckpt->objects_total)));
  }
  if (!have_partial && old.objects_done > 0) {
    return RestartHint(Error("checkpoint " + p.checkpoint + " records " + std::to_string(old.objects_done) +
                             " finished objects but " + p.partial + " is missing"));
  }
  if (!have_partial || old.objects_done == 0) return false;
  *ckpt = std::move(old);
  return true;
}

// Refuses to start without room for what is still to be written plus the
// margin (SGLang's text), unless removing the pack being replaced makes it.
Status CheckSpace(const Paths& p, const ExpertSet& ex, const PackLayout& layout, const std::vector<UniqueFd>& src,
                  const Checkpoint& ckpt, bool resume, const ep::ExpertRange& written, const BuildOptions& o) {
  // What is still to be written: the data of objects past the checkpoint,
  // the journal, and (fresh) the header + index. Space the rerun takes back
  // counts as free: the partial's bytes past the checkpoint (zeroed, then
  // rewritten) and the journal's (rewritten in place), or all of both when a
  // partial without usable checkpoint is replaced.
  std::string dir = std::filesystem::path(p.out).parent_path().string();
  if (dir.empty()) dir = ".";
  K3_ASSIGN_OR_RETURN(uint64_t avail, AvailableBytes(dir));
  const uint64_t margin = static_cast<uint64_t>(o.safety_margin_gib * 1024.0 * 1024.0 * 1024.0);
  const uint64_t estimate = RemainingDataBytes(ex, src, ckpt.objects_done, written) + DigestsFileBytes(layout.index_count()) +
                            (resume ? 0 : layout.data_start());
  const uint64_t durable_end = !resume ? 0
                               : ckpt.objects_done < layout.object_count()
                                   ? layout.Entry(ckpt.objects_done * kRoleCount).offset
                                   : layout.final_size();
  const uint64_t reusable = HeldBytes(p.partial, durable_end) + HeldBytes(p.journal, 0);
  const uint64_t required = estimate > reusable ? estimate - reusable : 0;
  // The pack being replaced is kept until the new one is renamed over it;
  // its blocks count as free only when the disk cannot hold both.
  const uint64_t replaced = PathExists(p.out) ? HeldBytes(p.out, 0) + HeldBytes(p.digests, 0) : 0;
  if (avail < required + margin) {
    if (replaced > 0 && avail + replaced >= required + margin) {
      Log(o, "not enough free space to keep " + p.out + " until its rebuild is complete (" + std::to_string(avail) +
                 " bytes free, " + std::to_string(required + margin) + " needed): removing it now");
      for (const std::string& f : {p.out, p.digests}) K3_RETURN_IF_ERROR(RemoveIfExists(f));
      K3_RETURN_IF_ERROR(FsyncParentDir(p.out));
    } else {
      return Error("insufficient space for Kimi Expert Pack: available=" + std::to_string(avail) +
                       ", required=" + std::to_string(required + margin),
                   ErrorKind::kOS, ENOSPC)
          .WithHint("the pack needs " + std::to_string(required) + " more bytes on disk (logical size " +
                    std::to_string(layout.final_size()) + ") plus the --safety-margin-gib margin" +
                    (replaced > 0 ? " (the " + std::to_string(replaced) + " bytes of the pack it replaces counted as free)"
                                  : std::string()));
    }
  }
  return Status::OK();
}

// Reopens a checkpointed partial build: checks the checkpointed objects
// against their journal records (anything changed since is copied again),
// and clears what lies past them so source holes stay zero.
Status ReopenPartial(const Paths& p, const PackLayout& layout, const ep::ExpertRange& written, const BuildOptions& o,
                     Checkpoint* ckpt, UniqueFd* pack_fd, UniqueFd* journal_fd, std::vector<Digest>* digests,
                     std::vector<uint32_t>* crcs, BuildResult* result) {
  bool have_crcs = false;
  K3_RETURN_IF_ERROR(OpenResume(p, layout, *ckpt, pack_fd, journal_fd, digests, crcs, &have_crcs));
  Log(o, "checking the " + std::to_string(ckpt->objects_done) + " checkpointed objects of " + p.partial +
             " against their " + (have_crcs ? "CRC32C" : "SHA-256") + " records");
  K3_ASSIGN_OR_RETURN(PrefixCheck check, CheckPrefix(layout, pack_fd->get(), ckpt->objects_done, *digests, crcs,
                                                     have_crcs, o.threads, p.partial, written, o.progress));
  if (check.first_bad < ckpt->objects_done) {
    Log(o, "object " + std::to_string(check.first_bad) + " of " + p.partial + ", " + check.detail +
                 ", changed since it was checkpointed; copying it and every later object again");
    result->rewritten_objects = ckpt->objects_done - check.first_bad;
    ckpt->objects_done = check.first_bad;
  }
  if (!have_crcs && ckpt->objects_done > 0) {
    // The checkpoint predates the journal's CRCs: record the ones just derived.
    K3_RETURN_IF_ERROR(WriteFileAt(journal_fd->get(), p.journal, crcs->data(),
                                   ckpt->objects_done * kRoleCount * kCrcBytes, CrcRecordOffset(layout.index_count(), 0)));
    if (::fdatasync(journal_fd->get()) != 0) return Error::FromErrno("fdatasync failed for " + p.journal, errno);
  }
  ckpt->journal_sha256 = JournalSha(*digests, ckpt->objects_done * kRoleCount);
  ckpt->journal_crc_sha256 = ToHex(Sha256Raw(crcs->data(), ckpt->objects_done * kRoleCount * kCrcBytes).data(), 32);
  // Objects past the watermark are re-copied; clear their ranges so source
  // holes stay zero (punching keeps them sparse).
  if (ckpt->objects_done < layout.object_count()) {
    const uint64_t from = layout.Entry(ckpt->objects_done * kRoleCount).offset;
    K3_RETURN_IF_ERROR(ZeroRange(pack_fd->get(), from, layout.final_size() - from));
  }
  result->resumed_objects = ckpt->objects_done;
  Log(o, "resuming " + p.partial + " at object " + std::to_string(ckpt->objects_done) + " of " +
             std::to_string(ckpt->objects_total));
  return Status::OK();
}

// An existing pack at the output path: a finalize cut short is finished
// (true), a rebuild under way resumes, anything else needs --force.
Result<bool> CheckExistingPack(const Paths& p, const std::string& fingerprint, const BuildOptions& o) {
  if (!PathExists(p.out)) return false;
  K3_ASSIGN_OR_RETURN(bool finished, CompleteInterruptedFinalize(p, fingerprint));
  if (finished) {
    Log(o, "finished an interrupted build: " + p.out);
    return true;
  }
  // A rebuild under way over a finished pack (a `--force` run that was
  // interrupted) resumes as any other; the pack is replaced when it is done.
  // Its checkpoint is made first, so it alone marks such a rebuild: one
  // stopped before its partial file existed (a full disk at the
  // checkpoint's reservation, a kill at its first renames) was refused
  // here on every rerun, the plan having chosen to resume it and so
  // dropped --force, and before --restart could clean up.
  if (!o.replace_existing && !PathExists(p.checkpoint)) {
    return Error("refusing to overwrite existing Expert Pack: " + p.out, ErrorKind::kFileExists)
        .WithHint("`k3pack pack` and `k3pack build` rebuild it with --force; or write the pack to another path");
  }
  return false;
}

Result<std::vector<UniqueFd>> OpenSources(const ExpertSet& ex) {
  std::vector<UniqueFd> src;
  for (const auto& path : ex.shard_paths) {
    K3_ASSIGN_OR_RETURN(UniqueFd fd, OpenReadOnly(path));
    ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
    src.push_back(std::move(fd));
  }
  return src;
}

Status DiscardPartialBuild(const Paths& p, const BuildOptions& o) {
  for (const auto& f : {p.partial, p.checkpoint, p.journal, p.checkpoint + ".tmp", CheckpointSparePathFor(p.checkpoint)}) {
    if (PathExists(f)) Log(o, "discarding " + f);
    K3_RETURN_IF_ERROR(RemoveIfExists(f));
  }
  return Status::OK();
}

// The journal records a fresh build starts from: no object done.
void StartFresh(const std::vector<Digest>& digests, const std::vector<uint32_t>& crcs, Checkpoint* ckpt) {
  ckpt->objects_done = 0;
  ckpt->journal_sha256 = JournalSha(digests, 0);
  ckpt->journal_crc_sha256 = ToHex(Sha256Raw(crcs.data(), 0).data(), 32);
}

// The shards' whole-file digests, computed beside the copy, keyed by the
// shards' resolved paths.
Status FinishSourceHashes(ParallelSha256& hasher, const ExpertSet& ex, const BuildOptions& o, BuildResult* result) {
  // Not checkpointed (a hash state is not resumable from a file here): say
  // so before the long part, where a stop loses it.
  Log(o, "finishing the SHA-256 of the source shards for the manifest (the copy is done and kept; a stop here "
         "restarts this hashing on the rerun; --no-full-source-hashes skips it)");
  ParallelSha256::Wait wait;
  wait.progress = o.progress;
  K3_ASSIGN_OR_RETURN(std::vector<std::string> by_index, hasher.Finish(wait));
  for (size_t i = 0; i < by_index.size() && i < ex.shard_paths.size(); ++i) {
    K3_ASSIGN_OR_RETURN(std::string resolved, ResolvePath(ex.shard_paths[i]));
    result->source_sha256[resolved] = by_index[i];
  }
  return Status::OK();
}

// Publishes the copied partial: the inputs record, then the finalize (index,
// digests, renames).
Status Publish(const ExpertSet& ex, const BuildOptions& o, const Paths& p, const PackLayout& layout,
               const std::vector<FileStamp>& stamps, int pack_fd, int journal_fd, const std::vector<Digest>& digests,
               const std::vector<uint32_t>& crcs) {
  // A shard appended to, truncated, rewritten or replaced while it was read
  // gives a pack that may match neither its old bytes nor its new ones:
  // never published (the partial and its checkpoint stay; the checkpoint no
  // longer matches the shards, so the rerun asks for --restart).
  K3_RETURN_IF_ERROR(CheckShardsUnchanged(ex.shard_paths, stamps, p.out));
  // While the checkpoint still stands: until the finalize is done, a rerun
  // resumes or finishes it and never judges the pack by this record.
  K3_RETURN_IF_ERROR(WriteInputsRecord(p.out, ex, stamps));
  // A rank pack records which source it came from, so that ep-merge can refuse
  // rank packs of two checkpoints that share a layout.
  uint32_t source_tag = 0;
  if (o.ep) {
    K3_ASSIGN_OR_RETURN(source_tag, SourceTag(ex));
  }
  return Finalize(p, layout, pack_fd, journal_fd, digests, crcs, o.ep, source_tag);
}

}  // namespace

Result<BuildResult> BuildPack(const ExpertSet& ex, const BuildOptions& o) {
  const auto t0 = Clock::now();
  if (o.out_path.empty()) return Error("BuildPack: no output path");
  // NaN fails both comparisons and passed `< 0`; converting it (or a margin
  // past 2^34 GiB) to bytes is undefined.
  if (!(o.safety_margin_gib >= 0 && o.safety_margin_gib <= kMaxSafetyMarginGib))
    return Error("--safety-margin-gib must be within 0..1048576 (GiB), got " + std::to_string(o.safety_margin_gib));
  Paths p{o.out_path, PartialPathFor(o.out_path), CheckpointPathFor(o.out_path), JournalPathFor(o.out_path),
          DigestsPathFor(o.out_path), LockPathFor(o.out_path)};
  K3_ASSIGN_OR_RETURN(PackLayout layout, LayoutOf(ex));
  K3_ASSIGN_OR_RETURN(LockFile lock, LockPack(p.out));  // makes the pack's directory
  if (o.ep) K3_RETURN_IF_ERROR(ep::CheckRank(*o.ep, ex.num_experts));
  const ep::ExpertRange written = WrittenExperts(ex.num_experts, o.ep);
  K3_ASSIGN_OR_RETURN(std::string fingerprint, InputFingerprint(ex, layout, o.ep));

  BuildResult result;
  result.pack_path = p.out;
  result.digests_path = p.digests;
  result.pack_bytes = layout.final_size();
  result.index_count = layout.index_count();
  result.index_sha256 = layout.IndexSha256();
  auto seconds_since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };

  K3_ASSIGN_OR_RETURN(const bool finished, CheckExistingPack(p, fingerprint, o));
  if (finished) {
    result.resumed_objects = layout.object_count();
    result.seconds = seconds_since(t0);
    return result;
  }
  K3_ASSIGN_OR_RETURN(std::vector<UniqueFd> src, OpenSources(ex));
  K3_ASSIGN_OR_RETURN(std::vector<FileStamp> stamps, StampShards(src, ex.shard_paths));
  // A forced rebuild starts over: a partial file without a checkpoint (no
  // rebuild under way; an older k3pack's leftover) is discarded as
  // --restart discards it, not a refusal that named --restart while
  // --restart alone repairs the finished pack and keeps it.
  const bool stray_partial = o.replace_existing && PathExists(p.partial) && !PathExists(p.checkpoint);
  if (o.restart || stray_partial) K3_RETURN_IF_ERROR(DiscardPartialBuild(p, o));
  Checkpoint ckpt;
  ckpt.fingerprint = fingerprint;
  ckpt.pack_size = layout.final_size();
  ckpt.index_count = layout.index_count();
  ckpt.index_sha256 = result.index_sha256;
  ckpt.objects_total = layout.object_count();
  K3_ASSIGN_OR_RETURN(const bool resume, TakeCheckpoint(p, &ckpt));
  K3_RETURN_IF_ERROR(CheckSpace(p, ex, layout, src, ckpt, resume, written, o));
  if (o.started) o.started();

  std::vector<Digest> digests(layout.index_count());
  std::vector<uint32_t> crcs(layout.index_count());
  UniqueFd pack_fd, journal_fd;
  if (resume) {
    K3_RETURN_IF_ERROR(ReopenPartial(p, layout, written, o, &ckpt, &pack_fd, &journal_fd, &digests, &crcs, &result));
  } else {
    StartFresh(digests, crcs, &ckpt);
  }
  // Checkpoint first: a partial file never exists without one. Its space is
  // reserved now, while there is room (CheckpointFile).
  K3_ASSIGN_OR_RETURN(CheckpointFile ckpt_file, CheckpointFile::Create(p.checkpoint, ckpt, nullptr));
  if (!resume) K3_RETURN_IF_ERROR(CreateFresh(p, layout, &pack_fd, &journal_fd));
  if (o.ep && !resume && !SupportsHoles(pack_fd.get(), layout)) {
    // ftruncate extended the file with zeros the filesystem stores: correct
    // bytes, but no disk saved.
    Log(o, "the filesystem of " + p.partial + " does not support sparse files: the objects of the other ranks are " +
        "written as zeros (the rank pack takes the full pack's disk space)");
  }
  // The shards' whole-file digests are computed beside the copy: its reads
  // and these move through the same files, and the page cache serves
  // whichever comes second.
  std::optional<ParallelSha256> hasher;
  if (o.hash_sources) hasher.emplace(ex.shard_paths, std::max(1, std::min(4, o.threads > 0 ? o.threads : 4)));
  K3_RETURN_IF_ERROR(RunCopy(ex, layout, o, p, ckpt, pack_fd.get(), journal_fd.get(), src, &digests, &crcs,
                             &ckpt_file, &result));
  if (hasher) K3_RETURN_IF_ERROR(FinishSourceHashes(*hasher, ex, o, &result));
  const auto f0 = Clock::now();
  K3_RETURN_IF_ERROR(Publish(ex, o, p, layout, stamps, pack_fd.get(), journal_fd.get(), digests, crcs));
  result.phases.finalize = seconds_since(f0);
  result.seconds = seconds_since(t0);
  (void)lock;
  return result;
}

}  // namespace k3pack::pack
