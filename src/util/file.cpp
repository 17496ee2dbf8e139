#include "util/file.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace k3pack {

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}

Result<UniqueFd> OpenReadOnly(const std::string& path, int extra_flags) {
  // O_NONBLOCK for the open only: opening a FIFO for reading waits for a
  // writer, so a named pipe where a shard, config, manifest or trace was
  // expected hung the command for good. Every reader here reads a file by
  // offset or size, which a pipe has not: it is refused by name.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | extra_flags);
  if (fd < 0) return Error::FromErrno("cannot open " + path, errno);
  UniqueFd owned(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) return Error::FromErrno("cannot stat " + path, errno);
  if (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)) {
    return Error("cannot open " + path + ": it is a " + (S_ISFIFO(st.st_mode) ? "FIFO (named pipe)" : "socket") +
                     ", not a regular file (k3pack reads its inputs by offset)")
        .WithHint("pass the file itself, not a pipe (copy a streamed input to a file first)");
  }
  if ((extra_flags & O_NONBLOCK) == 0) {
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0)
      return Error::FromErrno("cannot open " + path + ": fcntl(F_SETFL)", errno);
  }
  return owned;
}

Result<int> OneOpenFile::Get(uint32_t index, const std::string& path) {
  if (!fd_.valid() || index_ != index) {
    fd_ = UniqueFd();  // closed before the next is opened: one descriptor at most
    K3_ASSIGN_OR_RETURN(fd_, OpenReadOnly(path));
    index_ = index;
  }
  return fd_.get();
}

Result<uint64_t> FileSize(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return Error::FromErrno("cannot stat " + path, errno);
  return static_cast<uint64_t>(st.st_size);
}

bool PathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string FileNamedWithSlash(const std::string& path) {
  if (path.size() < 2 || path.back() != '/') return "";
  std::string bare = path;
  while (bare.size() > 1 && bare.back() == '/') bare.pop_back();
  struct stat st;
  if (::stat(bare.c_str(), &st) != 0 || S_ISDIR(st.st_mode)) return "";
  return bare;
}

std::string EndsInSlashButNames(const std::string& bare, const std::string& what) {
  return "ends in '/', so it names a directory, but " + bare + " is " + what;
}

FileStamp StampOf(const struct stat& st) {
  return {st.st_dev, st.st_ino, st.st_size, static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

Result<FileStamp> StampFile(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return Error::FromErrno("cannot stat " + path, errno);
  return StampOf(st);
}

std::string HowFileChanged(const std::string& path, const FileStamp& then) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return "it is gone (" + std::string(std::strerror(errno)) + ")";
  const FileStamp now = StampOf(st);
  if (now.dev != then.dev || now.ino != then.ino) return "another file was put in its place";
  if (now.size != then.size) {
    return "its size went from " + std::to_string(then.size) + " to " + std::to_string(now.size) + " bytes";
  }
  if (now.mtime_ns != then.mtime_ns) return "it was written to (its modification time changed)";
  return "";
}

Result<size_t> PreadFull(int fd, void* buf, size_t n, uint64_t offset) {
  size_t done = 0;
  auto* p = static_cast<uint8_t*>(buf);
  while (done < n) {
    ssize_t r = ::pread(fd, p + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      return Error::FromErrno("read failed at offset " + std::to_string(offset + done), errno);
    }
    if (r == 0) break;
    done += static_cast<size_t>(r);
  }
  return done;
}

Status PwriteFull(int fd, const void* buf, size_t n, uint64_t offset) {
  size_t done = 0;
  auto* p = static_cast<const uint8_t*>(buf);
  while (done < n) {
    ssize_t r = ::pwrite(fd, p + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      return Error::FromErrno("write failed at offset " + std::to_string(offset + done), errno);
    }
    // No error and no progress: retrying would spin forever.
    if (r == 0) return Error::FromErrno("write failed at offset " + std::to_string(offset + done) + ": wrote nothing", EIO);
    done += static_cast<size_t>(r);
  }
  return Status::OK();
}

Status FsyncPath(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Error::FromErrno("cannot open " + path + " for fsync", errno);
  UniqueFd guard(fd);
  if (::fsync(fd) != 0) return Error::FromErrno("fsync failed for " + path, errno);
  return Status::OK();
}

Status FsyncParentDir(const std::string& path) {
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (parent.empty()) parent = ".";
  return FsyncPath(parent.string());
}

namespace {

const char* const kAtomicHint = "written to a temporary file beside it, renamed into place when complete";

// A name no other writer uses: this process's id and a per-process count.
// Where the output's own name leaves no room for that suffix (a legal name
// of 240 bytes), the name is cut to fit, so any name the filesystem takes
// can be written atomically.
std::string UniqueTempName(const std::string& path) {
  static std::atomic<uint64_t> next{0};
  const std::string suffix = "." + std::to_string(::getpid()) + "." + std::to_string(next.fetch_add(1)) + ".tmp";
  const size_t slash = path.rfind('/');
  const size_t name_start = slash == std::string::npos ? 0 : slash + 1;
  const size_t name_bytes = path.size() - name_start;
  if (name_bytes + suffix.size() <= kFileNameMax) return path + suffix;
  return path.substr(0, name_start + (kFileNameMax - suffix.size())) + suffix;
}

// The pid in `name` when it is `<base>.<pid>.<n>.tmp` (UniqueTempName's
// shape for `base`, with `base` cut where the whole name would pass
// NAME_MAX), else 0.
pid_t TempNamePid(const std::string& name, const std::string& base) {
  if (!name.ends_with(".tmp")) return 0;
  const std::string head = name.substr(0, name.size() - 4);  // "<stem>.<pid>.<n>"
  const size_t n_dot = head.rfind('.');
  if (n_dot == std::string::npos || n_dot == 0) return 0;
  const size_t pid_dot = head.rfind('.', n_dot - 1);
  if (pid_dot == std::string::npos) return 0;
  const std::string pid = head.substr(pid_dot + 1, n_dot - pid_dot - 1), count = head.substr(n_dot + 1);
  auto digits = [](const std::string& x) { return !x.empty() && x.find_first_not_of("0123456789") == std::string::npos; };
  if (!digits(pid) || !digits(count) || pid.size() > 9) return 0;
  const std::string stem = head.substr(0, pid_dot);
  const bool whole = stem == base;
  const bool cut = name.size() == kFileNameMax && !stem.empty() && stem.size() < base.size() &&
                   base.compare(0, stem.size(), stem) == 0;
  if (!whole && !cut) return 0;
  return static_cast<pid_t>(std::stol(pid));
}

}  // namespace

bool IsAtomicTempNameOf(const std::string& file_name, const std::string& base_name) {
  return TempNamePid(file_name, base_name) > 0;
}

Result<std::vector<std::string>> RegularFileNames(const std::string& dir, std::string_view what) {
  namespace fs = std::filesystem;
  std::vector<std::string> names;
  std::error_code ec;
  // The range-for form advances with the throwing operator++.
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code sec;
    if (it->is_regular_file(sec)) names.push_back(it->path().filename().string());
  }
  if (ec) return Error::FromErrno("cannot list " + std::string(what) + " " + dir, ec.value());
  std::sort(names.begin(), names.end());
  return names;
}

bool HoldsMarker(const std::string& dir, const std::string& name) {
  std::error_code ec;
  if (std::filesystem::exists(std::filesystem::path(dir) / name, ec)) return true;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (IsAtomicTempNameOf(e.path().filename().string(), name)) return true;
  }
  return false;
}

std::optional<std::string> ReadMarker(const std::string& dir, const std::string& name) {
  const std::filesystem::path d(dir);
  if (auto text = ReadFileToString((d / name).string()); text.ok()) return *text;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(d, ec)) {
    if (!IsAtomicTempNameOf(e.path().filename().string(), name)) continue;
    if (auto text = ReadFileToString(e.path().string()); text.ok()) return *text;
  }
  return std::nullopt;
}

namespace {

// A writer's temporary holds an flock from its creation to its writer's
// exit, which the kernel drops however the writer ends. The pid in the name
// alone cannot tell: a writer in another PID namespace sharing the directory
// (a container) has a pid this process cannot see.
bool TempIsAbandoned(const std::string& path, pid_t pid) {
  if (pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) return false;
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
  if (!fd.valid()) return false;
  // (A named temporary is locked before it has its name, except where the
  // filesystem has no unnamed ones: there a writer is exposed between its
  // open and its flock, a matter of microseconds.)
  return !(::flock(fd.get(), LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK);
}

}  // namespace

size_t RemoveStaleTempFiles(const std::string& path) {
  const std::filesystem::path p(path);
  std::string dir = p.parent_path().string();
  if (dir.empty()) dir = ".";
  const std::string base = p.filename().string();
  if (base.empty()) return 0;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return 0;
  size_t removed = 0;
  std::vector<std::pair<std::string, pid_t>> named;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (const pid_t pid = TempNamePid(name, base); pid > 0) named.emplace_back(name, pid);
  }
  ::closedir(d);
  for (const auto& [name, pid] : named) {
    const std::string full = (std::filesystem::path(dir) / name).string();
    // Only a writer that is gone: a live one may be about to rename it.
    if (TempIsAbandoned(full, pid) && ::unlink(full.c_str()) == 0) ++removed;
  }
  return removed;
}

Result<AtomicFile> AtomicFile::Create(const std::string& path) {
  // A writer killed between naming its temporary and the rename left it
  // under its own pid, a name no later writer uses: this output's next
  // writer is the one that can tell it is abandoned.
  RemoveStaleTempFiles(path);
  AtomicFile f;
  f.path_ = path;
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  f.fd_ = UniqueFd(::open(dir.c_str(), O_WRONLY | O_TMPFILE | O_CLOEXEC, kNewFileMode));
  if (f.fd_.valid()) return f.MarkLive();
  // Every writer makes the directories an output path names (as `mkdir -p`).
  std::error_code ec;
  // (Another writer may have made it meanwhile: then it is there to use.)
  if (errno == ENOENT && (std::filesystem::create_directories(dir, ec) || std::filesystem::is_directory(dir, ec))) {
    f.fd_ = UniqueFd(::open(dir.c_str(), O_WRONLY | O_TMPFILE | O_CLOEXEC, kNewFileMode));
    if (f.fd_.valid()) return f.MarkLive();
  }
  // Filesystems without unnamed temporaries refuse with one of these; any
  // other error (no directory, no permission) is the named file's too.
  if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL) {
    return Error::FromErrno("cannot write " + path, errno).WithHint(kAtomicHint);
  }
  f.tmp_ = UniqueTempName(path);
  f.fd_ = UniqueFd(::open(f.tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, kNewFileMode));
  if (!f.fd_.valid()) return Error::FromErrno("cannot write " + path, errno).WithHint(kAtomicHint);
  return f.MarkLive();
}

AtomicFile&& AtomicFile::MarkLive() {
  // Where flock is not supported the pid and the age still decide.
  (void)::flock(fd_.get(), LOCK_EX | LOCK_NB);
  return std::move(*this);
}

AtomicFile::~AtomicFile() {
  if (!committed_ && !tmp_.empty() && fd_.valid()) ::unlink(tmp_.c_str());
}

Error AtomicFile::Fail(const Error& cause) const {
  Error e = cause.WithContext("cannot write " + path_);
  // A full disk: the way out first (the temporary goes with the error, an
  // older file at `path_` stays), as the pack build's own hint says it.
  if (cause.sys_errno() == ENOSPC || cause.sys_errno() == EDQUOT) {
    e = e.WithHint("free space on the filesystem of " + path_ + " and rerun the same command");
  }
  return e.WithHint(kAtomicHint);
}

Status AtomicFile::Write(const void* buf, size_t n, uint64_t offset) {
  Status st = PwriteFull(fd_.get(), buf, n, offset);
  if (!st.ok()) return Fail(st.error());
  return Status::OK();
}

Status AtomicFile::Commit() {
  if (::fsync(fd_.get()) != 0) return Fail(Error::FromErrno("fsync failed", errno));
  if (tmp_.empty()) {
    // rename() needs a name: the unnamed file gets a unique one just before.
    const std::string name = UniqueTempName(path_);
    const std::string self = "/proc/self/fd/" + std::to_string(fd_.get());
    if (::linkat(AT_FDCWD, self.c_str(), AT_FDCWD, name.c_str(), AT_SYMLINK_FOLLOW) != 0) {
      return Fail(Error::FromErrno("cannot give the temporary file a name", errno));
    }
    tmp_ = name;
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) return Fail(Error::FromErrno("cannot move it into place", errno));
  committed_ = true;
  fd_ = UniqueFd();
  return FsyncParentDir(path_);
}

Status WriteFileAtomic(const std::string& path, std::string_view content) {
  K3_ASSIGN_OR_RETURN(AtomicFile f, AtomicFile::Create(path));
  K3_RETURN_IF_ERROR(f.Write(content.data(), content.size(), 0));
  return f.Commit();
}

Result<std::string> ReadFileToString(const std::string& path) {
  K3_ASSIGN_OR_RETURN(UniqueFd fd, OpenReadOnly(path));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Error::FromErrno("cannot stat " + path, errno);
  std::string out(static_cast<size_t>(st.st_size), '\0');
  auto got = PreadFull(fd.get(), out.data(), out.size(), 0);
  if (!got.ok()) return got.error().WithContext("cannot read " + path);
  out.resize(*got);
  return out;
}

Result<std::string> ReadFileHead(const std::string& path, size_t n) {
  K3_ASSIGN_OR_RETURN(UniqueFd fd, OpenReadOnly(path));
  std::string head(n, '\0');
  auto got = PreadFull(fd.get(), head.data(), head.size(), 0);
  if (!got.ok()) return got.error().WithContext("cannot read " + path);
  head.resize(*got);
  return head;
}

Status RemoveIfExists(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return Error::FromErrno("cannot remove " + path, errno);
  return Status::OK();
}

Result<std::shared_ptr<const MappedFile>> MappedFile::Open(const std::string& path, bool copy_on_write) {
  K3_ASSIGN_OR_RETURN(UniqueFd fd, OpenReadOnly(path));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Error::FromErrno("cannot stat " + path, errno);
  if (!S_ISREG(st.st_mode)) return Error(path + ": not a regular file");
  std::shared_ptr<MappedFile> m(new MappedFile());
  m->path_ = path;
  m->size_ = static_cast<uint64_t>(st.st_size);
  if (m->size_ > 0) {
    void* p = MAP_FAILED;
    if (copy_on_write) {
      p = ::mmap(nullptr, m->size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, fd.get(), 0);
    }
    if (p == MAP_FAILED) p = ::mmap(nullptr, m->size_, PROT_READ, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) return Error::FromErrno("cannot mmap " + path, errno);
    m->data_ = static_cast<const uint8_t*>(p);
    m->mapped_ = true;
  }
  return std::shared_ptr<const MappedFile>(std::move(m));
}

Result<std::shared_ptr<const MappedFile>> MappedFile::OpenLabelled(const std::string& path, std::string label) {
  auto m = Open(path);
  if (!m.ok()) return m.error();
  std::const_pointer_cast<MappedFile>(*m)->path_ = std::move(label);
  return m;
}

std::shared_ptr<const MappedFile> MappedFile::FromBytes(std::string label, std::string bytes) {
  std::shared_ptr<MappedFile> m(new MappedFile());
  m->path_ = std::move(label);
  m->owned_ = std::move(bytes);
  m->data_ = reinterpret_cast<const uint8_t*>(m->owned_.data());
  m->size_ = m->owned_.size();
  return m;
}

MappedFile::~MappedFile() {
  if (mapped_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

Result<std::string> ResolvePath(const std::string& path) {
  std::error_code ec;
  auto p = std::filesystem::weakly_canonical(std::filesystem::absolute(path, ec), ec);
  if (ec) return Error::FromErrno("cannot resolve " + path, ec.value());
  return p.string();
}

std::string ResolvedPathOrGiven(const std::string& path) {
  auto resolved = ResolvePath(path);
  return resolved.ok() ? *resolved : path;
}

std::vector<Segment> MapRange(int fd, uint64_t offset, uint64_t length) {
  std::vector<Segment> out;
  const uint64_t end = offset + length;
  uint64_t pos = offset;
  auto push = [&](uint64_t a, uint64_t b, bool hole) {
    if (b <= a) return;
    if (!out.empty() && out.back().hole == hole && out.back().offset + out.back().length == a) {
      out.back().length += b - a;
    } else {
      out.push_back({a, b - a, hole});
    }
  };
  while (pos < end) {
    off_t d = ::lseek(fd, static_cast<off_t>(pos), SEEK_DATA);
    if (d < 0) {
      if (errno == ENXIO) {
        push(pos, end, true);  // no data beyond pos (or pos past EOF: reads fail later)
      } else {
        push(pos, end, false);  // SEEK_DATA unsupported: treat as data
      }
      break;
    }
    auto data = static_cast<uint64_t>(d);
    if (data >= end) {
      push(pos, end, true);
      break;
    }
    push(pos, data, true);
    off_t h = ::lseek(fd, d, SEEK_HOLE);
    uint64_t hole = h < 0 ? end : static_cast<uint64_t>(h);
    if (hole > end) hole = end;
    if (hole <= data) hole = end;  // defensive: never loop forever
    push(data, hole, false);
    pos = hole;
  }
  return out;
}

void ReleaseMappedPages(std::span<const uint8_t> view) {
  static const uintptr_t mask = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE)) - 1;
  const auto b = (reinterpret_cast<uintptr_t>(view.data()) + mask) & ~mask;
  const auto e = (reinterpret_cast<uintptr_t>(view.data()) + view.size()) & ~mask;
  if (e > b) ::madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);
}

}  // namespace k3pack
