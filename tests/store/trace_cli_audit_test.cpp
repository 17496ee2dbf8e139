// Faults a careless user of `k3pack trace` found (session 36): a JSON file
// that is no manifest, predictions the generator cannot make, a simulated
// cache too small for a call, a device tier too small under --family all,
// and dimensions that disagree without saying how.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "store/synthetic_pack.h"
#include "../cli_run.h"

namespace k3pack::store {
namespace {

namespace fs = std::filesystem;
using testing_cli::Cli;
using testing_cli::CliRun;

bool Says(const CliRun& r, const std::string& text) { return r.out.find(text) != std::string::npos; }

// Each run fails as a bad input (exit 1) saying `text` (and not `not_text`).
void ExpectEachFailsSaying(const std::vector<std::string>& runs, const std::string& text,
                           const std::string& not_text = "") {
  for (const std::string& args : runs) {
    SCOPED_TRACE(args);
    CliRun r = Cli(args);
    EXPECT_EQ(r.code, 1) << r.out;
    EXPECT_TRUE(Says(r, text)) << r.out;
    if (!not_text.empty()) {
      EXPECT_FALSE(Says(r, not_text)) << r.out;
    }
  }
}

// A model's config.json given as --manifest failed with the bare KeyError
// 'model' (exit 2 from gen and from sweep of a family, 1 elsewhere); replay
// without --pack sent the user to --pack. Now SGLang's step-2 text, a hint
// naming the file and what it lacks, and exit 1 (a bad input) everywhere.
TEST(TraceCliAudit, AJsonFileThatIsNoManifestIsNamedWithWhatItLacks) {
  testing::TinyPack p{testing::TinySpec{}, "no-manifest"};
  const std::string config = p.dir + "/config.json";
  std::ofstream(config) << "{\"model_type\": \"kimi_k3\"}\n";
  const std::string trace = p.dir + "/t.k3t";
  ASSERT_EQ(Cli("trace gen --trace " + trace + " --layers 2 --experts 8 --top-k 2 --requests 1 --decode-tokens 4").code,
            0);
  ExpectEachFailsSaying(
      {"trace gen --trace " + p.dir + "/z.k3t --manifest " + config,
       "trace sweep --progress none --manifest " + config + " --svg " + p.dir + "/s.svg",
       "trace sweep --progress none --trace " + trace + " --manifest " + config + " --svg " + p.dir + "/s.svg",
       "trace replay --progress none --simulate --trace " + trace + " --manifest " + config,
       "trace replay --progress none --trace " + trace + " --manifest " + config},
      "error: Kimi expert-pack manifest is incomplete or unsupported\nhint: " + config +
          ": it has no \"format\" key; pass the adapter manifest",
      "'model'");
  EXPECT_FALSE(fs::exists(p.dir + "/z.k3t"));
  EXPECT_FALSE(fs::exists(p.dir + "/s.svg"));
  // A missing manifest is the same kind of fault: exit 1 from gen too (it was 2).
  CliRun r = Cli("trace gen --trace " + p.dir + "/z.k3t --manifest " + p.dir + "/nope.json");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Says(r, "--manifest " + p.dir + "/nope.json does not exist")) << r.out;
}

// A finished manifest that lacks a key the store reads: trace gen and sweep
// said only SGLang's bare KeyError ('model'), naming no file (session 41).
TEST(TraceCliAudit, AManifestWithoutAKeyTheStoreReadsIsNamedInTheHint) {
  const std::string dir = testing::TinyPack::TempDir("no-key");
  const std::string bad = dir + "/bad.json";
  std::ofstream(bad) << "{\"format\": \"SGLANG-KIMI-GGMLMOEPACK-ADAPTER-v1\", \"complete\": true}\n";
  ExpectEachFailsSaying({"trace gen --trace " + dir + "/z.k3t --manifest " + bad,
                         "trace sweep --progress none --manifest " + bad + " --svg " + dir + "/s.svg"},
                        "error: 'model'\nhint: manifest " + bad +
                            " has no key 'model' that SGLang's expert store reads; regenerate it with `k3pack manifest`");
  EXPECT_FALSE(fs::exists(dir + "/z.k3t"));
}

// --predict-surprise S makes a share S of rows miss every prediction and
// the others right with chance accuracy / (1 - S): above 1 the generator
// capped it, so --predict-accuracy 0.95 --predict-surprise 0.5 wrote a trace
// of accuracy 0.5 without a word.
TEST(TraceCliAudit, PredictionAccuracyTheSurpriseShareRulesOutIsRefused) {
  const std::string dir = testing::TinyPack::TempDir("surprise");
  const std::string gen = "trace gen --layers 2 --experts 16 --top-k 4 --requests 1 --decode-tokens 8 --predict ";
  CliRun r = Cli(gen + "--trace " + dir + "/a.k3t --predict-surprise 0.5");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(Says(r, "error: --predict-accuracy 0.95 with --predict-surprise 0.5 cannot be met")) << r.out;
  EXPECT_TRUE(Says(r, "hint: give --predict-accuracy of at most 0.5 (1 - --predict-surprise)")) << r.out;
  EXPECT_FALSE(fs::exists(dir + "/a.k3t"));
  // At the bound it is met exactly: the other rows are always right.
  r = Cli(gen + "--trace " + dir + "/b.k3t --predict-surprise 0.5 --predict-accuracy 0.5");
  EXPECT_EQ(r.code, 0) << r.out;
}

// `replay --simulate` with a cache smaller than a call said only "expert
// cache cannot evict the active top-k working set"; the real replay names
// the call and the sizes. Now both do, with the trace and the record.
TEST(TraceCliAudit, ASimulatedCacheTooSmallForACallSaysHowSmall) {
  const std::string dir = testing::TinyPack::TempDir("small-sim");
  const std::string trace = dir + "/t.k3t";
  ASSERT_EQ(Cli("trace gen --trace " + trace + " --layers 3 --experts 16 --top-k 4 --requests 2 --decode-tokens 8").code,
            0);
  CliRun r = Cli("trace replay --progress none --simulate --trace " + trace + " --cache-mib 30");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Says(r, "error: " + trace + ": trace record 0: expert cache cannot evict the active top-k working set\n"
                     "hint: this call routes 4 distinct experts of one layer and the cache holds 2 objects"))
      << r.out;
}

// --device-mib below a call's working set failed after the trace was made,
// with exit 1 and, under --family all, no word of which family; --sizes
// below the largest call was already a usage error naming it.
TEST(TraceCliAudit, ADeviceTierTooSmallForACallIsAUsageErrorNamingTheFamily) {
  const std::string dir = testing::TinyPack::TempDir("small-device");
  CliRun r = Cli("trace sweep --progress none --timing --family batched --layers 2 --experts 32 --top-k 4 "
                 "--object-bytes 1048576 --sizes 40 --device-mib 8");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_TRUE(Says(r, "error: --device-mib 8 is below the largest call of family batched: its ")) << r.out;
  EXPECT_TRUE(Says(r, "hint: pass --device-mib of at least ")) << r.out;
}

// A trace for another model said "trace dimensions do not match manifest M"
// without either's dimensions.
TEST(TraceCliAudit, DimensionsThatDisagreeWithTheManifestAreBothNamed) {
  testing::TinyPack p{testing::TinySpec{}, "dims"};
  const std::string trace = p.dir + "/t.k3t";
  ASSERT_EQ(Cli("trace gen --trace " + trace + " --layers 2 --experts 16 --top-k 4 --requests 1 --decode-tokens 4").code,
            0);
  CliRun r = Cli("trace replay --progress none --simulate --trace " + trace + " --manifest " + p.manifest);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Says(r, trace + ": trace dimensions (experts 16, top_k 4) do not match manifest " + p.manifest +
                         " (8, 2)")) << r.out;
  // The same from the store's replay (it named neither file).
  CliRun store = Cli("trace replay --progress none --trace " + trace + " --manifest " + p.manifest);
  EXPECT_EQ(store.code, 1) << store.out;
  EXPECT_TRUE(Says(store, trace + ": trace dimensions (experts 16, top_k 4) do not match manifest " + p.manifest +
                             " (8, 2)")) << store.out;
}

// `trace gen` had no progress: `--requests 200` at K3 dimensions was silent
// for about 25 s. It takes --progress like the other long commands; the
// last line counts every token of every request.
TEST(TraceCliAudit, GenReportsProgressInTokens) {
  const std::string dir = testing::TinyPack::TempDir("gen-progress");
  CliRun r = Cli("trace gen --trace " + dir + "/t.k3t --layers 2 --experts 16 --top-k 4 --requests 3 "
                 "--prompt-tokens 5 --decode-tokens 7 --progress json");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(Says(r, "\"phase\":\"gen\"")) << r.out;
  EXPECT_TRUE(Says(r, "\"done\":true,\"done_bytes\":0,\"done_objects\":36,")) << r.out;
  EXPECT_TRUE(Says(r, "\"total_objects\":36,\"unit\":\"tokens\"")) << r.out;
  r = Cli("trace gen --trace " + dir + "/u.k3t --layers 2 --experts 16 --top-k 4 --progress sometimes");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_FALSE(fs::exists(dir + "/u.k3t"));
}

// --trace named wrong (session 37): a directory read as "cannot read dd:
// read failed at offset 0: Is a directory", a trace written with a '/' as
// "cannot open t/: Not a directory", a missing one as "cannot open": none
// named the option. Now each is named with --trace and what to pass.
TEST(TraceCliAudit, ATraceArgumentThatIsNoTraceFileNamesTheOption) {
  testing::TinyPack p{testing::TinySpec{}, "trace-arg"};
  const std::string trace = p.dir + "/t.trace";
  ASSERT_EQ(Cli("trace gen --trace " + trace + " --layers 2 --experts 8 --top-k 2 --requests 1 --decode-tokens 4").code,
            0);
  fs::create_directories(p.dir + "/adir");
  const std::string empty_dir = p.dir + "/none";
  fs::create_directories(empty_dir);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {p.dir + "/adir", "--trace " + p.dir + "/adir is a directory, not a trace file"},
      {trace + "/", "--trace " + trace + "/ ends in '/', so it names a directory, but " + trace + " is a file"},
      {p.dir + "/nosuch.trace", "--trace " + p.dir + "/nosuch.trace does not exist\nhint: found beside it:\n  " + trace},
      {empty_dir + "/t.trace", "does not exist\nhint: no *.trace in " + empty_dir + " either; write one with `k3pack trace gen`"},
  };
  for (const auto& [path, says] : cases) {
    for (const std::string& cmd : {"trace sweep --progress none --svg " + p.dir + "/s.svg --trace ",
                                   std::string("trace replay --progress none --simulate --trace ")}) {
      SCOPED_TRACE(cmd + path);
      CliRun r = Cli(cmd + path);
      EXPECT_EQ(r.code, 1) << r.out;
      EXPECT_TRUE(Says(r, says)) << r.out;
    }
  }
  EXPECT_FALSE(fs::exists(p.dir + "/s.svg"));
}

}  // namespace
}  // namespace k3pack::store
