// The interruption audit (session 28) of `ep-merge`, through the real binary:
// a stop (SIGINT / SIGTERM) while the merged files are put in place, a kill
// -9 between its renames, and the reruns of what those leave.
//
// Deterministic without timing: K3PACK_TEST_STOP_IN_MERGE=1 stops the merge
// (SIGSTOP) just before its first rename, K3PACK_TEST_KILL_IN_MERGE=1 kills
// it (SIGKILL) between the two; the test sends the real signal while the
// process is stopped and continues it.
#include "cli_fixture.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

namespace k3cli {
namespace interruption_audit {  // the tests are compiled eight to a unit
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::string PackArgs(const std::string& model, const std::string& pack) {
  return "pack --progress none --safety-margin-gib 0 --gguf-dir " + Q(model) + " --model-config " +
         Q(model + "/config.json") + " --pack " + Q(pack);
}

std::string MergeArgs(const std::string& dir, const std::string& out, const std::string& extra = "") {
  return "ep-merge --progress none " + Q(dir + "/m.ep0-of-2.pack") + " " + Q(dir + "/m.ep1-of-2.pack") + " --pack " +
         Q(out) + extra;
}

struct Stopped {
  bool stopped = false;
  int code = -1;  // exit status, or 128 + the killing signal
  std::string err;
};

// Runs k3pack with `args` (a shell word list) and `seam` set, sends `sig`
// while it is stopped there and continues it. SIGINT at its default, as in a
// foreground job (a runner started in the background passes it ignored).
Stopped SignalInMerge(const std::string& args, const std::string& seam, int sig) {
  const std::string err_path = Root() + "/interruption-audit.err";
  Stopped s;
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, STDOUT_FILENO);
    ::dup2(err, STDERR_FILENO);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::execl("/bin/sh", "sh", "-c", ("exec env " + seam + " " + K3PACK_BIN + " " + args).c_str(), nullptr);
    ::_exit(127);
  }
  int status = 0;
  if (::waitpid(pid, &status, WUNTRACED) == pid && WIFSTOPPED(status)) {
    s.stopped = true;
    ::kill(pid, sig);  // pending until it runs again
    ::kill(pid, SIGCONT);
    ::waitpid(pid, &status, 0);
  }
  s.code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
  s.err = ReadAll(err_path);
  return s;
}

// Two models' rank packs (seeds differ: their merged packs differ) and each
// one's merged pack and sidecar, for reference.
struct TwoMerges {
  std::string a, b;  // directories of the rank packs m.ep{0,1}-of-2.pack
  std::string a_pack, a_dig, b_pack, b_dig;
};

const TwoMerges& Merges() {
  static const TwoMerges m = [] {
    TwoMerges t;
    t.a = Root() + "/ia-merge-a";
    t.b = Root() + "/ia-merge-b";
    fs::remove_all(t.a);
    fs::remove_all(t.b);
    EXPECT_EQ(Cli("synth --preset tiny --seed 2 --out " + Q(t.b + "/model")).code, 0);
    EXPECT_EQ(Cli(PackArgs(BaseModel(), t.a + "/m.pack") + " --ep-size 2 --ep-rank all").code, 0);
    EXPECT_EQ(Cli(PackArgs(t.b + "/model", t.b + "/m.pack") + " --ep-size 2 --ep-rank all").code, 0);
    EXPECT_EQ(Cli(MergeArgs(t.a, t.a + "/m.pack")).code, 0);
    EXPECT_EQ(Cli(MergeArgs(t.b, t.b + "/m.pack")).code, 0);
    t.a_pack = ReadAll(t.a + "/m.pack");
    t.a_dig = ReadAll(t.a + "/m.pack.digests");
    t.b_pack = ReadAll(t.b + "/m.pack");
    t.b_dig = ReadAll(t.b + "/m.pack.digests");
    EXPECT_NE(t.a_pack, t.b_pack);
    EXPECT_NE(t.a_dig, t.b_dig);
    return t;
  }();
  return m;
}

std::string FreshOut(const std::string& name) {
  const std::string d = Root() + "/" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d + "/m.pack";
}

// Finding 3a/3c: a Ctrl-C during `ep-merge --force`'s replacement left the old
// pack without its sidecar (and threw the merged bytes away), and one during
// a fresh merge's left a sidecar without its pack, each told "no merged pack
// was written". The files are now put in place with the stop signals held
// back: a stop there is handled after them and says the merge was done.
TEST(InterruptionAudit, EpMergeStoppedWhilePuttingItsFilesInPlaceFinishesThemAndSaysSo) {
  const TwoMerges& m = Merges();
  for (const bool replace : {true, false}) {
    for (const int sig : {SIGINT, SIGTERM}) {
      SCOPED_TRACE(std::string(replace ? "--force over another merge" : "fresh") + ", signal " + std::to_string(sig));
      const std::string out = FreshOut("ia-stop");
      if (replace) {
        ASSERT_EQ(Cli(MergeArgs(m.a, out)).code, 0);
      }
      Stopped s = SignalInMerge(MergeArgs(m.b, out, replace ? " --force" : ""), "K3PACK_TEST_STOP_IN_MERGE=1", sig);
      ASSERT_TRUE(s.stopped) << s.err;
      EXPECT_EQ(s.code, 128 + sig) << s.err;
      EXPECT_TRUE(Contains(s.err, "k3pack ep-merge: interrupted; the merge was done: " + out +
                                      " and its digest sidecar are complete"))
          << s.err;
      EXPECT_TRUE(ReadAll(out) == m.b_pack);
      EXPECT_EQ(ReadAll(out + ".digests"), m.b_dig);
    }
  }
}

// Finding 3b: `ep-merge --force` killed between renaming the new pack and
// writing its sidecar left the complete merge without it; the plain rerun
// refused it ("its digest sidecar ... is missing"). Every rerun of the same
// merge now finishes it, as `pack`'s rerun finishes an interrupted finalize.
TEST(InterruptionAudit, AMergeKilledBetweenItsRenamesIsFinishedByTheRerunWithOrWithoutForce) {
  const TwoMerges& m = Merges();
  for (const std::string rerun_extra : {"", " --force"}) {
    SCOPED_TRACE("rerun" + rerun_extra);
    const std::string out = FreshOut("ia-kill");
    ASSERT_EQ(Cli(MergeArgs(m.a, out)).code, 0);
    CliRun killed = CliVia("env K3PACK_TEST_KILL_IN_MERGE=1", MergeArgs(m.b, out, " --force"));
    ASSERT_NE(killed.code, 0) << killed.out;
    ASSERT_TRUE(ReadAll(out) == m.b_pack);
    ASSERT_FALSE(fs::exists(out + ".digests"));
    CliRun rerun = Cli(MergeArgs(m.b, out, rerun_extra));
    ASSERT_EQ(rerun.code, 0) << rerun.out;
    EXPECT_TRUE(Contains(rerun.out, "finished an interrupted merge: " + out)) << rerun.out;
    EXPECT_TRUE(Contains(rerun.out, "copied 0 B")) << rerun.out;
    EXPECT_TRUE(ReadAll(out) == m.b_pack);
    EXPECT_EQ(ReadAll(out + ".digests"), m.b_dig);
    // And then it is the finished merge.
    EXPECT_TRUE(Contains(Cli(MergeArgs(m.b, out)).out, "already built: " + out));
  }
}

// The other window of a --force (a kill after the old sidecar went, before
// the new pack's rename) leaves the old pack without its sidecar: never
// paired with the new digests. The rerun compares every payload: without
// --force it is refused as not this merge, with --force merged again.
TEST(InterruptionAudit, AnOldPackWithoutItsSidecarIsNeverTakenForTheMerge) {
  const TwoMerges& m = Merges();
  const std::string out = FreshOut("ia-old");
  ASSERT_EQ(Cli(MergeArgs(m.a, out)).code, 0);
  fs::remove(out + ".digests");
  CliRun plain = Cli(MergeArgs(m.b, out));
  EXPECT_EQ(plain.code, 1) << plain.out;
  EXPECT_TRUE(Contains(plain.out, "refusing to overwrite existing " + out + " (--pack): it is not the merge of these "
                                  "rank packs: its digest sidecar " + out + ".digests is missing and payload"))
      << plain.out;
  EXPECT_TRUE(Contains(plain.out, "pass --force")) << plain.out;
  EXPECT_TRUE(ReadAll(out) == m.a_pack);
  EXPECT_FALSE(fs::exists(out + ".digests"));
  CliRun forced = Cli(MergeArgs(m.b, out, " --force"));
  ASSERT_EQ(forced.code, 0) << forced.out;
  EXPECT_FALSE(Contains(forced.out, "finished an interrupted merge")) << forced.out;
  EXPECT_TRUE(ReadAll(out) == m.b_pack);
  EXPECT_EQ(ReadAll(out + ".digests"), m.b_dig);
}

}  // namespace
}  // namespace interruption_audit
}  // namespace k3cli
