// Pack building: byte-identical layout, sidecars, refusals, crash + resume.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "../forked_child.h"
#include "pack/sidecars.h"
#include "pack_fixture.h"
#include "util/file.h"
#include "util/sha256.h"

namespace k3pack::pack {
namespace {

using testing::ExpectedPack;
using testing::Model;
using testing::ReadAll;

class PackBuild : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new std::string(testing::TempDir("build"));
    model_ = new Model(testing::MakeModel(*root_ + "/model"));
    expected_ = new std::string(ExpectedPack(model_->experts));
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*root_);
    delete model_;
    delete expected_;
    delete root_;
  }
  void SetUp() override {
    out_ = *root_ + "/" + ::testing::UnitTest::GetInstance()->current_test_info()->name() + "/x.expert-major.pack";
    unsetenv("K3PACK_CRASH_AFTER_OBJECTS");
    unsetenv("K3PACK_FAKE_FREE_BYTES");
    unsetenv("K3PACK_CHECKPOINT_BYTES");
  }
  Result<BuildResult> Build(bool restart = false, int threads = 3) {
    BuildOptions o;
    o.out_path = out_;
    o.safety_margin_gib = 0;
    o.restart = restart;
    o.threads = threads;
    o.chunk_bytes = 1 << 20;
    o.replace_existing = replace_;
    o.log = [this](const std::string& line) { logs_.push_back(line); };
    return BuildPack(model_->experts, o);
  }
  // Runs a build in a child process that crashes (_exit 86) after the
  // checkpoint covering `n` objects. Returns the child's exit status.
  int BuildAndCrash(uint64_t n, uint64_t throttle_us = 0) {
    pid_t pid = fork();
    if (pid == 0) {
      if (throttle_us) setenv("K3PACK_THROTTLE_US", std::to_string(throttle_us).c_str(), 1);
      setenv("K3PACK_CRASH_AFTER_OBJECTS", std::to_string(n).c_str(), 1);
      setenv("K3PACK_CHECKPOINT_BYTES", "1", 1);
      auto r = Build();
      _exit(r.ok() ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  static std::string* root_;
  static Model* model_;
  static std::string* expected_;
  std::string out_;
  bool replace_ = false;  // BuildOptions::replace_existing (--force)
  std::vector<std::string> logs_;
};
std::string* PackBuild::root_;
Model* PackBuild::model_;
std::string* PackBuild::expected_;

TEST_F(PackBuild, ByteIdenticalToSpecLayout) {
  auto r = Build();
  ASSERT_TRUE(r.ok()) << r.error().message();
  const std::string got = ReadAll(out_);
  ASSERT_EQ(got.size(), expected_->size());
  EXPECT_TRUE(got == *expected_) << "pack bytes differ from the spec layout";
  EXPECT_EQ(r->index_sha256, Sha256Hex(got.data(), 40 + r->index_count * 152));
  EXPECT_FALSE(PathExists(PartialPathFor(out_)));
  EXPECT_FALSE(PathExists(CheckpointPathFor(out_)));
  EXPECT_TRUE(PathExists(LockPathFor(out_)));

  // Digest sidecar: one SHA-256 per entry, recomputed here.
  auto d = ReadPackDigests(DigestsPathFor(out_));
  ASSERT_TRUE(d.ok()) << d.error().message();
  ASSERT_EQ(d->index_count, r->index_count);
  EXPECT_EQ(d->pack_size, got.size());
  EXPECT_EQ(d->index_sha256, r->index_sha256);
  for (uint64_t i = 0; i < d->index_count; ++i) {
    const uint8_t* e = reinterpret_cast<const uint8_t*>(got.data()) + 40 + i * 152;
    uint64_t off = 0, nb = 0;
    for (int k = 7; k >= 0; --k) off = (off << 8) | e[136 + k], nb = (nb << 8) | e[144 + k];
    EXPECT_EQ(ToHex(d->entry_sha256[i].data(), 32), Sha256Hex(got.data() + off, nb)) << i;
  }

  // SGLang's validator accepts it and reports the geometry.
  auto v = ValidatePack(out_, model_->experts);
  ASSERT_TRUE(v.ok()) << v.error().message();
  EXPECT_EQ((*v)["index_sha256"], r->index_sha256);
  EXPECT_EQ((*v)["payload_samples_verified"], 6);
  EXPECT_EQ((*v)["roles"]["down"]["dtype"], "Q3_K");
  EXPECT_EQ((*v)["object_bytes"], model_->experts.by_layer[0][0].expert_bytes * 2 +
                                      model_->experts.by_layer[0][2].expert_bytes);
}

TEST_F(PackBuild, SingleThreadSameBytes) {
  auto r = Build(false, 1);
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_TRUE(ReadAll(out_) == *expected_);
}

TEST_F(PackBuild, RefusesToOverwrite) {
  ASSERT_TRUE(Build().ok());
  auto again = Build();
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().kind(), ErrorKind::kFileExists);
  EXPECT_EQ(again.error().message().substr(0, again.error().message().find('\n')),
            "refusing to overwrite existing Expert Pack: " + out_);
  EXPECT_TRUE(ReadAll(out_) == *expected_);
}

TEST_F(PackBuild, RefusesWithoutSpace) {
  setenv("K3PACK_FAKE_FREE_BYTES", "1000", 1);
  auto r = Build();
  unsetenv("K3PACK_FAKE_FREE_BYTES");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().kind(), ErrorKind::kOS);
  const std::string m = r.error().message();
  EXPECT_EQ(m.rfind("insufficient space for Kimi Expert Pack: available=1000, required=", 0), 0u) << m;
  EXPECT_FALSE(PathExists(PartialPathFor(out_)));
  EXPECT_FALSE(PathExists(out_));
}

// --force: the pack it replaces and its sidecar stay until the new pack is
// renamed over them, so a refused or crashed rebuild loses nothing.
TEST_F(PackBuild, ReplaceKeepsTheOldPackUntilTheNewOneIsDone) {
  std::filesystem::create_directories(std::filesystem::path(out_).parent_path());
  const std::string old_pack = "the pack being replaced", old_digests = "its sidecar";
  ASSERT_TRUE(WriteFileAtomic(out_, old_pack).ok());
  ASSERT_TRUE(WriteFileAtomic(DigestsPathFor(out_), old_digests).ok());
  auto untouched = [&] { return ReadAll(out_) == old_pack && ReadAll(DigestsPathFor(out_)) == old_digests; };

  auto plain = Build();  // without replace_existing: refused, as before
  ASSERT_FALSE(plain.ok());
  EXPECT_EQ(plain.error().kind(), ErrorKind::kFileExists);
  EXPECT_TRUE(untouched());

  replace_ = true;
  setenv("K3PACK_FAKE_FREE_BYTES", "1000", 1);  // no room even with the old pack's blocks
  auto refused = Build();
  unsetenv("K3PACK_FAKE_FREE_BYTES");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().kind(), ErrorKind::kOS);
  EXPECT_NE(refused.error().message().find("bytes of the pack it replaces counted as free"), std::string::npos)
      << refused.error().message();
  EXPECT_TRUE(untouched());
  EXPECT_FALSE(PathExists(PartialPathFor(out_)));

  ASSERT_EQ(BuildAndCrash(5), 86);  // a crash mid-copy
  EXPECT_TRUE(untouched());
  ASSERT_TRUE(PathExists(PartialPathFor(out_)));

  replace_ = false;  // a plain rerun resumes the rebuild and replaces the pack at its end
  auto resumed = Build();
  ASSERT_TRUE(resumed.ok()) << resumed.error().message();
  EXPECT_GE(resumed->resumed_objects, 5u);
  EXPECT_TRUE(ReadAll(out_) == *expected_);
  auto d = ReadPackDigests(DigestsPathFor(out_));
  ASSERT_TRUE(d.ok()) << d.error().message();
  EXPECT_EQ(d->index_sha256, resumed->index_sha256);
  EXPECT_FALSE(PathExists(PartialPathFor(out_)));
  EXPECT_FALSE(PathExists(CheckpointPathFor(out_)));
}

// Where the disk cannot hold both, the old pack goes first, once every
// other check passed, and the log says so; with room for both it stays.
TEST_F(PackBuild, ReplaceRemovesTheOldPackFirstOnlyWhenTheDiskCannotHoldBoth) {
  std::filesystem::create_directories(std::filesystem::path(out_).parent_path());
  const std::string old_pack(expected_->size(), 'x');  // written out: its blocks are held
  replace_ = true;
  for (const bool room_for_both : {true, false}) {
    SCOPED_TRACE(room_for_both ? "room for both" : "room for one");
    ASSERT_TRUE(WriteFileAtomic(out_, old_pack).ok());
    logs_.clear();
    const uint64_t free = room_for_both ? 4 * expected_->size() : expected_->size() / 2;
    setenv("K3PACK_FAKE_FREE_BYTES", std::to_string(free).c_str(), 1);
    auto r = Build();
    unsetenv("K3PACK_FAKE_FREE_BYTES");
    ASSERT_TRUE(r.ok()) << r.error().message();
    EXPECT_TRUE(ReadAll(out_) == *expected_);
    const bool removed_first = std::any_of(logs_.begin(), logs_.end(), [&](const std::string& l) {
      return l.rfind("not enough free space to keep " + out_ + " until its rebuild is complete (" +
                         std::to_string(free) + " bytes free, ",
                     0) == 0 &&
             l.ends_with("needed): removing it now");
    });
    EXPECT_EQ(removed_first, !room_for_both);
  }
}

TEST_F(PackBuild, ResumeAfterCrashAtSeveralPoints) {
  const uint64_t total = model_->experts.layers.size() * model_->experts.num_experts;
  for (uint64_t n : {uint64_t{1}, uint64_t{7}, total / 2, total - 1, total}) {
    SCOPED_TRACE("crash after " + std::to_string(n) + " objects");
    std::filesystem::remove_all(std::filesystem::path(out_).parent_path());
    ASSERT_EQ(BuildAndCrash(n), 86);
    ASSERT_TRUE(PathExists(PartialPathFor(out_)));
    ASSERT_TRUE(PathExists(CheckpointPathFor(out_)));
    ASSERT_FALSE(PathExists(out_));
    auto r = Build();
    ASSERT_TRUE(r.ok()) << r.error().message();
    EXPECT_GE(r->resumed_objects, n);
    EXPECT_TRUE(ReadAll(out_) == *expected_);
    EXPECT_TRUE(ReadPackDigests(DigestsPathFor(out_)).ok());
    EXPECT_FALSE(PathExists(CheckpointPathFor(out_)));
  }
}

TEST_F(PackBuild, ResumeRepairsGarbageBeyondCheckpoint) {
  ASSERT_EQ(BuildAndCrash(5, 20000), 86);
  const std::string ckpt = ReadAll(CheckpointPathFor(out_));
  const uint64_t done = std::stoull(ckpt.substr(ckpt.find("\"objects_done\": ") + 16));
  ASSERT_LT(done, model_->experts.layers.size() * model_->experts.num_experts);
  // Bytes past the checkpoint are not trusted: scribble over them.
  int fd = ::open(PartialPathFor(out_).c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  std::string junk(100000, '\x5a');
  ASSERT_EQ(::pwrite(fd, junk.data(), junk.size(), static_cast<off_t>(expected_->size() - junk.size())),
            static_cast<ssize_t>(junk.size()));
  ::close(fd);
  auto r = Build();
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_TRUE(ReadAll(out_) == *expected_);
}

TEST_F(PackBuild, PartialWithoutCheckpointNeedsRestart) {
  std::filesystem::create_directories(std::filesystem::path(out_).parent_path());
  testing::WriteAll(PartialPathFor(out_), "something SGLang left behind");
  auto r = Build();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().kind(), ErrorKind::kFileExists);
  EXPECT_EQ(r.error().message(), "partial Expert Pack already exists: " + PartialPathFor(out_) +
                                     "\nhint: it has no k3pack checkpoint, so it cannot be resumed; pass --restart "
                                     "to discard it");
  auto r2 = Build(/*restart=*/true);
  ASSERT_TRUE(r2.ok()) << r2.error().message();
  EXPECT_TRUE(ReadAll(out_) == *expected_);
}

TEST_F(PackBuild, ChangedInputsNeedRestart) {
  ASSERT_EQ(BuildAndCrash(3), 86);
  // A checkpoint from other inputs (here: other fingerprint) is never resumed silently.
  auto text = ReadAll(CheckpointPathFor(out_));
  auto pos = text.find("\"fingerprint\": \"");
  ASSERT_NE(pos, std::string::npos);
  text[pos + 16] = text[pos + 16] == '0' ? '1' : '0';
  testing::WriteAll(CheckpointPathFor(out_), text);
  auto r = Build();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("was started from different inputs"), std::string::npos);
  EXPECT_NE(r.error().message().find("pass --restart"), std::string::npos);
  auto r2 = Build(/*restart=*/true);
  ASSERT_TRUE(r2.ok()) << r2.error().message();
  EXPECT_EQ(r2->resumed_objects, 0u);
  EXPECT_TRUE(ReadAll(out_) == *expected_);
}

TEST_F(PackBuild, DamagedJournalNeedsRestart) {
  ASSERT_EQ(BuildAndCrash(6), 86);
  int fd = ::open((out_ + ".partial.digests").c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, "X", 1, 128 + 5), 1);
  ::close(fd);
  auto r = Build();
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("does not match checkpoint"), std::string::npos) << r.error().message();
}

// A checkpoint is JSON a disk error or a hand can change: a "format" that is
// no string made json's value() throw out of BuildPack.
TEST_F(PackBuild, CheckpointWithNonStringFormatNeedsRestart) {
  ASSERT_EQ(BuildAndCrash(3), 86);
  auto j = nlohmann::json::parse(ReadAll(CheckpointPathFor(out_)));
  j["format"] = 1;
  testing::WriteAll(CheckpointPathFor(out_), j.dump(2));
  Result<BuildResult> r = Error("not run");
  ASSERT_NO_THROW(r = Build());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("checkpoint " + CheckpointPathFor(out_) + " is unreadable: unknown format"),
            std::string::npos)
      << r.error().message();
}

// A checkpoint whose object count is not the pack's, every other field
// consistent (its journal digest taken over as many records): the resume
// copied that many digests into vectors sized for the pack's entries.
TEST_F(PackBuild, CheckpointWithMoreObjectsThanThePackNeedsRestart) {
  const uint64_t total = model_->experts.layers.size() * model_->experts.num_experts;
  ASSERT_EQ(BuildAndCrash(total), 86);
  const uint64_t claimed = total + 1;
  const std::string journal = ReadAll(out_ + ".partial.digests");
  ASSERT_GE(journal.size(), kDigestsHeaderBytes + claimed * 3 * kDigestBytes);  // the CRC area follows the digests
  auto j = nlohmann::json::parse(ReadAll(CheckpointPathFor(out_)));
  j["objects_total"] = claimed;
  j["objects_done"] = claimed;
  j["journal_sha256"] = Sha256Hex(journal.data() + kDigestsHeaderBytes, claimed * 3 * kDigestBytes);
  j.erase("journal_crc_sha256");
  testing::WriteAll(CheckpointPathFor(out_), j.dump(2));
  // In a child: the resume wrote past the end of its digest and CRC vectors.
  const int status = k3test::InForkedChild([&] {
    try {
      auto r = Build();
      if (r.ok()) ::_exit(1);
      const std::string& m = r.error().message();
      ::_exit(m.find("pass --restart") != std::string::npos && m.find(CheckpointPathFor(out_)) != std::string::npos ? 0
                                                                                                                   : 2);
    } catch (...) {
      ::_exit(3);
    }
  });
  EXPECT_EQ(status, 0) << "1: resumed, 2: another error, 3: an exception, -1: still running after 60 s, >= 128: "
                          "killed by a signal";
}

TEST_F(PackBuild, LockIsExclusive) {
  std::filesystem::create_directories(std::filesystem::path(out_).parent_path());
  int fd = ::open(LockPathFor(out_).c_str(), O_WRONLY | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  // The child says when it holds the lock: a fixed sleep before Build() let a
  // loaded machine run Build() first.
  int locked[2];
  ASSERT_EQ(::pipe(locked), 0);
  pid_t pid = fork();
  if (pid == 0) {
    int cfd = ::open(LockPathFor(out_).c_str(), O_WRONLY);
    if (cfd < 0 || flock(cfd, LOCK_EX) != 0) _exit(1);
    (void)!::write(locked[1], "L", 1);
    sleep(60);
    _exit(0);
  }
  ::close(locked[1]);
  char c = 0;
  ASSERT_EQ(::read(locked[0], &c, 1), 1) << "the child could not take the lock";
  ::close(locked[0]);
  auto r = Build();
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  ::close(fd);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("another process is building or repairing the Expert Pack"), std::string::npos);
  EXPECT_EQ(r.error().message().find(".lock"), std::string::npos) << "internal file named: " << r.error().message();
}

}  // namespace
}  // namespace k3pack::pack
