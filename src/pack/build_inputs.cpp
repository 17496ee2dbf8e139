#include "pack/build_inputs.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <limits>

#include "util/file.h"
#include "util/sha256.h"

namespace k3pack::pack {

Result<PackLayout> LayoutOf(const ExpertSet& ex) {
  std::vector<LayerRoleBytes> v;
  std::vector<std::array<std::string, 3>> names;
  for (size_t i = 0; i < ex.layers.size(); ++i) {
    const auto& row = ex.by_layer[i];
    v.push_back({ex.layers[i], {row[0].expert_bytes, row[1].expert_bytes, row[2].expert_bytes}});
    names.push_back({row[0].tensor.name, row[1].tensor.name, row[2].tensor.name});
  }
  return PackLayout::Make(std::move(v), ex.num_experts, std::move(names));
}

ep::ExpertRange WrittenExperts(uint32_t num_experts, const std::optional<ep::Rank>& ep) {
  return ep ? ep::OwnedExperts(*ep, num_experts) : ep::ExpertRange{0, num_experts};
}

Result<std::string> InputFingerprint(const ExpertSet& ex, const PackLayout& layout, const std::optional<ep::Rank>& ep) {
  Sha256 h;
  h.Update("k3pack-pack-inputs-v1\n");
  // Absent for a full pack, so full packs' fingerprints are unchanged.
  if (ep) h.Update("ep " + std::to_string(ep->size) + " " + std::to_string(ep->rank) + "\n");
  h.Update("index_sha256 " + layout.IndexSha256() + "\nsize " + std::to_string(layout.final_size()) + "\n");
  for (size_t i = 0; i < ex.shard_paths.size(); ++i) {
    struct stat st;
    if (::stat(ex.shard_paths[i].c_str(), &st) != 0) {
      return Error::FromErrno("cannot stat " + ex.shard_paths[i], errno);
    }
    const std::string& p = ex.shard_paths[i];
    std::string base = p.substr(p.find_last_of('/') + 1);
    const FileStamp stamp = StampOf(st);
    h.Update("shard " + std::to_string(i) + " " + base + " " + std::to_string(stamp.size) + " " +
             std::to_string(stamp.mtime_ns) + "\n");
  }
  for (const auto& row : ex.by_layer) {
    for (const auto& t : row) {
      h.Update("tensor " + t.tensor.name + " " + std::to_string(t.tensor.dtype_id) + " " +
               std::to_string(t.tensor.shard_index) + " " + std::to_string(t.tensor.data_offset) + " " +
               std::to_string(t.tensor.nbytes) + "\n");
    }
  }
  return h.HexDigest();
}

Result<uint32_t> SourceTag(const ExpertSet& ex) {
  constexpr uint64_t kSample = 4096;
  Sha256 h;
  h.Update("k3pack-source-tag-v1\n");
  std::vector<UniqueFd> fds(ex.shard_paths.size());
  std::vector<uint8_t> buf(kSample);
  for (const auto& row : ex.by_layer) {
    for (const auto& t : row) {
      const SourceTensor& s = t.tensor;
      if (s.shard_index >= fds.size()) return Error("SourceTag: tensor " + s.name + " names no shard");
      UniqueFd& fd = fds[s.shard_index];
      if (fd.get() < 0) {
        K3_ASSIGN_OR_RETURN(fd, OpenReadOnly(ex.shard_paths[s.shard_index]));
      }
      const uint64_t n = std::min(kSample, s.nbytes);
      h.Update(s.name + "\n");
      for (uint64_t at : {s.data_offset, s.data_offset + s.nbytes - n}) {
        K3_ASSIGN_OR_RETURN(size_t got, PreadFull(fd.get(), buf.data(), n, at));
        if (got != n) return Error("short read of " + ex.shard_paths[s.shard_index] + " (tensor " + s.name + ")");
        h.Update(buf.data(), n);
      }
    }
  }
  const std::string hex = h.HexDigest();
  const auto tag = static_cast<uint32_t>(std::stoul(hex.substr(0, 8), nullptr, 16));
  return tag == 0 ? 1u : tag;
}

Result<std::vector<FileStamp>> StampShards(const std::vector<UniqueFd>& fds, const std::vector<std::string>& paths) {
  std::vector<FileStamp> out;
  for (size_t i = 0; i < fds.size(); ++i) {
    struct stat st;
    if (::fstat(fds[i].get(), &st) != 0) return Error::FromErrno("cannot stat " + paths[i], errno);
    out.push_back(StampOf(st));
  }
  return out;
}

Status CheckShardsUnchanged(const std::vector<std::string>& paths, const std::vector<FileStamp>& stamps,
                            const std::string& pack_path) {
  for (size_t i = 0; i < paths.size() && i < stamps.size(); ++i) {
    const std::string what = HowFileChanged(paths[i], stamps[i]);
    if (what.empty()) continue;
    return Error("source shard " + paths[i] + " changed while the Expert Pack " + pack_path + " was built from it: " +
                 what + "; the pack may mix its old and new bytes, so it was not published")
        .WithHint("once the shard is final, rerun the same command with --restart (the partial build was made from "
                  "the shard as it was)");
  }
  return Status::OK();
}

std::string BuildInProgressHint(const std::string& pack_path) {
  const LockHolder holder = LockHolderOf(LockPathFor(pack_path));
  if (holder.pid == 0) return "";
  return "a build of " + pack_path + " is in progress: " + holder.Text() + " holds its lock; rerun when it has finished";
}

Result<LockFile> LockPack(const std::string& pack_path) {
  // The lock file lives beside the pack: a writer that goes on makes the
  // directory the pack will be in (a failure shows as the lock file's).
  const std::string dir = std::filesystem::path(pack_path).parent_path().string();
  std::error_code ec;
  if (!dir.empty()) std::filesystem::create_directories(dir, ec);
  return LockFile::Acquire(LockPathFor(pack_path), "building or repairing the Expert Pack " + pack_path);
}

Result<std::optional<LockFile>> LockPackIfLockFileExists(const std::string& pack_path) {
  if (!PathExists(LockPathFor(pack_path))) return std::optional<LockFile>();
  K3_ASSIGN_OR_RETURN(LockFile lock, LockPack(pack_path));
  return std::optional<LockFile>(std::move(lock));
}

Result<LockFile> DecideUnderPackLock(const std::string& pack_path, const std::function<Status()>& decide) {
  K3_ASSIGN_OR_RETURN(std::optional<LockFile> held, LockPackIfLockFileExists(pack_path));
  if (!held) {
    K3_RETURN_IF_ERROR(decide());
    K3_ASSIGN_OR_RETURN(LockFile taken, LockPack(pack_path));
    held = std::move(taken);
  }
  K3_RETURN_IF_ERROR(decide());
  return std::move(*held);
}

Error WithFreeSpaceHint(Error e, const std::string& path) {
  if (e.sys_errno() != ENOSPC && e.sys_errno() != EDQUOT) return e;
  return e.WithHint("free space on the filesystem of " + path + " and rerun the same command; what is done is kept");
}

Status WriteFileAt(int fd, const std::string& path, const void* buf, size_t n, uint64_t offset) {
  const auto* p = static_cast<const uint8_t*>(buf);
  for (size_t done = 0; done < n;) {
    const ssize_t r = ::pwrite(fd, p + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      // A zero-byte write of a non-zero count is a full disk too.
      const int err = r < 0 ? errno : ENOSPC;
      return WithFreeSpaceHint(
          Error::FromErrno("cannot write " + path + " at offset " + std::to_string(offset + done), err), path);
    }
    done += static_cast<size_t>(r);
  }
  return Status::OK();
}

std::optional<uint64_t> EnvU64(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  char* end = nullptr;
  unsigned long long x = std::strtoull(v, &end, 10);
  if (end == v || *end != '\0') return std::nullopt;
  return static_cast<uint64_t>(x);
}

Result<uint64_t> AvailableBytes(const std::string& dir) {
  if (auto fake = EnvU64("K3PACK_FAKE_FREE_BYTES")) return *fake;
  struct statvfs vfs;
  if (::statvfs(dir.c_str(), &vfs) != 0) return Error::FromErrno("statvfs failed for " + dir, errno);
  // A filesystem that reports no size at all (ramfs, some FUSE ones: 0
  // blocks in all) has no free-space figure to check against; taking its 0
  // free blocks at face value refused every build there ("available=0").
  if (vfs.f_blocks == 0) return std::numeric_limits<uint64_t>::max();
  return static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
}

}  // namespace k3pack::pack
