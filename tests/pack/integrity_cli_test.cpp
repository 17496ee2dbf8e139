// Interruptions, full disks and damaged partial files, end to end through the
// real binary (issue 17 items 4, 5, 6, 13, 14):
//  - SIGINT / SIGTERM mid-copy: a checkpoint of the durable prefix, one line
//    saying where the rerun resumes, exit 130 / 143; the rerun resumes there;
//  - a real full filesystem (a small tmpfs; needs root): the checkpoint is
//    still written, so the rerun resumes instead of starting over;
//  - the rerun's free-space check counts only what is still to be written;
//  - bytes of the checkpointed prefix changed before the rerun are copied
//    again, never published;
//  - the digest sidecar records a CRC32C of every entry.
#include <signal.h>
#include <sys/statvfs.h>
#include <sys/wait.h>

#include <cstdio>
#include <regex>

#include <nlohmann/json.hpp>

#include "../scratch_mount.h"
#include "pack_fixture.h"
#include "spawn.h"
#include "util/crc32c.h"
#include "util/file.h"

namespace k3pack::pack {
namespace {

using testing::ReadAll;

int64_t CheckpointObjectsDone(const std::string& out) {
  auto j = nlohmann::json::parse(ReadAll(CheckpointPathFor(out)), nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("objects_done")) return -1;
  return j["objects_done"].get<int64_t>();
}

uint64_t Le(const std::string& b, uint64_t at, int k) {
  uint64_t v = 0;
  for (int i = k - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(b[at + i]);
  return v;
}

struct PackIntegrityModel {
  static constexpr const char* kName = "integrity";
  static constexpr uint64_t kSeed = 3;
};

class PackIntegrity : public testing::SharedModelTest<PackIntegrityModel> {
 protected:
  static std::vector<std::string> BuildArgs(const std::string& out) {
    return {"build", "--gguf-dir", model_->dir, "--model-config", model_->config, "--tokenizer-dir",
            model_->dir + "/tokenizer", "--profile", "scaled", "--out", out, "--manifest", out + ".json",
            "--safety-margin-gib", "0", "--threads", "2"};
  }
  static uint64_t TotalObjects() { return model_->experts.layers.size() * model_->experts.num_experts; }
  static uint64_t PayloadBytes() {
    uint64_t payload = 0;
    for (const auto& layer : model_->experts.by_layer) {
      for (const auto& t : layer) payload += t.expert_bytes * model_->experts.num_experts;
    }
    return payload;
  }
};

// Runs `args` with a throttled copy and JSON progress, sends `sig` once the
// finished prefix holds at least 2 objects; returns {exit status, stderr}.
std::pair<int, std::string> RunAndSignal(const std::vector<std::string>& base_args, int sig, bool* signalled) {
  auto args = base_args;
  args.insert(args.end(), {"--progress", "json"});
  // Slow enough (48 objects x 100 ms on 2 threads) for a JSON progress line
  // (at most one a second) to land in the middle of the copy.
  Proc p = Spawn(args, {"K3PACK_THROTTLE_US=100000", "K3PACK_BATCH_BYTES=1"});
  std::string err, line;
  char buf[4096];
  ssize_t n;
  *signalled = false;
  while ((n = read(p.err_fd, buf, sizeof buf)) > 0) {
    err.append(buf, static_cast<size_t>(n));
    if (*signalled) continue;
    size_t start = 0;
    for (size_t nl; (nl = err.find('\n', start)) != std::string::npos; start = nl + 1) {
      auto j = nlohmann::json::parse(err.substr(start, nl - start), nullptr, false);
      if (!j.is_discarded() && j.is_object() && j.value("phase", "") == "build" &&
          j.value("done_objects", 0) >= 2 && j.value("done_objects", 0) < j.value("total_objects", 0)) {
        ::kill(p.pid, sig);
        *signalled = true;
        break;
      }
    }
  }
  close(p.err_fd);
  int status = 0;
  waitpid(p.pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status)) << "k3pack died of signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0)
                                 << " instead of exiting:\n" << err;
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), err};
}

// 17.4: Ctrl-C (SIGINT) of `pack` and SIGTERM of `build` in the middle of the
// copy: exit 130 / 143 with one line naming the resume point, the checkpoint
// on disk says the same, and the same command resumes there and produces a
// pack byte-identical to an uninterrupted build.
TEST_F(PackIntegrity, SigintOrSigtermMidCopyCheckpointsAndTheRerunResumes) {
  struct Case {
    const char* command;
    int sig;
    int rc;
  };
  for (const Case& c : {Case{"pack", SIGINT, 130}, Case{"build", SIGTERM, 143}}) {
    SCOPED_TRACE(c.command);
    const std::string dir = *root_ + "/sig-" + c.command;
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    const std::string out = dir + "/s.pack";
    const auto args = std::string(c.command) == "pack" ? PackArgs(out) : BuildArgs(out);
    bool signalled = false;
    auto [rc, err] = RunAndSignal(args, c.sig, &signalled);
    ASSERT_TRUE(signalled) << "the build finished before it could be interrupted:\n" << err;
    EXPECT_EQ(rc, c.rc) << err;
    const int64_t done = CheckpointObjectsDone(out);
    ASSERT_GE(done, 2) << "nothing (or too little) was checkpointed on the signal:\n" << err;
    ASSERT_LT(done, static_cast<int64_t>(TotalObjects()));
    const std::string said = "interrupted; rerun the same command to resume from object " + std::to_string(done) +
                             " of " + std::to_string(TotalObjects());
    EXPECT_NE(err.find(said), std::string::npos) << err;
    // The message starts a line of its own (a progress line was ended first).
    const size_t at = err.find(said);
    ASSERT_NE(at, std::string::npos);
    const size_t line_start = err.rfind('\n', at);
    EXPECT_EQ(err.substr(line_start + 1, at - line_start - 1).find('{'), std::string::npos) << err;
    EXPECT_FALSE(PathExists(out));

    auto [rc2, err2] = RunCli(args);
    ASSERT_EQ(rc2, 0) << err2;
    EXPECT_NE(err2.find("resuming " + PartialPathFor(out) + " at object " + std::to_string(done) + " of "),
              std::string::npos)
        << err2;
    EXPECT_TRUE(ReadAll(out) == *expected_) << "pack bytes differ from an uninterrupted build";
    EXPECT_FALSE(PathExists(CheckpointPathFor(out)));
    EXPECT_FALSE(PathExists(CheckpointPathFor(out) + ".spare"));
  }
}


// 17.5: a filesystem that really fills up mid-copy (a tmpfs with a filler
// file; no periodic checkpoint happens in this run): the checkpoint of the
// finished objects must still be written, although no new block can be
// allocated then, so the rerun resumes instead of starting over.
TEST_F(PackIntegrity, RealFullDiskStillCheckpointsTheFinishedObjects) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a small tmpfs needs root";
  const uint64_t size = expected_->size() * 2 + (4u << 20);
  k3pack::testing_scratch::ScratchMount fs(*root_ + "/full", "tmpfs", "size=" + std::to_string(size));
  if (!fs.ok) GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  const std::string out = fs.dir + "/f.pack", filler = fs.dir + "/filler";
  struct statvfs sv {};
  ASSERT_EQ(::statvfs(fs.dir.c_str(), &sv), 0);
  const uint64_t free_now = sv.f_bavail * sv.f_frsize;
  const uint64_t data_start = Le(*expected_, 40 + 136, 8);
  const uint64_t room = data_start + PayloadBytes() / 2 + (64u << 10);  // about half the payload fits
  ASSERT_GT(free_now, room);
  {
    int fd = ::open(filler.c_str(), O_CREAT | O_WRONLY, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::posix_fallocate(fd, 0, static_cast<off_t>(free_now - room)), 0);
    ::close(fd);
  }
  // K3PACK_FAKE_FREE_BYTES gets past the up-front space check, so the disk
  // really fills up during the copy; K3PACK_CHECKPOINT_MS: no periodic one.
  auto [rc, err] = RunCli(PackArgs(out), {"K3PACK_FAKE_FREE_BYTES=1000000000000", "K3PACK_CHECKPOINT_MS=600000",
                                          "K3PACK_BATCH_BYTES=1"});
  EXPECT_EQ(rc, 1) << err;
  EXPECT_NE(err.find("No space left on device"), std::string::npos) << err;
  EXPECT_FALSE(PathExists(out));
  const int64_t done = CheckpointObjectsDone(out);
  EXPECT_GT(done, 0) << "the objects written before the disk filled were not checkpointed:\n" << err;
  EXPECT_NE(err.find("resumes at object " + std::to_string(done) + " of "), std::string::npos) << err;

  ASSERT_EQ(::unlink(filler.c_str()), 0);  // the user frees space
  auto [rc2, err2] = RunCli(PackArgs(out));
  ASSERT_EQ(rc2, 0) << err2;
  EXPECT_NE(err2.find("resuming " + PartialPathFor(out) + " at object " + std::to_string(done) + " of "),
            std::string::npos)
      << err2;
  EXPECT_TRUE(ReadAll(out) == *expected_);
}

// 17.6: after a full disk, freeing exactly the space that was missing must be
// enough: the rerun's check counts what is still to be written, not the
// bytes the partial file already holds. The disk is modelled with the seams:
// a fresh build needs R bytes (its refusal says so); the first run fills up
// after writing X bytes of pack data and journal; the rerun then sees
// R - data_start - X free bytes (data_start: the header + index, written
// before the seam counts).
TEST_F(PackIntegrity, RerunSpaceCheckCountsOnlyWhatIsStillToBeWritten) {
  const std::string dir = *root_ + "/space";
  std::filesystem::remove_all(dir);
  const std::string out = dir + "/s.pack";
  auto [rc0, err0] = RunCli(PackArgs(out), {"K3PACK_FAKE_FREE_BYTES=1"});
  ASSERT_EQ(rc0, 1) << err0;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(err0, m, std::regex("available=1, required=([0-9]+)"))) << err0;
  const uint64_t required_fresh = std::stoull(m[1]);
  EXPECT_FALSE(PathExists(PartialPathFor(out)));

  const uint64_t filled_after = PayloadBytes() / 2;
  auto [rc1, err1] = RunCli(PackArgs(out), {"K3PACK_TEST_ENOSPC_AFTER_BYTES=" + std::to_string(filled_after),
                                            "K3PACK_BATCH_BYTES=1"});
  ASSERT_EQ(rc1, 1) << err1;
  ASSERT_GT(CheckpointObjectsDone(out), 0) << err1;

  const uint64_t data_start = Le(*expected_, 40 + 136, 8);
  const uint64_t freed = required_fresh - data_start - filled_after;
  auto [rc2, err2] = RunCli(PackArgs(out), {"K3PACK_FAKE_FREE_BYTES=" + std::to_string(freed)});
  ASSERT_EQ(rc2, 0) << "freeing what was missing is not enough:\n" << err2;
  EXPECT_TRUE(ReadAll(out) == *expected_);
}

// Flips one byte of the partial pack at `at`.
void FlipByte(const std::string& path, uint64_t at) {
  int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char c = 0;
  ASSERT_EQ(::pread(fd, &c, 1, static_cast<off_t>(at)), 1);
  c = static_cast<char>(c ^ 0x5a);
  ASSERT_EQ(::pwrite(fd, &c, 1, static_cast<off_t>(at)), 1);
  ::close(fd);
}

// 17.14: a byte of an object inside the checkpointed prefix changes between
// the kill and the rerun (a disk error, a stray write): the resume checks the
// prefix's CRC32Cs, copies that object (and those after it) again, and the
// published pack is byte-identical to an uninterrupted build. Also for a
// checkpoint written before the journal had CRCs (then the SHA-256 records
// are compared).
TEST_F(PackIntegrity, ResumeRecopiesCheckpointedObjectsWhoseBytesChanged) {
  for (bool old_checkpoint : {false, true}) {
    SCOPED_TRACE(old_checkpoint ? "checkpoint without CRCs" : "checkpoint with CRCs");
    const std::string dir = *root_ + "/prefix";
    std::filesystem::remove_all(dir);
    const std::string out = dir + "/p.pack";
    const uint64_t total = TotalObjects();
    // A crash right after the checkpoint that covers 3/4 of the objects.
    auto [rc, err] = RunCli(PackArgs(out), {"K3PACK_CRASH_AFTER_OBJECTS=" + std::to_string(total * 3 / 4),
                                            "K3PACK_BATCH_BYTES=1"});
    ASSERT_EQ(rc, 86) << err;
    const int64_t done = CheckpointObjectsDone(out);
    ASSERT_GE(done, 4) << err;
    if (old_checkpoint) {
      auto j = nlohmann::json::parse(ReadAll(CheckpointPathFor(out)));
      ASSERT_TRUE(j.contains("journal_crc_sha256"));
      j.erase("journal_crc_sha256");
      testing::WriteAll(CheckpointPathFor(out), j.dump(2) + "\n");
    }
    // A byte in the middle of the gate payload of object done/2.
    const uint64_t victim = static_cast<uint64_t>(done) / 2, entry = victim * 3 + 1;
    const uint64_t off = Le(*expected_, 40 + entry * 152 + 136, 8), nb = Le(*expected_, 40 + entry * 152 + 144, 8);
    FlipByte(PartialPathFor(out), off + nb / 2);

    auto [rc2, err2] = RunCli(PackArgs(out));
    ASSERT_EQ(rc2, 0) << err2;
    EXPECT_NE(err2.find("object " + std::to_string(victim) + " of " + PartialPathFor(out)), std::string::npos) << err2;
    EXPECT_NE(err2.find("changed since it was checkpointed"), std::string::npos) << err2;
    EXPECT_NE(err2.find("resuming " + PartialPathFor(out) + " at object " + std::to_string(victim) + " of "),
              std::string::npos)
        << err2;
    EXPECT_TRUE(ReadAll(out) == *expected_) << "a changed byte of the checkpointed prefix was published";
    auto d = ReadPackDigests(DigestsPathFor(out));
    ASSERT_TRUE(d.ok()) << d.error().message();
    ASSERT_EQ(d->entry_crc32c.size(), d->index_count);
  }
}

// 17.13 (writer side): the sidecar of a built pack holds the CRC32C of every
// entry's payload, computed here from the expected bytes.
TEST_F(PackIntegrity, DigestSidecarRecordsTheCrc32cOfEveryEntry) {
  const std::string dir = *root_ + "/crc";
  std::filesystem::remove_all(dir);
  const std::string out = dir + "/c.pack";
  auto [rc, err] = RunCli(PackArgs(out));
  ASSERT_EQ(rc, 0) << err;
  auto d = ReadPackDigests(DigestsPathFor(out));
  ASSERT_TRUE(d.ok()) << d.error().message();
  const uint64_t n = Le(*expected_, 24, 8);
  ASSERT_EQ(d->index_count, n);
  ASSERT_EQ(d->entry_crc32c.size(), n);
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t off = Le(*expected_, 40 + i * 152 + 136, 8), nb = Le(*expected_, 40 + i * 152 + 144, 8);
    ASSERT_EQ(d->entry_crc32c[i], Crc32cPortable(expected_->data() + off, nb)) << "entry " << i;
  }
}

}  // namespace
}  // namespace k3pack::pack
