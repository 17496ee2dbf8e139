// `k3pack repair IN OUT --fix ssm-a`: write a repaired copy of a shard set.
#include <algorithm>
#include <iostream>
#include <set>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/output_rule.h"
#include "cli/preflight.h"
#include "cli/profile.h"
#include "k3pack/doctor.h"
#include "util/file.h"
#include "util/lock_file.h"
#include "util/progress.h"
#include "util/utf8.h"
#include "util/json_text.h"

namespace {

namespace fs = std::filesystem;
using k3pack::doctor::kRepairMarkerName;
using k3pack::doctor::kRepairRecordName;

// What a finished repair records in OUT, so a rerun of the same command is
// reported as already built and --force knows the directory is ours.
// A run that copies no sidecars records it: a rerun that copies them is
// another repair, not this one already built (it said so, and left
// config.json and tokenizer/ missing).
nlohmann::json Recipe(const std::string& in, const std::string& fix, bool copy_sidecars) {
  auto resolved = k3pack::ResolvePath(in);
  nlohmann::json recipe = {{"input", resolved.ok() ? *resolved : in}, {"fix", fix}};
  if (!copy_sidecars) recipe["sidecars"] = false;
  return recipe;
}

// Whether IN has sidecars a repair copies (config.json, tokenizer/, the
// profile record): where it has none, a run with --no-sidecars writes what
// one without it does.
bool HasSidecars(const std::string& in) {
  std::error_code ec;
  const fs::path dir = fs::is_directory(in, ec) ? fs::path(in) : fs::path(in).parent_path();
  return fs::is_regular_file(dir / "config.json", ec) || fs::is_directory(dir / "tokenizer", ec) ||
         fs::is_regular_file(dir / k3pack::cli::kProfileSidecar, ec);
}

// A record's recipe as this k3pack writes it: one written before the
// recipe held "sidecars" says by its files (any but the shards) whether
// they were copied.
nlohmann::json RecordedRecipe(const nlohmann::json& record) {
  nlohmann::json recipe = record.value("recipe", nlohmann::json());
  if (!recipe.is_object() || recipe.contains("sidecars")) return recipe;
  bool copied = false;
  for (const auto& f : record.value("files", nlohmann::json::array()))
    if (f.is_string() && !f.get<std::string>().ends_with(".gguf")) copied = true;
  if (!copied) recipe["sidecars"] = false;
  return recipe;
}

std::optional<nlohmann::json> RecordIn(const std::string& out) {
  auto text = k3pack::ReadFileToString((fs::path(out) / kRepairRecordName).string());
  if (!text.ok()) return std::nullopt;
  nlohmann::json j = k3pack::ParseJsonOrDiscarded(*text);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  return j;
}

// Whether OUT holds an unfinished repair: its marker, or only the temporary
// a kill between naming it and renaming it left. *recipe: the marker's
// recipe (null when it cannot be read).
bool UnfinishedRepairIn(const std::string& out, nlohmann::json* recipe) {
  *recipe = nullptr;
  if (!k3pack::HoldsMarker(out, kRepairMarkerName)) return false;
  if (auto text = k3pack::ReadMarker(out, kRepairMarkerName)) {
    nlohmann::json j = k3pack::ParseJsonOrDiscarded(*text);
    if (j.is_object() && j.contains("k3pack_repair_in_progress")) *recipe = j["k3pack_repair_in_progress"];
  }
  return true;
}

// The command's options.
k3pack::cli::Args RepairArgs() {
  k3pack::cli::Args args(
      "repair", "IN OUT --fix ssm-a [--json] [--profile kimi-k3|scaled] [--no-sidecars]",
      "Writes a repaired copy of the shard set IN (a shard or its directory) into OUT, which must not\n"
      "exist or be empty. The input is never modified. --fix ssm-a rewrites ssm_a tensors that hold raw\n"
      "A_log as -exp(A_log); every other byte is copied unchanged (holes kept). It refuses, writing\n"
      "nothing, when an ssm_a tensor fails SGLang's check but is not unambiguously raw A_log.\n"
      "config.json and tokenizer/ beside the shards are copied too (unless --no-sidecars).");
  args.Positional("IN OUT", "input shard set, output directory", 2, 2)
      .Option("--fix", "what to repair (only: ssm-a)", std::nullopt, true)
      .Flag("--json", "print the result as JSON")
      .Flag("--no-sidecars", "do not copy config.json and tokenizer/")
      .Flag("--force", "replace the output of an earlier `k3pack repair` in OUT (never other files)");
  k3pack::cli::AddProfileOption(args);
  k3pack::cli::AddWaitOption(args);
  return args;
}

k3pack::doctor::RepairOptions RepairOptionsOf(const k3pack::cli::Args& args, k3pack::kimi::Profile profile) {
  k3pack::doctor::RepairOptions opt;
  opt.keep_marker = true;  // removed after the record (RecordRepair)
  opt.fixes = {args.Get("--fix")};
  opt.profile = profile;
  opt.copy_sidecars = !args.Has("--no-sidecars");
  if (k3pack::cli::StderrIsTty()) opt.progress = [](const std::string& s) { std::cerr << s << "\n"; };
  return opt;
}

// IN is a shard set, OUT may be written, and OUT is not IN. Reports a
// refusal and returns its exit status; 0 when both are fine.
int CheckInAndOut(const std::string& in, const std::string& out) {
  k3pack::Status in_ok = k3pack::cli::CheckGgufDir("IN", in);
  if (!in_ok.ok()) return k3pack::cli::ReportError("repair", in_ok.error());
  k3pack::Status w = k3pack::cli::CheckOutputDirWritable("OUT", out);
  if (!w.ok()) return k3pack::cli::ReportError("repair", w.error());
  std::error_code ec;
  if (fs::exists(in, ec) && fs::exists(out, ec) && fs::equivalent(in, out, ec)) {
    return k3pack::cli::ReportError(
        "repair", k3pack::Error("OUT " + out + " is the input IN; the input is never modified")
                      .WithHint("pass a new or empty directory as OUT"));
  }
  return 0;
}

// What the overwrite rule (output_rule.h) says about OUT for this repair.
// Reports a refusal and returns its exit status; 0 when *action is decided.
int DecideOutAction(const k3pack::cli::Args& args, const std::string& out, const nlohmann::json& recipe,
                    k3pack::cli::OutputAction* action) {
  using k3pack::cli::OutputAction;
  k3pack::cli::OutputSpec spec;
  spec.option = "OUT";
  spec.path = out;
  spec.directory = true;
  spec.force = args.Has("--force");
  nlohmann::json unfinished_recipe;
  const bool unfinished = UnfinishedRepairIn(out, &unfinished_recipe);
  spec.is_finished = [&]() -> k3pack::Result<bool> {
    auto rec = RecordIn(out);
    return !unfinished && rec && RecordedRecipe(*rec) == recipe;
  };
  spec.why_refused = RecordIn(out) ? "it holds the output of a `k3pack repair` of another input or with other options"
                                    : "it holds other files";
  if (unfinished && !spec.force && !unfinished_recipe.is_null() && unfinished_recipe != recipe) {
    return k3pack::cli::ReportError(
        "repair", k3pack::Error("refusing to overwrite " + out + " (OUT): it holds an unfinished repair of " +
                                    unfinished_recipe.value("input", std::string("another input")) + " (--fix " +
                                    unfinished_recipe.value("fix", std::string("?")) + ")",
                                k3pack::ErrorKind::kFileExists)
                      .WithHint("rerun that repair to finish it, pass --force to write this one over it, or pass "
                                "another OUT"));
  }
  // An unfinished repair (ours, by its marker) is finished by the rerun,
  // with or without --force.
  auto decided = unfinished ? k3pack::Result<OutputAction>(OutputAction::kResume) : k3pack::cli::DecideOutput(spec);
  if (!decided.ok() && !RecordIn(out)) {
    // Not an earlier repair's output: --force would be refused too, so the
    // hint does not offer it.
    return k3pack::cli::ReportError(
        "repair", k3pack::Error("refusing to overwrite non-empty directory " + out +
                                    " (OUT): it holds other files, not the output of an earlier `k3pack repair`",
                                k3pack::ErrorKind::kFileExists)
                      .WithHint("k3pack only replaces its own output; pass a new or empty directory as OUT"));
  }
  if (!decided.ok()) return k3pack::cli::ReportError("repair", decided.error());
  *action = *decided;
  return 0;
}

// The files the record in OUT lists (none without one).
std::vector<std::string> RecordedFilesIn(const std::string& out) {
  std::vector<std::string> files;
  if (auto rec = RecordIn(out); rec && rec->contains("files") && (*rec)["files"].is_array()) {
    for (const auto& f : (*rec)["files"]) {
      if (f.is_string()) files.push_back(f.get<std::string>());
    }
  }
  return files;
}

// What the run decided about OUT before writing anything.
struct OutDecision {
  // Held from the look at OUT to the record written last (Repair, which
  // makes a missing OUT, takes it again): two repairs into one directory, or
  // a --force beside a running repair, would leave shards of both.
  std::optional<k3pack::LockFile> lock;
  bool already_built = false;  // OUT holds this repair, finished: nothing to write
  // The files of the output a --force replaces: those the new one does not
  // write again go once the new record is written (the old shards stay
  // until each new one is renamed over it).
  std::vector<std::string> old_files;
};

// Locks OUT and decides what becomes of it. Reports a refusal and returns
// its exit status; 0 when *d is decided.
int DecideOut(const k3pack::cli::Args& args, const std::string& out, const nlohmann::json& recipe, OutDecision* d) {
  using k3pack::cli::OutputAction;
  std::error_code ec;
  if (fs::is_directory(out, ec)) {
    auto lock = k3pack::LockFile::Acquire(out, "repairing a shard set into " + out);
    if (!lock.ok()) return k3pack::cli::ReportError("repair", lock.error());
    d->lock = std::move(*lock);
  }
  OutputAction action{};
  if (int failed = DecideOutAction(args, out, recipe, &action)) return failed;
  if (action == OutputAction::kAlreadyBuilt) {
    d->already_built = true;
    return 0;
  }
  if (action == OutputAction::kReplace) {
    auto rec = RecordIn(out);
    if (!rec || !(*rec).contains("files")) {
      return k3pack::cli::ReportError(
          "repair", k3pack::Error("--force: " + out + " is not the output of an earlier `k3pack repair`")
                        .WithHint("k3pack only replaces its own output; pass a new or empty directory as OUT"));
    }
  }
  if (action == OutputAction::kReplace || action == OutputAction::kResume) {
    // (A --force run that was interrupted left the old record beside the new files.)
    d->old_files = RecordedFilesIn(out);
  }
  return 0;
}

// What this run wrote (relative to OUT).
std::set<std::string> WrittenFiles(const k3pack::doctor::RepairResult& r, const std::string& out) {
  std::set<std::string> written(r.sidecars_copied.begin(), r.sidecars_copied.end());
  for (const std::string& s : r.shards_written) {
    std::error_code rel_ec;
    written.insert(fs::relative(s, out, rel_ec).string());
  }
  return written;
}

// Copies the profile sidecar beside IN's shards into OUT (unless
// --no-sidecars); true when it was copied.
bool CopyProfileSidecar(const k3pack::cli::Args& args, const std::string& in, const std::string& out) {
  std::error_code ec;
  const fs::path in_dir = fs::is_directory(in) ? fs::path(in) : fs::path(in).parent_path();
  const fs::path side = in_dir / k3pack::cli::kProfileSidecar;
  if (args.Has("--no-sidecars") || !fs::is_regular_file(side, ec)) return false;
  auto text = k3pack::ReadFileToString(side.string());
  return text.ok() && k3pack::WriteFileAtomic((fs::path(out) / k3pack::cli::kProfileSidecar).string(), *text).ok();
}

// The new record stands: what only the replaced output had goes, then the marker.
void RemoveReplacedOutput(const std::string& out, const std::vector<std::string>& old_files,
                          const std::set<std::string>& written) {
  std::error_code ec;
  for (const std::string& f : old_files) {
    if (!written.count(f)) fs::remove(fs::path(out) / f, ec);
  }
  fs::remove(fs::path(out) / "tokenizer", ec);  // only when empty now
  fs::remove(fs::path(out) / kRepairMarkerName, ec);
  (void)k3pack::FsyncPath(out);
}

// The record of what was written (relative names), then the profile
// sidecar; then the replaced output's leftovers go. Reports a failure and
// returns its exit status.
int RecordRepair(const k3pack::cli::Args& args, const nlohmann::json& recipe, const std::vector<std::string>& old_files,
                 k3pack::kimi::Profile profile, k3pack::doctor::RepairResult* r) {
  const auto& pos = args.positionals();
  nlohmann::json files = nlohmann::json::array();
  std::set<std::string> written = WrittenFiles(*r, pos[1]);
  // Only what this run wrote (every shard and sidecar, each run writes them
  // all): a directory walk also recorded a user's file found in OUT, which
  // the next --force then removed as the old output's.
  for (const std::string& rel : written) {
    if (rel != k3pack::cli::kProfileSidecar) files.push_back(rel);  // recorded below when this run copies it
  }
  if (CopyProfileSidecar(args, pos[0], pos[1])) {
    files.push_back(k3pack::cli::kProfileSidecar);
    written.insert(k3pack::cli::kProfileSidecar);
  }
  k3pack::Status st = k3pack::WriteFileAtomic((fs::path(pos[1]) / kRepairRecordName).string(),
                                              k3pack::DumpJsonEscaped(nlohmann::json{{"recipe", recipe}, {"files", files}}) + "\n");
  if (!st.ok()) return k3pack::cli::ReportError("repair", st.error());
  RemoveReplacedOutput(pos[1], old_files, written);
  if (!old_files.empty()) {
    auto remaining = k3pack::doctor::CheckRepairedOutput(pos[1], profile);
    if (!remaining.ok()) return k3pack::cli::ReportError("repair", remaining.error());
    r->remaining_problems = std::move(*remaining);
  }
  return 0;
}

void PrintRepair(const k3pack::doctor::RepairResult& r) {
  for (const auto& t : r.repaired) {
    std::cout << "repaired " << t.name << " (" << t.before.count << " values, were in [" << t.before.min << ", "
              << t.before.max << "]) -> -exp(A_log) in " << t.file << "\n";
  }
  std::cout << "wrote " << r.shards_written.size() << " shard(s)";
  if (!r.sidecars_copied.empty()) std::cout << " + " << r.sidecars_copied.size() << " sidecar file(s)";
  std::cout << " to " << r.out_dir << "\n";
  if (!r.remaining_problems.empty()) {
    std::cout << "still reported by doctor (not touched by this fix):\n";
    for (const auto& p : r.remaining_problems) std::cout << "  " << p << "\n";
  }
}

int RunRepair(const std::vector<std::string>& argv) {
  k3pack::cli::Args args = RepairArgs();
  int code = 0;
  if (!args.Parse(argv, &code)) return code;
  auto wait = k3pack::cli::LockWaitOf(args, "repair");
  if (!wait.ok()) return k3pack::cli::ReportError("repair", wait.error(), k3pack::cli::kExitUsage);
  const k3pack::ScopedLockWait waiting(*wait);
  auto profile = k3pack::cli::ResolveProfile(args, {args.positionals()[0]});
  if (!profile.ok()) return k3pack::cli::ReportError("repair", profile.error(), k3pack::cli::ProfileErrorExit(args));
  if (args.Get("--fix") != "ssm-a") {
    return k3pack::cli::ReportError("repair", k3pack::Error("unknown --fix '" + args.Get("--fix") + "' (available: ssm-a)"),
                                    k3pack::cli::kExitUsage);
  }
  const k3pack::doctor::RepairOptions opt = RepairOptionsOf(args, *profile);
  const auto& pos = args.positionals();
  // The copy is marked as this command's until its record is written: the rerun finishes it.
  k3pack::cli::StopOnSignals("repair", pos[1] + " holds an unfinished copy: rerun the same command to finish it");
  const nlohmann::json recipe = Recipe(pos[0], args.Get("--fix"), !args.Has("--no-sidecars") && HasSidecars(pos[0]));
  if (int failed = CheckInAndOut(pos[0], pos[1])) return failed;
  OutDecision out;
  if (int failed = DecideOut(args, pos[1], recipe, &out)) return failed;
  if (out.already_built) {
    k3pack::cli::ReportAlreadyBuilt("repair", pos[1], args.Has("--json"), "out_dir");
    return k3pack::cli::kExitOk;
  }
  auto r = k3pack::doctor::Repair(pos[0], pos[1], opt);
  if (!r.ok()) return k3pack::cli::ReportError("repair", r.error(), 1);
  if (int failed = RecordRepair(args, recipe, out.old_files, opt.profile, &*r)) return failed;
  if (args.Has("--json")) {
    k3pack::cli::PrintJson(r->ToJson());
    return 0;
  }
  PrintRepair(*r);
  return 0;
}

}  // namespace

K3_COMMAND("repair", "write a repaired copy of a shard set (--fix ssm-a: raw A_log -> -exp(A_log))", RunRepair);
