// Diagnose(): runs every check group on every input and keeps going past
// problems, so one run lists everything that is wrong.
#include <algorithm>
#include <filesystem>
#include <set>

#include "doctor/internal.h"

namespace k3pack::doctor {

namespace fs = std::filesystem;

namespace {

void Mark(Report& r, const std::string& name, bool ran, const std::string& note = {}) {
  for (CheckRun& c : r.checks) {
    if (c.name == name) {
      c.ran = c.ran || ran;
      if (!note.empty()) c.note = note;
      return;
    }
  }
  r.checks.push_back({name, ran, note});
}

bool LooksLikeJson(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  if (fs::path(path).extension() == ".json") return true;
  auto fd = OpenReadOnly(path);
  if (!fd.ok()) return false;
  char c = 0;
  auto n = PreadFull(fd->get(), &c, 1, 0);
  return n.ok() && *n == 1 && c == '{';
}

// Records a shard directory the report covers (absolute, once).
void AddShardDir(Report& r, const std::string& dir) {
  std::error_code ec;
  fs::path p = fs::absolute(dir.empty() ? "." : dir, ec);
  const std::string shown = (ec ? fs::path(dir) : p).lexically_normal().string();
  std::string trimmed = shown.size() > 1 && shown.back() == '/' ? shown.substr(0, shown.size() - 1) : shown;
  if (std::find(r.shard_dirs.begin(), r.shard_dirs.end(), trimmed) == r.shard_dirs.end()) r.shard_dirs.push_back(trimmed);
}

void ExamineView(const internal::ShardView& view, const DiagnoseOptions& options, internal::Collector& out) {
  auto say = [&](const std::string& s) {
    if (options.progress) options.progress(s);
  };
  internal::CheckSplit(view, out);
  internal::CheckStringsAreUtf8(view, out);
  internal::CheckRenamedShards(view, out);
  Mark(out.report(), "split", true);
  say("doctor: checking names, shapes and types");
  internal::ModelContext model = internal::CheckModel(view, options, out);
  Mark(out.report(), "spec", model.spec.has_value(), model.spec ? "" : "no usable model spec");
  Mark(out.report(), "names", !model.expected.empty(),
       model.expected.empty() ? "no kimi-k3.* layout; only SGLang's name table was applied" : "");
  internal::CheckExperts(view, model, options, out);
  Mark(out.report(), "experts", model.spec.has_value() || model.dims.has_value());
  if (options.check_values || options.check_ssm_a) {
    say(options.check_values ? "doctor: checking tensor values" : "doctor: checking ssm_a values");
    internal::CheckValues(view, model, out, options.value_progress, /*ssm_a_only=*/!options.check_values);
  }
  Mark(out.report(), "values", options.check_values || options.check_ssm_a,
       options.check_values ? "" : options.check_ssm_a ? "ssm_a only" : "disabled");
}

void ExamineGguf(const std::string& path, const DiagnoseOptions& options, internal::Collector& out) {
  if (options.progress) options.progress("doctor: examining " + path);
  auto view = internal::DiscoverAndOpen(path, out);
  Mark(out.report(), "files", view.has_value());
  if (view) AddShardDir(out.report(), view->dir);
  if (view) ExamineView(*view, options, out);
}

// A manifest's shards: the files it lists, in its order (what the loader
// opens), not a discovery of their directory, which may hold other files.
void ExamineListed(const internal::ManifestTargets& t, const DiagnoseOptions& options, internal::Collector& out) {
  if (options.progress) options.progress("doctor: examining the manifest's " + std::to_string(t.shard_paths.size()) + " shards");
  auto view = internal::OpenListed(t.shard_paths, out);
  Mark(out.report(), "files", view.has_value());
  if (!view) return;
  DiagnoseOptions o = options;
  if (o.config_path.empty()) o.config_path = t.config_path;  // the config the manifest was made with
  if (o.tokenizer_dir.empty()) o.tokenizer_dir = t.tokenizer_dir;  // where SGLang's server reads its config
  ExamineView(*view, o, out);
}

}  // namespace

Report Diagnose(const std::vector<std::string>& paths, const DiagnoseOptions& options) {
  Report report;
  report.inputs = paths;
  report.profile = options.profile;
  internal::Collector out(&report);
  std::set<std::string> examined;
  for (const std::string& path : paths) {
    std::error_code ec;
    if (LooksLikeJson(path)) {
      internal::ManifestTargets targets = internal::CheckManifest(path, options, out);
      Mark(report, "manifest", true);
      if (targets.shard_paths.empty()) continue;
      // The shards the manifest records, wherever they are (not the manifest's directory).
      for (const std::string& s : targets.shard_paths) AddShardDir(report, fs::path(s).parent_path().string());
      const std::string key = fs::weakly_canonical(targets.shard_paths.front(), ec).parent_path().string();
      if (!examined.insert(key).second) continue;
      ExamineListed(targets, options, out);
      continue;
    }
    const std::string key = fs::weakly_canonical(path, ec).string();
    if (!examined.insert(fs::is_directory(key, ec) ? key : fs::path(key).parent_path().string()).second) continue;
    ExamineGguf(path, options, out);
  }
  // One finding per (code, object, file, message) even when inputs overlap
  // (two keys of one config can disagree with one GGUF key).
  std::set<std::tuple<std::string, std::string, std::string, std::string>> seen;
  std::vector<Finding> unique;
  for (Finding& f : report.findings) {
    if (seen.insert({f.code, f.object, f.file, f.message}).second) unique.push_back(std::move(f));
  }
  report.findings = std::move(unique);
  std::stable_sort(report.findings.begin(), report.findings.end(),
                   [](const Finding& a, const Finding& b) { return a.severity < b.severity; });
  return report;
}

}  // namespace k3pack::doctor
