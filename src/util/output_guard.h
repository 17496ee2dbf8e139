// The output rules every k3pack writer applies, shared by the CLI commands
// and the Python binding (so `k3pack.build(...)` refuses what `k3pack build`
// refuses, with the same texts). A user's file is never replaced by accident:
//   - no output is one of the inputs (CheckOutputsAreNotInputs);
//   - the output does not exist (an empty directory counts as absent): write;
//   - a resumable partial of it exists (`<pack>.partial` + checkpoint): resume;
//   - it exists and is the finished, valid result of the same inputs: report
//     "already built" and do nothing;
//   - it exists otherwise: refuse, naming the option, unless forced.
// Option names are the caller's: "--pack" and "--force" for the CLI, the
// keyword ("out", "force=True") for Python.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "k3pack/error.h"
#include "util/file.h"

namespace k3pack {

struct NamedPath {
  std::string option;  // "--model-config", "source shard", ...
  std::string path;
};

enum class OutputAction {
  kWrite,         // nothing there: write it
  kResume,        // a resumable partial is there: continue it
  kAlreadyBuilt,  // the finished output is there and valid: nothing to do
  kReplace,       // something is there and force was given: rebuild it
};

struct OutputSpec {
  std::string option;  // the option naming the output ("--pack"), for messages
  std::string path;
  bool force = false;
  std::string force_option = "--force";  // how the caller spells force, for the hint
  bool directory = false;    // the output is a directory: an empty one counts as absent
  bool has_partial = false;  // a resumable partial of this output exists
  // Says whether an existing output is the finished, valid result of the
  // same inputs; unset: an existing output is never taken as finished.
  std::function<Result<bool>()> is_finished;
  // Appended to the refusal ("it is not a pack built from these shards").
  std::string why_refused;
  // An existing regular file is ever replaced (or taken as finished) only
  // when this returns "" (it is the kind of file this output is); otherwise
  // it says what the file is ("it is a GGUF file, not an Expert Pack"), and
  // the output is refused even with force. Unset: any regular file. A slip
  // of the output path with --force once wrote a pack over a shard.
  std::function<std::string()> not_own_kind;
};

// Applies the rule. The refusal is ErrorKind::kFileExists, names the option
// and says to pass force or another path. A dangling link at a file output
// is refused without force, naming its target (force replaces the link).
Result<OutputAction> DecideOutput(const OutputSpec& spec);

// A file output named with a trailing '/' that does not exist: writing it
// created the directory and then failed to rename onto it (and blamed a
// race), or (the store's stats file) lost what was to be written. An
// existing directory is refused by the callers as one.
Status RefuseFileOutputEndingInSlash(const std::string& option, const std::string& path);

// An existing output must be what the rule may replace: a regular file (or
// a link to one, or a dangling link: the final rename replaces the link's
// name), or for a directory output a directory (or a link to one). A device, FIFO or socket, or a directory where
// a file is written, is refused even with force; so is a regular file that
// not_own_kind says is another kind of file. Absent: OK.
Status CheckOutputKind(const OutputSpec& spec);

// An existing file output this user may rename over. In a directory with the
// sticky bit (/tmp, a shared scratch directory) only the owner of the file or
// of the directory may (root aside): the final rename would fail with EPERM
// after the whole run. Refused naming the owner and the rule; absent or a
// directory output: OK.
Status CheckReplaceable(const OutputSpec& spec);

// The rule's refusal of an existing output, for a caller that finds out
// only later (e.g. while comparing) that the output is not its own.
Error RefuseExisting(const OutputSpec& spec);

// No output path is one of the inputs (same file by inode, or the same path
// once resolved). Inputs that are directories also cover every file in them.
// The refusal: "OPTION PATH is an input (INPUT); writing it would destroy it".
Status CheckOutputsAreNotInputs(const std::vector<NamedPath>& outputs, const std::vector<NamedPath>& inputs);

// An output file is not directly in `dir` (a directory input whose every
// file is read and recorded, such as the tokenizer directory of a manifest):
// written there, it would be read as one of them. The refusal names both
// options and `why`.
Status CheckOutputNotIn(const NamedPath& output, const NamedPath& dir, const std::string& why);

// The directory an output is written in (or its nearest existing ancestor,
// the writers create the rest) is writable; a read-only model directory is
// reported with the option to pass elsewhere. Refused first, before any work,
// what the kernel would refuse only at the end: a path of PATH_MAX bytes or
// more, a component of more than 255, a `..` after a component that does not
// exist, and a dangling symbolic link where a directory is to be made.
Status CheckOutputWritable(const std::string& option, const std::string& path);
// The same, except that an output already there in a directory the user may
// not write in passes unless `will_write` (--force, a repair): it may be a
// finished one, reported as already built, and rerunning a finished build
// must not fail for want of rights it never uses. Whoever then decides to
// write it calls CheckOutputWritable.
Status CheckOutputWritableUnlessThere(const std::string& option, const std::string& path, bool will_write);
// The same for a directory output (synth's --out, repair's OUT, a dump): the
// directory itself, or the nearest existing one above it, is writable.
Status CheckOutputDirWritable(const std::string& option, const std::string& dir);

// Every path a manifest records (shards, pack, config, tokenizer files, the
// manifest itself) must be UTF-8: SGLang reads the manifest as UTF-8 JSON.
// Checked before the build copies anything; the error names the option and
// shows the path with its odd bytes \xNN-escaped.
Status CheckManifestRecordablePaths(const std::vector<NamedPath>& paths);

// What was at an output path when its writer decided on it: the file's
// stamp, or nullopt when nothing was there.
std::optional<FileStamp> SeeOutput(const std::string& path);

// Runs `write` (which writes `path`) only if the path still holds what
// `seen` recorded (or nothing, where something was: it was removed). The
// look and the write are one step for every such writer: threads of this
// process take turns, processes hold an flock on the path's directory
// (waiting up to 30 s; where a directory cannot be locked, as on NFS, the
// write goes on without). Of two writers that decided on one path at the
// same time (two builds of one manifest, two trace gens), the second is
// refused naming the option, instead of replacing what the first wrote.
Status WriteIfStillAsSeen(const std::string& option, const std::string& path, const std::optional<FileStamp>& seen,
                          const std::function<Status()>& write);

// What a file is, from its first bytes (a file shorter than a magic counts
// as that kind when its bytes begin the magic: one cut short while written).
// A file of NUL bytes only (as far as looked at: left by a crash) is kEmpty.
enum class FileStart { kMissing, kEmpty, kGguf, kExpertPack, kTrace, kJson, kSvg, kOther };
// Whether a file's first bytes `head` are of a file that starts with `magic`:
// all of it, or (a file cut short while its header was written) a prefix.
bool BeginsMagic(std::string_view head, std::string_view magic);
// "a file", "a directory", "a character device", "a FIFO (named pipe)", ...
std::string KindOf(const std::filesystem::file_status& st);
FileStart ClassifyFileStart(const std::string& path);
// For messages: "a GGUF file", "an Expert Pack", "a k3pack routing trace",
// "a JSON document", "an SVG image", "an empty file", or "a file that starts
// with \"...\"".
std::string DescribeFileStart(const std::string& path);

// For OutputSpec::not_own_kind: "" when the file at `path` is missing, empty
// or of kind `own`; else "it is <DescribeFileStart>, not <own_name>".
std::string NotAFileOf(const std::string& path, FileStart own, const std::string& own_name);

// Every regular file in `dir` (one level, RegularFileNames), as NamedPaths
// labelled `label`. A directory that cannot be listed is RegularFileNames's
// error (`cannot list {what} {dir}: ...`): an input the rule did not see
// could be written over, and the writer would fail on it only later.
Result<std::vector<NamedPath>> FilesIn(const std::string& label, const std::string& dir, std::string_view what);

}  // namespace k3pack
