// Traces of an unfinished download next to the shards. A download tool
// leaves them where doctor's GGUF checks cannot see the problem: aria2
// preallocates the whole file under its final name (right size, parts still
// zeros, which every ggml type decodes), a Hugging Face snapshot links to a
// blob that is not there yet, and a missing shard is often a `.part` file.
#include <filesystem>

#include "doctor/internal.h"

namespace k3pack::doctor::internal {

namespace fs = std::filesystem;

namespace {

// Suffixes download tools append to the final file name while they write.
constexpr const char* kPartialSuffixes[] = {".part", ".downloading", ".crdownload", ".incomplete", ".aria2"};

}  // namespace

std::vector<std::string> DownloadLeftovers(const std::string& shard_path) {
  std::vector<std::string> found;
  std::error_code ec;
  for (const char* suffix : kPartialSuffixes) {
    const std::string p = shard_path + suffix;
    if (fs::exists(fs::symlink_status(p, ec))) found.push_back(p);
  }
  return found;
}

bool ReportBrokenLink(const Shard& s, Collector& out) {
  std::error_code ec;
  if (!fs::is_symlink(s.path, ec) || fs::exists(s.path, ec)) return false;
  const fs::path target = fs::read_symlink(s.path, ec);
  const fs::path resolved = (target.is_absolute() ? target : fs::path(s.path).parent_path() / target).lexically_normal();
  std::string msg = "a symbolic link to " + target.string() + " (" + resolved.string() + "), which does not exist";
  Finding& f = out.Add("shard-link-broken", s.path, msg, {}, s.path);
  f.details = {{"target", target.string()}, {"resolved", resolved.string()}};
  // huggingface_hub downloads a blob as <blob>.incomplete and links it when done.
  if (fs::exists(resolved.string() + ".incomplete", ec)) {
    f.message += "; " + resolved.string() + ".incomplete is there: its download did not finish";
    f.details["incomplete"] = resolved.string() + ".incomplete";
  }
  return true;
}

void CheckDownloadLeftovers(const Shard& s, Collector& out) {
  // Only aria2's control file means the file under the final name is still
  // being written; other tools write elsewhere and rename at the end.
  const std::string control = s.path + ".aria2";
  std::error_code ec;
  if (!fs::exists(control, ec)) return;
  Finding& f = out.Add("download-in-progress", s.path,
                       "aria2's control file " + fs::path(control).filename().string() +
                           " is beside it: aria2 has not finished this file (it preallocates the full size, so "
                           "the size looks right while parts of the data are still zeros)",
                       {}, s.path);
  f.details = {{"control_file", control}};
}

}  // namespace k3pack::doctor::internal
