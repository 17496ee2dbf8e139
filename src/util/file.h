// Small POSIX file helpers: owned descriptors, full preads, read-only memory
// maps with shared lifetime, and the temp-file + fsync + rename writer that
// every k3pack output goes through.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "k3pack/error.h"

namespace k3pack {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd();
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { int f = fd_; fd_ = -1; return f; }

 private:
  int fd_ = -1;
};

Result<UniqueFd> OpenReadOnly(const std::string& path, int extra_flags = 0);

// One file of a set open at a time (read-only), reopened when asked for
// another: readers that go through many shards in order (verify, the
// payload samples) hold one descriptor, not one per shard, so a model of
// many shards fits a small `ulimit -n`.
class OneOpenFile {
 public:
  // The descriptor of file `index` (at `path`), opening it if another is open.
  Result<int> Get(uint32_t index, const std::string& path);

 private:
  UniqueFd fd_;
  uint32_t index_ = 0;
};

// Mode for every file k3pack creates: the umask decides what is taken away,
// as it does for cp and for Python's open() (SGLang's writer), so a group
// that shares a model directory under umask 002 can manage the outputs.
inline constexpr mode_t kNewFileMode = 0666;
Result<uint64_t> FileSize(const std::string& path);
bool PathExists(const std::string& path);

// For a path written with a trailing '/' whose bare form is an existing file
// (not a directory), the bare path: the kernel answers ENOTDIR and a reader
// would say the path does not exist while the file is right there. Else "".
std::string FileNamedWithSlash(const std::string& path);
// The one wording of that case, for every reader's message: "ends in '/', so
// it names a directory, but BARE is WHAT".
std::string EndsInSlashButNames(const std::string& bare, const std::string& what = "a file");

// What tells a file changed since it was looked at: which file it is
// (device, inode), its size and its modification time.
struct FileStamp {
  dev_t dev = 0;
  ino_t ino = 0;
  off_t size = 0;
  int64_t mtime_ns = 0;
};
FileStamp StampOf(const struct stat& st);
Result<FileStamp> StampFile(const std::string& path);
// How the file at `path` differs from `then`, for a message ("another file
// was put in its place", "its size went from A to B bytes", "it is gone
// (...)", ...); empty when it is the same file, size and modification time.
std::string HowFileChanged(const std::string& path, const FileStamp& then);

// Reads until `n` bytes or EOF; returns the count read (short only at EOF).
Result<size_t> PreadFull(int fd, void* buf, size_t n, uint64_t offset);
// Writes all `n` bytes at `offset` or fails.
Status PwriteFull(int fd, const void* buf, size_t n, uint64_t offset);

// A byte range of a file that is data or a hole.
struct Segment {
  uint64_t offset = 0;  // absolute in the file
  uint64_t length = 0;
  bool hole = false;
};

// Data/hole segments covering [offset, offset+length) of `fd` (holes only
// where the filesystem reports them through SEEK_DATA/SEEK_HOLE; everything
// is data otherwise). Readers use it to skip holes: their bytes are zeros.
std::vector<Segment> MapRange(int fd, uint64_t offset, uint64_t length);

Status FsyncPath(const std::string& path);
Status FsyncParentDir(const std::string& path);

// The one temp-file + fsync + rename writer behind every k3pack output:
// bytes go to a temporary file of this writer's own (an unnamed O_TMPFILE
// inode in the target's directory, or `<path>.<pid>.<n>.tmp` where the
// filesystem has none); Commit() fsyncs it, renames it onto `path` and
// fsyncs the directory, so readers see either the old file or the new one.
// Two writers of the same path (two `manifest` runs, two stores on one
// stats file) each publish a whole file, the last rename winning; before,
// they shared `<path>.tmp`: one truncated the other's bytes, the first
// rename published a file the second was still writing into, and the
// second failed. Dropped without Commit() (an error path, or a kill -9 of
// the unnamed case) nothing is left behind.
// Every error names `path`, the file the user asked for; the temporary name
// appears only in the hint line.
class AtomicFile {
 public:
  static Result<AtomicFile> Create(const std::string& path);
  AtomicFile(AtomicFile&& o) noexcept = default;
  AtomicFile& operator=(AtomicFile&&) noexcept = default;
  ~AtomicFile();

  int fd() const { return fd_.get(); }
  const std::string& path() const { return path_; }
  Status Write(const void* buf, size_t n, uint64_t offset);  // PwriteFull, error names path()
  // "cannot write <path>: <what>" with the hint; for callers' own failures.
  Error Fail(const Error& cause) const;
  Status Commit();

 private:
  AtomicFile() = default;
  // Takes the flock that marks the temporary as a live writer's.
  AtomicFile&& MarkLive();
  std::string path_, tmp_;  // tmp_: the temporary's name; empty while it has none (O_TMPFILE)
  UniqueFd fd_;
  bool committed_ = false;
};

// Removes `<path>.<pid>.<n>.tmp` files (AtomicFile's named temporaries of
// `path`) whose writer is gone: what a kill between naming the temporary and
// renaming it left. Gone: no process of that pid here (kill(pid, 0) fails
// with ESRCH), and no flock on the file (a live writer holds one, also from
// another PID namespace). Returns how many were removed. AtomicFile::Create
// calls it.
size_t RemoveStaleTempFiles(const std::string& path);
// The longest file name Linux filesystems take (NAME_MAX): AtomicFile cuts
// its temporaries' names to it, and writers of fixed side-file names check
// theirs against it.
inline constexpr size_t kFileNameMax = 255;
// Whether `file_name` is one of AtomicFile's named temporaries of a file
// named `base_name` in the same directory (`<base_name>.<pid>.<n>.tmp`, with
// `base_name` cut short where the whole would pass the 255-byte name limit).
bool IsAtomicTempNameOf(const std::string& file_name, const std::string& base_name);
// Whether `dir` holds the marker file `name` of an unfinished writer (synth,
// repair, a dump), or only the named temporary a kill between naming it and
// renaming it left: the directory was being written either way.
bool HoldsMarker(const std::string& dir, const std::string& name);
// The text of the marker `name` in `dir`, or where only its named temporary
// is there (a kill between naming and renaming it: its content is whole,
// written before the name was given), the temporary's; nullopt when neither
// can be read.
std::optional<std::string> ReadMarker(const std::string& dir, const std::string& name);

// AtomicFile for a whole string.
Status WriteFileAtomic(const std::string& path, std::string_view content);
Result<std::string> ReadFileToString(const std::string& path);
// The first `n` bytes of a file (fewer when it is shorter): what a check of a
// file's kind needs, without reading a file of any size whole.
Result<std::string> ReadFileHead(const std::string& path, size_t n);
// Removes `path`; one that is not there is fine.
Status RemoveIfExists(const std::string& path);
// The names of the regular files in `dir`, sorted by bytes (sorted(Path) in
// one directory): links are followed, and one that cannot be (broken, a
// loop) is skipped. A listing that fails, at its start or mid-way, is an
// error `cannot list {what} {dir}: ...`, never a shorter list.
Result<std::vector<std::string>> RegularFileNames(const std::string& dir, std::string_view what);

// A read-only, shared mapping of a whole file. Views handed out from it keep
// it alive through shared_ptr, so a tensor view never outlives its bytes.
class MappedFile {
 public:
  // copy_on_write: map private and writable (MAP_PRIVATE | MAP_NORESERVE),
  // for views handed to code that may write into them (torch ignores
  // read-only flags): a write then lands in a private page (the file never
  // changes) instead of faulting on a read-only one. It costs nothing until
  // written. Falls back to the read-only mapping where the kernel refuses.
  static Result<std::shared_ptr<const MappedFile>> Open(const std::string& path, bool copy_on_write = false);
  // Maps `path` but reports it as `label` (path()): for a stand-in file whose
  // own name means nothing to the user (doctor's copy of a cut-off header).
  static Result<std::shared_ptr<const MappedFile>> OpenLabelled(const std::string& path, std::string label);
  // An in-memory image labelled `label` (fuzzers, tests); owns the bytes.
  static std::shared_ptr<const MappedFile> FromBytes(std::string label, std::string bytes);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const { return size_; }
  const uint8_t* data() const { return data_; }
  std::span<const uint8_t> bytes() const { return {data_, static_cast<size_t>(size_)}; }

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  bool mapped_ = false;
  std::string owned_;
};

// Absolute, normalized path (like Python's Path.resolve(): symlinks followed).
Result<std::string> ResolvePath(const std::string& path);
// ResolvePath, or `path` as given when it cannot be resolved (for messages and reports).
std::string ResolvedPathOrGiven(const std::string& path);

// Drops this process's mapping of the whole pages inside `view` (a range of
// a read-only file mapping): the page cache keeps the bytes and they fault
// back in on access, but resident memory no longer grows with every range
// read. Inward rounding: never drops a page that also holds bytes outside
// `view`. Best effort.
void ReleaseMappedPages(std::span<const uint8_t> view);

}  // namespace k3pack
