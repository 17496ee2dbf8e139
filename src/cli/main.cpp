// k3pack: command-line entry point. Dispatches to the registered sub-commands.
#include <iostream>
#include <sstream>

#include "cli/command.h"
#include "cli/help_gen.h"
#include "k3pack_version.h"

namespace {

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
               "and one that only applies with another is refused without it (listed under \"needs\").\n";
  std::cout << "\nexit codes (every command):\n"
               "  0    done (also: the output is already built)\n"
               "  1    the input is bad or a check failed\n"
               "  2    usage error: unknown flag, bad value, conflicting flags\n"
               "  130  interrupted (Ctrl-C); rerun the same command to resume\n";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 3 && std::string(argv[1]) == "help" && std::string(argv[2]) == "--man") {
    std::ostringstream top;
    std::streambuf* old = std::cout.rdbuf(top.rdbuf());
    PrintHelp();
    std::cout.rdbuf(old);
    std::cout << k3pack::cli::ManPage(top.str());
    return 0;
  }
  // `k3pack help CMD` is `k3pack CMD --help`; an unknown CMD is a usage error.
  if (argc == 3 && std::string(argv[1]) == "help") {
    const auto& cmds = k3pack::cli::Commands();
    auto it = cmds.find(argv[2]);
    if (it == cmds.end()) {
      std::cerr << "k3pack help: unknown command '" << argv[2] << "' (run `k3pack --help` for the list)\n";
      return 2;
    }
    return it->second.run({"--help"});
  }
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" ||
      std::string(argv[1]) == "help") {
    PrintHelp();
    return argc < 2 ? 2 : 0;
  }
  std::string name = argv[1];
  if (name == "--version" || name == "-V") {
    std::cout << k3pack::cli::VersionLine() << "\n";
    return 0;
  }
  const auto& cmds = k3pack::cli::Commands();
  auto it = cmds.find(name);
  if (it == cmds.end()) {
    std::cerr << "k3pack: unknown command '" << name << "' (run `k3pack --help` for the list)\n";
    return 2;
  }
  std::vector<std::string> rest(argv + 2, argv + argc);
  return it->second.run(rest);
}
