// Helpers of the pack builder: the pack layout of an ExpertSet, the input
// fingerprint a checkpoint is tied to, the lock file, free-space probing and
// the test seams read from the environment.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "k3pack/pack.h"
#include "pack/format.h"
#include "pack/sidecars.h"
#include "util/file.h"

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

// An exclusive flock on `<pack>.lock`, held while the object lives.
class LockFile {
 public:
  static Result<LockFile> Acquire(const std::string& path);
  LockFile(LockFile&&) = default;
  LockFile& operator=(LockFile&&) = default;

 private:
  LockFile() = default;
  UniqueFd fd_;
};

// Free bytes for an unprivileged writer in `dir` (statvfs f_bavail), or the
// K3PACK_FAKE_FREE_BYTES test override; UINT64_MAX (no limit to check) on a
// filesystem that reports no size (0 blocks: ramfs).
Result<uint64_t> AvailableBytes(const std::string& dir);

// Unsigned integer from the environment (nullopt when unset or malformed).
std::optional<uint64_t> EnvU64(const char* name);

}  // namespace k3pack::pack
