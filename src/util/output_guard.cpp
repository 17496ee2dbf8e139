#include "util/output_guard.h"

#include <unistd.h>

#include <cerrno>
#include <filesystem>

namespace k3pack {

namespace fs = std::filesystem;

namespace {

bool SameFile(const std::string& a, const std::string& b) {
  std::error_code ec;
  if (fs::exists(a, ec) && fs::exists(b, ec)) return fs::equivalent(a, b, ec) && !ec;
  return fs::weakly_canonical(a, ec) == fs::weakly_canonical(b, ec);
}

}  // namespace

Result<OutputAction> DecideOutput(const OutputSpec& spec) {
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(spec.path, ec);
  const bool exists = fs::exists(st);
  const bool empty_dir = exists && fs::is_directory(st) && fs::is_empty(spec.path, ec);
  // A checkpointed partial wins even over a finished-looking output: a build
  // killed between the final rename and its last steps must finish them.
  if (spec.has_partial) return OutputAction::kResume;
  if (!exists || (spec.directory && empty_dir)) return OutputAction::kWrite;
  if (spec.directory && !fs::is_directory(st)) {
    return Error(spec.option + " " + spec.path + " is a file, not a directory", ErrorKind::kFileExists)
        .WithHint("pass a new or empty directory as " + spec.option);
  }
  if (spec.force) return OutputAction::kReplace;
  if (spec.is_finished) {
    K3_ASSIGN_OR_RETURN(bool finished, spec.is_finished());
    if (finished) return OutputAction::kAlreadyBuilt;
  }
  return RefuseExisting(spec);
}

Error RefuseExisting(const OutputSpec& spec) {
  std::string what = spec.directory ? "non-empty directory " : "existing ";
  return Error("refusing to overwrite " + what + spec.path + " (" + spec.option + ")" +
                   (spec.why_refused.empty() ? "" : ": " + spec.why_refused),
               ErrorKind::kFileExists)
      .WithHint("pass " + spec.force_option + " to replace it, or another " + spec.option + " path");
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

Status CheckOutputWritable(const std::string& option, const std::string& path) {
  // The writers create missing directories: what must be writable is the
  // nearest one that exists.
  fs::path dir = fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  std::error_code ec;
  while (!fs::exists(dir, ec) && dir.has_parent_path() && dir.parent_path() != dir) dir = dir.parent_path();
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

std::vector<NamedPath> FilesIn(const std::string& label, const std::string& dir) {
  std::vector<NamedPath> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code e;
    if (it->is_regular_file(e)) out.push_back({label, it->path().string()});
  }
  return out;
}

}  // namespace k3pack
