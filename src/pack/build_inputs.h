// Helpers of the pack builder: the pack layout of an ExpertSet, the input
// fingerprint a checkpoint is tied to, the pack's lock, the shards' stamps,
// free-space probing and the test seams read from the environment.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "k3pack/pack.h"
#include "pack/format.h"
#include "pack/sidecars.h"
#include "util/file.h"
#include "util/lock_file.h"

namespace k3pack::pack {

using Digest = std::array<uint8_t, 32>;

struct PackPaths {
  std::string out, partial, checkpoint, journal, digests, lock;
};

class CheckpointFile;

// The copy phase (copy_engine.cpp): copies objects [base.objects_done, total)
// with options.threads workers, journaling digests and CRCs and
// checkpointing through `ckpt_file`. SIGINT/SIGTERM stop it with a final
// checkpoint and the error "interrupted; rerun the same command to resume
// from object N of T" (errno EINTR; InterruptExitCode gives 130/143).
Status RunCopy(const ExpertSet& ex, const PackLayout& layout, const BuildOptions& o, const PackPaths& p,
               const Checkpoint& base, int pack_fd, int journal_fd, const std::vector<UniqueFd>& src,
               std::vector<Digest>* digests, std::vector<uint32_t>* crcs, CheckpointFile* ckpt_file,
               BuildResult* result);

// The layout the writer builds from `experts`: their sizes, and in the index
// their tensors' own names (SGLang's writer keeps a GGUF's "blk.07").
Result<PackLayout> LayoutOf(const ExpertSet& experts);

// Hex SHA-256 over what determines the pack's bytes: the layout (index
// digest, size) and, per expert tensor, shard file name/size/mtime and the
// tensor's place. Any change makes a checkpoint unusable.
// A rank pack's rank is part of it, so a rank pack's checkpoint is never
// taken for a full pack's (or another rank's).
Result<std::string> InputFingerprint(const ExpertSet& experts, const PackLayout& layout,
                                     const std::optional<ep::Rank>& ep = std::nullopt);

// What tells the rank packs of one checkpoint from those of another with the
// same layout (a fine-tune, another seed): a rank pack holds only its own
// experts and its index is the layout's, so nothing else in it says which
// source it came from. A 32-bit tag of SHA-256 over the first and last 4 KiB
// of every routed expert tensor (experts 0 and E-1: read by every rank's
// build alike, a few KiB per tensor), the same for any copy of the same
// shards wherever it lives; never 0 (0 in a sidecar means "not recorded").
Result<uint32_t> SourceTag(const ExpertSet& experts);

// The experts whose objects a build writes: all of them, or those `ep` owns.
ep::ExpertRange WrittenExperts(uint32_t num_experts, const std::optional<ep::Rank>& ep);

// What tells each shard changed since the build opened it.
Result<std::vector<FileStamp>> StampShards(const std::vector<UniqueFd>& fds, const std::vector<std::string>& paths);
// An error naming the first shard whose path no longer shows `stamps` (the
// file at it was replaced, or its size or modification time changed).
Status CheckShardsUnchanged(const std::vector<std::string>& paths, const std::vector<FileStamp>& stamps,
                            const std::string& pack_path);

// "a build of P is in progress: pid N (...) holds its lock; rerun when it
// has finished" while a process holds `<pack>.lock`, else empty: the hint of
// a reader that found the pack missing or changing under it.
std::string BuildInProgressHint(const std::string& pack_path);

// The exclusive lock on `<pack>.lock` every writer of the pack takes (build,
// repair, merge, and the CLI from its first look at the outputs on).
Result<LockFile> LockPack(const std::string& pack_path);
// LockPack where `<pack>.lock` exists (every writer of the pack made it);
// none where it does not: nobody holds it, and a command refused before it
// writes leaves nothing beside the pack (the writer locks when it starts).
Result<std::optional<LockFile>> LockPackIfLockFileExists(const std::string& pack_path);
// Runs `decide` (a writer's look at its outputs: refuse, resume, replace...)
// under the pack's lock and returns the lock, which the caller holds to its
// last write. Where no writer was ever here (no lock file), the first
// decision is made without making one, so a refusal leaves nothing beside the
// user's path; going on takes the lock and decides again under it, since
// another writer may have started in between.
Result<LockFile> DecideUnderPackLock(const std::string& pack_path, const std::function<Status()>& decide);

// Free bytes for an unprivileged writer in `dir` (statvfs f_bavail), or the
// K3PACK_FAKE_FREE_BYTES test override; UINT64_MAX (no limit to check) on a
// filesystem that reports no size (0 blocks: ramfs).
Result<uint64_t> AvailableBytes(const std::string& dir);

// Writes all `n` bytes at `offset` of `fd`, the open file `path`. A failure
// names the file and the offset ("cannot write P at offset N: ..."), and a
// full disk or quota gives the hint the payload writes give; PwriteFull's
// bare "write failed at offset 0" named neither.
Status WriteFileAt(int fd, const std::string& path, const void* buf, size_t n, uint64_t offset);
// The hint of a build stopped by a full disk (ENOSPC, EDQUOT) outside the
// copy: free space and rerun; `e` unchanged for any other error.
Error WithFreeSpaceHint(Error e, const std::string& path);

// Unsigned integer from the environment (nullopt when unset or malformed).
std::optional<uint64_t> EnvU64(const char* name);

}  // namespace k3pack::pack
