// Field audit (session 11): traces of an unfinished download that the GGUF
// checks alone cannot see. Each case starts from the clean tiny model.
#include <fcntl.h>
#include <unistd.h>

#include "doctor_test_util.h"

namespace dtest {
namespace {

using doctor::Report;

fs::path ShardPath(const fs::path& dir, int number) {
  char name[64];
  std::snprintf(name, sizeof name, "KIMI-K3-SYNTH-%05d-of-00003.gguf", number);
  return dir / name;
}

// aria2 preallocates the final file: right size, valid header, the rest zeros.
TEST(Downloads, Aria2PreallocatedShardIsReported) {
  auto dir = TempDir("dl-aria2");
  Synth(dir);
  const fs::path shard = ShardPath(dir, 3);
  const uint64_t size = fs::file_size(shard);
  {
    UniqueFd fd(::open(shard.c_str(), O_WRONLY));
    ASSERT_TRUE(fd.valid());
    std::vector<uint8_t> zeros(size / 2, 0);
    ASSERT_TRUE(PwriteFull(fd.get(), zeros.data(), zeros.size(), size - zeros.size()).ok());
  }
  std::ofstream(shard.string() + ".aria2") << "control";
  Report r = Scaled({dir.string()});
  EXPECT_EQ(r.ExitCode(), 1) << Dump(r);
  auto f = r.With("download-in-progress");
  ASSERT_EQ(f.size(), 1u) << Dump(r);
  EXPECT_EQ(f.front()->file, shard.string());
  EXPECT_NE(f.front()->message.find(".aria2"), std::string::npos);

  // repair must not launder it into a copy without the marker.
  synth::SynthResult raw = Synth(TempDir("dl-aria2-raw"), {synth::Fault::kRawSsmA});
  const fs::path in = fs::path(raw.shard_paths.front()).parent_path();
  std::ofstream(raw.shard_paths.back() + ".aria2") << "control";
  const fs::path out = TempDir("dl-aria2-out") / "o";
  auto rep = doctor::Repair(in.string(), out.string(), {});
  ASSERT_FALSE(rep.ok());
  EXPECT_NE(rep.error().message().find("still being downloaded"), std::string::npos) << rep.error().message();
  EXPECT_FALSE(fs::exists(out));
}

TEST(Downloads, PartialFileOfAMissingShardIsNamed) {
  auto dir = TempDir("dl-part");
  Synth(dir);
  const fs::path shard = ShardPath(dir, 2);
  fs::rename(shard, shard.string() + ".part");
  Report r = Scaled({dir.string()});
  auto f = r.With("shard-set-incomplete");
  ASSERT_EQ(f.size(), 1u) << Dump(r);
  EXPECT_NE(f.front()->message.find("KIMI-K3-SYNTH-00002-of-00003.gguf.part"), std::string::npos) << Dump(r);
  EXPECT_NE(f.front()->fix.find(".part"), std::string::npos) << Dump(r);
  EXPECT_EQ(f.front()->sglang_error, "GGUF shard set is incomplete: count=3, numbers=[1, 3]");
}

// A Hugging Face snapshot: every shard a link into blobs/, one blob not there
// (its download is still blobs/<sha>.incomplete).
TEST(Downloads, HuggingFaceSnapshotWithAMissingBlob) {
  auto root = TempDir("dl-hf");
  auto model = root / "model";
  Synth(model);
  const fs::path blobs = root / "blobs", snap = root / "snapshots" / "rev";
  fs::create_directories(blobs);
  fs::create_directories(snap);
  for (int i = 1; i <= 3; ++i) {
    const fs::path blob = blobs / ("sha" + std::to_string(i));
    fs::copy_file(ShardPath(model, i), blob);
    fs::create_symlink(fs::path("../..") / "blobs" / blob.filename(), ShardPath(snap, i));
  }
  fs::copy_file(model / "config.json", snap / "config.json");
  Report healthy = Scaled({snap.string()});
  EXPECT_EQ(healthy.ExitCode(), 0) << Dump(healthy);

  fs::rename(blobs / "sha3", blobs / "sha3.incomplete");
  Report r = Scaled({snap.string()});
  EXPECT_EQ(r.ExitCode(), 1);
  EXPECT_FALSE(r.Has("gguf-unreadable")) << Dump(r);
  auto f = r.With("shard-link-broken");
  ASSERT_EQ(f.size(), 1u) << Dump(r);
  EXPECT_EQ(f.front()->object, ShardPath(snap, 3).string());
  EXPECT_NE(f.front()->message.find("sha3.incomplete"), std::string::npos) << Dump(r);
}

}  // namespace
}  // namespace dtest

namespace dtest {
namespace {

// An interrupted `k3pack synth` or `repair` leaves its marker; its shards can
// look complete (the set had been written up to the last one). The CLI audit
// of session 28 saw doctor report only the shard faults, and `inspect` hint
// at a download.
TEST(Downloads, AnUnfinishedSynthOrRepairIsNamed) {
  auto dir = TempDir("unfinished-synth");
  Synth(dir);
  Report clean = Scaled({dir.string()});
  EXPECT_TRUE(clean.With("synth-unfinished").empty()) << Dump(clean);
  std::ofstream(dir / ".k3pack-synth.partial") << "";
  Report r = Scaled({dir.string()});
  EXPECT_EQ(r.ExitCode(), 1) << Dump(r);
  auto f = r.With("synth-unfinished");
  ASSERT_EQ(f.size(), 1u) << Dump(r);
  EXPECT_NE(f.front()->message.find("did not finish"), std::string::npos) << Dump(r);
  fs::remove(dir / ".k3pack-synth.partial");
  // The marker's own temporary (a kill between naming and renaming it).
  std::ofstream(dir / ".k3pack-repair.partial.4242.0.tmp") << "";
  r = Scaled({dir.string()});
  EXPECT_EQ(r.With("repair-unfinished").size(), 1u) << Dump(r);
  EXPECT_TRUE(r.With("synth-unfinished").empty()) << Dump(r);
}

}  // namespace
}  // namespace dtest
