// Several k3pack processes on the same files (the multi-process audit,
// session 16): a second writer of a pack, a synthetic model or a manifest
// while the first is at work, a shard changed under a build, a read-side
// command while a build holds the pack. Real processes on `synth --preset
// tiny` models. Deterministic without timing: the holder stops itself at a
// test seam (K3PACK_TEST_STOP_HOLDING_LOCK=1 right after taking its lock,
// K3PACK_TEST_STOP_AFTER_COPY=1 after the copy); the test waits for that
// stop (waitpid WUNTRACED), acts, and continues it.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "../pack/spawn.h"
#include "cli_fixture.h"
#include "util/file.h"

namespace k3cli {
namespace {

using k3pack::pack::Proc;
using k3pack::pack::Spawn;

const char* kStopHoldingLock = "K3PACK_TEST_STOP_HOLDING_LOCK=1";

std::vector<std::string> PackArgv(const std::string& model, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> a = {"pack", "--progress", "none", "--safety-margin-gib", "0", model};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// A child stopped at a seam: continue it (or kill it) and collect its end.
struct Stopped {
  Proc p;
  bool stopped = false;

  Stopped(const std::vector<std::string>& argv, const std::string& seam) : p(Spawn(argv, {seam})) {
    int status = 0;
    stopped = ::waitpid(p.pid, &status, WUNTRACED) == p.pid && WIFSTOPPED(status);
  }
  // Exit code (128 + signal when killed) and stderr.
  std::pair<int, std::string> Finish(int sig = SIGCONT) {
    ::kill(p.pid, sig);
    std::string err;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(p.err_fd, buf, sizeof buf)) > 0) err.append(buf, static_cast<size_t>(n));
    ::close(p.err_fd);
    int status = 0;
    ::waitpid(p.pid, &status, 0);
    return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), err};
  }
};

std::string TextOf(const std::string& path) {
  auto r = k3pack::ReadFileToString(path);
  return r.ok() ? *r : "";
}

std::string PackOf(const std::string& model) { return model + "/KIMI-K3-SYNTH.expert-major.pack"; }

// Before, the refusal said only "another process is building or repairing
// the Expert Pack P": not which one, nor that it was stopped (a build
// suspended with Ctrl-Z keeps the lock for good). After a kill -9 of the
// holder the next run builds: nothing else stays locked.
TEST(ConcurrentWriters, ASecondBuildNamesTheStoppedHolderOfThePackLock) {
  const std::string m = FreshModel("conc-holder");
  Stopped a(PackArgv(m), kStopHoldingLock);
  ASSERT_TRUE(a.stopped) << "the seam did not stop the first pack";
  const std::string pid = std::to_string(a.p.pid);

  CliRun b = Build(m);
  EXPECT_EQ(b.code, 1) << b.out;
  EXPECT_TRUE(Contains(b.out, "another process is building or repairing the Expert Pack " + PackOf(m) + ": pid " +
                                  pid + " (")) << b.out;
  EXPECT_TRUE(Contains(b.out, "k3pack pack --progress none")) << b.out;
  EXPECT_TRUE(Contains(b.out, ", which is stopped, holds the lock")) << b.out;
  EXPECT_TRUE(Contains(b.out, "`kill -CONT " + pid + "`")) << b.out;

  EXPECT_EQ(a.Finish(SIGKILL).first, 128 + SIGKILL);
  CliRun again = Build(m);
  EXPECT_EQ(again.code, 0) << again.out;
  EXPECT_EQ(Cli("verify --full " + Q(m)).code, 0);
}

// Before, `pack --force` removed the pack and its digests before it looked
// at the lock: beside a running repair (`pack --repair-damaged`, which holds
// it) it deleted the pack being repaired and then failed on the lock, so the
// repair "succeeded" and no pack was left.
TEST(ConcurrentWriters, ForceNeverRemovesAPackAnotherWriterHolds) {
  const std::string m = FreshModel("conc-force");
  ASSERT_EQ(Build(m).code, 0);
  Stopped repair(PackArgv(m, {"--repair-damaged"}), kStopHoldingLock);
  ASSERT_TRUE(repair.stopped) << "the seam did not stop the repair";

  CliRun force = Pack(m, "--force");
  EXPECT_EQ(force.code, 1) << force.out;
  EXPECT_TRUE(Contains(force.out, "pid " + std::to_string(repair.p.pid))) << force.out;
  EXPECT_TRUE(fs::exists(PackOf(m)));
  EXPECT_TRUE(fs::exists(PackOf(m) + ".digests"));

  auto [rc, err] = repair.Finish();
  EXPECT_EQ(rc, 0) << err;
  CliRun v = Cli("verify --full " + Q(m));
  EXPECT_EQ(v.code, 0) << v.out;
}

// Before, every atomic writer used `<path>.tmp`: a second writer of the same
// file (here a `k3pack manifest` beside an open writer, as two `manifest`
// runs or two stores on one stats file) truncated the first one's bytes and
// published the shared temporary; the first writer's later bytes then went
// into the published manifest, and its rename failed.
TEST(ConcurrentWriters, TwoWritersOfOneFileEachPublishAWholeFile) {
  const std::string m = FreshModel("conc-manifest");
  ASSERT_EQ(Pack(m).code, 0);
  const std::string out = m + "/two-writers.manifest.json";
  auto first = k3pack::AtomicFile::Create(out);
  ASSERT_TRUE(first.ok()) << first.error().message();
  const std::string head = "{\"writer\": ", tail = "\"first\"}\n";
  ASSERT_TRUE(first->Write(head.data(), head.size(), 0).ok());

  CliRun second = Cli("manifest --progress none " + Q(m) + " --manifest " + Q(out));
  ASSERT_EQ(second.code, 0) << second.out;
  ASSERT_TRUE(first->Write(tail.data(), tail.size(), head.size()).ok());
  EXPECT_TRUE(nlohmann::json::accept(TextOf(out)))
      << "the second writer's manifest was changed by the first writer's bytes";
  EXPECT_EQ(Cli("verify " + Q(out)).code, 0);

  k3pack::Status committed = first->Commit();
  ASSERT_TRUE(committed.ok()) << committed.message();
  EXPECT_EQ(TextOf(out), head + tail);
  for (const auto& e : fs::directory_iterator(m)) EXPECT_NE(e.path().extension(), ".tmp") << e.path();
}

// Before, a shard appended to while `build` copied from it still gave a
// published pack and manifest (exit 0): a pack that may match neither the
// old shard nor the new one.
TEST(ConcurrentWriters, AShardChangedDuringTheBuildIsNeverPublished) {
  const std::string m = FreshModel("conc-shard");
  Stopped b({"build", "--progress", "none", "--safety-margin-gib", "0", m}, "K3PACK_TEST_STOP_AFTER_COPY=1");
  ASSERT_TRUE(b.stopped) << "the seam did not stop the build";
  const std::string shard = Shard(m, 3);
  const auto size = fs::file_size(shard);
  { std::ofstream(shard, std::ios::app) << "appended"; }
  auto [rc, err] = b.Finish();
  EXPECT_EQ(rc, 1) << err;
  EXPECT_TRUE(Contains(err, "source shard " + shard + " changed while the Expert Pack " + PackOf(m) +
                                " was built from it: its size went from " + std::to_string(size) + " to " +
                                std::to_string(size + 8) + " bytes")) << err;
  EXPECT_FALSE(fs::exists(PackOf(m)));
  EXPECT_FALSE(fs::exists(m + "/kimi-k3-expert-pack.manifest.json"));

  fs::resize_file(shard, size);  // the shard is final again
  CliRun rerun = Build(m, "--restart");
  EXPECT_EQ(rerun.code, 0) << rerun.out;
  EXPECT_EQ(Cli("verify --full " + Q(m)).code, 0);
}

// Before, a second synth into the directory the first was writing took the
// first one's marker for an interrupted run, removed its temporary files
// and wrote over it.
TEST(ConcurrentWriters, ASecondSynthIntoTheSameDirectoryIsRefusedNamingTheFirst) {
  const std::string d = Root() + "/conc-synth";
  fs::remove_all(d);
  Stopped a({"synth", "--preset", "tiny", "--seed", "3", "--out", d}, kStopHoldingLock);
  ASSERT_TRUE(a.stopped) << "the seam did not stop the first synth";
  CliRun b = Cli("synth --preset tiny --seed 3 --out " + Q(d));
  EXPECT_EQ(b.code, 1) << b.out;
  EXPECT_TRUE(Contains(b.out, "another process is writing a synthetic model into " + d + ": pid " +
                                  std::to_string(a.p.pid) + " (")) << b.out;
  auto [rc, err] = a.Finish();
  EXPECT_EQ(rc, 0) << err;
  CliRun again = Cli("synth --preset tiny --seed 3 --out " + Q(d));
  EXPECT_EQ(again.code, 0) << again.out;
  EXPECT_TRUE(Contains(again.out, "already")) << again.out;
}

// Before, `verify`, `load` and `manifest` of a model whose first build was
// still running said its manifest or pack "does not exist ... run `k3pack
// build` first".
TEST(ConcurrentWriters, ReadersOfAModelWhoseBuildIsRunningSaySo) {
  const std::string m = FreshModel("conc-readers");
  Stopped b({"build", "--progress", "none", "--safety-margin-gib", "0", m}, kStopHoldingLock);
  ASSERT_TRUE(b.stopped) << "the seam did not stop the build";
  const std::string pid = std::to_string(b.p.pid);
  for (const std::string cmd : {"verify ", "load ", "manifest "}) {
    CliRun r = Cli(cmd + Q(m));
    EXPECT_NE(r.code, 0) << cmd << r.out;
    EXPECT_TRUE(Contains(r.out, "a build of " + PackOf(m) + " is in progress: pid " + pid + " (")) << cmd << r.out;
    EXPECT_FALSE(Contains(r.out, "run `k3pack build` first")) << cmd << r.out;
  }
  auto [rc, err] = b.Finish();
  EXPECT_EQ(rc, 0) << err;
}

}  // namespace
}  // namespace k3cli
