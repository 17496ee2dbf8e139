// `k3pack completion bash`: prints a bash completion script generated from
// the command table (commands, sub-commands, options).
#include <iostream>

#include "cli/command.h"
#include "cli/help_gen.h"

namespace k3pack::cli {
namespace {

int RunCompletion(const std::vector<std::string>& argv) {
  Args args("completion", "bash",
            "Prints a bash completion script for k3pack, generated from its commands and their options.\n"
            "Install: k3pack completion bash > /etc/bash_completion.d/k3pack (cmake --install does this).");
  args.Positional("SHELL", "bash (the only shell supported)");
  int code = 0;
  if (!args.Parse(argv, &code)) return code;
  if (args.positionals()[0] != "bash") {
    return ReportError("completion", Error("unsupported shell '" + args.positionals()[0] + "'; supported: bash"), 2);
  }
  std::cout << BashCompletion();
  return 0;
}

}  // namespace

K3_COMMAND("completion", "print a bash completion script (k3pack completion bash)", RunCompletion);

}  // namespace k3pack::cli
