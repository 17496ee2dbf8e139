// The one overwrite rule of every k3pack command that writes an output
// (pack, build, manifest, synth, trace gen, trace sweep --svg, repair,
// load --dump, run-experts --trace-out). A user's file is never replaced by
// accident:
//   - the output does not exist (an empty directory counts as absent): write;
//   - a resumable partial of it exists (`<pack>.partial` + checkpoint): resume;
//   - it exists and is the finished, valid result of the same inputs: report
//     "already built: PATH (use --force to rebuild)" and exit 0;
//   - it exists otherwise: refuse, naming the option, unless --force.
#pragma once

#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "k3pack/error.h"
#include "util/lock_file.h"
#include "util/output_guard.h"

namespace k3pack::cli {

// The rule itself is shared with the Python binding (util/output_guard.h).
using k3pack::CheckOutputKind;
using k3pack::DecideOutput;
using k3pack::OutputAction;
using k3pack::OutputSpec;
using k3pack::RefuseExisting;

// "already built: PATH (use --force to rebuild)".
std::string AlreadyBuiltLine(const std::string& path);

// Adds --force ("replace an existing output") to a command's options.
void AddForceFlag(Args& args, const std::string& what);

// Adds --wait SECONDS|forever to a command that takes an output's lock: a
// second writer of the same output (a build queued behind another, a repair
// behind a build) waits for it instead of being refused at once.
void AddWaitOption(Args& args);
// The wait --wait asks for (0 when not given); it is told on stderr as
// "k3pack COMMAND: waiting for ...". A bad value is a usage error.
Result<LockWait> LockWaitOf(const Args& args, const std::string& command);

// Prints "already built: PATH (use --force to rebuild)" on stdout; with
// `json` the line goes to stderr and stdout gets {"already_built": true,
// "path": PATH} (stdout stays valid JSON), plus PATH under `key` when given:
// the key a fresh run's JSON names that output by ("pack", "manifest",
// "out_dir"), so a script reads the same key either way. `fields` are set in
// the JSON last: the paths in the form a fresh run prints them (absolute for
// `build` and `manifest`), and any other output the fresh JSON names.
void ReportAlreadyBuilt(const std::string& command, const std::string& path, bool json, const std::string& key = "",
                        const nlohmann::json& fields = nlohmann::json::object());

// The rule for an output each run regenerates (a plot, a run's stats), which
// is never "already built": an existing file is replaced when `is_ours` says
// an earlier k3pack run wrote it, or with --force when it is of the kind
// `own` (named `own_name` in messages); anything else never.
Status CheckRegeneratedOutput(const Args& args, const std::string& option, const std::string& path,
                              const std::string& why_refused, const std::function<bool(const std::string&)>& is_ours,
                              FileStart own, const std::string& own_name);

}  // namespace k3pack::cli
