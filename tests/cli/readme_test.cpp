// Every command of the README's fenced shell blocks runs, exactly as written,
// on the synthetic model: the model path is the only substitution, and `k3pack`
// is the binary under test. A README that drifts from the CLI fails here.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "cli_fixture.h"

namespace k3cli {
namespace {

// The `k3pack ...` commands of every ```sh block (continuation lines joined,
// trailing `# comments` dropped).
std::vector<std::string> ReadmeCommands(const std::string& readme) {
  std::ifstream in(readme);
  std::vector<std::string> cmds;
  std::string line, pending;
  bool in_sh = false;
  while (std::getline(in, line)) {
    if (line.rfind("```", 0) == 0) {
      in_sh = !in_sh && line == "```sh";
      continue;
    }
    if (!in_sh) continue;
    // A comment starts at "#" preceded by whitespace, outside quotes (the README has no quoted '#').
    static const std::regex comment(R"(\s+#.*$|^\s*#.*$)");
    line = std::regex_replace(line, comment, "");
    if (pending.empty() && line.rfind("k3pack ", 0) != 0) continue;
    const bool continues = !line.empty() && line.back() == '\\';
    if (continues) line.pop_back();
    pending += line + (continues ? " " : "");
    if (!continues) {
      cmds.push_back(pending);
      pending.clear();
    }
  }
  return cmds;
}

TEST(Readme, EveryCommandRunsAsWrittenOnTheSyntheticModel) {
  const std::string model = FreshModel("readme-model");
  const auto cmds = ReadmeCommands(std::string(K3PACK_SOURCE_DIR) + "/README.md");
  ASSERT_GE(cmds.size(), 6u) << "README commands not found";
  for (std::string cmd : cmds) {
    cmd = std::regex_replace(cmd, std::regex("/models/Kimi-K3-Q2_K"), model);
    cmd = std::string(K3PACK_BIN) + cmd.substr(std::string("k3pack").size());
    FILE* f = ::popen((cmd + " 2>&1").c_str(), "r");
    ASSERT_NE(f, nullptr);
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
    const int status = ::pclose(f);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << cmd << "\n" << out;
  }
}

}  // namespace
}  // namespace k3cli
