#include "util/progress.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <cerrno>
#include <ctime>
#include <forward_list>

#include <nlohmann/json.hpp>

#include "util/format.h"
#include "util/utf8.h"

namespace k3pack {
namespace {

// Set while a bar line is drawn without its newline; read by the signal
// handler (a lock-free atomic is async-signal-safe).
std::atomic<bool> g_line_open{false};
// The report a stop signal prints. Each ExitOnStopSignals publishes a new one
// and never frees the old: a handler on another thread may be reading it.
// They stay reachable (a leak checker's exit report stays clean) and are
// never destroyed (a signal during exit may still read the last).
std::atomic<const StopReport*> g_stop_report{nullptr};
std::forward_list<StopReport>* const g_stop_reports = new std::forward_list<StopReport>;
std::atomic<bool> g_stdout_taken{false};
// CLOCK_MONOTONIC time of the first stop signal, +1 (0: none yet).
std::atomic<int64_t> g_first_stop_ns{0};
static_assert(std::atomic<const StopReport*>::is_always_lock_free && std::atomic<int64_t>::is_always_lock_free,
              "read in signal handlers");

double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string Percent(double frac) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%5.1f%%", frac * 100);
  return buf;
}

std::string ItemRate(double per_s, const std::string& unit) {
  char buf[64];
  std::snprintf(buf, sizeof buf, per_s >= 10 ? "%.0f %s/s" : "%.2f %s/s", per_s, unit.c_str());
  return buf;
}

void WriteAll(int fd, const std::string& bytes) {
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n <= 0 && errno != EINTR) return;
    if (n > 0) done += static_cast<size_t>(n);
  }
}

// Only reads what was built before: no allocation, no stdio, no locks.
extern "C" void OnStopExit(int sig) {
  // The second half of a stop told twice: the first is printing and exiting.
  if (TakeStopSignal() == StopSignalTurn::kRepeat) return;
  ProgressEndLineForSignal();
  if (const StopReport* r = g_stop_report.load()) {
    WriteAll(STDERR_FILENO, r->line);
    if (!g_stdout_taken.load()) WriteAll(STDOUT_FILENO, sig == SIGTERM ? r->stdout_on_sigterm : r->stdout_on_sigint);
  }
  ::_exit(128 + sig);  // 130 for SIGINT, 143 for SIGTERM
}

}  // namespace

Result<ProgressMode> ParseProgressMode(const std::string& name, bool tty) {
  if (name == "auto") return tty ? ProgressMode::kBar : ProgressMode::kLines;
  if (name == "bar") return ProgressMode::kBar;
  if (name == "lines") return ProgressMode::kLines;
  if (name == "json") return ProgressMode::kJson;
  if (name == "none") return ProgressMode::kNone;
  return Error("--progress must be one of auto, bar, json, none; got '" + name + "'");
}

ProgressReporter::ProgressReporter(Options options) : options_(std::move(options)) {
  if (!options_.clock) options_.clock = SteadySeconds;
  start_ = options_.clock();
}

ProgressReporter::~ProgressReporter() { Finish(); }

ProgressFn ProgressReporter::Fn() {
  if (options_.mode == ProgressMode::kNone) return {};
  return [this](const Progress& p) { Update(p); };
}

std::function<void(uint64_t, uint64_t)> ProgressReporter::CountFn(std::string phase, std::string unit) {
  if (options_.mode == ProgressMode::kNone) return {};
  return [this, phase = std::move(phase), unit = std::move(unit)](uint64_t done, uint64_t total) {
    Progress p;
    p.phase = phase;
    p.unit = unit;
    p.done_objects = done;
    p.total_objects = total;
    Update(p);
  };
}

// Fraction done: by bytes when the work is byte-shaped, else by items.
static std::optional<double> Fraction(const Progress& p) {
  if (p.total_bytes > 0) return std::min(1.0, static_cast<double>(p.done_bytes) / static_cast<double>(p.total_bytes));
  if (p.total_objects > 0)
    return std::min(1.0, static_cast<double>(p.done_objects) / static_cast<double>(p.total_objects));
  return std::nullopt;
}

static bool Complete(const Progress& p) {
  if (p.total_bytes > 0) return p.done_bytes >= p.total_bytes && p.done_objects >= p.total_objects;
  return p.total_objects > 0 && p.done_objects >= p.total_objects;
}

std::string ProgressReporter::Describe(const Progress& p, double now, std::optional<double>* eta, double* rate_bytes,
                                       double* rate_items) const {
  const double run_s = now - phase_start_;
  const uint64_t run_bytes = p.done_bytes > base_bytes_ ? p.done_bytes - base_bytes_ : 0;
  const uint64_t run_objects = p.done_objects > base_objects_ ? p.done_objects - base_objects_ : 0;
  // Throughput counts bytes really moved; holes only advance the fraction.
  const uint64_t moved = p.copied_bytes ? (*p.copied_bytes > base_copied_ ? *p.copied_bytes - base_copied_ : 0) : run_bytes;
  *rate_bytes = run_s > 0 ? static_cast<double>(moved) / run_s : 0;
  *rate_items = run_s > 0 ? static_cast<double>(run_objects) / run_s : 0;
  eta->reset();
  const auto frac = Fraction(p);
  if (frac && run_s >= options_.eta_min_elapsed_s) {
    // Progress speed of this run (holes included: they take time too, just
    // little), as a fraction of the whole per second.
    double run_frac = 0;
    if (p.total_bytes > 0) run_frac = static_cast<double>(run_bytes) / static_cast<double>(p.total_bytes);
    else run_frac = static_cast<double>(run_objects) / static_cast<double>(p.total_objects);
    if (run_frac >= options_.eta_min_fraction && *frac < 1) *eta = (1 - *frac) * run_s / run_frac;
  }
  std::string s;
  if (frac) s += Percent(*frac) + " ";
  if (p.total_bytes > 0) {
    s += HumanBytes(p.done_bytes) + "/" + HumanBytes(p.total_bytes);
  } else if (p.done_bytes > 0) {
    s += HumanBytes(p.done_bytes);
  }
  if (p.total_objects > 0 || (p.total_bytes == 0 && p.done_objects > 0)) {
    if (!s.empty() && s.back() != ' ') s += ", ";
    s += std::to_string(p.done_objects);
    if (p.total_objects > 0) s += "/" + std::to_string(p.total_objects);
    s += " " + p.unit;
  }
  if (p.done_bytes > 0 || p.copied_bytes) s += "  " + HumanRate(*rate_bytes);
  else if (p.done_objects > 0) s += "  " + ItemRate(*rate_items, p.unit);
  if (*eta) s += "  ETA " + HumanDuration(**eta);
  return s;
}

std::string ProgressReporter::PhaseText(const Progress& p) const {
  return options_.scope.empty() ? p.phase : p.phase + " (" + options_.scope + ")";
}

void ProgressReporter::EmitLocked(const Progress& p, double now, bool complete, bool stopped) {
  std::FILE* out = options_.out;
  std::optional<double> eta;
  double rate_bytes = 0, rate_items = 0;
  const std::string text = Describe(p, now, &eta, &rate_bytes, &rate_items);
  switch (options_.mode) {
    case ProgressMode::kNone:
      return;
    case ProgressMode::kBar: {
      std::string bar;
      if (auto frac = Fraction(p)) {
        constexpr int kWidth = 30;
        bar = std::string(static_cast<size_t>(*frac * kWidth), '#');
        bar.resize(kWidth, '.');
        bar = " [" + bar + "]";
      }
      // \033[K clears what a longer previous draw left behind. The line
      // counts as open before the draw starts: a signal arriving during it
      // (on any thread) still ends the line.
      g_line_open.store(true);
      std::fprintf(out, "\r%s%s %s\033[K", PhaseText(p).c_str(), bar.c_str(), text.c_str());
      if ((complete || stopped) && g_line_open.exchange(false)) std::fprintf(out, "\n");
      break;
    }
    case ProgressMode::kLines:
      std::fprintf(out, "%s: %s%s  (%s elapsed)\n", PhaseText(p).c_str(), complete ? "done, " : stopped ? "stopped, " : "",
                   text.c_str(),
                   HumanDuration(now - start_).c_str());
      any_line_ = true;
      break;
    case ProgressMode::kJson: {
      nlohmann::json j = {{"phase", p.phase},
                          {"done_bytes", p.done_bytes},
                          {"total_bytes", p.total_bytes},
                          {"done_objects", p.done_objects},
                          {"total_objects", p.total_objects},
                          {"unit", p.unit},
                          {"elapsed_s", now - start_},
                          {"bytes_per_s", rate_bytes},
                          {"objects_per_s", rate_items},
                          {"eta_s", eta ? nlohmann::json(*eta) : nlohmann::json(nullptr)},
                          {"done", complete}};
      if (stopped) j["stopped"] = true;
      for (const auto& [key, value] : options_.scope_fields) j[key] = value;
      std::fprintf(out, "%s\n", j.dump().c_str());
      break;
    }
  }
  std::fflush(out);
  last_emit_ = now;
}

void ProgressReporter::Update(const Progress& p) {
  if (options_.mode == ProgressMode::kNone) return;
  std::lock_guard<std::mutex> lock(mu_);
  const double now = options_.clock();
  if (p.phase != phase_) {
    phase_ = p.phase;
    phase_start_ = now;
    base_bytes_ = p.done_bytes;
    base_objects_ = p.done_objects;
    base_copied_ = p.copied_bytes.value_or(0);
    if (Complete(p) && p.elapsed_s > 0) {
      // A phase told once, when done: its rate is all of it over the
      // engine's own time (a resumed phase's first report is never complete).
      phase_start_ = now - p.elapsed_s;
      base_bytes_ = base_objects_ = base_copied_ = 0;
    }
    complete_shown_ = false;
    if (options_.mode == ProgressMode::kJson) last_emit_ = -1e300;  // a new phase is announced at once
  }
  if (p.final) {  // the last update: show where it ended, and end a bar's line
    const bool complete = Complete(p);
    EmitLocked(p, now, complete, !complete);
    return;
  }
  const bool complete = Complete(p);
  if (complete) {
    if (complete_shown_) return;
    // In lines mode a short run stays silent; one that printed lines says
    // it finished.
    if (options_.mode == ProgressMode::kLines && !any_line_) return;
    complete_shown_ = true;
    EmitLocked(p, now, true);
    return;
  }
  complete_shown_ = false;
  double interval = options_.bar_interval_s;
  if (options_.mode == ProgressMode::kLines) interval = options_.line_interval_s;
  if (options_.mode == ProgressMode::kJson) interval = options_.json_interval_s;
  // Lines: the first one only after a full interval (short runs print none).
  const double since = options_.mode == ProgressMode::kLines && last_emit_ < start_ ? now - start_ : now - last_emit_;
  if (since < interval) return;
  EmitLocked(p, now, false);
}

void ProgressReporter::Note(const std::string& phase, const std::string& text) {
  if (options_.mode == ProgressMode::kNone) return;
  std::lock_guard<std::mutex> lock(mu_);
  const double now = options_.clock();
  std::FILE* out = options_.out;
  switch (options_.mode) {
    case ProgressMode::kNone:
      return;
    case ProgressMode::kBar:
      std::fprintf(out, "\r%s: %s\033[K", phase.c_str(), text.c_str());
      g_line_open.store(true);
      break;
    case ProgressMode::kLines: {
      const double since = last_emit_ < start_ ? now - start_ : now - last_emit_;
      if (since < options_.line_interval_s) return;
      std::fprintf(out, "%s: %s  (%s elapsed)\n", phase.c_str(), text.c_str(), HumanDuration(now - start_).c_str());
      any_line_ = true;
      break;
    }
    case ProgressMode::kJson:
      std::fprintf(out, "%s\n",
                   DumpJsonEscaped({{"phase", phase}, {"note", text}, {"elapsed_s", now - start_}}, -1).c_str());
      break;
  }
  std::fflush(out);
  last_emit_ = now;
}

void ProgressReporter::Finish() {
  if (options_.mode != ProgressMode::kBar) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (g_line_open.exchange(false)) {
    std::fprintf(options_.out, "\n");
    std::fflush(options_.out);
  }
}

void ProgressEndLineForSignal() {
  if (g_line_open.exchange(false)) {
    ssize_t ignored = ::write(STDERR_FILENO, "\n", 1);
    (void)ignored;
  }
}

void ExitOnStopSignals(const StopReport& report) {
  StopReport* r = &g_stop_reports->emplace_front(report);
  r->line += "\n";
  g_stop_report.store(r);
  for (int sig : {SIGINT, SIGTERM}) InstallUnlessIgnored(sig, OnStopExit);
}

void StdoutTaken() { g_stdout_taken.store(true); }

StopSignalTurn TakeStopSignal() {
  struct timespec ts {};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  const int64_t now = static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec + 1;
  int64_t first = 0;
  if (g_first_stop_ns.compare_exchange_strong(first, now)) return StopSignalTurn::kFirst;
  return now - first < kSameStopWindowNs ? StopSignalTurn::kRepeat : StopSignalTurn::kInsist;
}

void ForgetStopSignals() { g_first_stop_ns.store(0); }

void InstallUnlessIgnored(int sig, void (*handler)(int), int flags, struct sigaction* old) {
  struct sigaction previous {};
  ::sigaction(sig, nullptr, &previous);
  if (old != nullptr) *old = previous;
  if (previous.sa_handler == SIG_IGN) return;
  struct sigaction sa {};
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = flags;
  ::sigaction(sig, &sa, nullptr);
}

}  // namespace k3pack
