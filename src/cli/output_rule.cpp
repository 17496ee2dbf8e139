#include "cli/output_rule.h"

#include <filesystem>
#include <iostream>

#include <nlohmann/json.hpp>

namespace k3pack::cli {

namespace fs = std::filesystem;

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
  std::string what = spec.directory ? "non-empty directory " : "existing ";
  return Error("refusing to overwrite " + what + spec.path + " (" + spec.option + ")" +
                   (spec.why_refused.empty() ? "" : ": " + spec.why_refused),
               ErrorKind::kFileExists)
      .WithHint("pass --force to replace it, or another " + spec.option + " path");
}

void AddForceFlag(Args& args, const std::string& what) {
  args.Flag("--force", "replace an existing " + what + " (otherwise refused; a finished valid one is reported)");
}

void ReportAlreadyBuilt(const std::string& command, const std::string& path, bool json) {
  const std::string line = "already built: " + path + " (use --force to rebuild)";
  if (json) {
    std::cerr << "k3pack " << command << ": " << line << "\n";
    PrintJson(nlohmann::json{{"already_built", true}, {"path", path}});
  } else {
    std::cout << line << "\n";
  }
}

}  // namespace k3pack::cli
