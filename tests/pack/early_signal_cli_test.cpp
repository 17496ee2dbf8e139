// A Ctrl-C (SIGINT) or SIGTERM that reaches `pack` / `build` before their
// first step is the same clean stop as one during the copy: one line, exit
// 130 / 143, and files the same command continues from. Before, the copy
// phase's handler was the only one, so a signal in the first few
// milliseconds killed the process without a word.
//
// Deterministic without timing: K3PACK_TEST_STOP_AT_START=1 makes the
// command stop itself (SIGSTOP) at the moment it starts; the test waits for
// that stop, sends the real signal (pending while the process is stopped)
// and continues it, so the signal is delivered exactly there.
#include <signal.h>
#include <sys/wait.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "pack_fixture.h"
#include "spawn.h"
#include "util/file.h"

namespace k3pack::pack {
namespace {

using testing::ReadAll;

struct EarlySignalModel {
  static constexpr const char* kName = "early-signal";
  static constexpr uint64_t kSeed = 5;
};

class EarlySignal : public testing::SharedModelTest<EarlySignalModel> {
 protected:
  static std::vector<std::string> BuildArgs(const std::string& out) {
    return {"build", "--gguf-dir", model_->dir, "--model-config", model_->config, "--tokenizer-dir",
            model_->dir + "/tokenizer", "--profile", "scaled", "--out", out, "--manifest", out + ".json",
            "--safety-margin-gib", "0", "--threads", "2"};
  }
};

struct Outcome {
  bool stopped_at_start = false;  // the seam stopped the process
  bool exited = false;            // exited (rather than died of a signal)
  int code = -1;                  // exit status, or 128 + the killing signal
  std::string err;
};

// Runs `args`, delivers `sig` while the command is stopped at its start,
// continues it and collects its stderr and exit status.
Outcome SignalAtStart(const std::vector<std::string>& args, int sig) {
  Outcome o;
  Proc p = Spawn(args, {"K3PACK_TEST_STOP_AT_START=1"});
  int status = 0;
  if (waitpid(p.pid, &status, WUNTRACED) == p.pid && WIFSTOPPED(status)) {
    o.stopped_at_start = true;
    ::kill(p.pid, sig);  // pending until the process runs again
    ::kill(p.pid, SIGCONT);
    char buf[4096];
    ssize_t n;
    while ((n = read(p.err_fd, buf, sizeof buf)) > 0) o.err.append(buf, static_cast<size_t>(n));
    waitpid(p.pid, &status, 0);
  } else {
    char buf[4096];
    ssize_t n;
    while ((n = read(p.err_fd, buf, sizeof buf)) > 0) o.err.append(buf, static_cast<size_t>(n));
  }
  close(p.err_fd);
  o.exited = WIFEXITED(status);
  o.code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
  return o;
}

int64_t CheckpointObjectsDone(const std::string& out) {
  auto j = nlohmann::json::parse(ReadAll(CheckpointPathFor(out)), nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("objects_done")) return -1;
  return j["objects_done"].get<int64_t>();
}

// A fresh `pack` stopped by SIGINT before its first step: the message and
// 130, nothing written (not even the lock file the build takes first), and
// the same command then builds the pack.
TEST_F(EarlySignal, SigintBeforeTheFirstStepOfPackIsACleanStop) {
  const std::string dir = *root_ + "/fresh";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string out = dir + "/e.pack";
  Outcome o = SignalAtStart(PackArgs(out), SIGINT);
  ASSERT_TRUE(o.stopped_at_start) << "the test seam did not stop the command:\n" << o.err;
  EXPECT_TRUE(o.exited) << "k3pack died of the signal instead of stopping cleanly:\n" << o.err;
  EXPECT_EQ(o.code, 130) << o.err;
  EXPECT_NE(o.err.find("k3pack pack: interrupted; rerun the same command to continue"), std::string::npos) << o.err;
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "the stop came before the first step, yet something was written";

  auto [rc, err] = RunCli(PackArgs(out));
  ASSERT_EQ(rc, 0) << err;
  EXPECT_TRUE(ReadAll(out) == *expected_) << "pack bytes differ from the expected pack";
}

// `build` with a checkpointed partial from an earlier crash, stopped by
// SIGTERM before its first step: 143 and the message; the partial and its
// checkpoint are untouched, and the rerun resumes from the checkpoint.
TEST_F(EarlySignal, SigtermBeforeTheFirstStepOfBuildKeepsTheResumableState) {
  const std::string dir = *root_ + "/resume";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string out = dir + "/e.pack";
  auto [rc0, err0] = RunCli(BuildArgs(out), {"K3PACK_CRASH_AFTER_OBJECTS=4", "K3PACK_BATCH_BYTES=1"});
  ASSERT_EQ(rc0, 86) << err0;
  const int64_t done = CheckpointObjectsDone(out);
  ASSERT_GE(done, 4) << err0;
  const std::string partial = ReadAll(PartialPathFor(out)), checkpoint = ReadAll(CheckpointPathFor(out));

  Outcome o = SignalAtStart(BuildArgs(out), SIGTERM);
  ASSERT_TRUE(o.stopped_at_start) << "the test seam did not stop the command:\n" << o.err;
  EXPECT_TRUE(o.exited) << "k3pack died of the signal instead of stopping cleanly:\n" << o.err;
  EXPECT_EQ(o.code, 143) << o.err;
  EXPECT_NE(o.err.find("k3pack build: interrupted; rerun the same command to continue"), std::string::npos) << o.err;
  EXPECT_TRUE(ReadAll(PartialPathFor(out)) == partial);
  EXPECT_EQ(ReadAll(CheckpointPathFor(out)), checkpoint);
  EXPECT_FALSE(PathExists(out));

  auto [rc, err] = RunCli(BuildArgs(out));
  ASSERT_EQ(rc, 0) << err;
  EXPECT_NE(err.find("resuming " + PartialPathFor(out) + " at object " + std::to_string(done) + " of "),
            std::string::npos)
      << err;
  EXPECT_TRUE(ReadAll(out) == *expected_) << "pack bytes differ from the expected pack";
  EXPECT_TRUE(PathExists(out + ".json"));
}

}  // namespace
}  // namespace k3pack::pack
