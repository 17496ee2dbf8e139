#include "util/output_guard.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <thread>

#include "util/file.h"
#include "util/utf8.h"

namespace k3pack {

namespace fs = std::filesystem;

std::string KindOf(const fs::file_status& st) {
  switch (st.type()) {
    case fs::file_type::regular: return "a file";
    case fs::file_type::directory: return "a directory";
    case fs::file_type::symlink: return "a symbolic link";
    case fs::file_type::block: return "a block device";
    case fs::file_type::character: return "a character device";
    case fs::file_type::fifo: return "a FIFO (named pipe)";
    case fs::file_type::socket: return "a socket";
    default: return "not a regular file";
  }
}

namespace {

// A path as it resolves, for comparing paths that need not exist. Made
// absolute first: weakly_canonical of a relative path with no existing
// component stays relative, so `X` and `./X` (two spellings of one new file)
// compared unequal and `build --pack X --manifest ./X` wrote the whole pack
// before the manifest was refused. A path that cannot be resolved (a name too
// long) is compared lexically: on error weakly_canonical gives an empty path,
// which equalled every other that failed.
fs::path Resolved(const std::string& p) {
  std::error_code ec;
  const fs::path abs = fs::absolute(p, ec);
  if (ec) return fs::path(p).lexically_normal();
  fs::path r = fs::weakly_canonical(abs, ec);
  return ec ? abs.lexically_normal() : r;
}

// Where a link points, as a path from here: a relative target is relative to
// the link's directory, and "create ghost first" for out/lnk -> ghost would
// send the user to ./ghost.
std::string LinkTarget(const fs::path& link) {
  std::error_code ec;
  fs::path target = fs::read_symlink(link, ec);
  if (target.is_relative()) target = link.parent_path() / target;
  return target.lexically_normal().string();
}

bool SameFile(const std::string& a, const std::string& b) {
  std::error_code ec;
  if (fs::exists(a, ec) && fs::exists(b, ec)) return fs::equivalent(a, b, ec) && !ec;
  return Resolved(a) == Resolved(b);
}

Status RefuseDirectoryName(const OutputSpec& spec) {
  return spec.directory ? Status::OK() : RefuseFileOutputEndingInSlash(spec.option, spec.path);
}

}  // namespace

Status RefuseFileOutputEndingInSlash(const std::string& option, const std::string& path) {
  std::error_code ec;
  if (path.empty() || path.back() != '/' || fs::exists(path, ec)) return Status::OK();
  return Error(option + " " + path + " ends in '/', so it names a directory, not a file", ErrorKind::kFileExists)
      .WithHint("pass " + option + " a path for a regular file, such as " + path + "NAME");
}

Status CheckOutputKind(const OutputSpec& spec) {
  K3_RETURN_IF_ERROR(RefuseDirectoryName(spec));
  std::error_code ec;
  // A directory output may be a link to a directory (the files go into its
  // target); a file output is looked at itself, as the final rename replaces
  // the name, never a link's target.
  const fs::file_status st = spec.directory ? fs::status(spec.path, ec) : fs::symlink_status(spec.path, ec);
  if (!fs::exists(st)) return Status::OK();
  if (spec.directory) {
    if (fs::is_directory(st)) return Status::OK();
    return Error(spec.option + " " + spec.path + " is " + KindOf(st) + ", not a directory", ErrorKind::kFileExists)
        .WithHint("pass a new or empty directory as " + spec.option);
  }
  if (fs::is_symlink(st)) {
    // The final rename replaces the link, never its target: a dangling link
    // has nothing behind it to lose. A link to a directory, a device or a
    // shard is the same slip of the path as naming that itself, which was
    // refused while --force replaced the link with the output.
    const fs::file_status target = fs::status(spec.path, ec);
    if (!fs::exists(target)) return Status::OK();
    if (!fs::is_regular_file(target)) {
      return Error(spec.option + " " + spec.path + " is a symbolic link to " + KindOf(target) +
                       ", not to a file: k3pack never replaces one" +
                       (spec.force ? ", not even with " + spec.force_option : ""),
                   ErrorKind::kFileExists)
          .WithHint("pass " + spec.option + " a path for a regular file");
    }
  }
  if (fs::is_symlink(st) || fs::is_regular_file(st)) {
    const std::string other = spec.not_own_kind ? spec.not_own_kind() : std::string();
    if (other.empty()) return Status::OK();
    return Error("refusing to overwrite existing " + spec.path + " (" + spec.option + "): " + other +
                     "; k3pack replaces only a file of the kind it writes, not even with " + spec.force_option,
                 ErrorKind::kFileExists)
        .WithHint("pass another " + spec.option + " path; if that file should go, remove it yourself");
  }
  // Never replaced, not even with force: --force removed or renamed over a
  // device node (`--pack /dev/null --force` as root deleted /dev/null), a
  // named pipe (whose check first hung waiting for a writer) or an empty
  // directory.
  return Error(spec.option + " " + spec.path + " is " + KindOf(st) + ", not a file: k3pack never replaces one" +
                   (spec.force ? ", not even with " + spec.force_option : ""),
               ErrorKind::kFileExists)
      .WithHint("pass " + spec.option + " a path for a regular file");
}

Result<OutputAction> DecideOutput(const OutputSpec& spec) {
  K3_RETURN_IF_ERROR(RefuseDirectoryName(spec));
  std::error_code ec;
  const fs::file_status st = spec.directory ? fs::status(spec.path, ec) : fs::symlink_status(spec.path, ec);
  const bool exists = fs::exists(st);
  const bool empty_dir = exists && fs::is_directory(st) && fs::is_empty(spec.path, ec);
  // A checkpointed partial wins even over a finished-looking output: a build
  // killed between the final rename and its last steps must finish them.
  if (spec.has_partial) return OutputAction::kResume;
  if (!exists || (spec.directory && empty_dir)) return OutputAction::kWrite;
  K3_RETURN_IF_ERROR(CheckOutputKind(spec));
  // Before force and before the refusal's "pass --force": neither can
  // replace a file this user may not rename over. A finished output is
  // still reported as built: nothing is replaced.
  const Status replaceable = CheckReplaceable(spec);
  if (spec.force) return replaceable.ok() ? Result<OutputAction>(OutputAction::kReplace) : replaceable;
  if (!spec.directory && fs::is_symlink(st) && !fs::exists(fs::status(spec.path, ec))) {
    // The finished check read through the link and refused the pack as
    // "not a valid pack of these shards: No such file"; the output replaces
    // the link, it is never written through it (maybe onto another disk).
    const std::string target = LinkTarget(spec.path);
    return Error("refusing to overwrite existing " + spec.path + " (" + spec.option + "): it is a symbolic link to " +
                     target + ", which does not exist, and k3pack replaces a link with its output, never writes "
                     "through it",
                 ErrorKind::kFileExists)
        .WithHint("pass " + spec.option + " " + target + " to write there, or " + spec.force_option +
                  " to replace the link");
  }
  if (spec.is_finished) {
    K3_ASSIGN_OR_RETURN(bool finished, spec.is_finished());
    if (finished) return OutputAction::kAlreadyBuilt;
  }
  K3_RETURN_IF_ERROR(replaceable);
  return RefuseExisting(spec);
}

Status CheckReplaceable(const OutputSpec& spec) {
  if (spec.directory) return Status::OK();
  struct stat file {}, dir {};
  fs::path parent = fs::path(spec.path).parent_path();
  if (parent.empty()) parent = ".";
  if (::lstat(spec.path.c_str(), &file) != 0 || ::stat(parent.c_str(), &dir) != 0) return Status::OK();
  const uid_t me = ::geteuid();
  if ((dir.st_mode & S_ISVTX) == 0 || me == 0 || file.st_uid == me || dir.st_uid == me) return Status::OK();
  // The sentence says what EPERM would; the errno stays on the error (Python's PermissionError).
  return Error("refusing to overwrite existing " + spec.path + " (" + spec.option + "): it belongs to uid " +
                   std::to_string(file.st_uid) + " and " + parent.string() +
                   " has the sticky bit, so only the owner of the file or of the directory may replace it",
               ErrorKind::kOS, EPERM)
      .WithHint("pass another " + spec.option + " path, or ask the owner of " + spec.path + " to remove it");
}

Error RefuseExisting(const OutputSpec& spec) {
  std::string what = spec.directory ? "non-empty directory " : "existing ";
  return Error("refusing to overwrite " + what + spec.path + " (" + spec.option + ")" +
                   (spec.why_refused.empty() ? "" : ": " + spec.why_refused),
               ErrorKind::kFileExists)
      .WithHint("pass " + spec.force_option + " to replace it, or another " + spec.option + " path");
}

Status CheckOutputNotIn(const NamedPath& output, const NamedPath& dir, const std::string& why) {
  if (output.path.empty() || dir.path.empty()) return Status::OK();
  fs::path parent = fs::path(output.path).parent_path();
  if (parent.empty()) parent = ".";
  if (!SameFile(parent.string(), dir.path)) return Status::OK();
  return Error(output.option + " " + output.path + " is in " + dir.option + " " + dir.path + ": " + why,
               ErrorKind::kFileExists)
      .WithHint("pass " + output.option + " a path outside " + dir.path);
}

Status CheckOutputsAreNotInputs(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& inputs) {
  for (const NamedPath& out : outputs) {
    if (out.path.empty()) continue;
    for (const NamedPath& in : inputs) {
      if (in.path.empty() || !SameFile(out.path, in.path)) continue;
      return Error(out.option + " " + out.path + " is an input (" + in.option + "); writing it would destroy it",
                   ErrorKind::kFileExists)
          .WithHint("pass " + out.option + " a new path that is not one of the inputs");
    }
  }
  return Status::OK();
}

namespace {

// What the kernel refuses only when the output is created or renamed into
// place, which the writers do after their whole run (a trace generated, a
// sweep simulated, a pack reused): a path of PATH_MAX bytes or more, or a
// component past the 255-byte limit of a file name ("cannot move it into
// place: File name too long", the work lost). And `nox/../x` where nox does
// not exist: the kernel finds no x there, so the rule judged x absent, then the
// writer made nox (mkdir -p) and found x, blaming another process for it.
Status CheckPathShape(const std::string& option, const std::string& path) {
  // A newline in an output's name split the KEY=value and progress lines
  // that scripts read (`EXPERT_PACK_READY path=...`); no tool shows any
  // control character in a name usably.
  std::string shown, first;
  for (char c : path) {
    const auto b = static_cast<unsigned char>(c);
    if (b >= 0x20 && b != 0x7f) {
      shown += c;
      continue;
    }
    char esc[8];
    std::snprintf(esc, sizeof esc, "\\x%02x", b);
    shown += esc;
    if (first.empty()) first = esc;
  }
  if (!first.empty()) {
    return Error(option + " " + shown + ": the name holds a control character (" + first +
                 "), which would split the lines k3pack prints about it (`KEY=value` results, progress)")
        .WithHint("pass " + option + " a path without control characters (newlines, tabs, escapes)");
  }
  if (path.size() >= PATH_MAX) {
    return Error(option + " " + path + ": the path is " + std::to_string(path.size()) + " bytes, past the " +
                     std::to_string(PATH_MAX - 1) + "-byte limit of a path",
                 ErrorKind::kFileExists, ENAMETOOLONG)
        .WithHint("pass " + option + " a shorter path (a relative one, or from a directory nearer to it)");
  }
  fs::path prefix;
  for (const fs::path& part : fs::path(path)) {
    const std::string name = part.string();
    if (name.size() > kFileNameMax) {
      return Error(option + " " + path + ": its component " + name.substr(0, 32) + "... is " +
                       std::to_string(name.size()) + " bytes, past the " + std::to_string(kFileNameMax) +
                       "-byte limit of a file name",
                   ErrorKind::kFileExists, ENAMETOOLONG)
          .WithHint("give it a name of at most " + std::to_string(kFileNameMax) + " bytes");
    }
    std::error_code ec;
    if (name == ".." && !prefix.empty() && !fs::exists(fs::symlink_status(prefix, ec))) {
      return Error(option + " " + path + ": " + prefix.string() + " does not exist, so " + (prefix / "..").string() +
                       " names no directory",
                   ErrorKind::kFileNotFound, ENOENT)
          .WithHint("write the path without it: " + option + " " + fs::path(path).lexically_normal().string());
    }
    prefix /= part;
  }
  return Status::OK();
}

// `dir`, or where it does not exist the nearest directory above it that
// does, may be written: the writers create the missing ones. `path` (named
// by `option`) is what the messages name.
Status CheckWritableFrom(const std::string& option, const std::string& path, fs::path dir) {
  K3_RETURN_IF_ERROR(CheckPathShape(option, path));
  if (dir.empty()) dir = ".";
  std::error_code ec;
  while (!fs::exists(dir, ec) && dir.parent_path() != dir) {
    // A link to a directory not there (yet): creating it failed with "File
    // exists", or for a file beneath it "cannot create its directory".
    if (fs::is_symlink(fs::symlink_status(dir, ec))) {
      const std::string target = LinkTarget(dir);
      return Error(option + " " + path + ": " + dir.string() + " is a symbolic link to " + target +
                       ", which does not exist",
                   ErrorKind::kFileNotFound, ENOENT)
          .WithHint("create " + target + " first, or pass " + option + " a path without the dangling link");
    }
    // "out/p.pack" with no out/: the nearest existing one is the current directory.
    dir = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  }
  if (!fs::is_directory(dir, ec)) {
    return Error(option + " " + path + ": " + dir.string() + " is not a directory", ErrorKind::kFileExists)
        .WithHint("pass " + option + " in a directory");
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    const int err = errno;
    return Error::FromErrno(option + " " + path + ": cannot write in " + dir.string(), err)
        .WithHint("the directory is read-only for you; pass " + option + " elsewhere");
  }
  return Status::OK();
}

}  // namespace

Status CheckOutputWritable(const std::string& option, const std::string& path) {
  return CheckWritableFrom(option, path, fs::path(path).parent_path());
}

Status CheckOutputWritableUnlessThere(const std::string& option, const std::string& path, bool will_write) {
  Status writable = CheckOutputWritable(option, path);
  if (writable.ok() || will_write || !PathExists(path)) return writable;
  const int err = writable.error().sys_errno();
  return err == EACCES || err == EROFS || err == EPERM ? Status::OK() : writable;
}

Status CheckOutputDirWritable(const std::string& option, const std::string& dir) {
  return CheckWritableFrom(option, dir, dir);
}

namespace {

std::string FirstBytes(const std::string& path, size_t n) {
  auto head = ReadFileHead(path, n);
  return head.ok() ? *head : std::string();
}

}  // namespace

bool BeginsMagic(std::string_view head, std::string_view magic) {
  return head.size() >= magic.size() ? head.starts_with(magic) : magic.starts_with(head);
}

FileStart ClassifyFileStart(const std::string& path) {
  if (!PathExists(path)) return FileStart::kMissing;
  std::string head = FirstBytes(path, 32);
  if (head.find_first_not_of('\0') == std::string::npos) return FileStart::kEmpty;
  if (head.starts_with("\xEF\xBB\xBF")) head.erase(0, 3);  // a byte-order mark before JSON
  const auto begins = [&](std::string_view magic) { return BeginsMagic(head, magic); };
  if (begins("GGUF")) return FileStart::kGguf;
  if (begins("GGMLMOEPACKv1")) return FileStart::kExpertPack;
  if (begins(std::string_view("K3TRACE\0", 8))) return FileStart::kTrace;
  const size_t first = head.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && (head[first] == '{' || head[first] == '[')) return FileStart::kJson;
  if (first != std::string::npos && (head.compare(first, 4, "<svg") == 0 || head.compare(first, 5, "<?xml") == 0)) {
    return FileStart::kSvg;
  }
  return FileStart::kOther;
}

std::string DescribeFileStart(const std::string& path) {
  switch (ClassifyFileStart(path)) {
    case FileStart::kMissing: return "no file";
    case FileStart::kEmpty: return "an empty file";
    case FileStart::kGguf: return "a GGUF file";
    case FileStart::kExpertPack: return "an Expert Pack";
    case FileStart::kTrace: return "a k3pack routing trace";
    case FileStart::kJson: return "a JSON document";
    case FileStart::kSvg: return "an SVG image";
    case FileStart::kOther: break;
  }
  std::string shown;
  for (unsigned char c : FirstBytes(path, 16)) {
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      shown += static_cast<char>(c);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      shown += hex;
    }
  }
  return "a file that starts with \"" + shown + "\"";
}

std::string NotAFileOf(const std::string& path, FileStart own, const std::string& own_name) {
  const FileStart kind = ClassifyFileStart(path);
  if (kind == own || kind == FileStart::kMissing || kind == FileStart::kEmpty) return "";
  return "it is " + DescribeFileStart(path) + ", not " + own_name;
}

std::optional<FileStamp> SeeOutput(const std::string& path) {
  auto stamp = StampFile(path);
  if (!stamp.ok()) return std::nullopt;
  return *stamp;
}

namespace {

// An exclusive flock on `dir` itself, waited for up to 30 s; an invalid fd
// where the filesystem cannot lock a directory (NFS emulates flock with
// byte-range locks, which need a file open for writing; a directory without
// read permission cannot be opened): the write then goes on without it,
// rather than fail after the hours its build took.
Result<UniqueFd> LockDirectoryForAWrite(const std::string& dir, const std::string& path) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return UniqueFd();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (;;) {
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) == 0) return fd;
    if (errno != EWOULDBLOCK) return UniqueFd();
    if (std::chrono::steady_clock::now() >= deadline) {
      return Error("another process held the directory of " + path + " for 30 s while this one waited to write it",
                   ErrorKind::kOS, EWOULDBLOCK)
          .WithHint("rerun the same command once the other one has finished (what is done is kept)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

Status WriteIfStillAsSeen(const std::string& option, const std::string& path, const std::optional<FileStamp>& seen,
                          const std::function<Status()>& write) {
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  fs::create_directories(dir, ec);
  // Threads of this process take turns here; processes, by the flock.
  static std::mutex in_this_process;
  std::lock_guard<std::mutex> turn(in_this_process);
  K3_ASSIGN_OR_RETURN(UniqueFd dir_lock, LockDirectoryForAWrite(dir.string(), path));
  const std::optional<FileStamp> now = SeeOutput(path);
  if (now && (!seen || !HowFileChanged(path, *seen).empty())) {
    const std::string how = seen ? HowFileChanged(path, *seen) : "it did not exist when this run began";
    return Error("refusing to overwrite existing " + path + " (" + option +
                     "): another process wrote it while this run went on (" + how + ")",
                 ErrorKind::kFileExists)
        .WithHint("rerun the same command once the other one has finished (what is done is kept), or pass another " +
                  option + " path");
  }
  return write();
}

Result<std::vector<NamedPath>> FilesIn(const std::string& label, const std::string& dir, std::string_view what) {
  K3_ASSIGN_OR_RETURN(const std::vector<std::string> names, RegularFileNames(dir, what));
  std::vector<NamedPath> out;
  for (const std::string& name : names) out.push_back({label, (fs::path(dir) / name).string()});
  return out;
}

Status CheckManifestRecordablePaths(const std::vector<NamedPath>& paths) {
  for (const NamedPath& p : paths) {
    std::error_code ec;
    const std::string abs = fs::absolute(p.path, ec).string();
    const std::string& shown = ec ? p.path : abs;
    if (IsValidUtf8(shown)) continue;
    return Error(p.option + " " + EscapeInvalidUtf8(shown) +
                 " is not valid UTF-8, and the manifest records it: SGLang reads the manifest as UTF-8 JSON")
        .WithHint("move or rename it to a UTF-8 path (the bytes shown as \\xNN are not UTF-8), then rerun");
  }
  return Status::OK();
}

}  // namespace k3pack
