// The one overwrite rule of every k3pack command that writes an output
// (pack, build, manifest, synth, trace gen, trace sweep --svg, repair,
// load --dump). A user's file is never replaced by accident:
//   - the output does not exist (an empty directory counts as absent): write;
//   - a resumable partial of it exists (`<pack>.partial` + checkpoint): resume;
//   - it exists and is the finished, valid result of the same inputs: report
//     "already built: PATH (use --force to rebuild)" and exit 0;
//   - it exists otherwise: refuse, naming the option, unless --force.
#pragma once

#include <functional>
#include <string>

#include "cli/command.h"
#include "k3pack/error.h"

namespace k3pack::cli {

enum class OutputAction {
  kWrite,         // nothing there: write it
  kResume,        // a resumable partial is there: continue it
  kAlreadyBuilt,  // the finished output is there and valid: nothing to do
  kReplace,       // something is there and --force was given: rebuild it
};

struct OutputSpec {
  std::string option;  // the option naming the output ("--pack"), for messages
  std::string path;
  bool force = false;
  bool directory = false;    // the output is a directory: an empty one counts as absent
  bool has_partial = false;  // a resumable partial of this output exists
  // Says whether an existing output is the finished, valid result of the
  // same inputs; unset: an existing output is never taken as finished.
  std::function<Result<bool>()> is_finished;
  // Appended to the refusal ("it is not a pack built from these shards").
  std::string why_refused;
};

// Applies the rule. The refusal is ErrorKind::kFileExists, names the option
// and says to pass --force or another path.
Result<OutputAction> DecideOutput(const OutputSpec& spec);

// Adds --force ("replace an existing output") to a command's options.
void AddForceFlag(Args& args, const std::string& what);

// Prints "already built: PATH (use --force to rebuild)" on stdout; with
// `json` the line goes to stderr and stdout gets {"already_built": true,
// "path": PATH} (stdout stays valid JSON).
void ReportAlreadyBuilt(const std::string& command, const std::string& path, bool json);

}  // namespace k3pack::cli
