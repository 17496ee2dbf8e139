// `k3pack load --dump DIR` under the shared overwrite rule (cli/output_rule.h):
// a rerun whose dump is already there, byte for byte and nothing else, is
// reported "already built" and leaves DIR untouched; any other non-empty DIR
// is refused naming --dump and --force; --force writes. Before, every rerun
// was refused as if DIR were someone else's.
#include <sys/stat.h>

#include <map>

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

}  // namespace
}  // namespace k3pack::loader
