#include "cli/command.h"
#include "k3pack/pack.h"
#include "util/edit_distance.h"
#include "util/utf8.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>

namespace k3pack::cli {

namespace {

// Counts what goes through std::cout, so an error can tell whether the
// command already printed its JSON.
class CountingBuf : public std::streambuf {
 public:
  explicit CountingBuf(std::streambuf* inner) : inner_(inner) {}
  uint64_t count() const { return count_; }

 protected:
  int_type overflow(int_type c) override {
    if (traits_type::eq_int_type(c, traits_type::eof())) return traits_type::not_eof(c);
    Taken();
    ++count_;
    return inner_->sputc(traits_type::to_char_type(c));
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    if (n > 0) Taken();
    count_ += static_cast<uint64_t>(n);
    return inner_->sputn(s, n);
  }
  int sync() override { return inner_->pubsync(); }

 private:
  // The command's own JSON has begun: a stop no longer adds the error object.
  void Taken() {
    if (count_ == 0) StdoutTaken();
  }
  std::streambuf* inner_;
  uint64_t count_ = 0;
};

// Set once a command's arguments ask for --json: a script reading stdout then
// gets a JSON object for an error too (not an empty stdout), unless the
// command already printed its JSON (doctor's report, "already built").
CountingBuf* g_json_stdout = nullptr;

}  // namespace

bool AsksForJson(const std::vector<std::string>& args) {
  // `--json=1` asks too: the script that wrote it reads stdout as JSON, and
  // the usage error ("--json takes no value") is what it must get there.
  const auto options_end = std::find(args.begin(), args.end(), "--");
  return std::any_of(args.begin(), options_end,
                     [](const std::string& a) { return a == "--json" || a.starts_with("--json="); });
}

namespace {

void ExpectJsonOutput() {
  if (g_json_stdout) return;
  // Never destroyed: std::cout is flushed by the runtime after every static
  // object is gone, and must still find its buffer then.
  g_json_stdout = new CountingBuf(std::cout.rdbuf());
  std::cout.rdbuf(g_json_stdout);
}

// README: `command`, `error` = the first line, `message`, `error_kind`,
// `exit_code`, and `hint` and `errno` when the error has them.
nlohmann::json JsonError(const std::string& command, const Error& error, int exit_code) {
  nlohmann::json j = {{"command", command},
                      {"error", error.headline()},
                      {"message", error.message()},
                      {"error_kind", ErrorKindName(error.kind())},
                      {"exit_code", exit_code}};
  if (const std::string hint = error.hint(); !hint.empty()) j["hint"] = hint;
  if (error.sys_errno() != 0) j["errno"] = error.sys_errno();
  return j;
}

void PrintJsonError(const std::string& command, const Error& error, int exit_code) {
  if (!g_json_stdout || g_json_stdout->count() > 0) return;
  PrintJson(JsonError(command, error, exit_code));
}

// What a stop signal ends the running command with (StopOnSignals); the
// report is made again when Parse learns that stdout is JSON.
struct StopAdvice {
  std::string command, advice;
};
std::optional<StopAdvice> g_stop_advice;
// --progress json: Narrate writes JSON objects.
bool g_narrate_json = false;

void InstallStopReport(const StopAdvice& a) {
  // The same error a stopped copy returns (errno EINTR), so --json reads alike.
  const Error error("interrupted; " + a.advice, ErrorKind::kOS, EINTR);
  StopReport report;
  report.line = "k3pack " + a.command + ": " + error.message();
  if (g_json_stdout) {
    report.stdout_on_sigint = DumpJsonEscaped(JsonError(a.command, error, kExitInterrupted)) + "\n";
    report.stdout_on_sigterm = DumpJsonEscaped(JsonError(a.command, error, kExitTerminated)) + "\n";
  }
  ExitOnStopSignals(report);
}

// Every command's stop handling is in place once its words parsed, before
// its first step. Test seam: K3PACK_TEST_STOP_AT_START=1 then makes the
// process stop itself (SIGSTOP), so a test can send a real signal there.
void StopOnSignalsFromHere(const std::string& command) {
  // What the command said before its words parsed stands (pack, build).
  if (!g_stop_advice || g_stop_advice->command != command) g_stop_advice = StopAdvice{command, kNothingToResume};
  InstallStopReport(*g_stop_advice);
  const char* seam = std::getenv("K3PACK_TEST_STOP_AT_START");
  if (seam != nullptr && std::string(seam) == "1") ::raise(SIGSTOP);
}

}  // namespace

Args& Args::Option(const std::string& name, const std::string& help, std::optional<std::string> def, bool required) {
  specs_[name] = {help, std::move(def), required, false};
  order_.push_back(name);
  return *this;
}

Args& Args::Repeatable(const std::string& name) {
  specs_.at(name).repeatable = true;
  return *this;
}

Args& Args::Flag(const std::string& name, const std::string& help) {
  specs_[name] = {help, std::nullopt, false, true};
  order_.push_back(name);
  return *this;
}

Args& Args::Positional(const std::string& metavar, const std::string& help, int min, int max) {
  pos_name_ = metavar;
  pos_help_ = help;
  pos_min_ = min;
  pos_max_ = max;
  return *this;
}

Args& Args::Deprecated(const std::string& old_name, const std::string& name) {
  deprecated_[old_name] = name;
  return *this;
}

Args& Args::PositionalAsOption(const std::string& name) {
  positional_option_ = name;
  return *this;
}

Args& Args::Exclusive(std::vector<std::string> names, std::string why) {
  exclusive_.push_back({std::move(names), std::move(why)});
  return *this;
}

Args& Args::Requires(std::string name, std::vector<std::string> needs, std::string why) {
  requires_.push_back({std::move(name), std::move(needs), std::move(why), std::nullopt});
  return *this;
}

Args& Args::RequiresValueOtherThan(std::string name, std::string companion, std::string inert, std::string why) {
  requires_.push_back({std::move(name), {std::move(companion)}, std::move(why), std::move(inert)});
  return *this;
}

namespace {

// "--a and --b", "--a, --b and --c" (or "--a or --b" with `last` " or ").
std::string AndList(const std::vector<std::string>& names, const char* last = " and ") {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) {
    s += (i == 0 ? "" : i + 1 == names.size() ? last : ", ") + names[i];
  }
  return s;
}

// The same value, as text or, when both read whole as numbers, as numbers
// ("0" and "0.0", "1" and "01").
bool SameValue(const std::string& a, const std::string& b) {
  if (a == b) return true;
  auto number = [](const std::string& s, double* out) {
    if (s.empty()) return false;
    char* end = nullptr;
    *out = std::strtod(s.c_str(), &end);
    return end == s.c_str() + s.size();
  };
  double x = 0, y = 0;
  return number(a, &x) && number(b, &y) && x == y;
}

// What a requirement reads in the help and the refusal: "--x or --y", or
// "--prefetch other than none".
std::string NeedsText(const std::vector<std::string>& needs, const std::optional<std::string>& inert) {
  return AndList(needs, " or ") + (inert ? " other than " + *inert : "");
}

}  // namespace

bool Args::Satisfies(const Requirement& r) const {
  if (r.inert) {
    const std::optional<std::string> v = GetOpt(r.needs.front());
    return v.has_value() && !SameValue(*v, *r.inert);
  }
  return std::any_of(r.needs.begin(), r.needs.end(), [&](const std::string& n) { return values_.count(n) > 0; });
}

std::string Args::Usage() const {
  // A help text's own line breaks keep its indent (not column 0).
  auto indented = [](std::string text) {
    for (size_t at = text.find('\n'); at != std::string::npos; at = text.find('\n', at + 1)) text.insert(at + 1, 6, ' ');
    return text;
  };
  std::ostringstream os;
  os << "usage: k3pack " << command_ << " " << usage_ << "\n\n" << description_ << "\n";
  if (!pos_name_.empty()) os << "\n  " << pos_name_ << "\n      " << indented(pos_help_) << "\n";
  if (!order_.empty()) os << "\noptions:\n";
  for (const auto& name : order_) {
    const Spec& s = specs_.at(name);
    os << "  " << name << (s.is_flag ? "" : " VALUE") << "\n      " << indented(s.help);
    if (name == positional_option_) os << " (or give it as the argument)";
    if (s.required) os << " (required)";
    if (s.repeatable) os << " (repeatable)";
    if (s.def && !s.def->empty()) os << " [default: " << *s.def << "]";
    os << "\n";
  }
  os << "  --help\n      show this help and exit\n";
  if (!exclusive_.empty()) {
    // One line, not indented: the help generator reads indented "--" lines as options.
    os << "\nnot together:";
    const char* sep = " ";
    for (const ExclusiveGroup& g : exclusive_) {
      os << sep << AndList(g.names);
      sep = "; ";
    }
    os << "\n";
  }
  if (!requires_.empty()) {
    // Also one line; options that need the same companion are listed together
    // ("--a and --b need --timing"), so a command with many reads short.
    os << "\nneeds:";
    const char* sep = " ";
    for (size_t i = 0; i < requires_.size();) {
      std::vector<std::string> names;
      size_t j = i;
      auto same = [&](const Requirement& a, const Requirement& b) { return a.needs == b.needs && a.inert == b.inert; };
      for (; j < requires_.size() && same(requires_[j], requires_[i]); ++j) names.push_back(requires_[j].name);
      os << sep << AndList(names) << (names.size() > 1 ? " need " : " needs ")
         << NeedsText(requires_[i].needs, requires_[i].inert);
      sep = "; ";
      i = j;
    }
    os << "\n";
  }
  if (!deprecated_.empty()) {
    os << "\ndeprecated spellings (still accepted):";
    const char* sep = " ";
    for (const auto& [old_name, name] : deprecated_) {
      os << sep << old_name << " = " << name;
      sep = "; ";
    }
    os << "\n";
  }
  return os.str();
}

std::string Args::Suggest(const std::string& word) const {
  // The nearest option name within two edits, or the only one that starts
  // with `word`: "--sampels" -> "--samples", "-json" -> "--json".
  std::string best;
  size_t best_d = 3, prefixed = 0;
  std::string prefix_match;
  auto consider = [&](const std::string& name) {
    if (name.rfind(word, 0) == 0 && word.size() > 2) {
      ++prefixed;
      prefix_match = name;
    }
    const size_t d = EditDistance(word, name);
    if (d < best_d) best_d = d, best = name;
  };
  for (const auto& [name, spec] : specs_) consider(name);
  for (const auto& [old_name, name] : deprecated_) consider(old_name);
  consider("--help");
  if (!best.empty()) return best;
  return prefixed == 1 ? prefix_match : "";
}

bool Args::Parse(const std::vector<std::string>& argv, int* exit_code) {
  g_narrate_json = false;  // this parse's --progress decides, not an earlier one's
  const bool parsed = ParseWords(argv, exit_code);
  if (parsed) g_narrate_json = specs_.contains("--progress") && Get("--progress") == "json";
  for (const std::string& note : notes_) Narrate(command_, "note: " + note);
  if (!parsed) return false;
  StopOnSignalsFromHere(command_);
  return true;
}

bool Args::ParseWords(const std::vector<std::string>& argv, int* exit_code) {
  // `--` ends the options (POSIX): every word after it is an argument, so a
  // path that starts with "-" can be given (`k3pack inspect -- --odd-name`).
  // Also for a command without --json (completion): its error is then JSON.
  if (AsksForJson(argv)) ExpectJsonOutput();
  auto fail = [&](const std::string& msg) {
    // The notes of the words before the fault come first, as text.
    for (const std::string& note : notes_) std::cerr << "k3pack " << command_ << ": note: " << note << "\n";
    notes_.clear();
    std::cerr << "k3pack " << command_ << ": error: " << msg << "\n"
              << "usage: k3pack " << command_ << " " << usage_ << "\n"
              << "(run `k3pack " << command_ << " --help` for details)\n";
    *exit_code = 2;
    PrintJsonError(command_, Error(msg), *exit_code);
    return false;
  };
  bool options_done = false;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (!options_done && a == "--") {
      options_done = true;
      positionals_before_dashdash_ = positionals_.size();
      continue;
    }
    if (!options_done && (a == "--help" || a == "-h")) {
      notes_.clear();  // the help is the answer; it lists the spellings
      std::cout << Usage();
      *exit_code = 0;
      return false;
    }
    if (!options_done && a.size() > 2 && a.rfind("--", 0) == 0) {
      if (std::string error = TakeOption(argv, &i); !error.empty()) return fail(error);
      continue;
    }
    if (a.empty()) return fail("an argument is empty (an unset shell variable?); give the path or value itself");
    positionals_.push_back(a);
  }
  // In order: the positional option moves an argument the later checks count.
  if (std::string error = TakePositionalOption(); !error.empty()) return fail(error);
  if (std::string error = CheckCombinations(); !error.empty()) return fail(error);
  if (std::string error = CheckPositionalCount(); !error.empty()) return fail(error);
  return true;
}

bool Args::IsOptionName(const std::string& word) const {
  const std::string name = word.substr(0, word.find('='));
  return name == "--help" || specs_.count(name) > 0 || deprecated_.count(name) > 0;
}

std::string Args::TakeOption(const std::vector<std::string>& argv, size_t* i) {
  const std::string& a = argv[*i];
  std::string name = a, value;
  bool inline_value = false;
  if (auto eq = a.find('='); eq != std::string::npos) {
    name = a.substr(0, eq);
    value = a.substr(eq + 1);
    inline_value = true;
  }
  const std::string spelling = name;
  if (auto dep = deprecated_.find(name); dep != deprecated_.end()) {
    // Told once the words parsed: only then is it known whether notes are
    // JSON objects (--progress json may come later on the line).
    notes_.push_back(name + " is deprecated; use " + dep->second);
    name = dep->second;
  }
  auto it = specs_.find(name);
  if (it == specs_.end()) {
    const std::string near = Suggest(name);
    return "unknown option " + name + (near.empty() ? "" : " (did you mean " + near + "?)");
  }
  const Spec& spec = it->second;
  if (spec.is_flag && inline_value) return name + " takes no value";
  if (!spec.is_flag && !inline_value) {
    if (*i + 1 >= argv.size()) return name + " needs a value";
    // `--out --force` is a forgotten value, not a directory named
    // "--force": this command's own option names are never taken as a
    // value unless attached (`--out=--force`).
    if (IsOptionName(argv[*i + 1])) {
      return name + " needs a value, but the next argument is the option " + argv[*i + 1] + " (write " + name + "=" +
             argv[*i + 1] + " if that is the value)";
    }
    value = argv[++*i];
  }
  // An empty value is almost always an unset shell variable
  // (`--out "$DIR"`); taken as given it read as "no option" or as the
  // current directory.
  if (!spec.is_flag && value.empty()) return name + " needs a value, but an empty one was given";
  if (spec.is_flag) value = "1";
  if (spec.repeatable) all_values_[name].push_back(value);
  if (auto seen = spelled_.find(name); seen != spelled_.end()) {
    // Never "last one wins": a repeated option is a typo or two scripts'
    // arguments glued together, and either value could be the meant one.
    if (spec.repeatable || values_.at(name) == value) return "";  // a flag, or the same value again
    if (seen->second != spelling) {
      const std::string& older = deprecated_.count(spelling) ? spelling : seen->second;
      return older + " and " + name + " are the same option, given as '" + values_.at(name) + "' and '" + value +
             "'; give it once";
    }
    return name + " given twice, as '" + values_.at(name) + "' and '" + value + "'; give it once";
  }
  spelled_[name] = spelling;
  values_[name] = value;
  return "";
}

std::string Args::TakePositionalOption() {
  if (positional_option_.empty() || positionals_.empty() || !pos_name_.empty()) return "";
  // The same value twice is fine, as for any option.
  if (values_.count(positional_option_) && values_.at(positional_option_) != positionals_.front()) {
    return "both " + positional_option_ + " " + values_.at(positional_option_) + " and the argument " +
           positionals_.front() + " given; give one";
  }
  values_[positional_option_] = positionals_.front();
  positionals_.erase(positionals_.begin());
  if (positionals_before_dashdash_ != SIZE_MAX && positionals_before_dashdash_ > 0) --positionals_before_dashdash_;
  return "";
}

std::string Args::CheckCombinations() const {
  for (const ExclusiveGroup& g : exclusive_) {
    std::vector<std::string> given;
    for (const std::string& n : g.names) {
      if (values_.count(n)) given.push_back(n);
    }
    if (given.size() > 1) return AndList(given) + " cannot be used together" + (g.why.empty() ? "" : ": " + g.why);
  }
  for (const Requirement& r : requires_) {
    if (!values_.count(r.name) || Satisfies(r)) continue;
    std::string msg = r.name + " needs " + NeedsText(r.needs, r.inert) + (r.why.empty() ? "" : " (" + r.why + ")");
    if (r.inert) {
      // Name the value that makes it meaningless, and where it came from.
      const std::string& companion = r.needs.front();
      if (values_.count(companion)) {
        msg += ", but " + companion + " " + values_.at(companion) + " was given";
      } else if (GetOpt(companion)) {
        msg += ", but " + companion + " is " + Get(companion) + " by default";
      } else {
        msg += ", but " + companion + " was not given";
      }
    }
    return msg;
  }
  for (const auto& [name, spec] : specs_) {
    if (spec.required && !values_.count(name)) return "missing required option " + name;
  }
  return "";
}

std::string Args::CheckPositionalCount() const {
  const int n = static_cast<int>(positionals_.size());
  if (n < pos_min_) {
    if (pos_name_.empty()) return "missing argument";
    // "FILE_OR_DIR NAME" with one given: name the one that is missing.
    std::vector<std::string> names;
    std::istringstream words(pos_name_);
    for (std::string w; words >> w;) names.push_back(w);
    if (n > 0 && static_cast<int>(names.size()) == pos_min_) {
      std::string missing;
      for (int i = n; i < pos_min_; ++i) missing += (missing.empty() ? "" : " ") + names[size_t(i)];
      return "missing " + missing + " (after " + names[size_t(n - 1)] + " " + positionals_.back() + ")";
    }
    return "missing " + pos_name_;
  }
  if (pos_max_ >= 0 && n > pos_max_) {
    const std::string& extra = positionals_[pos_max_];
    if (static_cast<size_t>(pos_max_) >= positionals_before_dashdash_ && extra.size() > 1 && extra[0] == '-') {
      // "--full" after `--` is an argument by the rule, not a misspelt option.
      return "unexpected argument " + extra + " (after `--` every word is an argument; give options before `--`)";
    }
    const std::string near = extra.size() > 1 && extra[0] == '-' ? Suggest("-" + extra) : "";
    return "unexpected argument " + extra + (near.empty() ? "" : " (did you mean " + near + "?)");
  }
  return "";
}

bool Args::Has(const std::string& name) const { return values_.count(name) > 0; }

std::optional<std::string> Args::GetOpt(const std::string& name) const {
  if (auto it = values_.find(name); it != values_.end()) return it->second;
  if (auto it = specs_.find(name); it != specs_.end() && it->second.def) return it->second.def;
  return std::nullopt;
}

std::vector<std::string> Args::GetAll(const std::string& name) const {
  auto it = all_values_.find(name);
  return it == all_values_.end() ? std::vector<std::string>{} : it->second;
}

std::string Args::Get(const std::string& name) const { return GetOpt(name).value_or(""); }

void Args::Set(const std::string& name, std::string value) {
  if (auto given = values_.find(name); given != values_.end()) {
    given->second = std::move(value);
  } else if (auto it = specs_.find(name); it != specs_.end()) {
    it->second.def = std::move(value);
  }
}

Result<int64_t> Args::GetInt(const std::string& name) const {
  std::string v = Get(name);
  int64_t out = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (!v.empty() && p == v.data() + v.size() && ec == std::errc::result_out_of_range)
    return Error(name + " is out of range, got '" + v + "' (an integer from -2^63 to 2^63-1)");
  if (v.empty() || ec != std::errc() || p != v.data() + v.size())
    return Error(name + " must be an integer, got '" + v + "'");
  return out;
}

Result<double> Args::GetDouble(const std::string& name) const {
  std::string v = Get(name);
  Error bad(name + " must be a number, got '" + v + "'");
  // Plain decimal only, as GetInt: strtod also took "+7", "0x10" (16) and
  // leading blanks, which the README says are refused.
  double d = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), d, std::chars_format::general);
  if (v.empty() || p != v.data() + v.size()) return bad;
  // nan and inf parse, but no option means them: NaN passes every range
  // check written as `x < 0` (a Zipf skew of NaN never finishes drawing, a
  // timing of NaN prints a table of nan), and inf overflows every
  // conversion to bytes.
  if (ec == std::errc::result_out_of_range)
    return Error(name + " is out of range, got '" + v + "' (a finite double)");
  if (ec != std::errc()) return bad;
  if (!std::isfinite(d)) return Error(name + " must be a finite number, got '" + v + "'");
  return d;
}

static std::map<std::string, CommandInfo>& Registry() {
  static std::map<std::string, CommandInfo> r;
  return r;
}

bool RegisterCommand(CommandInfo info) {
  Registry()[info.name] = std::move(info);
  return true;
}

const std::map<std::string, CommandInfo>& Commands() { return Registry(); }

int ReportError(const std::string& command, const Error& error, int exit_code) {
  std::cerr << "k3pack " << command << ": error: " << error.message() << "\n";
  PrintJsonError(command, error, exit_code);
  return exit_code;
}

int ReportDispatchError(const std::string& command, const std::string& line, const std::string& message,
                        const std::vector<std::string>& args) {
  std::cerr << line << "\n";
  if (AsksForJson(args)) {
    ExpectJsonOutput();
    PrintJsonError(command, Error(message), kExitUsage);
  }
  return kExitUsage;
}

void PrintJson(nlohmann::json j) { std::cout << DumpJsonEscaped(std::move(j)) << "\n"; }

bool StderrIsTty() { return ::isatty(STDERR_FILENO) == 1; }

void AddCopyOptions(Args& args, std::string_view restart_help) {
  args.Option("--safety-margin-gib", "free space required beyond the pack, in GiB", "2")
      .Flag("--restart", std::string(restart_help))
      .Option("--threads", "copies in flight (default 4)");
  AddProgressOption(args);
}

void AddProgressOption(Args& args) {
  args.Option("--progress",
              "auto | bar | json | none: auto draws a bar on a terminal and prints a line every 10 s otherwise; "
              "json prints one object per line on stderr",
              "auto");
}

Result<ProgressMode> ProgressModeOf(const Args& args) { return ParseProgressMode(args.Get("--progress"), StderrIsTty()); }

void StopOnSignals(const std::string& command, const std::string& advice) {
  g_stop_advice = StopAdvice{command, advice};
  InstallStopReport(*g_stop_advice);
}

void Narrate(const std::string& command, const std::string& line) {
  ProgressEndLineForSignal();
  if (g_narrate_json) {
    // The key says it is a note: {"note": "note: ..."} said it twice.
    std::string_view text = line;
    if (text.starts_with("note: ")) text.remove_prefix(6);
    std::cerr << DumpJsonEscaped(nlohmann::json{{"phase", command}, {"note", text}}, -1) << "\n";
  } else {
    std::cerr << "k3pack " << command << ": " << line << "\n";
  }
  std::cerr.flush();
}

std::unique_ptr<ProgressReporter> StartProgress(ProgressMode mode) {
  ProgressReporter::Options o;
  o.mode = mode;
  return std::make_unique<ProgressReporter>(o);
}

Result<CopyValues> ParseCopyValues(const Args& args) {
  CopyValues v;
  K3_ASSIGN_OR_RETURN(v.margin, args.GetDouble("--safety-margin-gib"));
  if (v.margin < 0) return Error("--safety-margin-gib must be non-negative");
  if (v.margin > pack::kMaxSafetyMarginGib)  // BuildPack's bound, as a usage error here
    return Error("--safety-margin-gib must be at most 1048576 (1 PiB), got " + args.Get("--safety-margin-gib"));
  K3_ASSIGN_OR_RETURN(v.mode, ProgressModeOf(args));
  K3_ASSIGN_OR_RETURN(v.threads, ParseCopyThreads(args));
  return v;
}

Result<int> ParseCopyThreads(const Args& args) {
  if (!args.Has("--threads")) return 0;
  K3_ASSIGN_OR_RETURN(int64_t t, args.GetInt("--threads"));
  if (t < 1 || t > 256) return Error("--threads must be in 1..256");
  return static_cast<int>(t);
}

}  // namespace k3pack::cli
