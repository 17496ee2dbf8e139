// k3pack: command-line entry point. Dispatches to the registered sub-commands.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <new>
#include <sstream>

#include "cli/command.h"
#include "cli/help_gen.h"
#include "k3pack/quant.h"
#include "util/edit_distance.h"
#include "util/process_limits.h"
#include "k3pack_version.h"

namespace {

int Dispatch(int argc, char** argv);

void PrintHelp() {
  std::cout << "k3pack " << K3PACK_VERSION
            << " - Kimi-K3 GGUF checkpoints, expert packs and expert streaming\n\n"
               "usage: k3pack <command> [options]   (k3pack <command> --help for details)\n\ncommands:\n";
  for (const auto& [name, info] : k3pack::cli::Commands()) {
    std::cout << "  " << name << std::string(name.size() < 14 ? 14 - name.size() : 1, ' ') << info.summary << "\n";
  }
  std::cout << "\noptions:\n"
               "  -V, --version show the version, git revision and build type\n"
               "  -h, --help    show this help (`k3pack help --man` prints it all as a man page)\n"
               "An option given twice must have the same value both times (a flag may repeat); options that\n"
               "contradict each other are refused together (each command's --help lists them under \"not together\"),\n"
               "and one that only applies with another is refused without it (listed under \"needs\").\n"
               "`--` ends the options: every word after it is an argument, even one that starts with \"--\".\n";
  std::cout << "\nexit codes (every command):\n"
               "  0    done (also: the output is already built)\n"
               "  1    the input is bad or a check failed\n"
               "  2    usage error: unknown flag, bad value, conflicting flags, an input that could not be found\n"
               "       beside the others (name it: --tokenizer-dir, --model-config)\n"
               "  130  interrupted (Ctrl-C, SIGINT): one line says what was left (with --json, the JSON error on stdout);\n"
               "       rerun the same command to resume\n"
               "  143  stopped by SIGTERM (kill, timeout): as 130\n";
}

// A process started with stdin, stdout or stderr closed (`k3pack build 2>&-`,
// a daemon's child) would hand that descriptor number to the first file it
// opens: the progress lines and messages written to "stderr" then went into
// the pack's lock file (and could as well have gone into an output). Each
// missing one is taken by /dev/null opened read-only, so reads see end of
// file and writes fail as on a closed descriptor (see FinishStdout).
void OccupyClosedStandardFds() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    const int nul = ::open("/dev/null", O_RDONLY);
    if (nul >= 0 && nul != fd) {
      ::dup2(nul, fd);
      ::close(nul);
    }
  }
}

// Output that could not be written (a full disk behind `> report.json`, a
// closed stdout, a reader gone while SIGPIPE is ignored) used to end in exit
// 0, so a script took a truncated or empty report for the whole. Called once
// the command returned: a lost write is an error (exit 1 unless the command
// already failed), named on stderr.
int FinishStdout(const std::string& who, int rc) {
  std::cout.flush();
  bool failed = std::cout.bad();
  errno = 0;
  if (std::fflush(stdout) != 0) failed = true;
  int err = errno;
  if (std::ferror(stdout)) failed = true;
  if (!failed) return rc;
  // The write that failed may be long past (stdio and std::cout stop writing
  // once it did), and errno with it: one more byte finds the reason (ENOSPC,
  // EPIPE, EBADF) on output that is broken anyway.
  if (err == 0 && ::write(STDOUT_FILENO, "\n", 1) < 0) err = errno;
  std::cerr << who << ": error: cannot write to standard output" << (err != 0 ? std::string(": ") + std::strerror(err) : "")
            << " (the output is incomplete)\n";
  return rc == 0 ? 1 : rc;
}

// An allocation that no Result reports (a container's growth deep in a
// library) ends the command with one line naming the limit that is likely to
// have caused it, not with `terminate called after throwing an instance of
// 'std::bad_alloc'` and SIGABRT. Sizes k3pack asks for itself are reported
// where they are asked, with the size.
int OutOfMemory(const std::string& who) {
  std::cerr << who << ": error: out of memory (an allocation failed)\nhint: " << k3pack::OutOfMemoryHint() << "\n";
  return 1;
}

// A typo in the debugging knob would leave dequantize on the fastest path
// without a word, so a comparison meant to run the scalar code would not.
void WarnOfAnIgnoredIsaCap(const std::string& who) {
  const std::string cap = k3pack::quant::IgnoredIsaCap();
  if (cap.empty()) return;
  std::cerr << who << ": warning: K3PACK_QUANT_ISA='" << cap
            << "' names none of scalar, avx2, avx512, auto and is ignored; dequantize uses "
            << k3pack::quant::IsaName(k3pack::quant::DetectedIsa()) << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  OccupyClosedStandardFds();
  // Under `ulimit -f` a write past the limit raises SIGXFSZ, whose default
  // action kills the process with no message and leaves its temporaries:
  // ignored, the write fails with EFBIG and the writer's error path runs
  // (the file named, the temporary removed, the old output kept), as in
  // Python, which ignores SIGXFSZ at start-up too.
  ::signal(SIGXFSZ, SIG_IGN);
  const std::string who = argc >= 2 && argv[1][0] != '-' ? std::string("k3pack ") + argv[1] : "k3pack";
  WarnOfAnIgnoredIsaCap(who);
  try {
    return FinishStdout(who, Dispatch(argc, argv));
  } catch (const std::bad_alloc&) {
    return FinishStdout(who, OutOfMemory(who));
  }
}

namespace {

// "unknown command 'biuld' (did you mean build?)": the nearest command within
// two edits, or the nearest of --help/--version for a word that is an option.
std::string UnknownCommand(const std::string& word) {
  const bool option = word.rfind('-', 0) == 0;
  std::string best;
  size_t best_d = 3;
  auto consider = [&](const std::string& name) {
    const size_t d = k3pack::EditDistance(word, name);
    if (d < best_d) best_d = d, best = name;
  };
  // Words for work another command does: its own name, not the nearest spelling.
  if (word == "ep-split")
    return "unknown command 'ep-split' (rank packs are written by `k3pack pack DIR --ep-size N --ep-rank R|all` or "
           "`k3pack build` with the same options; `k3pack ep-merge` joins them)";
  if (option) {
    for (const char* name : {"--help", "--version"}) consider(name);
  } else {
    for (const auto& [name, command] : k3pack::cli::Commands()) consider(name);
    consider("help");
  }
  return std::string(option ? "unknown option '" : "unknown command '") + word + "'" +
         (best.empty() ? "" : " (did you mean " + best + "?)");
}

int Dispatch(int argc, char** argv) {
  if (argc >= 3 && std::string(argv[1]) == "help" && std::string(argv[2]) == "--man") {
    std::ostringstream top;
    std::streambuf* old = std::cout.rdbuf(top.rdbuf());
    PrintHelp();
    std::cout.rdbuf(old);
    std::cout << k3pack::cli::ManPage(top.str());
    return 0;
  }
  // `k3pack help CMD [SUB]` is `k3pack CMD [SUB] --help` (`help trace gen`);
  // an unknown CMD is a usage error.
  if (argc >= 3 && std::string(argv[1]) == "help") {
    const auto& cmds = k3pack::cli::Commands();
    auto it = cmds.find(argv[2]);
    if (it == cmds.end()) {
      const std::string msg = UnknownCommand(argv[2]);
      // `help --json`: the word that asks for JSON is the unknown one itself.
      const int first = argv[2][0] == '-' ? 2 : 3;
      return k3pack::cli::ReportDispatchError("help", "k3pack help: " + msg + " (run `k3pack --help` for the list)",
                                              msg, std::vector<std::string>(argv + first, argv + argc));
    }
    std::vector<std::string> words(argv + 3, argv + argc);
    words.push_back("--help");
    return it->second.run(words);
  }
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" ||
      std::string(argv[1]) == "help") {
    PrintHelp();
    return argc < 2 ? 2 : 0;
  }
  std::string name = argv[1];
  const std::vector<std::string> words(argv + 1, argv + argc);
  const std::vector<std::string> rest(argv + 2, argv + argc);
  if (name == "--version" || name == "-V") {
    if (argc > 2) {
      // `k3pack -V build`: a word after it was meant for something; it is not ignored.
      const std::string msg = name + " takes no arguments, got '" + argv[2] + "'";
      return k3pack::cli::ReportDispatchError(
          "", "k3pack: " + msg + " (run `k3pack --version` alone, or `k3pack COMMAND --help`)", msg, rest);
    }
    std::cout << k3pack::cli::VersionLine() << "\n";
    return 0;
  }
  if (name.empty()) {
    const std::string msg = "the command is an empty argument (an unset shell variable?)";
    return k3pack::cli::ReportDispatchError("", "k3pack: " + msg + "; run `k3pack --help` for the list", msg, rest);
  }
  const auto& cmds = k3pack::cli::Commands();
  auto it = cmds.find(name);
  if (it == cmds.end()) {
    const std::string msg = UnknownCommand(name);
    // `k3pack --json`: the word that asks for JSON is the unknown one itself.
    const bool option = name.starts_with("-");
    return k3pack::cli::ReportDispatchError(option ? "" : name,
                                            "k3pack: " + msg + " (run `k3pack --help` for the list)", msg,
                                            option ? words : rest);
  }
  return it->second.run(rest);
}

}  // namespace
