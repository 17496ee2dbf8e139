// Sub-command registry and a small, strict argument parser shared by every
// `k3pack <command>`. Each command lives in its own cmd_<name>.cpp and
// registers itself with K3_COMMAND.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "k3pack/error.h"
#include "util/progress.h"

namespace k3pack::cli {

// Declarative options: declare, then Parse(). Unknown options, missing
// values and missing required options are errors; `--help` prints usage.
// An option given twice with different values is an error naming both,
// unless it is declared Repeatable() (the same value twice is accepted: a
// script that repeats itself means one thing); a flag given twice is harmless. Options declared Exclusive() are
// refused together; an option declared Requires() is refused without its
// companion.
class Args {
 public:
  Args(std::string command, std::string usage_line, std::string description)
      : command_(std::move(command)), usage_(std::move(usage_line)), description_(std::move(description)) {}
  const std::string& command() const { return command_; }  // "build", "trace gen"

  // `--name VALUE` (also `--name=VALUE`).
  Args& Option(const std::string& name, const std::string& help, std::optional<std::string> default_value = std::nullopt,
               bool required = false);
  // Option `name`, declared above, may be given more than once: every value
  // is kept, in order (GetAll), instead of a second value being refused.
  // Marked "(repeatable)" in the help.
  Args& Repeatable(const std::string& name);
  // `--name` boolean switch.
  Args& Flag(const std::string& name, const std::string& help);
  // Positional arguments: `min`..`max` of them (max < 0: unbounded).
  Args& Positional(const std::string& metavar, const std::string& help, int min = 1, int max = 1);
  // `old_name` is an older spelling of option `name`: it keeps working for a
  // release, with a deprecation note on stderr. Both spellings at once is a
  // usage error.
  Args& Deprecated(const std::string& old_name, const std::string& name);
  // A single positional argument may stand for option `name` (the main
  // input: `k3pack pack DIR` = `k3pack pack --gguf-dir DIR`).
  Args& PositionalAsOption(const std::string& name);
  // At most one of `names` (options or flags) may be given: two of them is a
  // usage error naming both, followed by `why` when not empty. Listed in the
  // help as "not together".
  Args& Exclusive(std::vector<std::string> names, std::string why = {});
  // `name` only means something together with one of `needs` (options or
  // flags): given without any of them, it would be silently ignored, so it
  // is a usage error naming both, followed by `why` when not empty. Listed
  // in the help under "needs".
  Args& Requires(std::string name, std::vector<std::string> needs, std::string why = {});
  // `name` only means something when option `companion` has a value other
  // than `inert` (its default counts when it is not given): `--lookahead`
  // with `--prefetch none`. Values are compared as text, or as numbers when
  // both read as numbers ("0" = "0.0"). Refused naming both options and the
  // value; listed under "needs" as "--name needs --companion other than V".
  Args& RequiresValueOtherThan(std::string name, std::string companion, std::string inert, std::string why = {});

  // Returns false and prints to stderr (exit code 2) on a usage error, or
  // prints help (exit code 0) on --help; `exit_code` says which. Parsed, the
  // command is stopped by SIGINT / SIGTERM as StopOnSignals says.
  bool Parse(const std::vector<std::string>& argv, int* exit_code);

  bool Has(const std::string& name) const;                 // option given or flag set
  std::string Get(const std::string& name) const;          // value or default ("" if none)
  std::optional<std::string> GetOpt(const std::string& name) const;
  std::vector<std::string> GetAll(const std::string& name) const;  // a Repeatable option's values, in order
  Result<int64_t> GetInt(const std::string& name) const;   // parses, names the option on error
  Result<double> GetDouble(const std::string& name) const;
  const std::vector<std::string>& positionals() const { return positionals_; }
  std::string Usage() const;
  // Sets declared option `name` after parsing: an input the other inputs
  // imply, or what a given value stands for (a directory for the manifest
  // in it). Has() still says whether the user gave the option.
  void Set(const std::string& name, std::string value);

 private:
  bool ParseWords(const std::vector<std::string>& argv, int* exit_code);
  // The parse steps; each returns the usage error, or "" when the words pass.
  std::string TakeOption(const std::vector<std::string>& argv, size_t* i);  // argv[*i] starts with "--"
  std::string TakePositionalOption();  // the first argument stands for positional_option_
  std::string CheckCombinations() const;  // exclusive groups, requirements, required options
  std::string CheckPositionalCount() const;
  bool IsOptionName(const std::string& word) const;  // this command's option, with or without "=value"
  struct Spec { std::string help; std::optional<std::string> def; bool required; bool is_flag; bool repeatable = false; };
  struct ExclusiveGroup { std::vector<std::string> names; std::string why; };
  struct Requirement {
    std::string name;
    std::vector<std::string> needs;
    std::string why;
    std::optional<std::string> inert;  // RequiresValueOtherThan: needs[0]'s value that satisfies nothing
  };
  bool Satisfies(const Requirement& r) const;
  // The declared option an unknown or misspelled `word` most likely meant ("" if none is close).
  std::string Suggest(const std::string& word) const;
  std::string command_, usage_, description_;
  std::map<std::string, Spec> specs_;
  std::vector<std::string> order_;
  std::string pos_name_, pos_help_;
  int pos_min_ = 0, pos_max_ = 0;
  std::map<std::string, std::string> values_;
  std::map<std::string, std::vector<std::string>> all_values_;  // Repeatable options
  std::vector<std::string> positionals_;
  size_t positionals_before_dashdash_ = SIZE_MAX;  // where `--` ended the options, if given
  std::map<std::string, std::string> deprecated_;  // old spelling -> current
  std::string positional_option_;
  std::vector<std::string> notes_;  // deprecated spellings used, told after parsing
  std::map<std::string, std::string> spelled_;  // option -> the spelling it was given under
  std::vector<ExclusiveGroup> exclusive_;
  std::vector<Requirement> requires_;
};

using CommandFn = std::function<int(const std::vector<std::string>& argv)>;

struct CommandInfo {
  std::string name;
  std::string summary;
  CommandFn run;
};

bool RegisterCommand(CommandInfo info);
const std::map<std::string, CommandInfo>& Commands();

// Exit codes of every command (documented in README and `k3pack --help`).
inline constexpr int kExitOk = 0;           // done (also: output already built)
inline constexpr int kExitFailed = 1;       // the input is bad or a check failed
inline constexpr int kExitUsage = 2;        // unknown flag, bad value, conflicting flags
inline constexpr int kExitInterrupted = 130;  // SIGINT; rerun the same command to resume
inline constexpr int kExitTerminated = 143;   // SIGTERM; as 130

// Prints "k3pack <cmd>: error: <message>" (message may be several lines)
// and returns the exit code to use (1 by default).
int ReportError(const std::string& command, const Error& error, int exit_code = 1);

// Whether `args` ask for JSON on stdout: a word `--json` (or `--json=...`)
// before `--`.
bool AsksForJson(const std::vector<std::string>& args);

// A usage error found before any Args parsed the words (an unknown command
// or trace sub-command): prints `line` on stderr and, when `args` ask for
// --json, the JSON error on stdout as Parse does (README: with --json a
// script reading stdout always gets a verdict). Returns kExitUsage.
int ReportDispatchError(const std::string& command, const std::string& line, const std::string& message,
                        const std::vector<std::string>& args);

// Prints a command's JSON result on stdout (indent 2, newline). Strings that
// are not UTF-8 (a path is bytes on Linux) are shown \xNN-escaped, as Python's
// backslashreplace shows them, instead of making the dump throw.
void PrintJson(nlohmann::json j);

// The copy options `pack` and `build` share: --safety-margin-gib, --restart,
// --threads, --progress.
void AddCopyOptions(Args& args, std::string_view restart_help = "discard an interrupted partial build instead of resuming it");
// --threads as a copy-worker count (0 = the builder's default).
Result<int> ParseCopyThreads(const Args& args);
// The values of AddCopyOptions' options, checked (a bad one is a usage error).
struct CopyValues {
  double margin = 0;  // --safety-margin-gib
  ProgressMode mode{};
  int threads = 0;
};
Result<CopyValues> ParseCopyValues(const Args& args);

// True when stderr is a terminal (progress bars) rather than a pipe (JSON lines).
bool StderrIsTty();

// --progress auto|bar|json|none, on every command that can run long.
void AddProgressOption(Args& args);
// The mode --progress asks for: auto is a bar on a terminal, else one line
// every 10 s. The error names the option (a usage error: exit code 2).
Result<ProgressMode> ProgressModeOf(const Args& args);
// One line of what a command is doing or noticed, on stderr: "k3pack
// COMMAND: LINE" (an open bar line is ended first). With --progress json it
// is {"phase": COMMAND, "note": LINE} instead, the shape of the reporter's
// notes, so that stderr stays one JSON object per line until an error.
void Narrate(const std::string& command, const std::string& line);

// The reporter of a long command (a stop signal ends its bar line: see
// StopOnSignals).
std::unique_ptr<ProgressReporter> StartProgress(ProgressMode mode);

// What an interrupted command left, for the one line it ends with.
inline constexpr const char* kNothingToResume = "nothing to resume, rerun the command to start over";
// From the moment its words parsed (Args::Parse), before any work, every
// command ends on SIGINT / SIGTERM with one line on stderr, "k3pack COMMAND:
// interrupted; ADVICE" (kNothingToResume unless the command said otherwise
// here), with --json the JSON error (exit_code 130 / 143, errno EINTR) on
// stdout unless the command's own JSON has begun, and exit 130 / 143, never a
// bare death by signal. Outputs are written through AtomicFile, so what is
// under an output name is the old file or none. The same stop told twice
// (`timeout`) is one stop. Called before Parse, it takes effect there.
void StopOnSignals(const std::string& command, const std::string& advice);

}  // namespace k3pack::cli

#define K3_COMMAND(name, summary, fn) \
  static const bool k3_command_registered_##fn = ::k3pack::cli::RegisterCommand({name, summary, fn})
