// Report rendering (text for people, JSON for machines) and the small
// helpers every check group uses.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <sstream>
#include <string_view>
#include <tuple>

#include "doctor/internal.h"
#include "util/process_limits.h"
#include "util/pyrepr.h"
#include "util/utf8.h"

namespace k3pack::doctor {

namespace internal {

Finding& Collector::Add(std::string_view code, std::string object, std::string message, std::string sglang_error,
                        std::string file) {
  Finding f;
  const Diagnosis* d = FindDiagnosis(code);
  f.code = std::string(code);
  if (d != nullptr) {
    f.severity = d->severity;
    f.meaning = d->meaning;
    f.fix = d->fix;
    if (!sglang_error.empty()) f.sglang_exception = d->sglang_exception;
  } else {
    // A code missing from the catalog is a doctor bug; keep it visible.
    f.severity = Severity::kError;
    f.meaning = "(undocumented diagnosis)";
  }
  f.object = std::move(object);
  f.message = std::move(message);
  f.sglang_error = std::move(sglang_error);
  f.file = std::move(file);
  report_->findings.push_back(std::move(f));
  return report_->findings.back();
}

bool IsOpenFileLimit(int err) { return err == EMFILE || err == ENFILE; }

bool ReportProcessCannotRead(const Error& e, const std::string& path, Collector& out) {
  const int err = e.sys_errno();
  if (!IsProcessCannotRead(err)) return false;
  const char* code = err == EACCES || err == EPERM ? "file-permission-denied"
                     : IsOpenFileLimit(err)         ? "open-file-limit"
                                                    : "out-of-memory";
  // Python's open() raises the same text (OSError's str) for each of them;
  // its mmap (gguf-py's reader) names no file.
  std::string python = "[Errno " + std::to_string(err) + "] " + std::strerror(err);
  if (err != ENOMEM) python += ": " + PyRepr(path);
  out.Add(code, path, e.message(), python, path).details["errno"] = err;
  return true;
}

std::string FileNamedIn(const Error& e, const std::vector<std::string>& files, const std::string& otherwise) {
  const std::string& m = e.message();
  for (const std::string& file : files) {
    const size_t at = m.find(" " + file + ": ");
    if (at != std::string::npos && at < m.find('\n')) return file;
  }
  return otherwise;
}

std::string NumpyShapeRepr(const std::vector<int64_t>& ne) {
  std::string s = "(";
  for (size_t i = 0; i < ne.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(ne[ne.size() - 1 - i]);
  }
  if (ne.size() == 1) s += ",";
  return s + ")";
}

std::string NeList(const std::vector<int64_t>& ne) {
  std::string s = "{";
  for (size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "}";
}

}  // namespace internal

size_t Report::Count(Severity s) const {
  return static_cast<size_t>(std::count_if(findings.begin(), findings.end(), [&](const Finding& f) { return f.severity == s; }));
}

// One exit-code rule for every command: 1 = the input is bad (unusable input
// included; the JSON status tells the two apart), 2 is left to usage errors.
int Report::ExitCode() const { return unusable || Count(Severity::kError) > 0 ? 1 : 0; }

bool Report::Has(std::string_view code) const {
  return std::any_of(findings.begin(), findings.end(), [&](const Finding& f) { return f.code == code; });
}

std::vector<const Finding*> Report::With(std::string_view code) const {
  std::vector<const Finding*> out;
  for (const Finding& f : findings) {
    if (f.code == code) out.push_back(&f);
  }
  return out;
}

nlohmann::json Report::ToJson() const {
  nlohmann::json j;
  j["schema"] = kReportSchema;
  j["inputs"] = inputs;
  j["profile"] = kimi::ProfileName(profile);
  const int code = ExitCode();
  j["status"] = code == 0 ? "healthy" : unusable ? "unusable" : "problems";
  j["exit_code"] = code;
  j["summary"] = {{"errors", Count(Severity::kError)},
                  {"warnings", Count(Severity::kWarning)},
                  {"info", Count(Severity::kInfo)},
                  {"files", files.size()},
                  {"tensors", tensors_examined}};
  j["files"] = files;
  j["shard_dirs"] = shard_dirs;
  nlohmann::json cj = nlohmann::json::array();
  for (const CheckRun& c : checks) {
    cj.push_back({{"name", c.name}, {"ran", c.ran}, {"note", c.note}});
  }
  j["checks"] = cj;
  nlohmann::json fs = nlohmann::json::array();
  for (const Finding& f : findings) {
    nlohmann::json entry = {{"severity", SeverityName(f.severity)},
                            {"code", f.code},
                            {"object", f.object},
                            {"file", f.file},
                            {"message", f.message},
                            {"sglang_error", f.sglang_error},
                            {"sglang_exception", f.sglang_exception},
                            {"meaning", f.meaning},
                            {"fix", f.fix},
                            {"details", f.details}};
    // GGUF keys, values and tensor names are bytes: a finding that quotes
    // one that is not UTF-8 shows it escaped (\xNN) and lists the fields.
    if (auto bad = EscapeInvalidUtf8Members(entry); !bad.empty()) entry["not_utf8"] = bad;
    fs.push_back(std::move(entry));
  }
  j["findings"] = fs;
  // Paths (inputs, files, notes) may hold any bytes too.
  if (auto bad = EscapeInvalidUtf8Members(j); !bad.empty()) j["not_utf8"] = bad;
  return j;
}

std::string Report::ToText() const {
  std::ostringstream os;
  const char* labels[] = {"ERROR", "WARNING", "INFO"};
  // Text that is not UTF-8 (from GGUF bytes) is shown escaped and marked.
  auto shown = [](const std::string& s) {
    return IsValidUtf8(s) ? s : EscapeInvalidUtf8(s) + " (not UTF-8; shown with \\xNN escapes)";
  };
  // Findings of one code are grouped: the explanation is printed once, with
  // the count and the first few objects, instead of once per tensor.
  constexpr size_t kShown = 5;
  // In the order each group first appears; one pass with an index (a scan
  // of the later findings for each took minutes for 100,000 of them).
  std::vector<std::vector<const Finding*>> groups;
  std::map<std::tuple<std::string_view, Severity, std::string_view>, size_t> group_of;
  for (const Finding& f : findings) {
    auto [it, fresh] = group_of.try_emplace({f.code, f.severity, f.sglang_error}, groups.size());
    if (fresh) groups.emplace_back();
    groups[it->second].push_back(&f);
  }
  for (const std::vector<const Finding*>& group : groups) {
    const Finding& f = *group.front();
    os << labels[static_cast<int>(f.severity)] << " [" << f.code << "] ";
    if (group.size() == 1) {
      os << shown(f.object) << "\n";
      if (!f.file.empty() && f.file != f.object) os << "  file:    " << shown(f.file) << "\n";
      if (!f.message.empty()) os << "  found:   " << shown(f.message) << "\n";
    } else {
      os << group.size() << " objects, first " << std::min(kShown, group.size()) << ":";
      for (size_t k = 0; k < group.size() && k < kShown; ++k) os << (k ? ", " : " ") << shown(group[k]->object);
      os << "\n";
      std::vector<std::string> texts;  // distinct texts only: "stored as BF16" once, not five times
      for (size_t k = 0; k < group.size() && k < kShown; ++k) {
        const std::string& msg = group[k]->message;
        if (!msg.empty() && std::find(texts.begin(), texts.end(), msg) == texts.end()) {
          texts.push_back(msg);
          os << "  found:   " << shown(msg) << "\n";
        }
      }
      if (group.size() > kShown) os << "  ...      " << group.size() - kShown << " more (all listed by --json)\n";
    }
    if (!f.sglang_error.empty()) {
      os << "  SGLang:  " << (f.sglang_exception.empty() ? "" : f.sglang_exception + ": ") << shown(f.sglang_error)
         << "\n";
    }
    os << "  means:   " << f.meaning << "\n";
    os << "  fix:     " << shown(f.fix) << "\n\n";
  }
  const size_t e = Count(Severity::kError), w = Count(Severity::kWarning);
  for (const std::string& d : shard_dirs) os << "shards checked in " << shown(d) << "\n";
  os << "checked " << files.size() << " file(s), " << tensors_examined << " tensor(s); ";
  for (const CheckRun& c : checks) {
    if (!c.ran) os << "[" << c.name << " skipped] ";
  }
  if (unusable) {
    os << "input unusable\n";
  } else if (e == 0) {
    os << "healthy" << (w ? " (" + std::to_string(w) + " warning(s))" : std::string()) << "\n";
  } else {
    os << e << " error(s), " << w << " warning(s)\n";
  }
  return os.str();
}

}  // namespace k3pack::doctor
