// With --json, a failed command used to print nothing on stdout (the error
// went to stderr only), so `k3pack verify --full --json | jq` got no verdict
// for a damaged pack. Now the error is also one JSON object on stdout, unless
// the command already printed its JSON.
#include <fstream>

#include <nlohmann/json.hpp>

#include "cli_fixture.h"

namespace k3cli {
namespace {

struct SplitRun {
  int code;
  std::string out, err;
};

SplitRun RunSplit(const std::string& args) {
  const std::string err_path = Root() + "/json-errors.stderr";
  const std::string cmd = std::string(K3PACK_BIN) + " " + args + " 2>" + Q(err_path);
  FILE* f = ::popen(cmd.c_str(), "r");
  EXPECT_NE(f, nullptr);
  SplitRun r{-1, "", ""};
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) r.out.append(buf, n);
  const int status = ::pclose(f);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream in(err_path);
  r.err.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return r;
}

// The error text stderr shows after "k3pack CMD: error: ".
std::string StderrError(const SplitRun& r, const std::string& command) {
  const std::string prefix = "k3pack " + command + ": error: ";
  const size_t at = r.err.find(prefix);
  EXPECT_NE(at, std::string::npos) << r.err;
  return at == std::string::npos ? "" : r.err.substr(at + prefix.size());
}

// stdout must be exactly one JSON document describing the error.
nlohmann::json ErrorJson(const SplitRun& r, const std::string& command) {
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << "stdout is not one JSON document:\n" << r.out;
  if (j.is_discarded()) return {};
  EXPECT_EQ(j.value("command", ""), command);
  EXPECT_EQ(j.value("exit_code", -1), r.code);
  const std::string text = StderrError(r, command);
  EXPECT_EQ(j.value("error", ""), text.substr(0, text.find('\n')));
  // The whole message stderr shows, hint lines included.
  const std::string message = j.value("message", "");
  EXPECT_FALSE(message.empty());
  EXPECT_EQ(text.substr(0, message.size()), message);
  return j;
}

TEST(JsonErrors, AFailedCommandPrintsItsErrorAsJsonOnStdout) {
  const std::string missing = Root() + "/no-such.manifest.json";
  SplitRun r = RunSplit("verify --manifest " + Q(missing) + " --json");
  EXPECT_EQ(r.code, 1) << r.err;
  nlohmann::json j = ErrorJson(r, "verify");
  EXPECT_TRUE(Contains(j.value("error", ""), "does not exist")) << j.dump();
  EXPECT_TRUE(j.contains("hint")) << j.dump();
  EXPECT_EQ(j.value("error_kind", ""), "FileNotFoundError");

  // Without --json stdout stays empty: the error is on stderr only.
  SplitRun text = RunSplit("verify --manifest " + Q(missing));
  EXPECT_EQ(text.code, 1);
  EXPECT_EQ(text.out, "");
}

TEST(JsonErrors, UsageErrorsAreJsonToo) {
  SplitRun r = RunSplit("inspect " + Q(Shard(BaseModel(), 1)) + " --json --no-such-flag");
  EXPECT_EQ(r.code, 2) << r.err;
  nlohmann::json j = ErrorJson(r, "inspect");
  EXPECT_EQ(j.value("error", ""), "unknown option --no-such-flag");

  // A bad value checked by the command itself (exit 2 as well).
  SplitRun v = RunSplit("verify --manifest " + Q(Root() + "/x.json") + " --samples -3 --json");
  EXPECT_EQ(v.code, 2) << v.err;
  EXPECT_EQ(ErrorJson(v, "verify").value("error", ""), "--samples must be non-negative");
}

TEST(JsonErrors, AnUnknownCommandOrSubCommandIsJsonToo) {
  // Before: stdout was empty for both (the words were never parsed).
  SplitRun r = RunSplit("bogus --json");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(Contains(r.err, "k3pack: unknown command 'bogus' (run `k3pack --help` for the list)")) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j.value("command", ""), "bogus");
  EXPECT_EQ(j.value("error", ""), "unknown command 'bogus'");
  EXPECT_EQ(j.value("exit_code", -1), 2);

  SplitRun t = RunSplit("trace bogus --json");
  EXPECT_EQ(t.code, 2) << t.err;
  EXPECT_EQ(ErrorJson(t, "trace").value("error", ""), "unknown sub-command 'bogus'");
  // Before: `trace --json` (no sub-command) printed only the text line.
  SplitRun bare = RunSplit("trace --json");
  EXPECT_EQ(bare.code, 2) << bare.err;
  EXPECT_EQ(ErrorJson(bare, "trace").value("error", ""), "missing sub-command (gen, replay or sweep) before --json");
  // Without --json stdout stays empty.
  EXPECT_EQ(RunSplit("bogus").out, "");
}

// Session 41: these usage errors left stdout empty with --json, though the
// README promises a verdict there; `--json=1` and a command without --json
// (completion) too.
TEST(JsonErrors, EveryUsageErrorOfARunThatAsksForJsonIsJson) {
  const std::pair<std::string, std::string> cases[] = {
      {"--json", "unknown option '--json'"},
      {"'' --json", "the command is an empty argument (an unset shell variable?)"},
      {"help bogus --json", "unknown command 'bogus'"},
      {"help --json", "unknown option '--json'"},
      {"--version --json", "--version takes no arguments, got '--json'"},
      {"completion bash --json", "unknown option --json"},
      {"verify nowhere.json --json=1", "--json takes no value"},
  };
  for (const auto& [args, error] : cases) {
    SCOPED_TRACE(args);
    SplitRun r = RunSplit(args);
    EXPECT_EQ(r.code, 2) << r.err;
    nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r.out;
    EXPECT_EQ(j.value("error", ""), error);
    EXPECT_EQ(j.value("exit_code", -1), 2);
    EXPECT_TRUE(Contains(r.err, error)) << r.err;
  }
  // After `--` the word is an argument, not a request for JSON.
  EXPECT_EQ(RunSplit("completion -- --json").out, "");
}

// A misspelled command got no hint (options did), and `help trace gen`
// printed the top-level help.
TEST(JsonErrors, AMisspelledCommandGetsTheNearestNameAndHelpTakesASubCommand) {
  SplitRun r = RunSplit("biuld --json");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(Contains(r.err, "k3pack: unknown command 'biuld' (did you mean build?)")) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j.value("error", ""), "unknown command 'biuld' (did you mean build?)");
  SplitRun v = RunSplit("--verison");
  EXPECT_EQ(v.code, 2) << v.err;
  EXPECT_TRUE(Contains(v.err, "unknown option '--verison' (did you mean --version?)")) << v.err;
  SplitRun h = RunSplit("help biuld");
  EXPECT_EQ(h.code, 2) << h.err;
  EXPECT_TRUE(Contains(h.err, "k3pack help: unknown command 'biuld' (did you mean build?)")) << h.err;

  SplitRun gen = RunSplit("help trace gen");
  EXPECT_EQ(gen.code, 0) << gen.err;
  EXPECT_EQ(gen.out, RunSplit("trace gen --help").out);
  EXPECT_TRUE(Contains(gen.out, "usage: k3pack trace gen")) << gen.out;
}

TEST(JsonErrors, ADamagedPackIsAJsonVerdictNamingEveryDamagedPayload) {
  const std::string model = FreshModel("json-damaged");
  CliRun b = Cli("build --gguf-dir " + Q(model) + " --progress none");
  ASSERT_EQ(b.code, 0) << b.out;
  const std::string pack = model + "/KIMI-K3-SYNTH.expert-major.pack";
  ASSERT_TRUE(fs::exists(pack));
  {
    std::fstream f(pack, std::ios::in | std::ios::out | std::ios::binary);
    const std::streamoff mid = static_cast<std::streamoff>(fs::file_size(pack) / 2);
    f.seekg(mid);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(mid);
    f.write(&c, 1);
  }
  SplitRun r = RunSplit("verify --manifest " + Q(model + "/kimi-k3-expert-pack.manifest.json") + " --full --json");
  EXPECT_EQ(r.code, 1) << r.err;
  nlohmann::json j = ErrorJson(r, "verify");
  EXPECT_TRUE(Contains(j.value("error", ""), "expert-pack payload does not match")) << j.dump();
  EXPECT_TRUE(Contains(j.value("hint", ""), "--repair-damaged")) << j.dump();
}

TEST(JsonErrors, ACommandThatPrintedItsJsonPrintsNoSecondDocument) {
  // doctor's report is the JSON of a failed diagnosis (exit 1): nothing is added.
  SplitRun r = RunSplit("doctor " + Q(Root() + "/no-such-dir") + " --json");
  EXPECT_EQ(r.code, 1) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j.value("schema", ""), "k3pack-doctor-v1");
  EXPECT_FALSE(j.contains("exit_code") && j.contains("command")) << r.out;
}

}  // namespace
}  // namespace k3cli
