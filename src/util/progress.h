// The one progress reporter of the command line: every long command (pack,
// build, verify, synth, trace replay/sweep, load, inspect --stats, doctor
// and run-experts) shows its k3pack::Progress through it, so they all look
// and behave alike:
//   * bar   (a terminal): one redrawn line with a bar, rate and ETA; the ETA
//           is hidden until it means something, holes are not throughput;
//   * lines (auto when stderr is not a terminal): one line every 10 s, so
//           logs of long runs show life without drowning in redraws;
//   * json  one JSON object per line (at most one a second, plus the last);
//   * none.
#pragma once

#include <signal.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "k3pack/error.h"
#include "k3pack/progress.h"

namespace k3pack {

enum class ProgressMode { kNone, kBar, kLines, kJson };

// "auto" -> bar when stderr is a terminal, else lines; "bar"; "json"; "none"
// ("lines" is accepted too). The error names --progress.
Result<ProgressMode> ParseProgressMode(const std::string& name, bool stderr_is_tty);

class ProgressReporter {
 public:
  struct Options {
    ProgressMode mode = ProgressMode::kNone;
    std::FILE* out = stderr;
    std::function<double()> clock;  // monotonic seconds; default steady_clock
    double bar_interval_s = 0.1;
    double line_interval_s = 10;
    double json_interval_s = 1;
    // The ETA is shown once this much time has passed and this fraction of
    // the work was done in this run (before that a rate is mostly noise).
    double eta_min_elapsed_s = 3;
    double eta_min_fraction = 0.01;
    // Whose work it is where one command does several alike (the ranks of
    // `--ep-rank all`): told after the phase in bar and lines ("build (rank
    // 1 of 2)"), and `scope_fields` added to every JSON object, so the phase
    // names stay what a reader of one rank's progress matches on.
    std::string scope;
    std::vector<std::pair<std::string, int64_t>> scope_fields;
  };
  explicit ProgressReporter(Options options);
  ~ProgressReporter();  // Finish()
  ProgressReporter(const ProgressReporter&) = delete;
  ProgressReporter& operator=(const ProgressReporter&) = delete;

  // Throttled per mode; the update that completes the work (done == total)
  // is always shown (bar and json) and ends the bar line.
  void Update(const Progress& p);
  // A status line without numbers ("doctor: checking tensor values"):
  // redrawn in bar mode, throttled like updates in lines mode.
  void Note(const std::string& phase, const std::string& text);
  // Ends an open bar line (before the command prints its result).
  void Finish();

  ProgressMode mode() const { return options_.mode; }
  // An adapter for engines taking a ProgressFn (empty for kNone); the
  // reporter must outlive it.
  ProgressFn Fn();
  // The same for engines that count items (done, total) of one phase.
  std::function<void(uint64_t, uint64_t)> CountFn(std::string phase, std::string unit);

 private:
  std::string Describe(const Progress& p, double now, std::optional<double>* eta, double* rate_bytes,
                       double* rate_items) const;
  // `stopped`: the work ended before it was complete (Progress::final on an
  // interrupt or error): the line ends, and nothing says "done".
  void EmitLocked(const Progress& p, double now, bool complete, bool stopped = false);
  std::string PhaseText(const Progress& p) const;

  Options options_;
  std::mutex mu_;
  double start_ = 0;
  double last_emit_ = -1e300;
  // Baseline of this phase: the first update seen (a resumed build starts
  // with work already done, which is not this run's speed).
  std::string phase_;
  double phase_start_ = 0;
  uint64_t base_bytes_ = 0, base_objects_ = 0, base_copied_ = 0;
  bool complete_shown_ = false;
  bool any_line_ = false;
};

// Async-signal-safe: if a progress bar line is open on stderr, ends it with a
// newline so that what is printed next starts at column 0. For SIGINT
// handlers (e.g. pack/build's checkpointing one).
void ProgressEndLineForSignal();

// What a command prints when a stop signal ends it, made before any signal
// comes: the handler only writes these bytes.
struct StopReport {
  std::string line;              // stderr: "k3pack CMD: interrupted; ..." (a newline is added)
  std::string stdout_on_sigint;  // stdout (--json): the error object for exit 130, with its newline; or ""
  std::string stdout_on_sigterm;  // the same for exit 143
};

// Every command, from before its first step (cli: Args::Parse): on SIGINT or
// SIGTERM, end the bar line, print `report` and exit 128 + the signal (130 /
// 143). Called again, the later report replaces the earlier one (a command
// that knows better what an interruption leaves says so). Pack and build,
// whose files on disk can be resumed at every moment (the state a `kill -9`
// leaves is one the rerun continues from), keep this handler outside their
// copy; the copy puts its own checkpointing handler in place while it runs
// and restores this one after.
void ExitOnStopSignals(const StopReport& report);

// The command began printing its result on stdout: a stop from now on adds
// no JSON error to it (a script would read two objects, or a broken one).
// Async-signal-safe.
void StdoutTaken();

// One stop can arrive as two signals: GNU `timeout` sends its signal to the
// command and then to the command's whole process group, which the command
// is in, so both land within microseconds. A stop signal within this long
// of the first is that same stop; only a later one is a second request.
inline constexpr int64_t kSameStopWindowNs = 1'000'000'000;

enum class StopSignalTurn {
  kFirst,   // the stop: act on it
  kRepeat,  // the same stop told again (within kSameStopWindowNs): ignore it
  kInsist,  // a later, second stop while the first is being acted on: exit now
};

// Every stop handler asks this first. Async-signal-safe (an atomic and
// clock_gettime(CLOCK_MONOTONIC)).
StopSignalTurn TakeStopSignal();
// The next stop signal is a first one again: for a new copy in a process
// that lives on (Python), and before a recorded stop is handed to the
// handler that was there before the copy.
void ForgetStopSignals();

// Puts `handler` in place for `sig` and returns the previous disposition in
// `*old` (when given), unless the process ignores `sig`: an ignored signal
// stays ignored, as a shell starts background jobs (`cmd &`, nohup) with
// SIGINT ignored so that a Ctrl-C meant for the foreground does not stop
// them. Every stop handler k3pack installs goes through here.
void InstallUnlessIgnored(int sig, void (*handler)(int), int flags = 0, struct sigaction* old = nullptr);

}  // namespace k3pack
