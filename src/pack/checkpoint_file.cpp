#include "pack/checkpoint_file.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "pack/build_inputs.h"
#include "util/file.h"

namespace k3pack::pack {
namespace {

Result<std::string> Padded(const std::string& path, const Checkpoint& c) {
  std::string text = EncodeCheckpoint(c);
  if (text.size() > kCheckpointFileBytes) {
    return Error("checkpoint for " + path + " does not fit its " + std::to_string(kCheckpointFileBytes) + " bytes",
                 ErrorKind::kRuntime);
  }
  text.resize(kCheckpointFileBytes - 1, ' ');
  text.push_back('\n');
  return text;
}

// Opens (creating) `path` and allocates its kCheckpointFileBytes.
Result<UniqueFd> OpenReserved(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, kNewFileMode);
  if (fd < 0) return Error::FromErrno("cannot open " + path, errno);
  UniqueFd out(fd);
  int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(kCheckpointFileBytes));
  if (rc != 0) return WithFreeSpaceHint(Error::FromErrno("cannot reserve space for " + path, rc), path);
  return out;
}

Status Charge(WriteBudget* budget, const std::string& path, size_t n) {
  if (!budget || !budget->limit) return Status::OK();
  if (budget->used.fetch_add(n) + n > *budget->limit) {
    return Error::FromErrno("cannot write " + path + ".tmp at offset 0", ENOSPC);
  }
  return Status::OK();
}

}  // namespace

std::string CheckpointSparePathFor(const std::string& p) { return p + ".spare"; }

Result<CheckpointFile> CheckpointFile::Create(const std::string& path, const Checkpoint& initial, WriteBudget* budget) {
  CheckpointFile f;
  f.path_ = path;
  f.spare_ = CheckpointSparePathFor(path);
  f.budget_ = budget;
  K3_ASSIGN_OR_RETURN(std::string text, Padded(path, initial));
  // At the start there is room (the free-space check comes next): write the
  // checkpoint at its full size, then the spare with the same content.
  K3_RETURN_IF_ERROR(WriteFileAtomic(path, text));
  K3_ASSIGN_OR_RETURN(f.current_, OpenReserved(path));
  if (::unlink(f.spare_.c_str()) != 0 && errno != ENOENT) {
    return Error::FromErrno("cannot remove " + f.spare_, errno);
  }
  K3_ASSIGN_OR_RETURN(f.spare_fd_, OpenReserved(f.spare_));
  K3_RETURN_IF_ERROR(WriteFileAt(f.spare_fd_.get(), f.spare_, text.data(), text.size(), 0));
  if (::fsync(f.spare_fd_.get()) != 0) return Error::FromErrno("fsync failed for " + f.spare_, errno);
  // Both hold the same checkpoint, so trying the exchange once is harmless.
  if (::renameat2(AT_FDCWD, f.spare_.c_str(), AT_FDCWD, path.c_str(), RENAME_EXCHANGE) == 0) {
    f.exchange_ = true;
    std::swap(f.current_, f.spare_fd_);
  } else {
    f.spare_fd_ = UniqueFd();
    ::unlink(f.spare_.c_str());
  }
  K3_RETURN_IF_ERROR(FsyncParentDir(path));
  return f;
}

Status CheckpointFile::Write(const Checkpoint& c) {
  K3_ASSIGN_OR_RETURN(std::string text, Padded(path_, c));
  if (!exchange_) return WriteNewFile(text);
  // In place: the spare's blocks were allocated when the build started.
  K3_RETURN_IF_ERROR(WriteFileAt(spare_fd_.get(), spare_, text.data(), text.size(), 0));
  if (::fdatasync(spare_fd_.get()) != 0) return Error::FromErrno("fsync failed for " + spare_, errno);
  if (::renameat2(AT_FDCWD, spare_.c_str(), AT_FDCWD, path_.c_str(), RENAME_EXCHANGE) != 0) {
    return Error::FromErrno("cannot exchange " + spare_ + " with " + path_, errno);
  }
  std::swap(current_, spare_fd_);
  return FsyncParentDir(path_);
}

Status CheckpointFile::WriteNewFile(const std::string& text) {
  K3_RETURN_IF_ERROR(Charge(budget_, path_, text.size()));
  return WriteFileAtomic(path_, text);
}

}  // namespace k3pack::pack
