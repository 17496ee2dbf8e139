// Issue 12, items 1-9: each test makes the mistake a new user makes and
// checks the exit code, that the message names the option and the fix, that
// no input changed (SHA-256 of every file before/after) and that nothing
// partial was published.
#include <gtest/gtest.h>

#include <unistd.h>

#include <csignal>
#include <fstream>

#include <nlohmann/json.hpp>

#include "cli_fixture.h"
#include "util/file.h"

namespace k3cli {
namespace {

// No pack, partial, lock, digests or manifest anywhere in `dir`.
void ExpectNothingPublished(const std::string& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    EXPECT_FALSE(Contains(n, ".pack") || Contains(n, "manifest") || Contains(n, ".partial") || Contains(n, ".tmp"))
        << "published: " << e.path();
  }
}

// ---------------------------------------------------------------- item 1

TEST(Preflight, BuildWithMissingTokenizerDirWritesNothing) {
  const std::string m = FreshModel("pf-tok");
  const auto before = Snapshot(m);
  CliRun r = Cli("build --progress none --gguf-dir " + Q(m) + " --model-config " + Q(m + "/config.json") +
                 " --tokenizer-dir /nonexistent-tokenizer");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "--tokenizer-dir /nonexistent-tokenizer does not exist")) << r.out;
  EXPECT_TRUE(Contains(r.out, "hint: pass the Kimi tokenizer directory")) << r.out;
  EXPECT_EQ(Snapshot(m), before);
  ExpectNothingPublished(m);
}

TEST(Preflight, TokenizerDirWithoutTokenizerFilesUsesSglangText) {
  const std::string m = FreshModel("pf-tok2");
  fs::create_directories(m + "/emptytok");
  std::ofstream(m + "/emptytok/config.json") << "{}";
  const auto before = Snapshot(m);
  CliRun r = Cli("build --progress none --gguf-dir " + Q(m) + " --model-config " + Q(m + "/config.json") +
          " --tokenizer-dir " + Q(m + "/emptytok"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "error: Kimi tokenizer directory is invalid: " + m + "/emptytok")) << r.out;
  EXPECT_TRUE(Contains(r.out, "--tokenizer-dir needs config.json and one of tokenizer.json")) << r.out;
  // Given relative, it is named resolved, as SGLang names it.
  CliRun relative = CliVia("cd " + Q(m) + " &&", "build --progress none --gguf-dir . --model-config config.json "
                                                  "--tokenizer-dir ./emptytok/../emptytok");
  EXPECT_EQ(relative.code, 1) << relative.out;
  EXPECT_TRUE(Contains(relative.out, "error: Kimi tokenizer directory is invalid: " + m + "/emptytok\n"))
      << relative.out;
  EXPECT_EQ(Snapshot(m), before);
}

TEST(Preflight, ManifestPathThatIsTheConfigIsRefused) {
  const std::string m = FreshModel("pf-cfg");
  const auto before = Snapshot(m);
  CliRun r = Build(m, "--manifest " + Q(m + "/config.json"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "--manifest " + m + "/config.json is an input (--model-config)")) << r.out;
  EXPECT_TRUE(Contains(r.out, "hint: pass --manifest a new path that is not one of the inputs")) << r.out;
  EXPECT_EQ(Snapshot(m), before);
  ExpectNothingPublished(m);
}

TEST(Preflight, PackPathThatIsAShardIsRefusedWithoutSuggestingDeletion) {
  const std::string m = FreshModel("pf-shard");
  const auto before = Snapshot(m);
  for (const std::string cmd : {"build", "pack"}) {
    CliRun r = cmd == "build" ? Build(m, "--pack " + Q(Shard(m, 2))) : Pack(m, "--pack " + Q(Shard(m, 2)));
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_TRUE(Contains(r.out, "--pack " + Shard(m, 2) + " is an input (source shard)")) << r.out;
    EXPECT_FALSE(Contains(r.out, "remove")) << r.out;
    EXPECT_EQ(Snapshot(m), before);
  }
  ExpectNothingPublished(m);
}

TEST(Preflight, TraceGenOverAShardIsRefused) {
  const std::string m = FreshModel("pf-trace");
  const auto before = Snapshot(m);
  CliRun r = Cli("trace gen --layers 2 --experts 8 --top-k 2 --requests 1 --decode-tokens 4 --trace " + Q(Shard(m, 1)));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "refusing to overwrite existing " + Shard(m, 1) +
                              " (--trace): it is a GGUF file, not a routing trace; k3pack replaces only a file of "
                              "the kind it writes, not even with --force")) << r.out;
  EXPECT_FALSE(Contains(r.out, "pass --force")) << r.out;
  EXPECT_EQ(Snapshot(m), before);
  r = Cli("trace gen --layers 2 --experts 8 --top-k 2 --requests 1 --decode-tokens 4 --force --trace " + Q(Shard(m, 1)));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_EQ(Snapshot(m), before);
}

TEST(Preflight, ModelConfigThatIsADirectoryOrNotKimi) {
  const std::string m = FreshModel("pf-cfgdir");
  const auto before = Snapshot(m);
  CliRun r = Cli("pack --progress none --gguf-dir " + Q(m) + " --model-config " + Q(m));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "--model-config " + m + " is a directory, not a config file")) << r.out;
  EXPECT_TRUE(Contains(r.out, "hint: pass --model-config " + m + "/config.json")) << r.out;
  const std::string llama = Root() + "/llama-config.json";
  std::ofstream(llama) << R"({"model_type": "llama", "num_hidden_layers": 4})";
  r = Cli("build --progress none --gguf-dir " + Q(m) + " --model-config " + Q(llama) + " --tokenizer-dir " +
          Q(m + "/tokenizer"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "--model-config " + llama + " is not a Kimi HF config (model_type 'llama')")) << r.out;
  EXPECT_EQ(Snapshot(m), before);
  ExpectNothingPublished(m);
}

// ---------------------------------------------------------------- item 2

TEST(OverwriteRule, PackTwiceIsAlreadyBuiltThenForceRebuilds) {
  const std::string m = FreshModel("ow-pack");
  CliRun r = Pack(m);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto built = Snapshot(m);
  r = Pack(m);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(Contains(r.out, "already built: " + m + "/" + kPackName + " (use --force to rebuild)")) << r.out;
  EXPECT_EQ(Snapshot(m), built);
  r = Pack(m, "--force");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(Contains(r.out, "EXPERT_PACK_READY")) << r.out;
  EXPECT_EQ(Snapshot(m), built);  // same bytes again
}

// `build --force` removed the pack and kept the manifest, so a kill mid-copy
// left a manifest of nothing, and the plain rerun verify suggested was
// refused ("not the manifest of this pack"). Now the old pack and manifest
// stay valid until the new pack is done, and the plain rerun finishes it.
TEST(OverwriteRule, AKilledForceBuildKeepsTheOldPackAndAPlainRerunFinishesIt) {
  const std::string m = FreshModel("ow-force-killed");
  ASSERT_EQ(Build(m).code, 0);
  const auto built = Snapshot(m);
  CliRun r = CliVia("K3PACK_CHECKPOINT_BYTES=1 K3PACK_TEST_KILL_AFTER_OBJECTS=5",
                    "build --progress none --safety-margin-gib 0 --force " + Q(m));
  ASSERT_EQ(r.code, 128 + SIGKILL) << r.out;  // as the shell reports it
  ASSERT_TRUE(fs::exists(m + "/" + kPackName + ".partial")) << r.out;
  auto now = Snapshot(m);
  for (const auto& [file, sha] : built) EXPECT_EQ(now[file], sha) << file;  // pack, sidecar, manifest untouched
  r = Cli("verify --progress none " + Q(m));
  EXPECT_EQ(r.code, 0) << r.out;

  r = Build(m);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(Contains(r.out, "note: resuming the rebuild of ")) << r.out;
  EXPECT_TRUE(Contains(r.out, "is written anew when it is done")) << r.out;
  EXPECT_TRUE(Contains(r.out, "resuming ")) << r.out;
  EXPECT_FALSE(fs::exists(m + "/" + kPackName + ".partial"));
  EXPECT_EQ(Snapshot(m)[kPackName], built.at(kPackName));  // the same shards: the same bytes
  r = Cli("verify --progress none " + Q(m));
  EXPECT_EQ(r.code, 0) << r.out;
  r = Build(m);
  EXPECT_TRUE(Contains(r.out, "already built: ")) << r.out;
}

TEST(OverwriteRule, PackOverAForeignFileIsRefused) {
  const std::string m = FreshModel("ow-foreign");
  const std::string mine = m + "/notes.pack";
  std::ofstream(mine) << "my notes";
  const auto before = Snapshot(m);
  CliRun r = Pack(m, "--pack " + Q(mine));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "refusing to overwrite existing " + mine + " (--pack): it is a file that starts with "
                              "\"my notes\", not an Expert Pack")) << r.out;
  EXPECT_TRUE(Contains(r.out, "hint: pass another --pack path; if that file should go, remove it yourself")) << r.out;
  EXPECT_EQ(Snapshot(m), before);
  r = Pack(m, "--force --pack " + Q(mine));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "not even with --force")) << r.out;
  EXPECT_EQ(Snapshot(m), before);
}

// Before, --force replaced whatever file was at the output path: `ep-merge
// --pack <shard> --force` wrote a pack over a source shard, `pack --pack
// tokenizer/tiktoken.model --force` over a tokenizer file. It now replaces
// only a file of the kind it writes (a pack, a manifest, a trace); a pack
// cut short inside its magic is still one.
TEST(OverwriteRule, ForceReplacesOnlyAFileOfTheKindItWrites) {
  const std::string m = FreshModel("ow-force-kind");
  ASSERT_EQ(Build(m, "--ep-size 2 --ep-rank all").code, 0);
  const std::string rank0 = m + "/KIMI-K3-SYNTH.expert-major.ep0-of-2.pack";
  const std::string rank1 = m + "/KIMI-K3-SYNTH.expert-major.ep1-of-2.pack";
  { std::ofstream(m + "/notes.txt") << "hello\n"; }
  { std::ofstream(m + "/other-config.json") << "{\"model_type\": \"kimi_k3\"}\n"; }
  const auto before = Snapshot(m);
  const std::pair<std::string, std::string> slips[] = {
      {"ep-merge --progress none " + Q(rank0) + " " + Q(rank1) + " --force --pack " + Q(Shard(m, 1)), "a GGUF file"},
      {"ep-merge --progress none " + Q(rank0) + " " + Q(rank1) + " --force --pack " + Q(m + "/config.json"),
       "a JSON document"},
      {"pack --progress none " + Q(m) + " --force --pack " + Q(m + "/tokenizer/tiktoken.model"),
       "a file that starts with "},
      {"manifest --progress none " + Q(m) + " --pack " + Q(rank0) + " --force --manifest " + Q(rank1),
       "an Expert Pack, not an adapter manifest"},
      // Another model's config or a note is no manifest either (session 41:
      // --force replaced any JSON or text given as --manifest).
      {"manifest --progress none " + Q(m) + " --pack " + Q(rank0) + " --force --manifest " +
           Q(m + "/other-config.json"),
       "a JSON document that names no GGMLMOEPACK pack or format, not an adapter manifest"},
      {"manifest --progress none " + Q(m) + " --pack " + Q(rank0) + " --force --manifest " + Q(m + "/notes.txt"),
       "a file that starts with \"hello\\x0a\", not an adapter manifest"},
      {"trace sweep --decode-tokens 4 --force --svg " + Q(Shard(m, 2)), "a GGUF file"},
  };
  for (const auto& [cmd, what] : slips) {
    CliRun r = Cli(cmd);
    EXPECT_EQ(r.code, 1) << cmd << "\n" << r.out;
    EXPECT_TRUE(Contains(r.out, "refusing to overwrite existing ")) << cmd << "\n" << r.out;
    EXPECT_TRUE(Contains(r.out, ": it is " + what)) << cmd << "\n" << r.out;
    EXPECT_TRUE(Contains(r.out, "not even with --force")) << cmd << "\n" << r.out;
  }
  EXPECT_EQ(Snapshot(m), before);

  // A pack cut short inside its magic is replaced; so is one a crash left
  // zero-filled, and a whole one.
  const std::string merged = m + "/merged.pack";
  { std::ofstream(merged) << "GGMLMOE"; }
  CliRun r = Cli("ep-merge --progress none " + Q(rank0) + " " + Q(rank1) + " --force --pack " + Q(merged));
  EXPECT_EQ(r.code, 0) << r.out;
  { std::ofstream(merged, std::ios::trunc) << std::string(4096, '\0'); }
  r = Cli("ep-merge --progress none " + Q(rank0) + " " + Q(rank1) + " --force --pack " + Q(merged));
  EXPECT_EQ(r.code, 0) << r.out;
  // An old or damaged manifest (what doctor says to regenerate) is --force's
  // to replace: one of another version with a byte-order mark, one cut short
  // before its format (it still names the pack's magic), an empty one.
  const std::string old_manifest = m + "/old.manifest.json";
  { std::ofstream(old_manifest) << "\xEF\xBB\xBF{\"format\": \"SGLANG-KIMI-GGMLMOEPACK-ADAPTER-v0\"}"; }
  r = Cli("manifest --progress none " + Q(m) + " --pack " + Q(rank0) + " --force --manifest " + Q(old_manifest));
  EXPECT_EQ(r.code, 0) << r.out;
  const std::string whole = FileBytes(old_manifest);
  ASSERT_NE(whole.find("\"magic\": \"GGMLMOEPACKv1\""), std::string::npos);
  for (const std::string& damaged : {whole.substr(0, whole.find("\"magic\"") + 40), std::string()}) {
    { std::ofstream(old_manifest, std::ios::trunc) << damaged; }
    r = Cli("manifest --progress none " + Q(m) + " --pack " + Q(rank0) + " --force --manifest " + Q(old_manifest));
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(FileBytes(old_manifest).size(), whole.size());
  }
  r = Cli("ep-merge --progress none " + Q(rank0) + " " + Q(rank1) + " --pack " + Q(merged));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(Contains(r.out, "already built: " + merged)) << r.out;
}

// SGLang prints EXPERT_PACK_BUILD_START only after its free-space check;
// before, a build short of space printed it and then failed.
TEST(Preflight, BuildStartIsPrintedOnlyOnceTheSpaceCheckPassed) {
  const std::string m = FreshModel("pf-space");
  CliRun r = CliVia("env K3PACK_FAKE_FREE_BYTES=4096", "build --progress none " + Q(m));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "insufficient space for Kimi Expert Pack: available=4096, required=")) << r.out;
  EXPECT_FALSE(Contains(r.out, "EXPERT_PACK_BUILD_START")) << r.out;
  r = Build(m);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(Contains(r.out, "EXPERT_PACK_BUILD_START output=")) << r.out;
}

TEST(OverwriteRule, BuildTwiceIsAlreadyBuilt) {
  const std::string m = FreshModel("ow-build");
  CliRun r = Build(m);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto built = Snapshot(m);
  r = Build(m);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(Contains(r.out, "already built: " + m + "/" + kManifestName + " (use --force to rebuild)")) << r.out;
  EXPECT_EQ(Snapshot(m), built);
  // --json keeps stdout JSON.
  r = Cli("build --json --progress none --gguf-dir " + Q(m) + " --model-config " + Q(m + "/config.json") +
          " --tokenizer-dir " + Q(m + "/tokenizer") + " 2>/dev/null");
  EXPECT_EQ(r.code, 0);
  ASSERT_NE(r.out.find('{'), std::string::npos) << r.out;  // stderr is merged by Cli(): skip the line before
  auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["already_built"], true);
  // Under the key a fresh `build --json` names the manifest by, too.
  EXPECT_EQ(j["manifest"], m + "/" + kManifestName);
  EXPECT_EQ(j["path"], j["manifest"]);
  // Given relative paths, the paths a fresh build's JSON gives: absolute, the pack's too.
  r = CliVia("cd " + Q(m) + " &&", "build --json --progress none .");
  EXPECT_EQ(r.code, 0);
  ASSERT_NE(r.out.find("{\n"), std::string::npos) << r.out;  // after the stderr lines
  j = nlohmann::json::parse(r.out.substr(r.out.find("{\n")), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["manifest"], fs::canonical(m).string() + "/" + kManifestName);
  EXPECT_EQ(j["pack"], fs::canonical(m).string() + "/" + kPackName);
  // `pack --json` of the same pack: `pack`, as a fresh pack run's JSON.
  r = Cli("pack --json --progress none " + Q(m) + " 2>/dev/null");
  EXPECT_EQ(r.code, 0);
  ASSERT_NE(r.out.find('{'), std::string::npos) << r.out;
  j = nlohmann::json::parse(r.out.substr(r.out.find('{')), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["already_built"], true);
  EXPECT_EQ(j["pack"], m + "/" + kPackName);
}

TEST(OverwriteRule, ManifestOverAnotherFileRefusedSameManifestAlreadyBuilt) {
  const std::string m = FreshModel("ow-manifest");
  ASSERT_EQ(Pack(m).code, 0);
  const std::string args = "manifest --progress none --gguf-dir " + Q(m) + " --pack " + Q(m + "/" + kPackName) +
                           " --model-config " + Q(m + "/config.json") + " --tokenizer-dir " + Q(m + "/tokenizer");
  const std::string other = m + "/other.json";
  std::ofstream(other) << "{\"mine\": 1}";
  const auto before = Snapshot(m);
  CliRun r = Cli(args + " --manifest " + Q(other));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "refusing to overwrite existing " + other + " (--manifest)")) << r.out;
  EXPECT_EQ(Snapshot(m), before);
  r = Cli(args);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::exists(m + "/" + kManifestName));
  const auto written = Snapshot(m);
  r = Cli(args);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(Contains(r.out, "already built: " + m + "/" + kManifestName)) << r.out;
  EXPECT_EQ(Snapshot(m), written);
}

TEST(OverwriteRule, SynthIntoNonEmptyDirRefusedSameModelAlreadyBuilt) {
  const std::string d = Root() + "/ow-synth";
  fs::remove_all(d);
  fs::create_directories(d);
  std::ofstream(d + "/thesis.tex") << "keep me";
  CliRun r = Cli("synth --preset tiny --out " + Q(d));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "refusing to overwrite non-empty directory " + d + " (--out)")) << r.out;
  EXPECT_TRUE(Contains(r.out, "--force")) << r.out;
  EXPECT_EQ(Snapshot(d).size(), 1u);
  const std::string d2 = Root() + "/ow-synth2";
  fs::remove_all(d2);
  ASSERT_EQ(Cli("synth --preset tiny --seed 3 --out " + Q(d2)).code, 0);
  const auto first = Snapshot(d2);
  r = Cli("synth --preset tiny --seed 3 --out " + Q(d2));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(Contains(r.out, "already built: " + d2)) << r.out;
  EXPECT_EQ(Snapshot(d2), first);
  r = Cli("synth --preset tiny --seed 4 --out " + Q(d2));  // other options: refused
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_EQ(Snapshot(d2), first);
}

// A model an older k3pack wrote has no k3pack-profile.json (the record of
// the options it was written with). Before, its refusal read like a
// stranger's directory ("not a model written by `k3pack synth` with these
// options"); it now says what is missing and who may have written it.
TEST(OverwriteRule, SynthIntoAModelWithoutItsRecordSaysAnOlderK3packMayHaveWrittenIt) {
  const std::string d = Root() + "/ow-synth-old";
  fs::remove_all(d);
  ASSERT_EQ(Cli("synth --preset tiny --seed 3 --out " + Q(d)).code, 0);
  ASSERT_TRUE(fs::remove(d + "/k3pack-profile.json"));
  const auto before = Snapshot(d);
  CliRun r = Cli("synth --preset tiny --seed 3 --out " + Q(d));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "refusing to overwrite non-empty directory " + d + " (--out)")) << r.out;
  EXPECT_TRUE(Contains(r.out, "no k3pack-profile.json")) << r.out;
  EXPECT_TRUE(Contains(r.out, "an older k3pack, or another tool, wrote them")) << r.out;
  EXPECT_TRUE(Contains(r.out, "--force")) << r.out;
  EXPECT_EQ(Snapshot(d), before);
  // A stranger's directory without GGUF files keeps the plain refusal.
  const std::string other = Root() + "/ow-synth-other";
  fs::remove_all(other);
  fs::create_directories(other);
  std::ofstream(other + "/notes.txt") << "keep me";
  r = Cli("synth --preset tiny --out " + Q(other));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_FALSE(Contains(r.out, "k3pack-profile.json")) << r.out;
}

TEST(OverwriteRule, TraceSweepSvgAndLoadDumpAndRepair) {
  const std::string m = FreshModel("ow-misc");
  const std::string user_svg = m + "/figure.svg";
  std::ofstream(user_svg) << "<svg>my figure</svg>";
  const auto before = Snapshot(m);
  CliRun r = Cli("trace sweep --layers 2 --sizes 4,8 --svg " + Q(user_svg));
  r = Cli("trace sweep --object-bytes 1000 --sizes 16,32 --svg " + Q(user_svg));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "refusing to overwrite existing " + user_svg + " (--svg)")) << r.out;
  EXPECT_EQ(Snapshot(m), before);
  // --force replaces another program's SVG, never a file of another kind (a
  // manifest or config given by a slip of the path).
  const std::string config = m + "/config.json", notes = m + "/notes.txt";
  std::ofstream(notes) << "my notes\n";
  const auto kept = Snapshot(m);
  for (const std::string& other : {config, notes}) {
    r = Cli("trace sweep --object-bytes 1000 --sizes 16,32 --force --svg " + Q(other));
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_TRUE(Contains(r.out, "not an SVG plot")) << r.out;
  }
  EXPECT_EQ(Snapshot(m), kept);
  const std::string other_svg = m + "/other.svg";
  std::ofstream(other_svg) << "<?xml version=\"1.0\"?>\n<svg>another program's</svg>";
  r = Cli("trace sweep --object-bytes 1000 --sizes 16,32 --force --svg " + Q(other_svg));
  EXPECT_EQ(r.code, 0) << r.out;
  auto plot = k3pack::ReadFileToString(other_svg);
  ASSERT_TRUE(plot.ok());
  EXPECT_TRUE(Contains(*plot, "hit rate vs cache size"));
  fs::remove(notes);
  fs::remove(other_svg);
  // Before, a plot path that could not be written failed after the whole
  // sweep, and its table was lost; now before the sweep runs.
  r = Cli("trace sweep --object-bytes 1000 --sizes 16,32 --json --svg " + Q(user_svg + "/plot.svg"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "--svg " + user_svg + "/plot.svg: " + user_svg + " is not a directory")) << r.out;
  EXPECT_FALSE(Contains(r.out, "\"bytes_read\"")) << "the sweep ran before the refusal:\n" << r.out;
  // A missing output directory is made (it is not "not a directory").
  const std::string fresh_dir = Root() + "/ow-new-dir";
  fs::remove_all(fresh_dir);
  r = Cli("trace gen --layers 2 --experts 32 --top-k 2 --decode-tokens 4 --json --trace " + Q(fresh_dir + "/t.trace"));
  EXPECT_EQ(r.code, 0) << r.out;
  // Already built, --json names the trace under the key a fresh run uses.
  r = Cli("trace gen --layers 2 --experts 32 --top-k 2 --decode-tokens 4 --json --trace " + Q(fresh_dir + "/t.trace"));
  EXPECT_EQ(r.code, 0) << r.out;
  const auto reply = nlohmann::json::parse(r.out.substr(r.out.find('{')), nullptr, false);
  EXPECT_EQ(reply.value("already_built", false), true) << r.out;
  EXPECT_EQ(reply.value("trace", ""), fresh_dir + "/t.trace") << r.out;
  // A trace command's output is never its input, even with --force: a
  // sweep's plot over the --trace it reads, a trace over a --manifest.
  const std::string inputs = Root() + "/ow-inputs";
  fs::remove_all(inputs);
  fs::create_directories(inputs);
  const std::string trace = inputs + "/in.trace", manifest = inputs + "/in.manifest.json";
  ASSERT_EQ(Cli("trace gen --layers 2 --experts 32 --top-k 2 --decode-tokens 4 --trace " + Q(trace)).code, 0);
  ASSERT_EQ(Build(m, "--manifest " + Q(manifest) + " --pack " + Q(inputs + "/in.pack")).code, 0);
  const auto inputs_before = Snapshot(inputs);
  r = Cli("trace sweep --trace " + Q(trace) + " --sizes 4 --force --svg " + Q(trace));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "is an input (--trace)")) << r.out;
  r = Cli("trace gen --manifest " + Q(manifest) + " --decode-tokens 4 --force --trace " + Q(manifest));
  EXPECT_EQ(r.code, 1) << r.out;  // a refusal, as every writer's
  EXPECT_TRUE(Contains(r.out, "is an input (--manifest)")) << r.out;
  EXPECT_EQ(Snapshot(inputs), inputs_before);

  // repair: a second identical run is already built; a foreign OUT is refused.
  const std::string broken = Root() + "/ow-broken", out = Root() + "/ow-repaired";
  fs::remove_all(broken);
  fs::remove_all(out);
  ASSERT_EQ(Cli("synth --preset tiny --seed 1 --fault raw-ssm-a --out " + Q(broken)).code, 0);
  const auto broken_before = Snapshot(broken);
  r = Cli("repair " + Q(broken) + " " + Q(out) + " --fix ssm-a");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto repaired = Snapshot(out);
  r = Cli("repair " + Q(broken) + " " + Q(out) + " --fix ssm-a");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(Contains(r.out, "already built: " + out)) << r.out;
  EXPECT_EQ(Snapshot(out), repaired);
  r = Cli("repair " + Q(broken) + " " + Q(m) + " --fix ssm-a");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "refusing to overwrite non-empty directory " + m + " (OUT)")) << r.out;
  EXPECT_FALSE(Contains(r.out, "--force")) << "the hint must not offer what is refused next:\n" << r.out;
  r = Cli("repair " + Q(broken) + " " + Q(m) + " --fix ssm-a --force");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "is not the output of an earlier `k3pack repair`")) << r.out;
  EXPECT_EQ(Snapshot(m), before);
  EXPECT_EQ(Snapshot(broken), broken_before);
  r = Cli("repair " + Q(broken) + " " + Q(out) + " --fix ssm-a --force");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(Snapshot(out), repaired);
}

// A file output named with a trailing '/' that does not exist (a slip for
// "write into this directory"). Before: each writer created the directory,
// then failed to rename onto it, and said so in its own words (`build`:
// "is a directory", `run-experts`: "cannot move it into place: Not a
// directory", `trace gen`: another process wrote it), with exit 1, 2 or 1,
// and left the empty directory behind.
TEST(OverwriteRule, AFileOutputEndingInSlashIsRefusedAndLeavesNoDirectory) {
  const std::string m = FreshModel("ow-slash");
  const std::string manifest = m + "/" + kManifestName;
  ASSERT_EQ(Build(m).code, 0);
  const std::string trace = m + "/t.trace";
  ASSERT_EQ(Cli("trace gen --manifest " + Q(manifest) + " --decode-tokens 2 --trace " + Q(trace)).code, 0);
  const auto before = Snapshot(m);
  const std::string out = Root() + "/ow-slash-out";
  fs::remove_all(out);
  fs::create_directories(out);
  const std::vector<std::pair<std::string, std::string>> writers = {
      {"--pack", "build --progress none --gguf-dir " + Q(m) + " --manifest " + Q(out + "/m.json") + " --pack "},
      {"--manifest", "build --progress none --gguf-dir " + Q(m) + " --pack " + Q(out + "/p.pack") + " --manifest "},
      {"--trace", "trace gen --layers 2 --experts 8 --top-k 2 --decode-tokens 2 --trace "},
      {"--stats", "trace replay --trace " + Q(trace) + " --manifest " + Q(manifest) + " --stats "},
      {"--trace-out", "run-experts " + Q(manifest) + " --trace-out "},
      {"--svg", "trace sweep --layers 2 --experts 8 --top-k 2 --decode-tokens 2 --policies lru --svg "},
  };
  for (const auto& [option, command] : writers) {
    const std::string path = out + "/new/";
    CliRun r = Cli(command + Q(path));
    EXPECT_EQ(r.code, 1) << option << ": " << r.out;
    EXPECT_TRUE(Contains(r.out, option + " " + path + " ends in '/', so it names a directory")) << option << ": " << r.out;
    EXPECT_FALSE(fs::exists(out + "/new")) << option << " left a directory behind";
    fs::remove_all(out + "/new");
  }
  EXPECT_TRUE(fs::is_empty(out));
  EXPECT_EQ(Snapshot(m), before);
}

// ---------------------------------------------------------------- item 3

void FlipByte(const std::string& path, uint64_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  f.read(&c, 1);
  c ^= 0x40;
  f.seekp(static_cast<std::streamoff>(at));
  f.write(&c, 1);
}

TEST(CorruptPack, VerifyHintsRepairAndRepairDamagedRewritesOnlyThose) {
  const std::string m = FreshModel("corrupt");
  ASSERT_EQ(Build(m).code, 0);
  const std::string pack = m + "/" + kPackName, manifest = m + "/" + kManifestName;
  const std::string shard_sums = Snapshot(m)["KIMI-K3-SYNTH-00002-of-00003.gguf"];
  const uint64_t size = fs::file_size(pack);
  FlipByte(pack, size / 2 + 12345);
  CliRun r = Cli("verify --progress none --full --manifest " + Q(manifest));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "does not match digest sidecar")) << r.out;
  EXPECT_TRUE(Contains(r.out, "hint: rewrite exactly the damaged payloads")) << r.out;
  EXPECT_TRUE(Contains(r.out, "k3pack pack --repair-damaged --gguf-dir " + m)) << r.out;
  EXPECT_FALSE(Contains(r.out, "remove")) << r.out;
  r = Pack(m, "--repair-damaged");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(Contains(r.out, "EXPERT_PACK_REPAIRED path=" + pack + " damaged=1 of")) << r.out;
  r = Cli("verify --progress none --full --against-source --manifest " + Q(manifest));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(Snapshot(m)["KIMI-K3-SYNTH-00002-of-00003.gguf"], shard_sums);

  // build --restart no longer reuses a corrupt pack silently: it repairs it.
  FlipByte(pack, size / 3 + 777);
  FlipByte(pack, size - 100);
  r = Build(m, "--restart");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(Contains(r.out, "damaged_rewritten=2")) << r.out;
  EXPECT_EQ(Cli("verify --progress none --full --manifest " + Q(manifest)).code, 0);
}

// Before, the pack of another model with the same layout was "not a valid
// pack of these shards" with a hint to --repair-damaged, which then found
// every payload matching its own digest and reported success, rewriting
// nothing (and build --restart the same): a loop with no way out named.
TEST(CorruptPack, RepairOfAnotherModelsPackSaysSoAndWritesNothing) {
  const std::string mine = FreshModel("other-pack-mine");
  const std::string other = Root() + "/other-pack-theirs";
  fs::remove_all(other);
  ASSERT_EQ(Cli("synth --preset tiny --seed 9 --out " + Q(other)).code, 0);
  ASSERT_EQ(Build(other).code, 0);
  const std::string pack = other + "/" + kPackName;
  const auto before = Snapshot(other);
  for (const std::string& cmd : {"pack --progress none --repair-damaged --pack " + Q(pack) + " " + Q(mine),
                                 "build --progress none --restart --pack " + Q(pack) + " --manifest " +
                                     Q(mine + "/m.manifest.json") + " " + Q(mine)}) {
    CliRun r = Cli(cmd);
    EXPECT_EQ(r.code, 1) << cmd << "\n" << r.out;
    EXPECT_TRUE(Contains(r.out, "error: pack " + pack + " was not built from these shards: ")) << r.out;
    EXPECT_TRUE(Contains(r.out, "no payload was rewritten\nhint: rebuild it from these shards with --force")) << r.out;
    EXPECT_FALSE(Contains(r.out, "EXPERT_PACK_REPAIRED")) << r.out;
  }
  EXPECT_EQ(Snapshot(other), before);
}

// ---------------------------------------------------------------- item 4

TEST(Unsupported, BuildRefusesWhatSglangCannotLoadAndDoctorGroups) {
  const std::string m = Root() + "/bf16";
  fs::remove_all(m);
  ASSERT_EQ(Cli("synth --preset tiny --seed 1 --matrix-type BF16 --out " + Q(m)).code, 0);
  const auto before = Snapshot(m);
  CliRun r = Build(m);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "SGLang cannot load this checkpoint")) << r.out;
  EXPECT_TRUE(Contains(r.out, "[tensor-must-be-quantized] token_embd.weight: stored as BF16")) << r.out;
  EXPECT_TRUE(Contains(r.out, "pass --allow-unsupported")) << r.out;
  EXPECT_EQ(Snapshot(m), before);
  ExpectNothingPublished(m);
  r = Cli("doctor --no-values " + Q(m));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "ERROR [tensor-must-be-quantized] 46 objects, first 5: token_embd.weight, ")) << r.out;
  // The explanation is printed once for the group, not once per tensor.
  size_t headers = 0;
  for (size_t at = r.out.find("means:"); at != std::string::npos; at = r.out.find("means:", at + 1)) ++headers;
  EXPECT_EQ(headers, 1u) << r.out;
  size_t found = 0;
  for (size_t at = r.out.find("stored as BF16"); at != std::string::npos; at = r.out.find("stored as BF16", at + 1))
    ++found;
  EXPECT_EQ(found, 1u) << r.out;
  EXPECT_EQ(Build(m, "--allow-unsupported").code, 0);
}

// ---------------------------------------------------------------- item 5

TEST(Vocabulary, PositionalGgufDirAndDeprecatedSpellings) {
  const std::string m = FreshModel("voc");
  const std::string pack = m + "/p.pack";
  CliRun r = Cli("pack " + Q(m) + " --progress none --model-config " + Q(m + "/config.json") + " --out " + Q(pack));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(Contains(r.out, "note: --out is deprecated; use --pack")) << r.out;
  EXPECT_TRUE(fs::exists(pack));
  r = Cli("manifest --progress none --gguf-dir " + Q(m) + " --expert-pack " + Q(pack) + " --model-config " +
          Q(m + "/config.json") + " --tokenizer-dir " + Q(m + "/tokenizer") + " --output " + Q(m + "/x.manifest.json"));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(Contains(r.out, "note: --expert-pack is deprecated; use --pack")) << r.out;
  EXPECT_TRUE(Contains(r.out, "note: --output is deprecated; use --manifest")) << r.out;
  EXPECT_TRUE(fs::exists(m + "/x.manifest.json"));
  // Both spellings at once, or the positional and the option, with two
  // values: usage errors. With one value, the rule of any option given twice.
  r = Cli("pack " + Q(m) + " --gguf-dir " + Q(m + "/other") + " --model-config " + Q(m + "/config.json"));
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(Contains(r.out, "both --gguf-dir " + m + "/other and the argument " + m + " given; give one")) << r.out;
  r = Cli("pack --gguf-dir " + Q(m) + " --model-config x --pack a --out b");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(Contains(r.out, "--out and --pack are the same option, given as 'a' and 'b'; give it once")) << r.out;
  r = Cli("pack " + Q(m) + " --gguf-dir " + Q(m) + " --progress none --model-config " + Q(m + "/config.json") +
          " --out " + Q(pack) + " --pack " + Q(pack));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(Contains(r.out, "already built: " + pack)) << r.out;
  // Every command takes --json.
  for (const std::string cmd : {"inspect", "doctor", "build", "pack", "manifest", "verify", "load", "run-experts",
                                "synth", "repair", "dump-tensor"}) {
    CliRun h = Cli(cmd + " --help");
    EXPECT_TRUE(Contains(h.out, "--json")) << cmd;
  }
}

// ---------------------------------------------------------------- item 6

TEST(ExitCodes, UsageErrorsAreTwoAndDocumented) {
  const std::string m = BaseModel();
  EXPECT_EQ(Cli("build --no-such-flag").code, 2);
  EXPECT_EQ(Cli("build --gguf-dir " + Q(m) + " --model-config c --tokenizer-dir t --payload-samples many").code, 2);
  EXPECT_EQ(Cli("build --gguf-dir " + Q(m) + " --model-config c --tokenizer-dir t --profile huge").code, 2);
  EXPECT_EQ(Cli("pack --gguf-dir " + Q(m) + " --model-config c --progress sideways").code, 2);
  EXPECT_EQ(Cli("pack --gguf-dir " + Q(m) + " --model-config c --threads 0").code, 2);
  EXPECT_EQ(Cli("verify --manifest m.json --samples 3 --full").code, 2);
  EXPECT_EQ(Cli("verify --manifest m.json --samples x").code, 2);
  EXPECT_EQ(Cli("manifest --gguf-dir d --pack p --model-config c --tokenizer-dir t --payload-samples -1").code, 2);
  CliRun help = Cli("--help");
  EXPECT_EQ(help.code, 0);
  EXPECT_TRUE(Contains(help.out, "2    usage error: unknown flag, bad value, conflicting flags, an input that could not be found")) << help.out;
  EXPECT_TRUE(Contains(help.out, "130  interrupted")) << help.out;
  // A bad input (not a usage error) is 1.
  EXPECT_EQ(Cli("verify --manifest /nonexistent/m.manifest.json").code, 1);
}

// ---------------------------------------------------------------- item 7

TEST(DefaultManifest, BuildWritesSglangNameAndMissingPathsListCandidates) {
  const std::string m = FreshModel("dm");
  ASSERT_EQ(Build(m).code, 0);
  EXPECT_TRUE(fs::exists(m + "/" + kManifestName));
  const auto before = Snapshot(m);
  CliRun r = Cli("verify --manifest " + Q(m + "/kimi-k3.manifest.json"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "--manifest " + m + "/kimi-k3.manifest.json does not exist")) << r.out;
  EXPECT_TRUE(Contains(r.out, "found beside it:\n  " + m + "/" + kManifestName)) << r.out;
  r = Cli("manifest --gguf-dir " + Q(m) + " --pack " + Q(m + "/KIMI.pack") + " --model-config " +
          Q(m + "/config.json") + " --tokenizer-dir " + Q(m + "/tokenizer"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "found beside it:\n  " + m + "/" + kPackName)) << r.out;
  EXPECT_EQ(Snapshot(m), before);
}

// A model directory copied with its manifest verified the original's files
// without a word; SGLang's texts for a file that is no manifest, a pack that
// is a directory or a cut pack named no file (the store's, run-experts').
TEST(Errors, ACopiedModelDirectoryAndWhatIsWrongWithAManifestOrPackAreNamed) {
  const std::string m = FreshModel("copied-from");
  ASSERT_EQ(Build(m).code, 0);
  const std::string original = fs::canonical(m).string();
  const std::string copy = Root() + "/copied-to";
  fs::remove_all(copy);
  fs::copy(m, copy, fs::copy_options::recursive);
  CliRun r = Cli("verify --progress none " + Q(copy));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(Contains(r.out, "records the shards and pack of the model in " + original + ", not the shards beside "
                              "it in " + copy)) << r.out;
  EXPECT_TRUE(Contains(r.out, "`k3pack build " + copy + " --force` gives this directory a pack and manifest of its own"))
      << r.out;
  EXPECT_TRUE(Contains(r.out, "shards: 3 unchanged (size and header digest)")) << r.out;
  r = Cli("verify --progress none " + Q(m));
  EXPECT_FALSE(Contains(r.out, "records the shards and pack of the model in")) << r.out;
  r = Build(copy);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "(it records the shards and pack of the model in " + original +
                              ": a model directory copied with its manifest?)")) << r.out;
  r = Build(copy, "--force");
  EXPECT_EQ(r.code, 0) << r.out;
  r = Cli("verify --progress none --full " + Q(copy));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_FALSE(Contains(r.out, "records the shards and pack of the model in")) << r.out;
  EXPECT_TRUE(Contains(r.out, "shards: 3 unchanged (whole-file SHA-256)")) << r.out;

  r = Cli("verify --progress none --manifest " + Q(copy + "/config.json"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "error: Kimi expert-pack manifest is incomplete or unsupported\nhint: " + copy +
                              "/config.json: it has no \"format\" key")) << r.out;
  r = Cli("load --manifest " + Q(copy + "/config.json"));
  EXPECT_TRUE(Contains(r.out, "error: Kimi-K3 manifest format is unsupported\nhint: " + copy +
                              "/config.json: it has no \"format\" key")) << r.out;
  // Before, a shard or pack given as the manifest was read whole and named
  // by the JSON parser's "invalid literal; last read: 'G'".
  for (const auto& [file, what] : {std::pair<std::string, std::string>{Shard(copy, 1), "a GGUF file"},
                                   {copy + "/" + kPackName, "an Expert Pack"}}) {
    for (const std::string cmd : {"verify --manifest ", "load --manifest "}) {
      r = Cli(cmd + Q(file));
      EXPECT_EQ(r.code, 1) << r.out;
      EXPECT_TRUE(Contains(r.out, "error: " + file + " is " + what + ", not a manifest\nhint: pass the adapter "
                                  "manifest")) << r.out;
    }
  }
  // Python's json.loads refuses a byte-order mark, so SGLang's server does.
  const std::string bom = copy + "/bom.manifest.json";
  ASSERT_TRUE(k3pack::WriteFileAtomic(bom, "\xEF\xBB\xBF" + *k3pack::ReadFileToString(copy + "/" + kManifestName)).ok());
  r = Cli("verify --manifest " + Q(bom));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "manifest is not valid JSON: Unexpected UTF-8 BOM (decode using utf-8-sig): line 1 "
                              "column 1 (char 0)")) << r.out;
  r = Cli("run-experts --tokens 1 --manifest " + Q(copy + "/" + kManifestName) + " --pack " + Q(copy));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "error: Kimi expert-pack or manifest is missing: ")) << r.out;
  EXPECT_TRUE(Contains(r.out, "hint: the pack " + copy + " is a directory, not a file")) << r.out;
  const std::string pack = copy + "/" + kPackName;
  const auto size = fs::file_size(pack);
  fs::resize_file(pack, size - 4096);
  r = Cli("run-experts --tokens 1 --manifest " + Q(copy + "/" + kManifestName));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "error: Kimi expert-pack size does not match its manifest\nhint: ")) << r.out;
  EXPECT_TRUE(Contains(r.out, " is " + std::to_string(size - 4096) + " bytes, the manifest ")) << r.out;
  EXPECT_TRUE(Contains(r.out, " records " + std::to_string(size) + ": the pack was truncated or replaced")) << r.out;
}

// ---------------------------------------------------------------- item 8

TEST(Profile, SynthRecordsItAndCommandsFindIt) {
  const std::string m = FreshModel("prof");
  std::ifstream side(m + "/k3pack-profile.json");
  ASSERT_TRUE(side.good());
  EXPECT_EQ(nlohmann::json::parse(side)["profile"], "scaled");
  ASSERT_EQ(Build(m).code, 0);  // no --profile: found
  const std::string manifest = m + "/" + kManifestName;
  CliRun r = Cli("doctor " + Q(manifest));
  EXPECT_EQ(r.code, 0) << r.out;
  r = Cli("doctor " + Q(m));
  EXPECT_EQ(r.code, 0) << r.out;
  // Asked for explicitly, the strict profile names the way out.
  r = Cli("pack --progress none --profile kimi-k3 --gguf-dir " + Q(m) + " --model-config " + Q(m + "/config.json") +
          " --pack " + Q(m + "/strict.pack"));
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "Kimi K3 model invariants do not match the audited model")) << r.out;
  EXPECT_TRUE(Contains(r.out, "--profile scaled")) << r.out;
}

// ---------------------------------------------------------------- item 9

TEST(Errors, UnslothQuantSubfolderNamesTheDirToPass) {
  const std::string d = Root() + "/unsloth";
  fs::remove_all(d);
  fs::create_directories(d);
  fs::copy(BaseModel(), d + "/UD-Q2_K_XL", fs::copy_options::recursive);
  const auto before = Snapshot(d);
  CliRun r = Cli("pack --progress none --gguf-dir " + Q(d) + " --model-config " + Q(d + "/UD-Q2_K_XL/config.json"));
  EXPECT_EQ(r.code, 1) << r.out;
  // SGLang's text on the first line (the directory resolved), the way out after it.
  EXPECT_TRUE(Contains(r.out, "error: no GGUF files found in " + d + "\nhint: found 3 shards in UD-Q2_K_XL/")) << r.out;
  EXPECT_TRUE(Contains(r.out, "pass --gguf-dir " + d + "/UD-Q2_K_XL")) << r.out;
  EXPECT_EQ(Snapshot(d), before);
}

TEST(Errors, MovedModelDirSaysRerunBuild) {
  const std::string m = FreshModel("err-moved"), moved = Root() + "/err-moved-elsewhere";
  ASSERT_EQ(Build(m).code, 0);
  fs::remove_all(moved);
  fs::rename(m, moved);
  const auto before = Snapshot(moved);
  for (const std::string cmd : {"verify", "load", "run-experts"}) {
    CliRun r = Cli(cmd + " --manifest " + Q(moved + "/" + kManifestName));
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_TRUE(Contains(r.out, "the manifest records are gone (first: " + m + "/")) << r.out;
    EXPECT_TRUE(Contains(r.out, "rerun `k3pack build` in its new place")) << r.out;
  }
  EXPECT_EQ(Snapshot(moved), before);
}

TEST(Errors, ReadOnlyModelDirSaysPassPackElsewhere) {
  // Root may write anywhere: run the binary as nobody on a 0555 model dir.
  if (::geteuid() != 0 || !fs::exists("/usr/bin/setpriv")) GTEST_SKIP() << "needs root and setpriv";
  const std::string m = FreshModel("err-ro");
  fs::permissions(Root(), fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                              fs::perms::others_read | fs::perms::others_exec);
  for (const auto& e : fs::recursive_directory_iterator(m)) {
    fs::permissions(e.path(), fs::perms::others_read | fs::perms::group_read, fs::perm_options::add);
    if (e.is_directory()) fs::permissions(e.path(), fs::perms::others_exec, fs::perm_options::add);
  }
  fs::permissions(m, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read | fs::perms::group_exec |
                         fs::perms::others_read | fs::perms::others_exec);
  const auto before = Snapshot(m);
  const std::string cmd = "/usr/bin/setpriv --reuid=65534 --regid=65534 --clear-groups " + std::string(K3PACK_BIN) +
                          " build " + Q(m) + " --progress none --model-config " + Q(m + "/config.json") +
                          " --tokenizer-dir " + Q(m + "/tokenizer") + " 2>&1";
  FILE* f = ::popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  const int status = ::pclose(f);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << out;
  EXPECT_TRUE(Contains(out, "--pack " + m + "/" + kPackName + ": cannot write in " + m)) << out;
  EXPECT_TRUE(Contains(out, "hint: the directory is read-only for you; pass --pack elsewhere")) << out;
  fs::permissions(m, fs::perms::owner_all, fs::perm_options::add);
  EXPECT_EQ(Snapshot(m), before);
  ExpectNothingPublished(m);
}

TEST(Errors, RunExpertsLayerThatIsNotRouted) {
  const std::string m = FreshModel("err-layer");
  ASSERT_EQ(Build(m).code, 0);
  CliRun r = Cli("run-experts --manifest " + Q(m + "/" + kManifestName) + " --layer 0");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(Contains(r.out, "--layer 0 is not a routed MoE layer")) << r.out;
  EXPECT_TRUE(Contains(r.out, "routed layers are 1..3")) << r.out;
}

}  // namespace
}  // namespace k3cli

namespace k3cli {
namespace {

// Item 9: errors name the user's path, not the writer's temporary file.
TEST(Errors, AtomicWriteErrorsNameTheUsersPath) {
  const std::string file = Root() + "/plain-file";
  std::ofstream(file) << "x";
  const std::string target = file + "/m.json";  // its "directory" is a file
  k3pack::Status st = k3pack::WriteFileAtomic(target, "{}");
  ASSERT_FALSE(st.ok());
  EXPECT_TRUE(Contains(st.error().message(), "cannot write " + target)) << st.error().message();
  EXPECT_FALSE(Contains(st.error().message(), ".tmp")) << st.error().message();
}

}  // namespace
}  // namespace k3cli
