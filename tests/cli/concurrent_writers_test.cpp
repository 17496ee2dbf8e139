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

#include <chrono>
#include <fstream>
#include <regex>

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

// Reads a child's stderr until `text` shows, or to its end ("" or never shown).
std::string ReadUntil(int fd, const std::string& text) {
  std::string err;
  char buf[4096];
  ssize_t n;
  while ((text.empty() || err.find(text) == std::string::npos) && (n = ::read(fd, buf, sizeof buf)) > 0) {
    err.append(buf, static_cast<size_t>(n));
  }
  return err;
}

// Before, a second writer was refused at once (there was no --wait): a build
// queued behind another had to be retried by hand. With --wait it says whom
// it waits for, takes the lock when the holder ends, and then judges the
// outputs as they are: what the first one built is already built.
TEST(ConcurrentWriters, ASecondWriterWithWaitGoesOnWhenTheHolderEnds) {
  const std::string m = FreshModel("conc-wait");
  Stopped a({"build", "--progress", "none", "--safety-margin-gib", "0", m}, kStopHoldingLock);
  ASSERT_TRUE(a.stopped) << "the seam did not stop the first pack";
  k3pack::pack::Proc b = Spawn({"build", "--progress", "none", "--safety-margin-gib", "0", "--wait", "forever",
                                "--json", m});
  std::string err = ReadUntil(b.err_fd, "waiting for ");
  EXPECT_TRUE(Contains(err, "k3pack build: waiting for " + PackOf(m) + ".lock: another process is building or "
                            "repairing the Expert Pack " + PackOf(m) + ": pid " + std::to_string(a.p.pid) + " (")) << err;
  EXPECT_TRUE(Contains(err, "(until it lets go)")) << err;
  EXPECT_TRUE(Contains(err, "`kill -CONT " + std::to_string(a.p.pid) + "`")) << err;  // it is stopped

  auto [rc, a_err] = a.Finish();
  EXPECT_EQ(rc, 0) << a_err;
  err += ReadUntil(b.err_fd, "");
  ::close(b.err_fd);
  int status = 0;
  ASSERT_EQ(::waitpid(b.pid, &status, 0), b.pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << err;
  EXPECT_TRUE(Contains(err, "k3pack build: took the lock on " + PackOf(m) + ".lock after ")) << err;
  // What the first one built, judged after it: nothing is written twice.
  EXPECT_TRUE(Contains(err, "already built: " + m + "/kimi-k3-expert-pack.manifest.json")) << err;
  EXPECT_EQ(Cli("verify --full " + Q(m)).code, 0);
}

TEST(ConcurrentWriters, AWaitThatRunsOutIsRefusedNamingTheHolder) {
  const std::string m = FreshModel("conc-wait-out");
  Stopped a(PackArgv(m), kStopHoldingLock);
  ASSERT_TRUE(a.stopped) << "the seam did not stop the first pack";
  const auto start = std::chrono::steady_clock::now();
  CliRun b = Pack(m, "--force --wait 0.3");
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(b.code, 1) << b.out;
  EXPECT_GE(waited, 0.3);  // a floor only: it waited, however slow the machine
  EXPECT_TRUE(Contains(b.out, "k3pack pack: waiting for " + PackOf(m) + ".lock:")) << b.out;
  EXPECT_TRUE(Contains(b.out, "(for up to 0.3 s)")) << b.out;
  EXPECT_TRUE(Contains(b.out, "pid " + std::to_string(a.p.pid) + " (")) << b.out;
  // However long a loaded machine made it (the figure is the wait's own).
  std::smatch still;
  ASSERT_TRUE(std::regex_search(b.out, still, std::regex("holds the lock \\(still after waiting ([0-9.]+) s"))) << b.out;
  EXPECT_GE(std::stod(still[1].str()), 0.3) << b.out;
  EXPECT_FALSE(fs::exists(PackOf(m)));  // --force acted on nothing
  for (const std::string bad : {"-1", "soon", "nan"}) {
    CliRun usage = Pack(m, "--wait " + bad);
    EXPECT_EQ(usage.code, 2) << bad << usage.out;
    EXPECT_TRUE(Contains(usage.out, "--wait must be a number of seconds (0 or more) or `forever`, got '" + bad + "'"))
        << usage.out;
  }
  auto [rc, err] = a.Finish();
  EXPECT_EQ(rc, 0) << err;
}

// Before, a first build (no <pack>.lock yet) took the pack's lock only inside
// the copy and let it go before writing the manifest: meanwhile a `pack
// --force` could remove and rebuild the pack the manifest was about to
// record. Now the lock is taken at the first look at the outputs and held to
// the manifest's last byte.
TEST(ConcurrentWriters, AFirstBuildHoldsThePackLockUntilItsManifestIsWritten) {
  const std::string m = FreshModel("conc-manifest-lock");
  ASSERT_FALSE(fs::exists(PackOf(m) + ".lock"));
  Stopped b({"build", "--progress", "none", "--safety-margin-gib", "0", m}, "K3PACK_TEST_STOP_BEFORE_MANIFEST=1");
  ASSERT_TRUE(b.stopped) << "the seam did not stop the build";
  ASSERT_TRUE(fs::exists(PackOf(m)));
  const std::string before = TextOf(PackOf(m) + ".digests");

  CliRun force = Pack(m, "--force");
  EXPECT_EQ(force.code, 1) << force.out;
  EXPECT_TRUE(Contains(force.out, "pid " + std::to_string(b.p.pid) + " (")) << force.out;
  EXPECT_TRUE(fs::exists(PackOf(m)));
  EXPECT_EQ(TextOf(PackOf(m) + ".digests"), before);

  auto [rc, err] = b.Finish();
  EXPECT_EQ(rc, 0) << err;
  CliRun v = Cli("verify --full " + Q(m));
  EXPECT_EQ(v.code, 0) << v.out;
}

// A command refused before it writes still leaves nothing beside the user's
// path: the lock file is made only once the command goes on.
TEST(ConcurrentWriters, ARefusedFirstLookLeavesNoLockFile) {
  const std::string m = FreshModel("conc-no-litter");
  { std::ofstream(PackOf(m)) << "a file of the user's"; }
  CliRun r = Pack(m);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(Contains(r.out, "refusing to overwrite existing " + PackOf(m))) << r.out;
  EXPECT_TRUE(Contains(r.out, "it is a file that starts with \"a file of the us\", not an Expert Pack")) << r.out;
  EXPECT_FALSE(fs::exists(PackOf(m) + ".lock"));
  EXPECT_EQ(TextOf(PackOf(m)), "a file of the user's");
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

// Before, two synths into a directory that did not exist yet both passed the
// first look before either made it, so the later one wrote over the first
// one's finished model. Now a synth that made the directory looks again once
// it holds its lock. The other synth's model is put there by copying it in
// while this one is stopped after taking the lock: what the look finds is the
// same either way.
TEST(ConcurrentWriters, ASynthLooksAgainOnceItHoldsTheLockOfTheDirectoryItMade) {
  const std::string d = Root() + "/conc-synth-race", other = Root() + "/conc-synth-other";
  fs::remove_all(d);
  fs::remove_all(other);
  ASSERT_EQ(Cli("synth --preset tiny --seed 5 --out " + Q(other)).code, 0);
  Stopped a({"synth", "--preset", "tiny", "--seed", "3", "--out", d}, kStopHoldingLock);
  ASSERT_TRUE(a.stopped) << "the seam did not stop the synth";
  ASSERT_TRUE(fs::is_directory(d));
  fs::copy(other, d, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  const std::string shard = TextOf(Shard(d, 1));
  auto [rc, err] = a.Finish();
  EXPECT_EQ(rc, 1) << err;
  EXPECT_TRUE(Contains(err, "refusing to overwrite non-empty directory " + d + " (--out)")) << err;
  EXPECT_EQ(TextOf(Shard(d, 1)), shard) << "the other synth's model was written over";
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

// Before, while a `build --force` short of space had removed the old pack
// (it does so, and logs it, before its copy), `verify` and the store's
// readers said only that the pack was missing and that a moved model needs
// a new build. The rebuild is stopped holding its lock and the pack removed
// as it would remove it.
TEST(ConcurrentWriters, ReadersOfAPackARebuildRemovedSayTheRebuildIsRunning) {
  const std::string m = FreshModel("conc-rebuild-readers");
  ASSERT_EQ(Build(m).code, 0);
  Stopped b({"build", "--progress", "none", "--safety-margin-gib", "0", "--force", m}, kStopHoldingLock);
  ASSERT_TRUE(b.stopped) << "the seam did not stop the build";
  fs::remove(PackOf(m));
  fs::remove(PackOf(m) + ".digests");
  const std::string pid = std::to_string(b.p.pid);
  for (const std::string cmd : {"verify ", "run-experts --tokens 1 "}) {
    CliRun r = Cli(cmd + Q(m));
    EXPECT_EQ(r.code, 1) << cmd << r.out;
    EXPECT_TRUE(Contains(r.out, "Kimi expert-pack or manifest is missing: ")) << cmd << r.out;
    EXPECT_TRUE(Contains(r.out, "a build of " + PackOf(m) + " is in progress: pid " + pid + " (")) << cmd << r.out;
  }
  auto [rc, err] = b.Finish();
  EXPECT_EQ(rc, 0) << err;
  EXPECT_EQ(Cli("verify --full " + Q(m)).code, 0);
}

// Before, two builds of one --manifest path with different packs both
// judged the path free, both wrote it and both reported MANIFEST_READY: the
// later rename silently replaced the earlier build's manifest. The first is
// stopped after its copy; the second finishes and writes the manifest.
TEST(ConcurrentWriters, TwoBuildsOfOneManifestPathNeverBothWriteIt) {
  const std::string m = FreshModel("conc-one-manifest");
  const std::string manifest = m + "/shared.manifest.json";
  Stopped a({"build", "--progress", "none", "--safety-margin-gib", "0", "--pack", m + "/a.pack", "--manifest", manifest,
             m},
            "K3PACK_TEST_STOP_BEFORE_MANIFEST=1");
  ASSERT_TRUE(a.stopped) << "the seam did not stop the build";
  CliRun b = Build(m, "--pack " + Q(m + "/b.pack") + " --manifest " + Q(manifest));
  ASSERT_EQ(b.code, 0) << b.out;
  const std::string written = TextOf(manifest);
  auto [rc, err] = a.Finish();
  EXPECT_EQ(rc, 1) << err;
  EXPECT_TRUE(Contains(err, "refusing to overwrite existing " + manifest + " (--manifest): another process wrote it "
                            "while this run went on (it did not exist when this run began)")) << err;
  EXPECT_FALSE(Contains(err, "MANIFEST_READY")) << err;
  EXPECT_EQ(TextOf(manifest), written) << "the second build's manifest was replaced";
  // The refused build's pack is kept: a rerun into its own manifest reuses it.
  CliRun again = Build(m, "--pack " + Q(m + "/a.pack") + " --manifest " + Q(m + "/a.manifest.json"));
  EXPECT_EQ(again.code, 0) << again.out;
  EXPECT_TRUE(Contains(again.out, "EXPERT_PACK_VALID")) << again.out;
}

}  // namespace
}  // namespace k3cli
