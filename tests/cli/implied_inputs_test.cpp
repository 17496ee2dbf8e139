// `k3pack build DIR` on SGLang's layout: the tokenizer directory and the
// model config are found where SGLang's server finds them (spec 8.4 step 3:
// <shard dir>/tokenizer, <shard dir>/../kimi-k3-tokenizer, the sorted
// <shard dir>/../*tokenizer* directories; its config.json is the model's),
// every filled path is said on stderr, and when none or several qualify the
// command stops with SGLang's text before it writes anything. Before, build,
// pack and manifest refused to start without --model-config and
// --tokenizer-dir (and manifest without --pack).
#include <fstream>

#include <nlohmann/json.hpp>

#include "cli_fixture.h"

namespace k3cli {
namespace {

const std::string kQuiet = " --progress none --safety-margin-gib 0 --profile scaled ";

// A manifest without its creation time, which is all two runs may differ in.
nlohmann::json ReadJson(const std::string& path) {
  std::ifstream f(path);
  nlohmann::json j = nlohmann::json::parse(f);
  j.erase("created_at");
  return j;
}

// The model's shards alone in `root`/gguf, nothing else beside them.
std::string ShardsOnly(const std::string& root) {
  fs::remove_all(root);
  fs::create_directories(root + "/gguf");
  for (int i = 1; i <= 3; ++i) fs::copy_file(Shard(BaseModel(), i), root + "/gguf/" + fs::path(Shard(BaseModel(), i)).filename().string());
  return root + "/gguf";
}

TEST(ImpliedInputs, BuildWithOnlyTheShardDirectoryUsesTheFilesBesideItAndSaysSo) {
  const std::string m = FreshModel("implied-beside");
  CliRun r = Cli("build" + kQuiet + Q(m));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(Contains(r.out, "using --tokenizer-dir " + m + "/tokenizer (")) << r.out;
  EXPECT_TRUE(Contains(r.out, "using --model-config " + m + "/config.json (config.json beside the shards)")) << r.out;
  const nlohmann::json j = ReadJson(m + "/" + kManifestName);
  EXPECT_EQ(j["tokenizer"]["path"].get<std::string>(), fs::canonical(m + "/tokenizer").string());

  // The same manifest as with every input given.
  CliRun explicit_run = Cli("manifest --progress none " + Q(m) + " --pack " + Q(m + "/KIMI-K3-SYNTH.expert-major.pack") +
                            " --model-config " + Q(m + "/config.json") + " --tokenizer-dir " + Q(m + "/tokenizer") +
                            " --manifest " + Q(m + "/explicit.json"));
  ASSERT_EQ(explicit_run.code, 0) << explicit_run.out;
  EXPECT_FALSE(Contains(explicit_run.out, "using --")) << "given inputs are never replaced: " << explicit_run.out;
  EXPECT_TRUE(ReadJson(m + "/explicit.json") == j) << "the manifest differs from the one with every input given";

  // manifest alone finds the pack `pack` wrote too.
  CliRun alone = Cli("manifest --progress none " + Q(m) + " --manifest " + Q(m + "/alone.json"));
  ASSERT_EQ(alone.code, 0) << alone.out;
  EXPECT_TRUE(Contains(alone.out, "using --pack " + m + "/KIMI-K3-SYNTH.expert-major.pack (")) << alone.out;
  EXPECT_TRUE(ReadJson(m + "/alone.json") == j) << "the manifest differs from the one with every input given";
}

TEST(ImpliedInputs, TokenizerBesideTheShardDirectoryGivesTheModelConfigToo) {
  const std::string root = Root() + "/implied-sibling";
  const std::string gguf = ShardsOnly(root);
  // kimi-k3-tokenizer is both SGLang's second candidate and a *tokenizer*
  // match: one directory, so one candidate.
  fs::copy(BaseModel() + "/tokenizer", root + "/kimi-k3-tokenizer", fs::copy_options::recursive);
  CliRun r = Cli("build" + kQuiet + Q(gguf));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(Contains(r.out, "using --tokenizer-dir " + root + "/kimi-k3-tokenizer (")) << r.out;
  EXPECT_TRUE(Contains(r.out, "using --model-config " + root + "/kimi-k3-tokenizer/config.json (the tokenizer "
                              "directory's config.json")) << r.out;
  EXPECT_TRUE(fs::exists(gguf + "/" + kManifestName));

  // pack alone: no config.json beside the shards, so the tokenizer's.
  CliRun p = Cli("pack" + kQuiet + Q(gguf) + " --pack " + Q(root + "/other.pack"));
  ASSERT_EQ(p.code, 0) << p.out;
  EXPECT_TRUE(Contains(p.out, "using --model-config " + root + "/kimi-k3-tokenizer/config.json")) << p.out;
}

// A missing or empty shard directory was reported as a missing tokenizer
// ("--tokenizer-dir  does not exist", the value blank) or with exit 2.
TEST(ImpliedInputs, AMissingOrEmptyShardDirectoryIsWhatIsReported) {
  const std::string root = Root() + "/implied-no-shards";
  fs::create_directories(root + "/empty");
  for (const std::string command : {"build", "pack", "manifest"}) {
    const std::string quiet = " --progress none --profile scaled ";
    CliRun missing = Cli(command + quiet + Q(root + "/nosuch"));
    EXPECT_EQ(missing.code, 1) << missing.out;
    EXPECT_TRUE(Contains(missing.out, "error: --gguf-dir " + root + "/nosuch does not exist\n")) << missing.out;
    CliRun empty = Cli(command + quiet + Q(root + "/empty"));
    EXPECT_EQ(empty.code, 1) << empty.out;
    // SGLang's text, the directory resolved; the option is named on the hint line.
    EXPECT_TRUE(Contains(empty.out, "error: no GGUF files found in " + root + "/empty\nhint: pass the directory holding "
                                    "the <prefix>-NNNNN-of-NNNNN.gguf shards as --gguf-dir\n"))
        << empty.out;
    EXPECT_FALSE(Contains(empty.out + missing.out, "tokenizer")) << command;
  }
  EXPECT_TRUE(fs::is_empty(root + "/empty"));
}

TEST(ImpliedInputs, NoneOrSeveralCandidatesStopWithSGLangsTextBeforeAnyWrite) {
  const std::string root = Root() + "/implied-none";
  const std::string gguf = ShardsOnly(root);
  const auto before = Snapshot(root);
  CliRun none = Cli("build" + kQuiet + Q(gguf));
  EXPECT_EQ(none.code, 2) << none.out;
  EXPECT_TRUE(Contains(none.out, "error: could not uniquely derive Kimi tokenizer beside " + gguf + "; candidates: none\n"))
      << none.out;
  EXPECT_TRUE(Contains(none.out, "pass --tokenizer-dir with the Kimi tokenizer directory")) << none.out;
  CliRun pack = Cli("pack" + kQuiet + Q(gguf));
  EXPECT_EQ(pack.code, 2) << pack.out;
  EXPECT_TRUE(Contains(pack.out, "--model-config not given, and no config.json found for it: no " + gguf +
                                     "/config.json, and could not uniquely derive Kimi tokenizer beside " + gguf))
      << pack.out;
  EXPECT_TRUE(Contains(pack.out, "pass --model-config with the Kimi-K3 model's HF config.json")) << pack.out;

  // Two valid directories: SGLang refuses to choose, and so does k3pack. A
  // directory that is not a tokenizer (no tokenizer file) is no candidate.
  fs::copy(BaseModel() + "/tokenizer", root + "/a-tokenizer", fs::copy_options::recursive);
  fs::copy(BaseModel() + "/tokenizer", root + "/b-tokenizer", fs::copy_options::recursive);
  fs::create_directories(root + "/c-tokenizer");
  fs::copy_file(BaseModel() + "/tokenizer/config.json", root + "/c-tokenizer/config.json");
  const auto before_two = Snapshot(root);
  CliRun two = Cli("build" + kQuiet + Q(gguf));
  EXPECT_EQ(two.code, 2) << two.out;
  // SGLang lists the candidates by their resolved paths.
  const std::string refusal = "error: could not uniquely derive Kimi tokenizer beside " + gguf + "; candidates: " +
                              root + "/a-tokenizer, " + root + "/b-tokenizer\n";
  EXPECT_TRUE(Contains(two.out, refusal)) << two.out;
  EXPECT_TRUE(Contains(two.out, "hint: pass --tokenizer-dir with the Kimi tokenizer directory")) << two.out;
  // Reached through a symlink, the shard directory is searched where it
  // really is (SGLang resolves the shard first): the link's own directory
  // is no place to look for other tokenizers.
  const std::string elsewhere = root + "-link";
  fs::remove_all(elsewhere);
  fs::create_directories(elsewhere);
  fs::create_directory_symlink(gguf, elsewhere + "/shards");
  CliRun linked = Cli("build" + kQuiet + Q(elsewhere + "/shards"));
  EXPECT_EQ(linked.code, 2) << linked.out;
  EXPECT_TRUE(Contains(linked.out, refusal)) << linked.out;
  fs::remove_all(elsewhere);
  EXPECT_EQ(Snapshot(root), before_two) << "a refused build writes nothing";
  fs::remove_all(root + "/a-tokenizer");
  fs::remove_all(root + "/b-tokenizer");
  fs::remove_all(root + "/c-tokenizer");
  EXPECT_EQ(Snapshot(root), before);

  // Given explicitly, a tokenizer directory is used whatever lies beside the shards.
  CliRun given = Cli("build" + kQuiet + Q(gguf) + " --tokenizer-dir " + Q(BaseModel() + "/tokenizer"));
  ASSERT_EQ(given.code, 0) << given.out;
  EXPECT_FALSE(Contains(given.out, "using --tokenizer-dir")) << given.out;
  EXPECT_TRUE(Contains(given.out, "using --model-config " + BaseModel() + "/tokenizer/config.json")) << given.out;
}

// After `k3pack build DIR`, the commands that read its manifest take DIR
// (or the manifest) as their argument. Before, each needed --manifest with
// the full file path.
TEST(ImpliedInputs, ManifestReadersTakeTheDirectoryBuildWroteInto) {
  const std::string m = FreshModel("implied-manifest-dir");
  ASSERT_EQ(Cli("build" + kQuiet + Q(m)).code, 0);
  const std::string manifest = m + "/" + kManifestName;
  for (const std::string cmd : {"verify", "load", "run-experts"}) {
    const std::string quiet = cmd == "run-experts" ? " " : " --progress none ";
    CliRun r = Cli(cmd + quiet + Q(m));
    EXPECT_EQ(r.code, 0) << cmd << ": " << r.out;
    EXPECT_TRUE(Contains(r.out, "using --manifest " + manifest + " (the manifest `k3pack build` writes in " + m + ")"))
        << cmd << ": " << r.out;
    CliRun file = Cli(cmd + quiet + Q(manifest));
    EXPECT_EQ(file.code, 0) << cmd << ": " << file.out;
    EXPECT_FALSE(Contains(file.out, "using --manifest")) << file.out;
  }
  // trace replay too, with SGLang's default cache budget (cache_vram_mib 4096) when none is given.
  const std::string trace = Root() + "/implied-manifest-dir.k3t";
  ASSERT_EQ(Cli("trace gen --manifest " + Q(manifest) + " --requests 1 --decode-tokens 4 --trace " + Q(trace)).code, 0);
  CliRun replay = Cli("trace replay --progress none --trace " + Q(trace) + " --manifest " + Q(m));
  EXPECT_EQ(replay.code, 0) << replay.out;
  EXPECT_TRUE(Contains(replay.out, "using --manifest " + manifest + " (")) << replay.out;
  EXPECT_TRUE(Contains(replay.out, "cache 4096 MiB")) << replay.out;

  const std::string empty = Root() + "/implied-manifest-empty";
  fs::create_directories(empty);
  CliRun none = Cli("verify " + Q(empty));
  EXPECT_EQ(none.code, 1) << none.out;
  EXPECT_TRUE(Contains(none.out, "error: --manifest " + empty + "/" + kManifestName + " does not exist")) << none.out;
}

TEST(ImpliedInputs, HelpShowsTheDefaultsAndTheUsageLineMarksThemOptional) {
  for (const std::string cmd : {"build", "manifest", "pack"}) {
    CliRun h = Cli(cmd + " --help");
    ASSERT_EQ(h.code, 0) << h.out;
    EXPECT_TRUE(Contains(h.out, "[--model-config CONFIG]")) << cmd << ": " << h.out;
    EXPECT_TRUE(Contains(h.out, "default: config.json beside the shards, else the tokenizer directory's")) << h.out;
    if (cmd != "pack") {
      EXPECT_TRUE(Contains(h.out, "[--tokenizer-dir TOK]")) << h.out;
    }
  }
}

// The help adds "(or give it as the argument)" to the option a positional
// argument stands for; a description must not say it again.
TEST(ImpliedInputs, HelpSaysOnceThatTheManifestMayBeTheArgument) {
  for (const std::string cmd : {"verify", "load", "run-experts"}) {
    CliRun h = Cli(cmd + " --help");
    ASSERT_EQ(h.code, 0) << h.out;
    const std::string phrase = "(or give it as the argument)";
    const size_t first = h.out.find(phrase);
    ASSERT_NE(first, std::string::npos) << cmd << ": " << h.out;
    EXPECT_EQ(h.out.find(phrase, first + 1), std::string::npos) << cmd << ": " << h.out;
  }
}

}  // namespace
}  // namespace k3cli
