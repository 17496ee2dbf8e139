// The `k3pack pack` / `k3pack verify` commands end to end, including a real
// kill -9 of the builder at several points followed by a resume.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include <nlohmann/json.hpp>

#include "pack_fixture.h"
#include "util/file.h"

namespace k3pack::pack {
namespace {

using testing::ReadAll;

struct Proc {
  pid_t pid = -1;
  int err_fd = -1;  // read end of the child's stderr
};

// Starts K3PACK_BIN with `args`, extra environment `env` (NAME=VALUE), stdout
// to /dev/null, stderr to a pipe.
Proc Spawn(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  Proc p;
  p.pid = fork();
  if (p.pid == 0) {
    dup2(fds[1], 2);
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    close(fds[0]);
    for (const auto& e : env) putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> argv{const_cast<char*>(K3PACK_BIN)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(K3PACK_BIN, argv.data());
    _exit(127);
  }
  close(fds[1]);
  p.err_fd = fds[0];
  return p;
}

// Runs to completion; returns {exit code, stderr}.
std::pair<int, std::string> RunCli(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  Proc p = Spawn(args, env);
  std::string err;
  char buf[4096];
  ssize_t n;
  while ((n = read(p.err_fd, buf, sizeof buf)) > 0) err.append(buf, static_cast<size_t>(n));
  close(p.err_fd);
  int status = 0;
  waitpid(p.pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), err};
}

class PackCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new std::string(testing::TempDir("cli"));
    model_ = new testing::Model(testing::MakeModel(*root_ + "/model", 3));
    expected_ = new std::string(testing::ExpectedPack(model_->experts));
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*root_);
    delete model_;
    delete expected_;
    delete root_;
  }
  std::vector<std::string> PackArgs(const std::string& out) const {
    return {"pack", "--gguf-dir", model_->dir, "--model-config", model_->config, "--profile", "scaled",
            "--out", out, "--safety-margin-gib", "0", "--threads", "2"};
  }
  static std::string* root_;
  static testing::Model* model_;
  static std::string* expected_;
};
std::string* PackCli::root_;
testing::Model* PackCli::model_;
std::string* PackCli::expected_;

TEST_F(PackCli, KillNineAtSeveralPointsThenResume) {
  const uint64_t total = model_->experts.layers.size() * model_->experts.num_experts;
  // (kill after this many ms, or after this many objects were reported)
  struct Point { int ms; uint64_t objects; };
  for (Point pt : {Point{0, 0}, Point{40, 0}, Point{0, 3}, Point{0, total / 2}, Point{0, total - 2}}) {
    SCOPED_TRACE("kill at ms=" + std::to_string(pt.ms) + " objects=" + std::to_string(pt.objects));
    const std::string out = *root_ + "/kill/k.pack";
    std::filesystem::remove_all(*root_ + "/kill");
    auto args = PackArgs(out);
    args.insert(args.end(), {"--progress", "json"});
    Proc p = Spawn(args, {"K3PACK_THROTTLE_US=50000", "K3PACK_BATCH_BYTES=1", "K3PACK_CHECKPOINT_BYTES=1", "K3PACK_CHECKPOINT_MS=0"});
    if (pt.objects == 0) {
      usleep(pt.ms * 1000);
    } else {
      FILE* f = fdopen(p.err_fd, "r");
      char line[4096];
      while (fgets(line, sizeof line, f)) {
        auto j = nlohmann::json::parse(line, nullptr, false);
        if (!j.is_discarded() && j.is_object() && j.value("done_objects", uint64_t{0}) >= pt.objects) break;
      }
      p.err_fd = -1;
      kill(p.pid, SIGKILL);
      fclose(f);
    }
    kill(p.pid, SIGKILL);
    int status = 0;
    waitpid(p.pid, &status, 0);
    if (p.err_fd >= 0) close(p.err_fd);
    ASSERT_FALSE(PathExists(out)) << "the build finished before the kill";
    auto [rc, err] = RunCli(PackArgs(out));
    ASSERT_EQ(rc, 0) << err;
    if (pt.objects > 0) {
      EXPECT_NE(err.find("resuming "), std::string::npos) << err;  // not redone from zero
    }
    EXPECT_TRUE(ReadAll(out) == *expected_);
    EXPECT_TRUE(ReadPackDigests(DigestsPathFor(out)).ok());
    EXPECT_FALSE(PathExists(CheckpointPathFor(out)));
    EXPECT_FALSE(PathExists(PartialPathFor(out)));
  }
}

TEST_F(PackCli, RefusalsAndExitCodes) {
  const std::string out = *root_ + "/ref/r.pack";
  auto [rc, err] = RunCli(PackArgs(out), {"K3PACK_FAKE_FREE_BYTES=4096"});
  EXPECT_EQ(rc, 1);
  EXPECT_NE(err.find("insufficient space for Kimi Expert Pack: available=4096, required="), std::string::npos) << err;
  auto [rc2, err2] = RunCli({"pack", "--gguf-dir", model_->dir});
  EXPECT_EQ(rc2, 2) << err2;  // usage: --model-config missing
  auto [rc3, err3] = RunCli(PackArgs(out));
  ASSERT_EQ(rc3, 0) << err3;
  auto [rc4, err4] = RunCli(PackArgs(out));
  EXPECT_EQ(rc4, 1);
  EXPECT_NE(err4.find("refusing to overwrite existing Expert Pack: " + out), std::string::npos) << err4;
}

TEST_F(PackCli, VerifyDetectsChangedShardAndFlippedByte) {
  // Own copy of the model so the shards can be damaged.
  const std::string dir = *root_ + "/ver";
  std::filesystem::remove_all(dir);
  std::filesystem::copy(model_->dir, dir, std::filesystem::copy_options::recursive);
  const std::string pack = dir + "/v.pack", manifest = dir + "/v.json";
  auto pa = PackArgs(pack);
  pa[2] = dir;
  pa[4] = dir + "/config.json";
  auto [rc, err] = RunCli(pa);
  ASSERT_EQ(rc, 0) << err;
  auto [mrc, merr] = RunCli({"manifest", "--gguf-dir", dir, "--expert-pack", pack, "--model-config", dir + "/config.json",
                          "--tokenizer-dir", dir + "/tokenizer", "--output", manifest, "--profile", "scaled"});
  ASSERT_EQ(mrc, 0) << merr;
  auto [v0, e0] = RunCli({"verify", "--manifest", manifest, "--full", "--against-source"});
  ASSERT_EQ(v0, 0) << e0;

  // Flip one payload byte in the middle of the pack: --full finds it.
  const uint64_t size = std::filesystem::file_size(pack);
  {
    int fd = open(pack.c_str(), O_RDWR);
    char c;
    ASSERT_EQ(pread(fd, &c, 1, static_cast<off_t>(size / 2 + 12345)), 1);
    c ^= 0x40;
    ASSERT_EQ(pwrite(fd, &c, 1, static_cast<off_t>(size / 2 + 12345)), 1);
    close(fd);
  }
  auto [v1, e1] = RunCli({"verify", "--manifest", manifest, "--full"});
  EXPECT_EQ(v1, 1);
  EXPECT_NE(e1.find("does not match digest sidecar"), std::string::npos) << e1;

  // Same-size shard with a changed header byte (inside the metadata).
  const std::string shard = dir + "/KIMI-K3-SYNTH-00002-of-00003.gguf";
  {
    int fd = open(shard.c_str(), O_RDWR);
    char c;
    ASSERT_EQ(pread(fd, &c, 1, 30), 1);
    c ^= 0x01;
    ASSERT_EQ(pwrite(fd, &c, 1, 30), 1);
    close(fd);
  }
  auto [v2, e2] = RunCli({"verify", "--manifest", manifest});
  EXPECT_EQ(v2, 1);
  EXPECT_NE(e2.find("changed since the manifest was written: metadata_sha256"), std::string::npos) << e2;
}

}  // namespace
}  // namespace k3pack::pack
