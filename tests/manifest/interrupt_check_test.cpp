// The long calls behind Python's create_manifest, verify_pack and
// validate_pack hash whole shards and whole packs, or every payload: hours on
// a full checkpoint, run without the GIL. Their `interrupt_check` is polled
// between chunks (or payloads) on the calling thread, so a Ctrl-C stops them
// within one chunk; these tests count the polls and check where each stops.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "../cli_run.h"
#include "k3pack/manifest.h"
#include "k3pack/pack.h"

namespace k3pack::manifest {
namespace {

class InterruptCheck : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    namespace fs = std::filesystem;
    if (!fs::exists(K3PACK_BIN)) return;
    dir_ = (fs::temp_directory_path() / ("k3-interrupt-check-" + std::to_string(getpid()))).string();
    fs::remove_all(dir_);
    model_ = dir_ + "/model";
    auto s = testing_cli::Cli("synth --preset tiny --seed 3 --out " + model_);
    ASSERT_EQ(s.code, 0) << s.out;
    // A default build records every shard's whole-file digest: `verify --full` hashes them again.
    auto b = testing_cli::Cli("build " + model_ + " --full-pack-hash --manifest " + dir_ + "/m.json --progress none");
    ASSERT_EQ(b.code, 0) << b.out;
    manifest_ = dir_ + "/m.json";
    const auto doc = nlohmann::json::parse(std::ifstream(manifest_));
    pack_ = doc["expert_pack"]["path"].get<std::string>();
    shards_ = doc["source"]["shards"].size();
    entries_ = doc["expert_pack"]["index_count"].get<uint64_t>();
  }
  static void TearDownTestSuite() {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  void SetUp() override {
    if (manifest_.empty()) GTEST_SKIP() << "k3pack CLI not built";
  }
  static Result<pack::ExpertSet> Experts() {
    auto m = ReadManifest(manifest_);
    if (!m.ok()) return m.error();
    return ExpertsOf(*m);
  }

  // Counts its polls; from poll number `fail_at` on (1-based) it stops the call.
  struct Poller {
    int polls = 0;
    int fail_at = 0;  // 0: never
    std::function<Status()> Check() {
      return [this]() -> Status {
        ++polls;
        if (fail_at && polls >= fail_at) return Error("caller stopped it");
        return Status::OK();
      };
    }
  };

  static inline std::string dir_, model_, manifest_, pack_;
  static inline size_t shards_ = 0;
  static inline uint64_t entries_ = 0;
};

TEST_F(InterruptCheck, VerifyFullStopsAtTheFirstShardChunkAndOtherwisePollsThroughout) {
  Poller stop_at_once{0, 1};
  VerifyPackOptions o;
  o.full = true;
  o.interrupt_check = stop_at_once.Check();
  auto r = VerifyPack(manifest_, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message(), "caller stopped it");
  EXPECT_EQ(stop_at_once.polls, 1);  // the first 8 MiB chunk of shard 0's whole-file digest

  // Not stopped: it polls at least once per shard digest, once per payload
  // (1 of 1 thread checks them all) and once for the whole-pack digest.
  Poller never;
  o.interrupt_check = never.Check();
  auto ok = VerifyPack(manifest_, o);
  ASSERT_TRUE(ok.ok()) << ok.error().message();
  EXPECT_TRUE((*ok)["pack_sha256_checked"].get<bool>());
  EXPECT_GE(never.polls, static_cast<int>(shards_ + 1));
}

TEST_F(InterruptCheck, PayloadChecksStopBetweenPayloadsOnTheCallingThread) {
  auto ex = Experts();
  ASSERT_TRUE(ex.ok()) << ex.error().message();
  ASSERT_GT(entries_, 4u);
  // One thread, the caller's: it polls before each payload, so stopped at
  // poll 3 it has checked exactly two.
  Poller stop_third{0, 3};
  uint64_t last_done = 0;
  pack::VerifyOptions o;
  o.threads = 1;
  o.interrupt_check = stop_third.Check();
  o.progress = [&](const Progress& p) { last_done = p.done_objects; };
  auto r = pack::VerifyPayloads(pack_, *ex, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message(), "caller stopped it");
  EXPECT_EQ(stop_third.polls, 3);
  EXPECT_LT(last_done, entries_);

  Poller never;
  o.interrupt_check = never.Check();
  o.progress = nullptr;
  auto ok = pack::VerifyPayloads(pack_, *ex, o);
  ASSERT_TRUE(ok.ok()) << ok.error().message();
  EXPECT_EQ(ok->entries_checked, entries_);
  EXPECT_GE(never.polls, static_cast<int>(entries_));

  // With helper threads the caller keeps polling while they finish, and a
  // stop ends every thread's work.
  Poller stop_at_once{0, 1};
  o.threads = 4;
  o.interrupt_check = stop_at_once.Check();
  auto stopped = pack::VerifyPayloads(pack_, *ex, o);
  ASSERT_FALSE(stopped.ok());
  EXPECT_EQ(stopped.error().message(), "caller stopped it");
}

// A caller's callback that throws (Python's, when it raises) unwinds
// VerifyPayloads while its helper threads still check payloads. They were
// joined only after the counters they update had gone out of scope (ASan:
// stack-use-after-scope); now they are joined first, and the exception
// reaches the caller. The interrupt check is polled before every payload
// of the calling thread, so its second poll comes while the helpers run
// (progress is reported at most every 100 ms: too late on a small pack).
TEST_F(InterruptCheck, ACallbackThatThrowsMidCheckLeavesNoThreadBehind) {
  auto ex = Experts();
  ASSERT_TRUE(ex.ok()) << ex.error().message();
  ASSERT_GT(entries_, 8u);
  pack::VerifyOptions o;
  o.threads = 4;
  int polls = 0;
  o.interrupt_check = [&]() -> Status {
    if (++polls == 2) throw std::runtime_error("the caller's check failed");
    return Status::OK();
  };
  EXPECT_THROW((void)pack::VerifyPayloads(pack_, *ex, o), std::runtime_error);
  EXPECT_EQ(polls, 2);
  o.interrupt_check = nullptr;
  auto ok = pack::VerifyPayloads(pack_, *ex, o);
  ASSERT_TRUE(ok.ok()) << ok.error().message();
  EXPECT_EQ(ok->entries_checked, entries_);
}

TEST_F(InterruptCheck, ValidatePollsBetweenSamplesAndPackChunks) {
  auto ex = Experts();
  ASSERT_TRUE(ex.ok()) << ex.error().message();
  // No samples: the first poll is the first chunk of the whole-pack digest.
  Poller stop_at_once{0, 1};
  pack::ValidateOptions o;
  o.payload_samples = 0;
  o.full_pack_hash = true;
  o.interrupt_check = stop_at_once.Check();
  auto r = pack::ValidatePack(pack_, *ex, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message(), "caller stopped it");
  EXPECT_EQ(stop_at_once.polls, 1);

  // Samples first: stopped at the second poll, one sample was compared.
  Poller stop_second{0, 2};
  o.payload_samples = 4;
  o.full_pack_hash = false;
  o.interrupt_check = stop_second.Check();
  auto s = pack::ValidatePack(pack_, *ex, o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(stop_second.polls, 2);

  Poller never;
  o.interrupt_check = never.Check();
  auto ok = pack::ValidatePack(pack_, *ex, o);
  ASSERT_TRUE(ok.ok()) << ok.error().message();
  EXPECT_EQ(never.polls, 4);
}

TEST_F(InterruptCheck, CreateManifestStopsWhileHashingShardsAndPollsOnlyOnTheCallingThread) {
  const std::thread::id caller = std::this_thread::get_id();
  int polls = 0, off_thread = 0;
  CreateOptions o;
  o.gguf_dir = model_;
  o.expert_pack = pack_;
  o.model_config = model_ + "/config.json";
  o.tokenizer_dir = model_ + "/tokenizer";
  auto recorded = ReadManifest(manifest_);
  ASSERT_TRUE(recorded.ok()) << recorded.error().message();
  o.profile = recorded->profile();  // what `build` took from the synth's profile sidecar
  o.full_source_hashes = true;
  o.interrupt_check = [&]() -> Status {
    if (std::this_thread::get_id() != caller) ++off_thread;
    return ++polls >= 2 ? Status(Error("caller stopped it")) : Status::OK();
  };
  auto r = CreateManifest(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message(), "caller stopped it");
  EXPECT_EQ(polls, 2);
  EXPECT_EQ(off_thread, 0);

  // Uninterrupted: the same manifest as without a check.
  polls = 0;
  o.interrupt_check = [&]() -> Status {
    if (std::this_thread::get_id() != caller) ++off_thread;
    ++polls;
    return Status::OK();
  };
  o.created_at = "2026-01-01T00:00:00+00:00";
  auto with = CreateManifest(o);
  ASSERT_TRUE(with.ok()) << with.error().message();
  o.interrupt_check = nullptr;
  auto without = CreateManifest(o);
  ASSERT_TRUE(without.ok()) << without.error().message();
  EXPECT_EQ(*with, *without);
  EXPECT_GE(polls, 1);
  EXPECT_EQ(off_thread, 0);
}

// A `pack --force` beside a `manifest` replaces the pack the manifest is
// reading (the poll between payload samples stands in for the moment): the
// manifest would record a pack that is no longer there, so none is made, and
// a writer holding the pack's lock is named.
TEST_F(InterruptCheck, APackReplacedWhileItsManifestIsMadeIsRefused) {
  namespace fs = std::filesystem;
  const std::string dir = dir_ + "/replaced";
  fs::create_directories(dir);
  const std::string pack = dir + "/KIMI-K3-SYNTH.expert-major.pack";
  CreateOptions o;
  o.gguf_dir = model_;
  o.expert_pack = pack;
  o.model_config = model_ + "/config.json";
  o.tokenizer_dir = model_ + "/tokenizer";
  o.profile = kimi::Profile::kScaled;
  o.full_source_hashes = false;
  o.payload_samples = 4;
  bool validating = false, replaced = false;
  o.progress = [&](const std::string& line) { validating = line.rfind("validating expert pack", 0) == 0; };
  o.interrupt_check = [&]() -> Status {
    if (validating && !replaced) {
      fs::copy_file(pack_, pack + ".new", fs::copy_options::overwrite_existing);
      fs::rename(pack + ".new", pack);
      replaced = true;
    }
    return Status::OK();
  };
  auto run = [&]() {
    fs::copy_file(pack_, pack, fs::copy_options::overwrite_existing);
    validating = replaced = false;
    return CreateManifest(o);
  };
  auto r = run();
  ASSERT_TRUE(replaced);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message(), "the Expert Pack " + pack + " changed while its manifest was made: another file "
            "was put in its place; the manifest would record a pack that is no longer there, so none was made\n"
            "hint: rerun once nothing writes the pack any more");

  // The writer that replaces it holds `<pack>.lock` (a second open file description conflicts even in this process).
  const int fd = ::open((pack + ".lock").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  auto locked = run();
  ::close(fd);
  ASSERT_FALSE(locked.ok());
  EXPECT_NE(locked.error().message().find("\nhint: a build of " + pack + " is in progress: pid " +
                                          std::to_string(getpid())),
            std::string::npos)
      << locked.error().message();

  // Left alone, the same call makes the manifest.
  o.interrupt_check = nullptr;
  fs::copy_file(pack_, pack, fs::copy_options::overwrite_existing);
  auto fine = CreateManifest(o);
  ASSERT_TRUE(fine.ok()) << fine.error().message();
}

}  // namespace
}  // namespace k3pack::manifest
