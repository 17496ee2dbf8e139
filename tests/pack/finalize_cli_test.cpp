// `k3pack pack` and `k3pack build` share one finalize path: a real SIGKILL
// after each finalize step (K3PACK_TEST_KILL_IN_FINALIZE=1..3), then the same
// command again, must end with the pack, its digest sidecar and no checkpoint,
// whichever command ran. And `build` refuses mixed expert types as `pack` does.
#include <sys/wait.h>

#include <array>
#include <csignal>
#include <cstdio>
#include <filesystem>

#include "pack_fixture.h"
#include "pack/sidecars.h"
#include "util/file.h"

namespace k3pack::pack {
namespace {

using testing::ReadAll;

std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

struct CmdRun {
  int code = 0;          // exit status, or 128 + signal
  std::string out;       // stdout + stderr
};

// Runs K3PACK_BIN with `args` and extra environment `env` ("NAME=VALUE ...").
CmdRun RunK3(const std::string& env, const std::vector<std::string>& args) {
  std::string cmd = "env " + env + " " + Quote(K3PACK_BIN);
  for (const auto& a : args) cmd += " " + Quote(a);
  FILE* f = ::popen((cmd + " 2>&1").c_str(), "r");
  if (f == nullptr) return {-1, "popen failed"};
  CmdRun r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), f)) > 0) r.out.append(buf.data(), n);
  const int st = ::pclose(f);
  // popen runs `sh -c`, which exec's env, which exec's k3pack: the signal shows
  // through as sh's status 128 + N.
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

struct PackFinalizeModel {
  static constexpr const char* kName = "finalize";
  static constexpr uint64_t kSeed = 5;
};

class PackFinalize : public testing::SharedModelTest<PackFinalizeModel> {
 protected:
  static std::vector<std::string> Args(const std::string& command, const std::string& dir) {
    std::vector<std::string> a{command,       "--gguf-dir", model_->dir, "--model-config", model_->config,
                               "--profile",   "scaled",     "--out",     dir + "/x.pack",  "--safety-margin-gib",
                               "0",           "--progress", "none",      "--json"};
    if (command == "build") {
      a.insert(a.end(), {"--tokenizer-dir", model_->dir + "/tokenizer", "--manifest", dir + "/m.json"});
    }
    return a;
  }
};

TEST_F(PackFinalize, KillAfterEveryFinalizeStepThenRerunFinishesThroughPackAndBuild) {
  // Reference: one uninterrupted build, for the digest sidecar's bytes.
  const std::string ref = *root_ + "/ref";
  std::filesystem::create_directories(ref);
  CmdRun r0 = RunK3("", Args("pack", ref));
  ASSERT_EQ(r0.code, 0) << r0.out;
  const std::string ref_digests = ReadAll(DigestsPathFor(ref + "/x.pack"));
  ASSERT_FALSE(ref_digests.empty());

  for (const std::string command : {"pack", "build"}) {
    for (int step = 1; step <= 3; ++step) {
      SCOPED_TRACE(command + ", killed after finalize step " + std::to_string(step));
      const std::string dir = *root_ + "/" + command + std::to_string(step);
      std::filesystem::create_directories(dir);
      const std::string out = dir + "/x.pack";
      CmdRun killed = RunK3("K3PACK_TEST_KILL_IN_FINALIZE=" + std::to_string(step), Args(command, dir));
      ASSERT_EQ(killed.code, 128 + SIGKILL) << killed.out;
      ASSERT_TRUE(PathExists(CheckpointPathFor(out))) << "the kill must land before the checkpoint is removed";

      CmdRun rerun = RunK3("", Args(command, dir));
      ASSERT_EQ(rerun.code, 0) << rerun.out;
      EXPECT_TRUE(ReadAll(out) == *expected_);
      EXPECT_EQ(ReadAll(DigestsPathFor(out)), ref_digests) << "digest sidecar missing or different";
      EXPECT_FALSE(PathExists(CheckpointPathFor(out)));
      EXPECT_FALSE(PathExists(PartialPathFor(out)));
      EXPECT_FALSE(PathExists(JournalPathFor(out)));
      if (step >= 2) {  // the pack was already published: the rerun finishes the finalize
        EXPECT_NE(rerun.out.find("finished an interrupted build: " + out), std::string::npos) << rerun.out;
      }
      if (command == "build") {
        CmdRun v = RunK3("", {"verify", "--manifest", dir + "/m.json", "--full", "--progress", "none"});
        EXPECT_EQ(v.code, 0) << v.out;
      }
    }
  }
}

TEST_F(PackFinalize, BuildRefusesMixedExpertTypesUnlessAllowed) {
  const std::string dir = *root_ + "/mixed";
  CmdRun s = RunK3("", {"synth", "--preset", "tiny", "--out", dir + "/model", "--layer-expert-types", "2:Q3_K,Q3_K,Q3_K"});
  ASSERT_EQ(s.code, 0) << s.out;
  for (const std::string command : {"pack", "build"}) {
    SCOPED_TRACE(command);
    const std::string out_dir = dir + "/" + command;
    std::filesystem::create_directories(out_dir);
    std::vector<std::string> args{command,   "--gguf-dir", dir + "/model", "--model-config", dir + "/model/config.json",
                                  "--profile", "scaled",   "--out",        out_dir + "/x.pack", "--safety-margin-gib",
                                  "0",         "--progress", "none"};
    if (command == "build") {
      args.insert(args.end(), {"--tokenizer-dir", dir + "/model/tokenizer", "--manifest", out_dir + "/m.json"});
    }
    CmdRun refused = RunK3("", args);
    EXPECT_EQ(refused.code, 1) << refused.out;
    // The first odd tensor in the files (llama.cpp writes a layer's gate
    // before its up), as SGLang's scan-order check names it.
    EXPECT_NE(refused.out.find("unexpected expert dtype for (2, 'gate'): Q3_K"), std::string::npos) << refused.out;
    EXPECT_NE(refused.out.find("--allow-mixed-types"), std::string::npos) << refused.out;
    EXPECT_FALSE(PathExists(out_dir + "/x.pack"));
    args.push_back("--allow-mixed-types");
    CmdRun allowed = RunK3("", args);
    EXPECT_EQ(allowed.code, 0) << allowed.out;
    EXPECT_TRUE(PathExists(out_dir + "/x.pack"));
  }
}

}  // namespace
}  // namespace k3pack::pack
