#include "k3pack/error.h"
#include "util/process_limits.h"

#include <sys/resource.h>

#include <cstring>

namespace k3pack {

const char* ErrorKindName(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kValue: return "ValueError";
    case ErrorKind::kKey: return "KeyError";
    case ErrorKind::kFileNotFound: return "FileNotFoundError";
    case ErrorKind::kFileExists: return "FileExistsError";
    case ErrorKind::kOS: return "OSError";
    case ErrorKind::kEOF: return "EOFError";
    case ErrorKind::kRuntime: return "RuntimeError";
    case ErrorKind::kMemory: return "MemoryError";
  }
  return "Error";
}

namespace {
constexpr const char kHintLabel[] = "\nhint: ";

// A limit of the process, not the file named, made the call fail: without
// saying which limit and its value, "Too many open files" on a shard or
// "File too large" on a pack reads like a fault of that file.
std::string ProcessLimitHint(int err) {
  switch (err) {
    case EMFILE:
      return "this process may have " + SoftLimitOf(RLIMIT_NOFILE) +
             " files open at once (`ulimit -n`); raise it (e.g. `ulimit -n 4096`) and rerun; the file itself is "
             "not at fault";
    case ENFILE:
      return "the system's table of open files is full (sysctl fs.file-max); close other programs' files or raise it, "
             "and rerun; the file itself is not at fault";
    case EFBIG: {
      // The file system's own cap gives the same errno: a pack written to a
      // FAT32 stick stops at 4 GiB with no process limit in sight.
      const std::string file_system =
          "the file system holding the file caps a file's size (vfat/FAT32: 4 GiB less a byte; ext4 with 4 KiB "
          "blocks: 16 TiB): write it to a file system that holds files this large (ext4, xfs, btrfs)";
      const std::string cap = SoftLimitOf(RLIMIT_FSIZE);
      if (cap == "unlimited") return file_system;
      return "this process may write files of at most " + cap + " bytes (`ulimit -f` counts 1024-byte blocks); raise "
             "it (`ulimit -f unlimited`) and rerun; if the file was still smaller than that, " + file_system;
    }
    case ENOMEM:
      // Under `ulimit -v` a mapping or buffer of ordinary size fails long
      // before memory runs out; without a cap the cause is not the process's.
      return SoftLimitOf(RLIMIT_AS) == "unlimited" ? std::string() : OutOfMemoryHint();
    default:
      return {};
  }
}

}  // namespace

std::string SoftLimitOf(int resource) {
  struct rlimit rl;
  if (::getrlimit(resource, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return "unlimited";
  return std::to_string(rl.rlim_cur);
}

bool IsProcessCannotRead(int err) {
  return err == EACCES || err == EPERM || err == EMFILE || err == ENFILE || err == ENOMEM;
}

std::string ThreadStartHint() {
  std::string hint = "raise the process's thread limit (`ulimit -u`; in a container, its pids limit)";
  if (const std::string cap = SoftLimitOf(RLIMIT_AS); cap != "unlimited")
    hint += " or its address space (`ulimit -v`: at most " + cap + " bytes now; each thread's stack takes some)";
  return hint;
}

std::string OutOfMemoryHint() {
  const std::string cap = SoftLimitOf(RLIMIT_AS);
  if (cap == "unlimited") return "free memory or lower the command's buffer and cache sizes, and rerun";
  return "this process may use at most " + cap + " bytes of address space (`ulimit -v`); raise it and rerun";
}

Error OutOfMemoryOn(const std::string& where) {
  return Error("out of memory on " + where + " (an allocation failed)", ErrorKind::kMemory, ENOMEM)
      .WithHint(OutOfMemoryHint());
}

namespace {
constexpr const char kBareOutOfMemory[] = "out of memory";
static_assert(sizeof(kBareOutOfMemory) - 1 <= 15, "libstdc++ keeps up to 15 characters inline, without allocating");
}  // namespace

Error BareOutOfMemory() noexcept { return Error(kBareOutOfMemory, ErrorKind::kMemory, ENOMEM); }

bool IsBareOutOfMemory(const Error& e) {
  return e.kind() == ErrorKind::kMemory && e.sys_errno() == ENOMEM && e.message() == kBareOutOfMemory;
}

const Error& ErrorOfOk() {
  static const Error ok("OK", ErrorKind::kRuntime);
  return ok;
}

Error Error::FromErrno(std::string what, int err) {
  ErrorKind kind = ErrorKind::kOS;
  if (err == ENOENT) kind = ErrorKind::kFileNotFound;
  if (err == EEXIST) kind = ErrorKind::kFileExists;
  Error e(what + ": " + std::strerror(err), kind, err);
  const std::string hint = ProcessLimitHint(err);
  return hint.empty() ? e : e.WithHint(hint);
}

Error Error::WithHint(const std::string& hint) const {
  return Error(message_ + kHintLabel + hint, kind_, errno_);
}

std::string Error::headline() const { return message_.substr(0, message_.find('\n')); }

std::string Error::hint() const {
  const size_t at = message_.find(kHintLabel);
  if (at == std::string::npos) return std::string();
  // Every hint's label goes, the second's too: the JSON "hint" read
  // "...first\nhint: second".
  std::string hints = message_.substr(at + sizeof(kHintLabel) - 1);
  const std::string_view label(kHintLabel, sizeof(kHintLabel) - 1);
  for (size_t next; (next = hints.find(label)) != std::string::npos;) hints.replace(next, label.size(), "\n");
  return hints;
}

Error Error::WithContext(const std::string& context) const {
  return Error(context + ": " + message_, kind_, errno_);
}

}  // namespace k3pack
