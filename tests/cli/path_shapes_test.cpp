// Path spellings users type (path-shape audit): a file input with a trailing
// '/', two spellings of one new output, an output at a pack's side file or in
// the tokenizer directory, `nox/..` with nox missing, a dangling link where a
// directory is made, names past the kernel's limits. Each is refused before
// anything is written, naming the option, the path and the rule.
#include <unistd.h>

#include "cli_fixture.h"

namespace k3cli {
namespace {

// Runs `args` with `dir` as the current directory (relative spellings).
CliRun CliIn(const std::string& dir, const std::string& args) { return CliVia("cd " + Q(dir) + " &&", args); }

// A fresh, empty scratch directory.
std::string EmptyDir(const std::string& name) {
  const std::string d = Root() + "/" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Before: `X` and `./X` compared unequal while neither existed, so the whole
// pack was written to X, and then the manifest was refused as written by
// "another process while this run went on".
TEST(PathShapes, TwoSpellingsOfOneNewOutputAreRefusedBeforeTheBuild) {
  const std::string m = FreshModel("two-spellings");
  const std::string out = EmptyDir("two-spellings-out");
  CliRun r = CliIn(out, "build --progress none " + Q(m) + " --pack X --manifest ./X");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "--manifest ./X is an input (--pack)")) << r.out;
  EXPECT_FALSE(Contains(r.out, "another process")) << r.out;
  EXPECT_TRUE(fs::is_empty(out));
}

}  // namespace
}  // namespace k3cli
