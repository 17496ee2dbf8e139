// Every command ends the same way on SIGINT and SIGTERM, from before its
// first step: one line on stderr ("k3pack CMD: interrupted; ..."), with
// --json the JSON error on stdout, exit 130 / 143. Before, only pack and
// build handled SIGTERM (the rest died by it without a word), dump-tensor
// and trace gen died by SIGINT too, and with --json stdout stayed empty.
//
// Deterministic without timing: K3PACK_TEST_STOP_AT_START=1 makes the
// command stop itself (SIGSTOP) once its words parsed; the test sends the
// real signal (pending while the process is stopped) and continues it, so
// the signal is delivered exactly there. The paths need not exist: nothing
// is read before that moment.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "../scratch_dir.h"
#include "../cli_run.h"

namespace {


struct Stopped {
  bool stopped = false;  // the seam stopped the process
  bool exited = false;   // exited (rather than died of a signal)
  int code = -1;         // exit status, or 128 + the killing signal
  std::string out, err;
};

// Runs k3pack `args` with the seam, sends `sigs` while it is stopped there,
// continues it and collects stdout, stderr and how it ended.
Stopped SignalAtStart(const std::vector<std::string>& args, const std::vector<int>& sigs) {
  const std::string dir = k3pack::testing_scratch::ProcessScratchDir("stop-signals");
  const std::string out_path = dir + "/stdout", err_path = dir + "/stderr";
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(out, STDOUT_FILENO);
    ::dup2(err, STDERR_FILENO);
    // A test runner started in the background inherits SIGINT ignored, which
    // k3pack rightly keeps; here the command is in the foreground.
    ::signal(SIGINT, SIG_DFL);
    ::setenv("K3PACK_TEST_STOP_AT_START", "1", 1);
    std::vector<char*> argv{const_cast<char*>(K3PACK_BIN)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(K3PACK_BIN, argv.data());
    ::_exit(127);
  }
  Stopped s;
  int status = 0;
  if (::waitpid(pid, &status, WUNTRACED) == pid && WIFSTOPPED(status)) {
    s.stopped = true;
    for (int sig : sigs) ::kill(pid, sig);  // pending until the process runs again
    ::kill(pid, SIGCONT);
    ::waitpid(pid, &status, 0);
  }
  s.exited = WIFEXITED(status);
  s.code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
  s.out = k3pack::testing_cli::FileBytes(out_path);
  s.err = k3pack::testing_cli::FileBytes(err_path);
  return s;
}

struct Command {
  std::string name;  // as in the message: "trace gen"
  std::vector<std::string> args;
};

// Every command that can run for long, with arguments that parse.
std::vector<Command> LongCommands(const std::string& d) {
  return {
      {"pack", {"pack", d + "/m"}},
      {"build", {"build", d + "/m"}},
      {"manifest", {"manifest", d + "/m"}},
      {"synth", {"synth", "--out", d + "/synth"}},
      {"verify", {"verify", d + "/m.json", "--full"}},
      {"inspect", {"inspect", d + "/m", "--stats"}},
      {"load", {"load", d + "/m.json"}},
      {"run-experts", {"run-experts", d + "/m.json"}},
      {"trace gen", {"trace", "gen", "--trace", d + "/t.trace"}},
      {"trace replay", {"trace", "replay", "--trace", d + "/t.trace", "--simulate"}},
      {"trace sweep", {"trace", "sweep"}},
      {"ep-merge", {"ep-merge", d + "/a.pack", d + "/b.pack"}},
      {"repair", {"repair", d + "/m", d + "/fixed", "--fix", "ssm-a"}},
      {"doctor", {"doctor", d + "/m"}},
      {"dump-tensor", {"dump-tensor", d + "/m", "blk.0.attn_norm.weight"}},
  };
}

// SIGINT and SIGTERM alike: one line naming the command, 130 / 143.
TEST(StopSignals, EveryCommandEndsWithOneLineAndTheSignalsExitCode) {
  const std::string d = k3pack::testing_scratch::ProcessScratchDir("stop-signals") + "/absent";
  for (const Command& c : LongCommands(d)) {
    for (const auto& [sig, code] : {std::pair{SIGINT, 130}, std::pair{SIGTERM, 143}}) {
      SCOPED_TRACE(c.name + (sig == SIGINT ? " + SIGINT" : " + SIGTERM"));
      const Stopped s = SignalAtStart(c.args, {sig});
      ASSERT_TRUE(s.stopped) << "the command never reached its first step:\n" << s.err;
      EXPECT_TRUE(s.exited) << "died of the signal without a word:\n" << s.err;
      EXPECT_EQ(s.code, code) << s.err;
      EXPECT_EQ(s.err.rfind("k3pack " + c.name + ": interrupted; ", 0), 0u) << s.err;
      EXPECT_EQ(std::count(s.err.begin(), s.err.end(), '\n'), 1) << s.err;
      EXPECT_EQ(s.out, "");  // no --json: nothing on stdout
    }
  }
}

// --json: the verdict is one JSON error object on stdout, shaped as every
// other JSON error (README), whatever the command.
TEST(StopSignals, WithJsonStdoutGetsTheErrorObject) {
  const std::string d = k3pack::testing_scratch::ProcessScratchDir("stop-signals") + "/absent";
  for (const Command& c : LongCommands(d)) {
    for (const auto& [sig, code] : {std::pair{SIGINT, 130}, std::pair{SIGTERM, 143}}) {
      SCOPED_TRACE(c.name + (sig == SIGINT ? " + SIGINT" : " + SIGTERM"));
      auto args = c.args;
      args.push_back("--json");
      const Stopped s = SignalAtStart(args, {sig});
      ASSERT_TRUE(s.stopped) << s.err;
      EXPECT_EQ(s.code, code) << s.err;
      const auto j = nlohmann::json::parse(s.out, nullptr, false);
      ASSERT_TRUE(j.is_object()) << "stdout: '" << s.out << "'\n" << s.err;
      EXPECT_EQ(j.value("command", ""), c.name);
      EXPECT_EQ(j.value("exit_code", 0), code);
      EXPECT_EQ(j.value("error_kind", ""), "OSError");
      EXPECT_EQ(j.value("errno", 0), EINTR);
      const std::string error = j.value("error", "");
      EXPECT_EQ(error.rfind("interrupted; ", 0), 0u) << error;
      EXPECT_EQ(j.value("message", ""), error);
      EXPECT_NE(s.err.find("k3pack " + c.name + ": " + error + "\n"), std::string::npos) << s.err;
    }
  }
}

// `timeout` signals the command and then its process group: one stop told
// twice, here as both signals at once. It is one stop: one line, and the
// exit code of one of them, never a death by the second.
TEST(StopSignals, TwoSignalsAtOnceAreOneStop) {
  const std::string d = k3pack::testing_scratch::ProcessScratchDir("stop-signals") + "/absent";
  for (const Command& c : {LongCommands(d)[0], LongCommands(d)[2]}) {
    SCOPED_TRACE(c.name);
    const Stopped s = SignalAtStart(c.args, {SIGINT, SIGTERM});
    ASSERT_TRUE(s.stopped) << s.err;
    EXPECT_TRUE(s.exited) << s.err;
    EXPECT_TRUE(s.code == 130 || s.code == 143) << s.code << "\n" << s.err;
    EXPECT_EQ(s.err.rfind("k3pack " + c.name + ": interrupted; ", 0), 0u) << s.err;
    EXPECT_EQ(std::count(s.err.begin(), s.err.end(), '\n'), 1) << s.err;
  }
}

// `--help` names both exit codes of a stop.
TEST(StopSignals, HelpNamesBothExitCodes) {
  FILE* f = ::popen((std::string(K3PACK_BIN) + " --help").c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string help;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, f)) > 0;) help.append(buf, n);
  ::pclose(f);
  EXPECT_NE(help.find("\n  130  interrupted (Ctrl-C, SIGINT)"), std::string::npos) << help;
  EXPECT_NE(help.find("\n  143  stopped by SIGTERM"), std::string::npos) << help;
}

}  // namespace
