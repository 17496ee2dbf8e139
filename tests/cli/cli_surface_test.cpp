// The command line's surface, driving the real binary: progress on every long
// command (--progress json lines, Ctrl-C), trace sweep on a small model,
// --version, the man page and bash completion generated from the commands.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "k3pack/gguf.h"
#include "store/object_space.h"
#include "store/replay.h"
#include "../cli_run.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct CliResult {
  int code = -1;  // exit status; -1 when killed by a signal
  std::string out, err;
};

class CliSurface : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("k3cli-" + std::to_string(::getpid()) + "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Runs `k3pack ARGS` through the shell, stdout and stderr kept apart.
  CliResult K3(const std::string& args) {
    const std::string o = (dir_ / "stdout").string(), e = (dir_ / "stderr").string();
    const std::string cmd = std::string(K3PACK_BIN) + " " + args + " >" + o + " 2>" + e + " </dev/null";
    const int st = std::system(cmd.c_str());
    CliResult r;
    r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    r.out = k3pack::testing_cli::FileBytes(o);
    r.err = k3pack::testing_cli::FileBytes(e);
    return r;
  }
  std::string P(const std::string& name) const { return (dir_ / name).string(); }

  // The JSON progress lines of stderr; every '{' line must parse.
  static std::vector<json> JsonLines(const std::string& err) {
    std::vector<json> out;
    std::istringstream is(err);
    for (std::string l; std::getline(is, l);) {
      if (l.empty() || l[0] != '{') continue;
      out.push_back(json::parse(l));
    }
    return out;
  }
  // The last progress line of `phase` says the work is complete.
  static void ExpectFinished(const std::vector<json>& lines, const std::string& phase, const std::string& unit) {
    const json* last = nullptr;
    for (const auto& j : lines)
      if (j.value("phase", "") == phase && j.contains("done")) last = &j;
    ASSERT_NE(last, nullptr) << "no progress line for phase " << phase;
    EXPECT_EQ((*last)["done"], true) << last->dump();
    EXPECT_EQ((*last)["unit"], unit);
    EXPECT_GT((*last)["total_objects"].get<uint64_t>(), 0u);
    EXPECT_EQ((*last)["done_objects"], (*last)["total_objects"]);
  }

  fs::path dir_;
};

TEST_F(CliSurface, SynthShowsJsonProgress) {
  auto r = K3("synth --preset tiny --all-data --out " + P("m") + " --progress json");
  ASSERT_EQ(r.code, 0) << r.err;
  ExpectFinished(JsonLines(r.err), "synth", "tensors");
  // stdout is the command's own result only.
  EXPECT_EQ(r.out.find("\"phase\""), std::string::npos);
}

TEST_F(CliSurface, InspectStatsAndDoctorShowJsonProgress) {
  ASSERT_EQ(K3("synth --preset tiny --out " + P("m") + " --progress none").code, 0);
  auto r = K3("inspect " + P("m") + " --stats --json --progress json");
  ASSERT_EQ(r.code, 0) << r.err;
  ExpectFinished(JsonLines(r.err), "stats", "tensors");
  EXPECT_TRUE(json::accept(r.out)) << r.out;  // stdout stays pure JSON

  r = K3("doctor " + P("m") + " --profile scaled --progress json");
  bool noted = false;
  for (const auto& j : JsonLines(r.err)) noted |= j.value("phase", "") == "doctor" && j.contains("note");
  EXPECT_TRUE(noted) << r.err;
  // The value checks (what takes time on a big set) count bytes and tensors.
  ExpectFinished(JsonLines(r.err), "doctor values", "tensors");
}

TEST_F(CliSurface, TraceSweepAndReplayShowJsonProgress) {
  ASSERT_EQ(K3("trace gen --layers 2 --experts 64 --top-k 4 --requests 1 --decode-tokens 32 --out " + P("t.trace"))
                .code,
            0);
  auto r = K3("trace sweep --trace " + P("t.trace") + " --object-bytes 4096 --sizes 8,16 --svg " + P("s.svg") +
              " --progress json --json");
  ASSERT_EQ(r.code, 0) << r.err;
  ExpectFinished(JsonLines(r.err), "sweep", "simulations");
  const auto lines = JsonLines(r.err);
  EXPECT_EQ(lines.back()["total_objects"], 12);  // (5 policies + Belady) x 2 sizes
  // Session 14: the timed and the expert-parallel sweeps showed none.
  r = K3("trace sweep --trace " + P("t.trace") + " --object-bytes 4096 --sizes 8,16 --policies lru --timing "
         "--progress json --json");
  ASSERT_EQ(r.code, 0) << r.err;
  ExpectFinished(JsonLines(r.err), "sweep", "simulations");
  EXPECT_EQ(JsonLines(r.err).back()["total_objects"], 6);  // (lru without and with prefetch + Belady) x 2 sizes
  r = K3("trace sweep --trace " + P("t.trace") + " --object-bytes 4096 --sizes 2,8 --policies lru --ep-size 2 "
         "--progress json --json");
  ASSERT_EQ(r.code, 0) << r.err;
  ExpectFinished(JsonLines(r.err), "sweep", "simulations");
  EXPECT_EQ(JsonLines(r.err).back()["total_objects"], 12);  // (lru + Belady) x 2 sizes x (2 ranks + one machine)
  // replay --simulate: the policy's calls, then Belady's, each a phase of
  // its own (one total over both gave a wrong ETA in the first half).
  r = K3("trace replay --simulate --trace " + P("t.trace") + " --object-bytes 4096 --cache-mib 1 --progress json --json");
  ASSERT_EQ(r.code, 0) << r.err;
  ExpectFinished(JsonLines(r.err), "simulate", "calls");
  ExpectFinished(JsonLines(r.err), "belady", "calls");
  for (const json& j : JsonLines(r.err)) EXPECT_EQ(j["total_objects"], JsonLines(r.err).front()["total_objects"]);
  EXPECT_TRUE(json::parse(r.out).contains("belady_hit_rate")) << r.out;
}

// With --progress json a successful run's stderr is JSON objects only: the
// narration before and between the long steps ("using --model-config ...",
// "finishing the SHA-256 ...", notes) is {"phase": COMMAND, "note": LINE}.
// Before, those lines were text among the objects.
TEST_F(CliSurface, ProgressJsonKeepsStderrOneJsonObjectPerLine) {
  auto every_line_is_an_object = [](const CliResult& r) {
    std::istringstream is(r.err);
    size_t notes = 0;
    for (std::string l; std::getline(is, l);) {
      const json j = json::parse(l, nullptr, /*allow_exceptions=*/false);
      EXPECT_TRUE(j.is_object()) << "not a JSON object on stderr: " << l;
      if (j.is_object() && j.contains("note")) {
        ++notes;
        // The key says it is a note (the sweep's said "note: note: ...").
        EXPECT_FALSE(j["note"].get<std::string>().starts_with("note:")) << l;
      }
    }
    return notes;
  };
  // A deprecated spelling's note is an object too (it was text: it was told
  // while the words parsed, before --progress json was known).
  auto d = K3("trace gen --out " + P("d.k3t") + " --layers 2 --experts 8 --top-k 2 --decode-tokens 4 --progress json");
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_GE(every_line_is_an_object(d), 1u) << d.err;
  EXPECT_NE(d.err.find("{\"note\":\"--out is deprecated; use --trace\",\"phase\":\"trace gen\"}"), std::string::npos)
      << d.err;
  ASSERT_EQ(K3("synth --preset tiny --out " + P("m") + " --progress none").code, 0);
  // Every input implied by the model directory: each one is announced.
  auto r = K3("build " + P("m") + " --progress json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_GE(every_line_is_an_object(r), 3u) << r.err;  // tokenizer, config, the manifest's steps
  EXPECT_NE(r.err.find("\"note\":\"using --model-config"), std::string::npos) << r.err;
  r = K3("build " + P("m") + " --progress json");  // already built
  ASSERT_EQ(r.code, 0) << r.err;
  every_line_is_an_object(r);
  r = K3("trace sweep --family kimi --layers 2 --experts 8 --top-k 2 --decode-tokens 16 --svg " + P("s.svg") +
         " --progress json --json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_GE(every_line_is_an_object(r), 1u) << r.err;  // the sizes note of a model this small
  // Without --progress json the same narration is text.
  r = K3("build " + P("m") + " --progress none");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("k3pack build: using --model-config"), std::string::npos) << r.err;
}

// pack/build, verify --full, load and trace replay on a real (tiny) pack.
TEST_F(CliSurface, PackedModelCommandsShowJsonProgress) {
  ASSERT_EQ(K3("synth --preset tiny --seed 3 --out " + P("m") + " --progress none").code, 0);
  const std::string m = P("m");
  auto r = K3("build --gguf-dir " + m + " --model-config " + m + "/config.json --tokenizer-dir " + m +
              "/tokenizer --profile scaled --manifest " + P("m.json") + " --progress json");
  ASSERT_EQ(r.code, 0) << r.err;
  auto lines = JsonLines(r.err);
  ExpectFinished(lines, "build", "objects");
  for (const auto& j : lines) {
    // The tiny model has no holes: every byte done was copied.
    // Notes share the phase's name ({"phase": "build", "note": ...}) and carry no counts.
    if (j["phase"] == "build" && j.value("done", false)) {
      EXPECT_GT(j["bytes_per_s"].get<double>(), 0.0);
    }
  }
  r = K3("verify --manifest " + P("m.json") + " --full --progress json");
  ASSERT_EQ(r.code, 0) << r.err;
  ExpectFinished(JsonLines(r.err), "verify", "objects");
  r = K3("load --manifest " + P("m.json") + " --progress json");
  ASSERT_EQ(r.code, 0) << r.err;
  ExpectFinished(JsonLines(r.err), "load", "shards");
  // Its fraction is of bytes (known up front from a walk of the stream), not
  // of whole shards: every object with a count carries the same byte total.
  uint64_t load_total = 0;
  for (const auto& j : JsonLines(r.err)) {
    if (j.value("phase", "") != "load" || !j.contains("done")) continue;
    EXPECT_GT(j["total_bytes"].get<uint64_t>(), 0u) << j.dump();
    load_total = j["total_bytes"].get<uint64_t>();
    if (j["done"] == true) {
      EXPECT_EQ(j["done_bytes"], j["total_bytes"]) << j.dump();
    }
  }
  EXPECT_GT(load_total, 0u);
  // run-experts: layers done, in both of its loops (the layer list and the stack).
  r = K3("run-experts --manifest " + P("m.json") + " --all-layers --progress json");
  ASSERT_EQ(r.code, 0) << r.err;
  ExpectFinished(JsonLines(r.err), "run", "layers");
  r = K3("run-experts --manifest " + P("m.json") + " --all-layers --trace-out " + P("stack.trace") + " --progress json");
  ASSERT_EQ(r.code, 0) << r.err;
  ExpectFinished(JsonLines(r.err), "run", "layers");
  ASSERT_EQ(K3("trace gen --manifest " + P("m.json") + " --requests 1 --decode-tokens 16 --out " + P("t.trace")).code,
            0);
  r = K3("trace replay --trace " + P("t.trace") + " --manifest " + P("m.json") + " --cache-mib 64 --progress json");
  ASSERT_EQ(r.code, 0) << r.err;
  ExpectFinished(JsonLines(r.err), "replay", "records");

  // A damaged payload: verify --full with progress still ends (its progress
  // loop once waited for entries that, being damaged, never counted as done).
  const std::string pack = json::parse(k3pack::testing_cli::FileBytes(P("m.json")))["expert_pack"]["path"].get<std::string>();
  {
    std::fstream f(pack, std::ios::in | std::ios::out | std::ios::binary);
    const auto at = static_cast<std::streamoff>(fs::file_size(pack) / 2);
    f.seekg(at);
    char c = static_cast<char>(f.get());
    f.seekp(at);
    f.put(static_cast<char>(c ^ 0x40));
  }
  const std::string cmd = "timeout 120 " + std::string(K3PACK_BIN) + " verify --manifest " + P("m.json") +
                          " --full --progress json >/dev/null 2>" + P("verify.err");
  const int st = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 1) << k3pack::testing_cli::FileBytes(P("verify.err"));  // 124: it hung
  EXPECT_NE(k3pack::testing_cli::FileBytes(P("verify.err")).find("does not match digest sidecar"), std::string::npos);
}

TEST_F(CliSurface, ProgressValueIsCheckedOnEveryLongCommand) {
  for (const std::string& cmd : std::vector<std::string>{"synth --out " + P("x"), "trace sweep", "trace replay --trace t --cache-mib 1",
                                "inspect " + P("x") + " --stats", "load --manifest m.json", "doctor " + P("x"),
                                "verify --manifest m.json --full", "run-experts --manifest m.json"}) {
    auto r = K3(cmd + " --progress sometimes");
    EXPECT_EQ(r.code, 2) << cmd << "\n" << r.err;
    EXPECT_NE(r.err.find("--progress must be one of auto, bar, json, none"), std::string::npos) << cmd << "\n" << r.err;
    EXPECT_FALSE(fs::exists(P("x"))) << cmd;
  }
}

TEST_F(CliSurface, LoadQuietIsADeprecatedAliasOfProgressNone) {
  auto r = K3("load --manifest " + P("missing.json") + " --quiet");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--quiet is deprecated"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--progress none"), std::string::npos) << r.err;
}

// Ctrl-C (or SIGTERM) in a command with nothing to resume: the bar line is
// ended, the user is told on a line of its own, the exit code is 130 (143).
TEST_F(CliSurface, InterruptEndsTheBarLineAndExits130) {
  for (const auto& [sig, code] : {std::pair{SIGINT, 130}, std::pair{SIGTERM, 143}}) {
    SCOPED_TRACE(sig);
    int err_pipe[2];
    ASSERT_EQ(::pipe(err_pipe), 0);
    const std::string svg = P("s.svg");
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::dup2(err_pipe[1], STDERR_FILENO);
      ::close(err_pipe[0]);
      std::freopen("/dev/null", "w", stdout);
      // The default trace on the full Kimi dimensions: many seconds of work.
      ::execl(K3PACK_BIN, K3PACK_BIN, "trace", "sweep", "--progress", "bar", "--svg", svg.c_str(), (char*)nullptr);
      ::_exit(127);
    }
    ::close(err_pipe[1]);
    std::string err;
    char c;
    // Wait for the first bar draw (then the handler is installed), then stop it.
    while (::read(err_pipe[0], &c, 1) == 1) {
      err.push_back(c);
      if (c == '\r') break;
    }
    ASSERT_FALSE(err.empty()) << "no progress bar drawn";
    ::kill(pid, sig);
    while (::read(err_pipe[0], &c, 1) == 1) err.push_back(c);
    ::close(err_pipe[0]);
    int st = 0;
    ::waitpid(pid, &st, 0);
    ASSERT_TRUE(WIFEXITED(st)) << "killed by signal " << (WIFSIGNALED(st) ? WTERMSIG(st) : 0) << "\n" << err;
    EXPECT_EQ(WEXITSTATUS(st), code) << err;
    EXPECT_NE(err.find("\nk3pack trace sweep: interrupted"), std::string::npos) << err;  // on its own line
    EXPECT_FALSE(fs::exists(svg));
  }
}

// Item 11: a small model gets sizes that fit and a note, not identical rows.
TEST_F(CliSurface, TraceSweepOnASmallModelPicksSizesThatFit) {
  ASSERT_EQ(K3("trace gen --layers 2 --experts 16 --top-k 4 --requests 2 --decode-tokens 64 --out " + P("t.trace"))
                .code,
            0);
  auto r = K3("trace sweep --trace " + P("t.trace") + " --object-bytes 4096 --svg " + P("s.svg") +
              " --progress none --json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("only 32 expert objects"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--sizes"), std::string::npos) << r.err;
  const json j = json::parse(r.out);
  const auto sizes = j["capacity_objects"].get<std::vector<uint64_t>>();
  ASSERT_GE(sizes.size(), 4u) << j.dump();
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_GE(sizes[i], 4u);
    EXPECT_LE(sizes[i], 32u);
    if (i) {
      EXPECT_GT(sizes[i], sizes[i - 1]) << j.dump();
    }
  }
  // Distinct sizes give distinct Belady hit rates on this trace.
  EXPECT_NE(j["hit_rate"]["belady"].front(), j["hit_rate"]["belady"].back()) << j.dump();
}

TEST(SweepSizes, KimiSizedModelKeepsTheDefaultShares) {
  k3pack::store::ObjectSpace s;
  s.active_layer_ids.resize(92);
  s.num_experts = 896;
  s.top_k = 16;
  std::string note;
  const auto sizes = k3pack::store::DefaultSweepSizes(s, &note);
  EXPECT_EQ(note, "");
  const uint64_t n = 92 * 896;
  EXPECT_EQ(sizes, (std::vector<uint64_t>{uint64_t(0.0054 * n), uint64_t(0.01 * n), uint64_t(0.02 * n),
                                          uint64_t(0.035 * n), uint64_t(0.05 * n), uint64_t(0.08 * n),
                                          uint64_t(0.12 * n), uint64_t(0.20 * n)}));
}

TEST(SweepSizes, TinyModelGetsEveryFittingSize) {
  k3pack::store::ObjectSpace s;
  s.active_layer_ids.resize(1);
  s.num_experts = 8;
  s.top_k = 4;
  std::string note;
  const auto sizes = k3pack::store::DefaultSweepSizes(s, &note);
  EXPECT_NE(note, "");
  EXPECT_EQ(sizes, (std::vector<uint64_t>{4, 5, 6, 7, 8}));
}

// Item 15.
TEST_F(CliSurface, VersionNamesRevisionAndBuildType) {
  auto v = K3("--version"), short_v = K3("-V");
  ASSERT_EQ(v.code, 0);
  EXPECT_EQ(v.out, short_v.out);
  std::smatch m;
  ASSERT_TRUE(std::regex_match(v.out, m, std::regex(R"(k3pack \d+\.\d+\.\d+ \(git ([0-9a-f]{12}|unknown), (\S+)\)\n)")))
      << v.out;
  const std::string rev = m[1];
  FILE* g = ::popen(("git -C " + std::string(K3PACK_SOURCE_DIR) + " rev-parse --short=12 HEAD 2>/dev/null").c_str(), "r");
  char buf[64] = {0};
  const bool have_git = g && std::fgets(buf, sizeof buf, g) != nullptr;
  if (g) ::pclose(g);
  if (have_git) {
    EXPECT_EQ(rev + "\n", std::string(buf));
  }
  auto help = K3("--help");
  EXPECT_NE(help.out.find("-V, --version"), std::string::npos) << help.out;
}

TEST_F(CliSurface, ManPageHasEveryCommandFromTheHelpText) {
  auto man = K3("help --man");
  ASSERT_EQ(man.code, 0) << man.err;
  EXPECT_EQ(man.out.rfind(".TH K3PACK 1", 0), 0u);
  auto help = K3("--help");
  std::istringstream is(help.out.substr(help.out.find("commands:")));
  std::string line;
  std::getline(is, line);
  int commands = 0;
  while (std::getline(is, line) && line.rfind("  ", 0) == 0) {
    const std::string name = line.substr(2, line.find(' ', 2) - 2);
    EXPECT_NE(man.out.find(".SS \"k3pack " + name + "\""), std::string::npos) << name;
    ++commands;
  }
  EXPECT_GT(commands, 10);
  // The commands' own help text, escaped for troff.
  EXPECT_NE(man.out.find(".SS \"k3pack trace sweep\""), std::string::npos);
  EXPECT_NE(man.out.find("\\-\\-gguf\\-dir"), std::string::npos);
  EXPECT_NE(man.out.find("\\-\\-progress"), std::string::npos);
}

TEST_F(CliSurface, BashCompletionCompletesCommandsSubcommandsAndOptions) {
  auto c = K3("completion bash");
  ASSERT_EQ(c.code, 0) << c.err;
  const std::string script = P("k3pack.bash");
  { std::ofstream(script) << c.out; }
  auto complete = [&](const std::string& words, int cword) {
    const std::string cmd = "bash -c 'source " + script + "; COMP_WORDS=(" + words + "); COMP_CWORD=" +
                            std::to_string(cword) + "; _k3pack; echo \"${COMPREPLY[*]}\"' 2>&1";
    FILE* f = ::popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
    ::pclose(f);
    return out;
  };
  EXPECT_EQ(complete("k3pack bui", 1), "build\n");
  EXPECT_EQ(complete("k3pack trace re", 2), "replay\n");
  EXPECT_EQ(complete("k3pack trace sweep --progr", 3), "--progress\n");
  EXPECT_NE(complete("k3pack build --", 2).find("--tokenizer-dir"), std::string::npos);
  EXPECT_EQ(K3("completion zsh").code, 2);
}

}  // namespace

namespace {

// A UINT64 array element above INT64_MAX is shown as its value, as gguf-py
// shows it (it was printed as a negative number).
TEST_F(CliSurface, InspectJsonShowsUint64ArrayElementsAsTheirValue) {
  std::string encoded;
  auto put = [&](auto v) { encoded.append(reinterpret_cast<const char*>(&v), sizeof v); };
  put(static_cast<uint32_t>(k3pack::gguf::ValueType::kUint64));
  put(uint64_t{2});
  put(std::numeric_limits<uint64_t>::max());
  put(uint64_t{42});
  k3pack::gguf::MetadataBuilder meta;
  meta.Str("general.architecture", "test").Raw("test.u64s", k3pack::gguf::ValueType::kArray, encoded);
  ASSERT_TRUE(k3pack::gguf::WriteGguf(P("u.gguf"), meta, {}).ok());
  auto r = K3("inspect " + P("u.gguf") + " --json --file-only");
  ASSERT_EQ(r.code, 0) << r.err;
  const json values = json::parse(r.out)["metadata"]["test.u64s"]["value"];
  ASSERT_EQ(values.size(), 2u) << r.out;
  EXPECT_EQ(values[0].get<uint64_t>(), std::numeric_limits<uint64_t>::max()) << r.out;
  EXPECT_EQ(values[1].get<uint64_t>(), 42u);
}

// A path is bytes on Linux: a directory name that is not UTF-8 must come back
// \xNN-escaped in --json output, never make the JSON dump abort the command.
TEST_F(CliSurface, JsonOutputSurvivesPathsThatAreNotUtf8) {
  const std::string odd = P("m\xff");  // passed to the shell as raw bytes
  auto r = K3("synth --preset tiny --out '" + odd + "' --progress none --json");
  ASSERT_EQ(r.code, 0) << r.err;
  ASSERT_TRUE(json::accept(r.out)) << r.out;
  EXPECT_NE(r.out.find("m\\\\xff"), std::string::npos) << r.out;  // \xff, JSON-escaped backslash
  r = K3("inspect '" + odd + "' --json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(json::accept(r.out)) << r.out;
  r = K3("doctor '" + odd + "' --json --progress none");
  EXPECT_TRUE(json::accept(r.out)) << r.err;
  // pack --json names the odd path escaped.
  r = K3("pack --gguf-dir '" + odd + "' --model-config '" + odd + "/config.json' --pack " + P("p.pack") +
         " --progress none --json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(json::accept(r.out)) << r.out;
  // build records the shard paths in the manifest, which SGLang reads as
  // UTF-8: refused in preflight, before a byte of the pack is written.
  r = K3("build --gguf-dir '" + odd + "' --model-config '" + odd + "/config.json' --tokenizer-dir '" + odd +
         "/tokenizer' --pack " + P("b.pack") + " --progress none");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("is not valid UTF-8, and the manifest records it"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("m\\xff"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(P("b.pack")));
  EXPECT_FALSE(fs::exists(P("b.pack.partial")));
}

TEST_F(CliSurface, HelpCommandIsTheCommandsHelpAndUsageLinesNameTheCommandOnce) {
  // `k3pack help CMD` prints CMD's own help; an unknown CMD is a usage error.
  CliResult pack = K3("help pack");
  EXPECT_EQ(pack.code, 0);
  EXPECT_EQ(pack.out, K3("pack --help").out);
  EXPECT_NE(pack.out.find("--model-config"), std::string::npos) << pack.out;
  EXPECT_EQ(K3("help bogus").code, 2);
  for (const char* cmd : {"verify", "pack", "build", "manifest", "load", "doctor", "repair", "synth", "inspect"}) {
    const std::string out = K3(std::string(cmd) + " --help").out;
    EXPECT_EQ(out.find("usage: k3pack " + std::string(cmd) + " k3pack"), std::string::npos) << out;
    EXPECT_EQ(out.find(";\n"), std::string::npos) << cmd << ": a list ends with a stray ';'";
  }
}

}  // namespace
