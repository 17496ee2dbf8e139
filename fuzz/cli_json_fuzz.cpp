// The program around the GGUF reader: `k3pack inspect` (JSON and text, set
// and --file-only, with --stats) and `k3pack doctor --json`, run in-process
// through the CLI's own command table over a fuzzed file. The reader never
// crashed under fuzzing; the commands did (a value that is not UTF-8 made
// nlohmann::json::dump throw), so this target checks what they print too:
// every --json output must parse as JSON.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "fuzz_util.h"

namespace {

struct Silenced {
  Silenced() {
    // Text modes print with printf; JSON modes with std::cout, captured below.
    if (std::freopen("/dev/null", "w", stdout) == nullptr) __builtin_trap();
    std::cerr.rdbuf(sink.rdbuf());
  }
  std::ostringstream sink;
};

// Runs `k3pack <argv...>` in-process; returns what it wrote to std::cout.
std::string RunCommand(const std::string& name, const std::vector<std::string>& argv) {
  static Silenced silenced;
  const auto& commands = k3pack::cli::Commands();
  auto it = commands.find(name);
  if (it == commands.end()) __builtin_trap();  // the command is not linked in
  std::ostringstream out;
  std::streambuf* old = std::cout.rdbuf(out.rdbuf());
  const int rc = it->second.run(argv);
  std::cout.rdbuf(old);
  silenced.sink.str("");
  if (rc < 0 || rc > 2) __builtin_trap();  // 0 ok, 1 problems/error, 2 unusable/usage
  return out.str();
}

void ExpectJson(const std::string& text) {
  if (text.empty()) return;  // the command failed before printing (error on stderr)
  if (nlohmann::json::parse(text, nullptr, false).is_discarded()) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = (k3fuzz::ScratchDir() / "input.gguf").string();
  k3fuzz::WriteFile(path, reinterpret_cast<const char*>(data), size);
  ExpectJson(RunCommand("inspect", {path, "--json"}));
  ExpectJson(RunCommand("inspect", {path, "--json", "--file-only", "--stats"}));
  RunCommand("inspect", {path});
  RunCommand("inspect", {path, "--file-only", "--summary", "--stats"});
  ExpectJson(RunCommand("doctor", {path, "--json"}));
  return 0;
}
