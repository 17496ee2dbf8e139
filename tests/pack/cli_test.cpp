// The `k3pack pack` / `k3pack verify` commands end to end, including a real
// kill -9 of the builder at 20 seeded points followed by a resume, and a disk
// that fills up mid-build.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "pack_fixture.h"
#include "spawn.h"
#include "util/file.h"

namespace k3pack::pack {
namespace {

using testing::ReadAll;

struct PackCliModel {
  static constexpr const char* kName = "cli";
  static constexpr uint64_t kSeed = 3;
};

class PackCli : public testing::SharedModelTest<PackCliModel> {};

// objects_done of the checkpoint next to `out`, or -1 when there is none.
int64_t CheckpointObjects(const std::string& out) {
  const std::string text = ReadAll(CheckpointPathFor(out));
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("objects_done")) return -1;
  return j["objects_done"].get<int64_t>();
}

// A real SIGKILL of `k3pack pack` at 20 points drawn from a seeded RNG (seed
// printed; K3_FAULT_SEED=N replays a run), then the same command again: the
// pack must be byte-identical to an uninterrupted build every time, and a
// checkpoint that recorded work must be resumed, not redone. Points:
//  - 3 in the finalize window (K3PACK_TEST_KILL_IN_FINALIZE=1..3);
//  - 12 after a random number of objects copied by this run
//    (K3PACK_TEST_KILL_AFTER_OBJECTS=N, 0 = before the first), each with a
//    random checkpoint cadence (every object, every few objects, none);
//  - 5 after a random delay within the duration of one uninterrupted,
//    throttled build timed first (these may land anywhere, even after the
//    build finished on a loaded machine: then there is nothing to resume).
TEST_F(PackCli, KillNineAtTwentySeededPointsThenResume) {
  const uint64_t total = model_->experts.layers.size() * model_->experts.num_experts;
  const auto& eb = model_->experts.by_layer[0];
  const uint64_t object_bytes = eb[0].expert_bytes + eb[1].expert_bytes + eb[2].expert_bytes;
  uint64_t seed = std::random_device{}();
  if (const char* s = std::getenv("K3_FAULT_SEED"); s && *s) seed = std::strtoull(s, nullptr, 10);
  std::cout << "[   SEED   ] K3_FAULT_SEED=" << seed << "\n";
  RecordProperty("K3_FAULT_SEED", std::to_string(seed));
  std::mt19937_64 rng(seed);
  auto uniform = [&](uint64_t lo, uint64_t hi) { return std::uniform_int_distribution<uint64_t>(lo, hi)(rng); };
  const std::string throttle = "K3PACK_THROTTLE_US=20000";

  // Calibration: one uninterrupted throttled build, timed.
  const std::string out = *root_ + "/kill/k.pack";
  std::filesystem::remove_all(*root_ + "/kill");
  const auto c0 = std::chrono::steady_clock::now();
  auto [crc, cerr] = RunCli(PackArgs(out), {throttle, "K3PACK_BATCH_BYTES=1"});
  ASSERT_EQ(crc, 0) << cerr;
  const auto calibrated_ms = static_cast<uint64_t>(
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - c0).count());
  ASSERT_TRUE(ReadAll(out) == *expected_);

  struct Point {
    std::string what;
    std::vector<std::string> env;
    uint64_t delay_ms = 0;  // > 0: time-based kill
  };
  std::vector<Point> points;
  for (int step = 1; step <= 3; ++step) {
    points.push_back(
        {"finalize step " + std::to_string(step), {"K3PACK_TEST_KILL_IN_FINALIZE=" + std::to_string(step)}});
  }
  for (int i = 0; i < 12; ++i) {
    const uint64_t n = uniform(0, total);
    std::vector<std::string> env{"K3PACK_TEST_KILL_AFTER_OBJECTS=" + std::to_string(n), "K3PACK_BATCH_BYTES=1"};
    std::string cadence;
    switch (uniform(0, 2)) {
      case 0:
        cadence = "every object";
        env.insert(env.end(), {"K3PACK_CHECKPOINT_BYTES=1", "K3PACK_CHECKPOINT_MS=0"});
        break;
      case 1: {
        const uint64_t k = uniform(2, 6);
        cadence = "every " + std::to_string(k) + " objects";
        env.push_back("K3PACK_CHECKPOINT_BYTES=" + std::to_string(k * object_bytes));
        break;
      }
      default:
        cadence = "no checkpoint";
        break;
    }
    points.push_back({"after " + std::to_string(n) + " objects, checkpoint " + cadence, env});
  }
  for (int i = 0; i < 5; ++i) {
    const uint64_t ms = uniform(1, std::max<uint64_t>(2, calibrated_ms * 9 / 10));
    points.push_back({"after " + std::to_string(ms) + " ms of ~" + std::to_string(calibrated_ms),
                      {throttle, "K3PACK_BATCH_BYTES=1", "K3PACK_CHECKPOINT_BYTES=1", "K3PACK_CHECKPOINT_MS=0"},
                      ms});
  }
  ASSERT_EQ(points.size(), 20u);

  int killed = 0, resumed = 0, finished_before_kill = 0;
  for (const Point& pt : points) {
    SCOPED_TRACE("seed " + std::to_string(seed) + ", kill " + pt.what);
    std::filesystem::remove_all(*root_ + "/kill");
    auto args = PackArgs(out);
    Proc p = Spawn(args, pt.env);
    if (pt.delay_ms > 0) {
      usleep(static_cast<useconds_t>(pt.delay_ms * 1000));
      kill(p.pid, SIGKILL);
    }
    int status = 0;
    waitpid(p.pid, &status, 0);
    close(p.err_fd);  // kept open until the end so a write cannot raise SIGPIPE
    const bool was_killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    if (pt.delay_ms == 0) {
      ASSERT_TRUE(was_killed) << "the kill seam did not fire (status " << status << ")";
    } else if (!was_killed) {
      ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
      ++finished_before_kill;
      EXPECT_TRUE(ReadAll(out) == *expected_);
      continue;
    }
    const bool had_partial = PathExists(PartialPathFor(out)), had_pack = PathExists(out);
    const int64_t ckpt_objects = CheckpointObjects(out);
    if (had_pack && ckpt_objects < 0 && !had_partial) {
      // The build had finished (pack renamed, checkpoint removed) when a
      // timed signal landed, e.g. during process exit (slow under ASan):
      // a complete pack, nothing to resume, and the same command would
      // report it as already built.
      ASSERT_GT(pt.delay_ms, 0u) << "a seam kill must land before the build finishes";
      ++finished_before_kill;
      EXPECT_TRUE(ReadAll(out) == *expected_);
      EXPECT_TRUE(ReadPackDigests(DigestsPathFor(out)).ok());
      continue;
    }
    ++killed;
    if (had_pack) {
      EXPECT_GE(ckpt_objects, 0) << "a finished pack may exist early only while its checkpoint does";
    }
    auto [rc, err] = RunCli(args);  // the same command, without any seam
    ASSERT_EQ(rc, 0) << err;
    if (had_pack) {
      EXPECT_NE(err.find("finished an interrupted build: " + out), std::string::npos) << err;
    } else if (had_partial && ckpt_objects > 0) {
      ++resumed;
      EXPECT_NE(err.find("resuming " + PartialPathFor(out) + " at object " + std::to_string(ckpt_objects) + " of "),
                std::string::npos)
          << err;
    }
    EXPECT_TRUE(ReadAll(out) == *expected_) << "pack bytes differ from an uninterrupted build";
    EXPECT_TRUE(ReadPackDigests(DigestsPathFor(out)).ok());
    EXPECT_FALSE(PathExists(CheckpointPathFor(out)));
    EXPECT_FALSE(PathExists(PartialPathFor(out)));
  }
  std::cout << "[   SEED   ] " << killed << " kills, " << resumed << " resumed from a checkpoint, "
            << finished_before_kill << " time-based points landed after the build finished\n";
  // Whether a given kill beat the first checkpoint is a race, so the number
  // resumed is reported, not asserted (PackBuild.ResumeAfterCrashAtSeveralPoints
  // resumes deterministically).
}

// A filesystem that fills up mid-build (K3PACK_TEST_ENOSPC_AFTER_BYTES: the
// copy phase's writes fail with ENOSPC after N bytes): a clear error naming
// the partial pack (or its digest sidecar), no finished-looking pack, and once space exists the same
// command resumes at the checkpoint written on the way out.
TEST_F(PackCli, EnospcMidBuildThenResume) {
  const std::string out = *root_ + "/enospc/e.pack";
  std::filesystem::remove_all(*root_ + "/enospc");
  uint64_t payload = 0;
  for (const auto& layer : model_->experts.by_layer) {
    for (const auto& t : layer) payload += t.expert_bytes * model_->experts.num_experts;
  }
  const uint64_t total = model_->experts.layers.size() * model_->experts.num_experts;
  auto [rc, err] = RunCli(PackArgs(out), {"K3PACK_TEST_ENOSPC_AFTER_BYTES=" + std::to_string(payload / 2),
                                          "K3PACK_BATCH_BYTES=1"});
  EXPECT_EQ(rc, 1) << err;
  // The write that crosses the limit is the pack's or its digest sidecar's,
  // whichever comes first (both are on the full filesystem).
  EXPECT_TRUE(err.find("cannot write " + PartialPathFor(out) + " at offset ") != std::string::npos ||
              err.find("cannot write " + PartialPathFor(out) + ".digests at offset ") != std::string::npos)
      << err;
  EXPECT_NE(err.find("No space left on device"), std::string::npos) << err;
  EXPECT_NE(err.find("free space on the filesystem of " + PartialPathFor(out)), std::string::npos) << err;
  EXPECT_FALSE(PathExists(out));
  EXPECT_FALSE(PathExists(DigestsPathFor(out)));
  ASSERT_TRUE(PathExists(PartialPathFor(out)));
  const int64_t done = CheckpointObjects(out);
  EXPECT_GT(done, 0) << "the objects written before the disk filled were not checkpointed";
  EXPECT_LT(done, static_cast<int64_t>(total));

  auto [rc2, err2] = RunCli(PackArgs(out));
  ASSERT_EQ(rc2, 0) << err2;
  EXPECT_NE(err2.find("resuming " + PartialPathFor(out) + " at object " + std::to_string(done) + " of "),
            std::string::npos)
      << err2;
  EXPECT_TRUE(ReadAll(out) == *expected_);
  EXPECT_TRUE(ReadPackDigests(DigestsPathFor(out)).ok());
  EXPECT_FALSE(PathExists(CheckpointPathFor(out)));
}

TEST_F(PackCli, RefusalsAndExitCodes) {
  const std::string out = *root_ + "/ref/r.pack";
  auto [rc, err] = RunCli(PackArgs(out), {"K3PACK_FAKE_FREE_BYTES=4096"});
  EXPECT_EQ(rc, 1);
  EXPECT_NE(err.find("insufficient space for Kimi Expert Pack: available=4096, required="), std::string::npos) << err;
  // (--model-config may be left out: config.json beside the shards is used,
  // tests/cli/implied_inputs_test.cpp.)
  auto [rc2, err2] = RunCli({"pack", "--model-config", model_->dir + "/config.json"});
  EXPECT_EQ(rc2, 2) << err2;  // usage: --gguf-dir missing
  EXPECT_NE(err2.find("missing required option --gguf-dir"), std::string::npos) << err2;
  auto [rc3, err3] = RunCli(PackArgs(out));
  ASSERT_EQ(rc3, 0) << err3;
  // The same command again: the finished pack is reported, not rebuilt.
  auto [rc4, err4] = RunCli(PackArgs(out));
  EXPECT_EQ(rc4, 0) << err4;
  EXPECT_TRUE(ReadAll(out) == *expected_);
}

// `--force` removed the finished pack before its checks, so a refused run
// (here: no space) left none; and a byte SGLang's validator skips (a name's
// NUL padding in the index) made `pack` call a damaged pack already built.
TEST_F(PackCli, ForceKeepsThePackWhenRefusedAndAChangedIndexIsNotAlreadyBuilt) {
  const std::string out = *root_ + "/keep/k.pack";
  auto [rc, err] = RunCli(PackArgs(out));
  ASSERT_EQ(rc, 0) << err;
  const std::string digests = ReadAll(DigestsPathFor(out));
  std::vector<std::string> force = PackArgs(out);
  force.push_back("--force");
  // Not even the old pack's blocks make room for a 1 GiB margin.
  *(std::find(force.begin(), force.end(), "--safety-margin-gib") + 1) = "1";
  auto [rc2, err2] = RunCli(force, {"K3PACK_FAKE_FREE_BYTES=4096"});
  EXPECT_EQ(rc2, 1) << err2;
  EXPECT_NE(err2.find("insufficient space for Kimi Expert Pack"), std::string::npos) << err2;
  EXPECT_TRUE(ReadAll(out) == *expected_);
  EXPECT_EQ(ReadAll(DigestsPathFor(out)), digests);

  {
    // Entry 0's name field (bytes 40 + 0..127) holds a short name and NULs.
    UniqueFd fd(::open(out.c_str(), O_WRONLY));
    ASSERT_TRUE(fd.valid());
    const char b = '\xff';
    ASSERT_EQ(::pwrite(fd.get(), &b, 1, 40 + 100), 1);
  }
  auto [rc3, err3] = RunCli(PackArgs(out));
  EXPECT_EQ(rc3, 1) << err3;
  EXPECT_NE(err3.find("it is not a valid pack of these shards: its header/index hashes to "), std::string::npos)
      << err3;
  EXPECT_NE(err3.find("--repair-damaged to rewrite only what differs from the shards"), std::string::npos) << err3;
  std::vector<std::string> repair = PackArgs(out);
  repair.push_back("--repair-damaged");
  auto [rc4, err4] = RunCli(repair);
  EXPECT_EQ(rc4, 0) << err4;
  EXPECT_TRUE(ReadAll(out) == *expected_);
  auto [rc5, err5] = RunCli(PackArgs(out));
  EXPECT_EQ(rc5, 0) << err5;
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

// One random byte flipped in each of 16 random payloads (seeded; K3_FAULT_SEED
// replays): `verify --full` reports all 16, each by tensor (layer, role),
// expert and entry. Then one random byte of the index, and of the header:
// `verify` refuses each (the store's refusals: StoreOpen.RandomHeaderAndIndexByteFlipsAreRefused).
TEST_F(PackCli, VerifyFullFindsEveryFlippedPayloadAndIndexOrHeaderByte) {
  uint64_t seed = std::random_device{}();
  if (const char* s = std::getenv("K3_FAULT_SEED"); s && *s) seed = std::strtoull(s, nullptr, 10);
  std::cout << "[   SEED   ] K3_FAULT_SEED=" << seed << "\n";
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::string dir = *root_ + "/flips";
  std::filesystem::remove_all(dir);
  const std::string pack = dir + "/f.pack", manifest = dir + "/f.json";
  auto [rc, err] = RunCli(PackArgs(pack));
  ASSERT_EQ(rc, 0) << err;
  auto [mrc, merr] = RunCli({"manifest", "--gguf-dir", model_->dir, "--expert-pack", pack, "--model-config",
                             model_->config, "--tokenizer-dir", model_->dir + "/tokenizer", "--output", manifest,
                             "--profile", "scaled"});
  ASSERT_EQ(mrc, 0) << merr;
  auto le = [&](uint64_t at, int k) {
    uint64_t v = 0;
    for (int b = k - 1; b >= 0; --b) v = (v << 8) | static_cast<uint8_t>((*expected_)[at + b]);
    return v;
  };
  const uint64_t n = le(24, 8);
  auto flip = [&](uint64_t at) {
    std::string bytes = *expected_;
    bytes[at] = static_cast<char>(bytes[at] ^ static_cast<char>(1 + rng() % 255));
    testing::WriteAll(pack, bytes);
  };

  std::set<uint64_t> victims;
  while (victims.size() < 16) victims.insert(rng() % n);
  std::string bytes = *expected_;
  for (uint64_t i : victims) {
    const uint64_t off = le(40 + i * 152 + 136, 8), nb = le(40 + i * 152 + 144, 8);
    const uint64_t at = off + rng() % nb;
    bytes[at] = static_cast<char>(bytes[at] ^ static_cast<char>(1 + rng() % 255));
  }
  testing::WriteAll(pack, bytes);
  auto [v1, e1] = RunCli({"verify", "--manifest", manifest, "--full"});
  EXPECT_EQ(v1, 1) << e1;
  for (uint64_t i : victims) {
    const std::string name = expected_->substr(40 + i * 152, expected_->find('\0', 40 + i * 152) - (40 + i * 152));
    const std::string what = "does not match digest sidecar for " + name + " expert " +
                             std::to_string(le(40 + i * 152 + 128, 4)) + " (entry " + std::to_string(i) + ", ";
    EXPECT_NE(e1.find(what), std::string::npos) << "flip in entry " << i << " not reported:\n" << e1;
  }
  EXPECT_NE(e1.find("16 of " + std::to_string(n) + " payloads are damaged"), std::string::npos) << e1;

  // Index damage (any entry, any field) and header damage: refused by verify,
  // and located: the header field, or the entry with its tensor and field.
  for (int trial = 0; trial < 10; ++trial) {
    const bool header = trial < 2;
    const uint64_t at = header ? rng() % 40 : 40 + rng() % (n * 152);
    SCOPED_TRACE("flip at byte " + std::to_string(at));
    flip(at);
    auto [v2, e2] = RunCli({"verify", "--manifest", manifest});
    EXPECT_EQ(v2, 1) << e2;
    if (header) {
      EXPECT_NE(e2.find("damaged: header field "), std::string::npos) << e2;
      continue;
    }
    const uint64_t i = (at - 40) / 152, k = (at - 40) % 152;
    const std::string name = expected_->substr(40 + i * 152, expected_->find('\0', 40 + i * 152) - (40 + i * 152));
    const char* field = k < 128 ? "name" : k < 132 ? "expert" : k < 136 ? "reserved" : k < 144 ? "offset" : "nbytes";
    EXPECT_NE(e2.find("damaged: index entry " + std::to_string(i) + " (" + name + " expert " +
                      std::to_string(le(40 + i * 152 + 128, 4)) + "), field " + field + " (byte " +
                      std::to_string(at) + ")"),
              std::string::npos)
        << e2;
  }
}

// Source shards changed after packing: truncated; same size with changed
// tensor bytes; same size with a changed header byte. `verify` and the loader
// (`load --verify-metadata`) report each, naming the shard (SGLang sees only
// the size change). Tensor bytes need the whole-shard digests a manifest has
// with --full-source-hashes (checked by `verify --full` and the loader).
TEST_F(PackCli, SourceShardChangesAfterPackingAreReported) {
  const std::string dir = *root_ + "/src-change";
  std::filesystem::remove_all(dir);
  std::filesystem::copy(model_->dir, dir, std::filesystem::copy_options::recursive);
  const std::string pack = dir + "/s.pack", manifest = dir + "/s.json";
  auto pa = PackArgs(pack);
  pa[2] = dir;
  pa[4] = dir + "/config.json";
  auto [rc, err] = RunCli(pa);
  ASSERT_EQ(rc, 0) << err;
  auto [mrc, merr] = RunCli({"manifest", "--gguf-dir", dir, "--expert-pack", pack, "--model-config",
                             dir + "/config.json", "--tokenizer-dir", dir + "/tokenizer", "--output", manifest,
                             "--profile", "scaled", "--full-source-hashes"});
  ASSERT_EQ(mrc, 0) << merr;
  const std::vector<std::string> verify_full{"verify", "--manifest", manifest, "--full"};
  const std::vector<std::string> load{"load", "--manifest", manifest, "--verify-metadata", "--summary"};
  auto [v0, e0] = RunCli(verify_full);
  ASSERT_EQ(v0, 0) << e0;
  auto [l0, le0] = RunCli(load);
  ASSERT_EQ(l0, 0) << le0;

  // A non-routed tensor of the first shard: its bytes are in no pack payload.
  const auto m = nlohmann::json::parse(ReadAll(manifest));
  std::string shard;
  uint64_t data_at = 0;
  for (const auto& t : m["source"]["tensors"]) {
    if (t["shard_index"] == 0 && t["name"].get<std::string>().find("_exps") == std::string::npos &&
        t["nbytes"].get<uint64_t>() > 16) {
      data_at = t["data_offset"].get<uint64_t>() + t["nbytes"].get<uint64_t>() / 2;
      break;
    }
  }
  for (const auto& sh : m["source"]["shards"]) {
    if (sh["index"] == 0) shard = sh["path"].get<std::string>();
  }
  ASSERT_FALSE(shard.empty());
  ASSERT_GT(data_at, m["source"]["shards"][0]["metadata_nbytes"].get<uint64_t>());
  const std::string original = ReadAll(shard);
  auto check = [&](const std::string& what, const std::string& verify_text, const std::string& load_text) {
    SCOPED_TRACE(what);
    auto [v, e] = RunCli(verify_full);
    EXPECT_EQ(v, 1) << e;
    EXPECT_NE(e.find("GGUF shard " + shard + " changed since the manifest was written: " + verify_text),
              std::string::npos)
        << e;
    auto [l, le] = RunCli(load);
    EXPECT_NE(l, 0) << le;
    EXPECT_NE(le.find(shard), std::string::npos) << le;
    EXPECT_NE(le.find(load_text), std::string::npos) << le;
    testing::WriteAll(shard, original);
  };
  testing::WriteAll(shard, original.substr(0, original.size() - 4096));
  check("truncated", "size " + std::to_string(original.size() - 4096) + " != " + std::to_string(original.size()),
        "Kimi-K3 GGUF shard is missing or changed: ");
  std::string changed = original;
  changed[data_at] = static_cast<char>(changed[data_at] ^ 0x20);
  testing::WriteAll(shard, changed);
  check("same size, tensor bytes", "sha256 ", "sha256 ");
  changed = original;
  const size_t key = original.find("head_count");  // a metadata key renamed in place: still a valid GGUF
  ASSERT_LT(key, m["source"]["shards"][0]["metadata_nbytes"].get<uint64_t>());
  changed[key + 5] = 'C';
  testing::WriteAll(shard, changed);
  check("same size, header", "metadata_sha256 ", "metadata_sha256 ");
  auto [v9, e9] = RunCli(verify_full);
  EXPECT_EQ(v9, 0) << e9;  // restored: clean again
}

}  // namespace
}  // namespace k3pack::pack
