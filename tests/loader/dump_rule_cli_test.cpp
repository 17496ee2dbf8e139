// `k3pack load --dump DIR` under the shared overwrite rule (cli/output_rule.h):
// a rerun whose dump is already there, byte for byte and nothing else, is
// reported "already built" and leaves DIR untouched; any other non-empty DIR
// is refused naming --dump and --force; --force writes. Before, every rerun
// was refused as if DIR were someone else's.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <thread>

#include "../cli_run.h"
#include "loader_fixture.h"
#include "util/file.h"

namespace k3pack::loader {
namespace {

using namespace testing;  // NOLINT

testing_cli::CliRun Load(const std::string& args) { return testing_cli::Cli("load " + args + " --progress none"); }

// A small model whose A_log values depend on `a0` (so two models dump
// different bytes); returns the manifest path.
std::string Model(const std::string& dir, float a0) {
  fs::create_directories(dir);
  std::vector<gguf::TensorSpec> t;
  t.push_back(Typed("token_embd.weight", GgmlType::Q8_0, {32, 4}));
  t.push_back(F32Tensor("blk.0.ssm_a", {4}, {a0, -2.0f, -0.5f, -4.0f}));
  t.push_back(F32Tensor("blk.0.attn_res_score.weight", {8}, {1, 2, 3, 4, 5, 6, 7, 8}));
  t.push_back(Typed("blk.1.ffn_down_exps.weight", GgmlType::Q3_K, {256, 4, 2}));
  return WriteModel(dir, t, {0, 0, 1, 1});
}

struct FileState {
  std::string bytes;
  ino_t ino = 0;
  int64_t mtime_ns = 0;
  bool operator==(const FileState&) const = default;
};

// Every file of `dir`: bytes, inode and mtime (a rewrite changes the inode,
// the atomic rename's, and the mtime).
std::map<std::string, FileState> State(const std::string& dir) {
  std::map<std::string, FileState> s;
  for (const auto& e : fs::directory_iterator(dir)) {
    struct stat st {};
    EXPECT_EQ(::stat(e.path().c_str(), &st), 0);
    s[e.path().filename().string()] = {*ReadFileToString(e.path().string()), st.st_ino,
                                       int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec};
  }
  return s;
}

// A `k3pack load` child whose stderr goes to a file (read while it runs, or
// after), started in the foreground's way: SIGINT at its default (a runner
// started in the background passes it ignored, which k3pack keeps).
struct Child {
  pid_t pid = -1;
  std::string err_path;
  std::string Err() const {
    auto text = ReadFileToString(err_path);
    return text.ok() ? *text : "";
  }
  // Waits for the child to stop itself (a test seam's SIGSTOP) or end: true
  // when it stopped.
  bool WaitStopped() const {
    int status = 0;
    return ::waitpid(pid, &status, WUNTRACED) == pid && WIFSTOPPED(status);
  }
  // Its exit code (128 + the signal that ended it).
  int Wait() const {
    int status = 0;
    ::waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
};

Child StartLoad(const std::vector<std::string>& args, const std::string& env, const std::string& err_path) {
  Child c;
  c.err_path = err_path;
  c.pid = ::fork();
  if (c.pid == 0) {
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, STDOUT_FILENO);
    ::dup2(err, STDERR_FILENO);
    ::signal(SIGINT, SIG_DFL);
    if (!env.empty()) ::putenv(const_cast<char*>(env.c_str()));
    std::vector<char*> argv{const_cast<char*>(K3PACK_BIN), const_cast<char*>("load")};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(const_cast<char*>("--progress"));
    argv.push_back(const_cast<char*>("none"));
    argv.push_back(nullptr);
    ::execv(K3PACK_BIN, argv.data());
    ::_exit(127);
  }
  return c;
}

// Sets every file's mtime to an hour ago, so that a rewrite shows even on a
// filesystem with coarse timestamps.
void AgeFiles(const std::string& dir) {
  for (const auto& e : fs::directory_iterator(dir))
    fs::last_write_time(e.path(), fs::last_write_time(e.path()) - std::chrono::hours(1));
}

TEST(LoadDumpRule, SameRerunIsAlreadyBuiltAndLeavesTheDumpUntouched) {
  TempDir dir("dump-same");
  const std::string m = Model(dir.path + "/a", -1.0f), out = dir.path + "/dump";
  testing_cli::CliRun r = Load("--manifest " + m + " --dump " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("dumped to       " + out), std::string::npos) << r.out;
  AgeFiles(out);
  const auto before = State(out);
  ASSERT_EQ(before.size(), 5u);

  r = Load("--manifest " + m + " --dump " + out);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("already built: " + out + " (use --force to rebuild)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("dumped to"), std::string::npos) << r.out;
  EXPECT_TRUE(State(out) == before) << "an identical rerun rewrote the dump";
}

TEST(LoadDumpRule, AnotherDumpIsRefusedNamingTheOptionAndForceReplacesIt) {
  TempDir dir("dump-other");
  const std::string m1 = Model(dir.path + "/a", -1.0f), m2 = Model(dir.path + "/b", -3.0f);
  const std::string out = dir.path + "/dump";
  ASSERT_EQ(Load("--manifest " + m1 + " --dump " + out).code, 0);
  AgeFiles(out);
  const auto before = State(out);

  // Another model's dump: one file differs.
  testing_cli::CliRun r = Load("--manifest " + m2 + " --dump " + out);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("refusing to overwrite non-empty directory " + out + " (--dump)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("model.layers.0.self_attn.A_log.npy differs from what this run writes"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("pass --force"), std::string::npos) << r.out;
  EXPECT_TRUE(State(out) == before);

  // The same dump plus a file this run does not write.
  ASSERT_TRUE(WriteFileAtomic(out + "/mine.npy", "not a dump").ok());
  const auto with_extra = State(out);
  r = Load("--manifest " + m1 + " --dump " + out);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find(out + "/mine.npy is not written by this run"), std::string::npos) << r.out;
  EXPECT_TRUE(State(out) == with_extra);

  // A file that is no .npy at all: refused before anything is loaded.
  const std::string notes = dir.path + "/notes";
  fs::create_directories(notes);
  ASSERT_TRUE(WriteFileAtomic(notes + "/README", "mine").ok());
  r = Load("--manifest " + m1 + " --dump " + notes);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("(--dump): it holds " + notes + "/README"), std::string::npos) << r.out;
  EXPECT_EQ(*ReadFileToString(notes + "/README"), "mine");

  // --force writes the other model's dump.
  fs::remove(out + "/mine.npy");
  r = Load("--manifest " + m2 + " --dump " + out + " --force");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string ref = dir.path + "/ref";
  ASSERT_EQ(Load("--manifest " + m2 + " --dump " + ref).code, 0);
  for (const auto& [name, st] : State(ref)) EXPECT_EQ(*ReadFileToString(out + "/" + name), st.bytes) << name;
  EXPECT_NE(*ReadFileToString(out + "/model.layers.0.self_attn.A_log.npy"),
            before.at("model.layers.0.self_attn.A_log.npy").bytes);
}

// Session 28: two dumps into one DIR both exited 0 and left a mix of the two
// models' files (or, staggered, the second refused the first's files as "not
// the dump of this run"). DIR is locked as synth's and repair's outputs: the
// second is refused naming the first, or waits for it with --wait.
TEST(LoadDumpRule, ASecondDumpIntoTheSameDirectoryIsRefusedNamingTheFirstOrWaitsForIt) {
  TempDir dir("dump-lock");
  const std::string m1 = Model(dir.path + "/a", -1.0f), m2 = Model(dir.path + "/b", -3.0f);
  const std::string out = dir.path + "/dump", ref = dir.path + "/ref";
  ASSERT_EQ(Load("--manifest " + m1 + " --dump " + ref).code, 0);
  // The first stops itself right after taking DIR's lock (made here, so the
  // lock is taken at its first look).
  fs::create_directories(out);
  Child first = StartLoad({"--manifest", m1, "--dump", out}, "K3PACK_TEST_STOP_HOLDING_LOCK=1", dir.path + "/first.err");
  ASSERT_TRUE(first.WaitStopped()) << first.Err();

  testing_cli::CliRun refused = Load("--manifest " + m2 + " --dump " + out);
  EXPECT_EQ(refused.code, 1) << refused.out;
  EXPECT_NE(refused.out.find("another process is writing a tensor dump into " + out + ": pid " +
                             std::to_string(first.pid) + " ("),
            std::string::npos)
      << refused.out;
  EXPECT_NE(refused.out.find("load --manifest " + m1), std::string::npos) << "the holder's command" << refused.out;
  EXPECT_TRUE(fs::is_empty(out)) << "the refused dump wrote into DIR";

  // With --wait the second goes on once the first is done: the same dump is
  // then there, already built.
  Child second = StartLoad({"--manifest", m1, "--dump", out, "--wait", "60"}, "", dir.path + "/second.err");
  for (int i = 0; i < 3000 && second.Err().find("waiting for") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_NE(second.Err().find("waiting for"), std::string::npos) << second.Err();
  ::kill(first.pid, SIGCONT);
  EXPECT_EQ(first.Wait(), 0) << first.Err();
  EXPECT_EQ(second.Wait(), 0) << second.Err();
  const auto want = State(ref);
  const auto got = State(out);
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, st] : want) EXPECT_EQ(got.at(name).bytes, st.bytes) << name;
}

// Session 28: an interrupted dump said "rerun the command to start over", but
// the rerun refused its files ("not the dump of this run (... is missing)").
// A marker in DIR while the dump is written makes the rerun start over, and
// the result is the uninterrupted dump.
TEST(LoadDumpRule, AnInterruptedDumpIsStartedOverByTheRerun) {
  TempDir dir("dump-interrupted");
  const std::string m = Model(dir.path + "/a", -1.0f), out = dir.path + "/dump", ref = dir.path + "/ref";
  ASSERT_EQ(Load("--manifest " + m + " --dump " + ref).code, 0);
  const auto want = State(ref);

  Child c = StartLoad({"--manifest", m, "--dump", out}, "K3PACK_TEST_STOP_AFTER_DUMP_FILES=2", dir.path + "/c.err");
  ASSERT_TRUE(c.WaitStopped()) << c.Err();
  ::kill(c.pid, SIGINT);  // pending until it runs again
  ::kill(c.pid, SIGCONT);
  EXPECT_EQ(c.Wait(), 130) << c.Err();
  EXPECT_NE(c.Err().find("k3pack load: interrupted; nothing to resume, rerun the command to start over"),
            std::string::npos)
      << c.Err();
  EXPECT_TRUE(fs::exists(out + "/.k3pack-dump.partial"));
  const auto marker = nlohmann::json::parse(*ReadFileToString(out + "/.k3pack-dump.partial"));
  EXPECT_EQ(marker["k3pack_dump_in_progress"]["found"], nlohmann::json::array()) << marker;

  testing_cli::CliRun rerun = Load("--manifest " + m + " --dump " + out);
  ASSERT_EQ(rerun.code, 0) << rerun.out;
  EXPECT_NE(rerun.out.find(out + " holds an interrupted dump; starting over"), std::string::npos) << rerun.out;
  EXPECT_NE(rerun.out.find("dumped to       " + out), std::string::npos) << rerun.out;
  const auto got = State(out);
  ASSERT_EQ(got.size(), want.size()) << "the marker must be gone";
  for (const auto& [name, st] : want) EXPECT_EQ(got.at(name).bytes, st.bytes) << name;
  // And the finished dump is the same command's "already built".
  EXPECT_NE(Load("--manifest " + m + " --dump " + out).out.find("already built: " + out), std::string::npos);

  // Interrupted over another model's dump with --force: the rerun starts
  // over too, and keeps only what was there before (none of it here is
  // missing from this dump, so it ends as the uninterrupted --force run).
  const std::string m2 = Model(dir.path + "/b", -3.0f);
  Child f = StartLoad({"--manifest", m2, "--dump", out, "--force"}, "K3PACK_TEST_STOP_AFTER_DUMP_FILES=1",
                      dir.path + "/f.err");
  ASSERT_TRUE(f.WaitStopped()) << f.Err();
  ::kill(f.pid, SIGINT);
  ::kill(f.pid, SIGCONT);
  EXPECT_EQ(f.Wait(), 130) << f.Err();
  EXPECT_EQ(nlohmann::json::parse(*ReadFileToString(out + "/.k3pack-dump.partial"))["k3pack_dump_in_progress"]["found"]
                .size(),
            want.size());
  rerun = Load("--manifest " + m2 + " --dump " + out + " --force");
  ASSERT_EQ(rerun.code, 0) << rerun.out;
  const std::string ref2 = dir.path + "/ref2";
  ASSERT_EQ(Load("--manifest " + m2 + " --dump " + ref2).code, 0);
  EXPECT_TRUE(State(out).size() == want.size() && !fs::exists(out + "/.k3pack-dump.partial"));
  for (const auto& [name, st] : State(ref2)) EXPECT_EQ(*ReadFileToString(out + "/" + name), st.bytes) << name;
}

}  // namespace
}  // namespace k3pack::loader
