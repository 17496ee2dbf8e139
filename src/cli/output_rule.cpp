#include "cli/output_rule.h"

#include <cstdio>
#include <iostream>
#include <limits>

#include <nlohmann/json.hpp>

namespace k3pack::cli {

void AddForceFlag(Args& args, const std::string& what) {
  args.Flag("--force", "replace an existing " + what + " (otherwise refused; a finished valid one is reported)");
}

void AddWaitOption(Args& args) {
  args.Option("--wait", "when another k3pack process is writing the same output, wait up to SECONDS (or forever) "
                        "for it to finish instead of failing at once; then go on as if run after it",
              "0");
}

Result<LockWait> LockWaitOf(const Args& args, const std::string& command) {
  LockWait wait;
  wait.option = "--wait SECONDS";
  const std::string value = args.Get("--wait");
  if (value == "forever") {
    wait.seconds = std::numeric_limits<double>::infinity();
  } else {
    auto seconds = args.GetDouble("--wait");
    if (!seconds.ok() || *seconds < 0) {
      return Error("--wait must be a number of seconds (0 or more) or `forever`, got '" + value + "'");
    }
    wait.seconds = *seconds;
  }
  wait.notify = [command](const std::string& line) { Narrate(command, line); };
  return wait;
}

std::string AlreadyBuiltLine(const std::string& path) {
  // --force rewrites beside it: where the user may not write, it is refused.
  const bool writable = CheckOutputWritable("", path).ok();
  return "already built: " + path + (writable ? " (use --force to rebuild)" : " (read-only for you: rebuild it elsewhere)");
}

void ReportAlreadyBuilt(const std::string& command, const std::string& path, bool json, const std::string& key,
                        const nlohmann::json& fields) {
  const std::string line = AlreadyBuiltLine(path);
  if (json) {
    Narrate(command, line);
    nlohmann::json j{{"already_built", true}, {"path", path}};
    if (!key.empty()) j[key] = path;
    for (const auto& [name, value] : fields.items()) j[name] = value;
    PrintJson(j);
  } else {
    std::cout << line << "\n";
  }
}

Status CheckRegeneratedOutput(const Args& args, const std::string& option, const std::string& path,
                              const std::string& why_refused, const std::function<bool(const std::string&)>& is_ours,
                              FileStart own, const std::string& own_name) {
  OutputSpec spec;
  spec.option = option;
  spec.path = path;
  spec.force = args.Has("--force");
  spec.why_refused = why_refused;
  // --force regenerates a file of the kind the option writes (another
  // program's plot), never a manifest or a shard given by a slip of the path.
  spec.not_own_kind = [&] { return NotAFileOf(path, own, own_name); };
  // Before the run: a read-only directory found only at the end lost the run.
  K3_RETURN_IF_ERROR(CheckOutputWritable(option, path));
  // Before is_ours reads it: a device or pipe is never ours to replace.
  K3_RETURN_IF_ERROR(CheckOutputKind(spec));
  // Regenerated whenever it differs, ours or not: it must be replaceable.
  K3_RETURN_IF_ERROR(CheckReplaceable(spec));
  auto action = DecideOutput(spec);
  if (!action.ok() && is_ours && is_ours(path)) return Status::OK();
  return action.ok() ? Status::OK() : Status(action.error());
}

}  // namespace k3pack::cli
