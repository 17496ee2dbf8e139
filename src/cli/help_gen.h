// Documentation generated from the command table, so that `--help`, the man
// page and shell completion never disagree: every registered command's own
// `--help` text (and its sub-commands') is collected and re-rendered.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace k3pack::cli {

struct CommandHelp {
  std::string name;                  // "build", "trace replay"
  std::string summary;               // from the command table (top-level commands)
  std::string text;                  // its --help output
  std::vector<std::string> options;  // "--gguf-dir", ... parsed from `text`
  std::vector<CommandHelp> subs;     // sub-commands (trace gen|replay|sweep)
};

// Runs `<command> --help` for every registered command, capturing stdout.
std::vector<CommandHelp> CollectHelp();

// "k3pack 0.1.0 (git 1a2b3c4d5e6f, RelWithDebInfo)".
std::string VersionLine();

// A man(7) page: NAME, SYNOPSIS, the top-level help `top_help` as the
// description, then every command's help text verbatim.
std::string ManPage(const std::string& top_help);

// A bash completion script: commands, sub-commands and each one's options.
std::string BashCompletion();

}  // namespace k3pack::cli
