// Expert-parallel rank packs through the real binary (issue 15, pack side):
// `pack/build --ep-size N --ep-rank R|all`, their manifests' k3pack.ep,
// `verify --full` on a rank pack, resume of a rank build, `ep-merge`, and
// the usage errors (exit 2).
#include <fcntl.h>
#include <signal.h>
#include <linux/falloc.h>
#include <unistd.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "k3pack/ep.h"
#include "pack/build_inputs.h"
#include "pack/copy.h"
#include "pack_fixture.h"
#include "spawn.h"
#include "util/file.h"

namespace k3pack::pack {
namespace {

using testing::ReadAll;

struct EpCliModel {
  static constexpr const char* kName = "ep-cli";
  static constexpr uint64_t kSeed = 16;
};

class EpCli : public testing::SharedModelTest<EpCliModel> {
 protected:
  static std::vector<std::string> Pack(const std::string& out, std::vector<std::string> extra = {}) {
    std::vector<std::string> a = {"pack",      model_->dir, "--model-config", model_->config, "--profile", "scaled",
                                  "--pack",    out,         "--safety-margin-gib", "0",       "--threads", "2",
                                  "--progress", "none"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  static std::vector<std::string> Build(const std::string& out, std::vector<std::string> extra = {}) {
    std::vector<std::string> a = {"build", model_->dir, "--model-config", model_->config, "--tokenizer-dir",
                                  model_->dir + "/tokenizer", "--profile", "scaled", "--pack", out,
                                  "--safety-margin-gib", "0", "--threads", "2", "--progress", "none"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  static std::string Dir(const std::string& name) {
    const std::string d = *root_ + "/" + name;
    std::filesystem::remove_all(d);
    std::filesystem::create_directories(d);
    return d;
  }
  static nlohmann::json Json(const std::string& path) { return nlohmann::json::parse(ReadAll(path)); }
};

// --ep-rank all writes the same N files as N separate --ep-rank R runs.
TEST_F(EpCli, RankAllEqualsSeparateRanks) {
  const std::string a = Dir("all"), b = Dir("sep");
  auto [rc, err] = RunCli(Pack(a + "/m.pack", {"--ep-size", "4", "--ep-rank", "all"}));
  ASSERT_EQ(rc, 0) << err;
  EXPECT_FALSE(PathExists(a + "/m.pack")) << "a full pack was written";
  for (uint32_t r = 0; r < 4; ++r) {
    auto [rc2, err2] = RunCli(Pack(b + "/m.pack", {"--ep-size", "4", "--ep-rank", std::to_string(r)}));
    ASSERT_EQ(rc2, 0) << err2;
    const std::string name = "/m.ep" + std::to_string(r) + "-of-4.pack";
    ASSERT_TRUE(PathExists(a + name));
    EXPECT_TRUE(ReadAll(a + name) == ReadAll(b + name)) << name;
    EXPECT_TRUE(ReadAll(DigestsPathFor(a + name)) == ReadAll(DigestsPathFor(b + name))) << name;
  }
  // The rule of every output: a second run finds them built (stdout says
  // "already built"), exit 0, and rewrites nothing.
  const auto before = std::filesystem::last_write_time(a + "/m.ep2-of-4.pack");
  auto [rc3, err3] = RunCli(Pack(a + "/m.pack", {"--ep-size", "4", "--ep-rank", "all"}));
  EXPECT_EQ(rc3, 0) << err3;
  EXPECT_EQ(std::filesystem::last_write_time(a + "/m.ep2-of-4.pack"), before);
}

// A full pack (or another rank's) at a rank pack's path is not taken as that
// rank's finished pack: only the rank's payloads are sampled, so the
// sidecar's rank decides.
TEST_F(EpCli, FullPackAtARankPathIsNotAlreadyBuilt) {
  const std::string d = Dir("not-rank");
  ASSERT_EQ(RunCli(Pack(d + "/m.pack")).first, 0);
  std::filesystem::copy_file(d + "/m.pack", d + "/m.ep1-of-2.pack");
  std::filesystem::copy_file(DigestsPathFor(d + "/m.pack"), DigestsPathFor(d + "/m.ep1-of-2.pack"));
  auto [rc, err] = RunCli(Pack(d + "/m.pack", {"--ep-size", "2", "--ep-rank", "1"}));
  EXPECT_EQ(rc, 1) << err;
  EXPECT_NE(err.find("refusing to overwrite existing " + d + "/m.ep1-of-2.pack (--pack): it is not a valid pack of "
                     "these shards: its digest sidecar does not record it as the pack of expert-parallel rank 1 of 2"),
            std::string::npos)
      << err;
  auto [rc2, err2] = RunCli(Pack(d + "/m.pack", {"--ep-size", "2", "--ep-rank", "1", "--force"}));
  EXPECT_EQ(rc2, 0) << err2;
  auto digests = ReadPackDigests(DigestsPathFor(d + "/m.ep1-of-2.pack"));
  ASSERT_TRUE(digests.ok() && digests->ep);
  EXPECT_EQ(digests->ep->rank, 1u);
}

// A rank build killed after a checkpoint resumes from it on the rerun and
// gives the bytes of an uninterrupted one.
TEST_F(EpCli, InterruptedRankBuildResumes) {
  const std::string d = Dir("resume"), ref = Dir("resume-ref");
  const std::vector<std::string> ep = {"--ep-size", "2", "--ep-rank", "1"};
  auto [rc, err] = RunCli(Pack(d + "/m.pack", ep), {"K3PACK_CRASH_AFTER_OBJECTS=12", "K3PACK_BATCH_BYTES=1",
                                                     "K3PACK_CHECKPOINT_BYTES=1"});
  ASSERT_EQ(rc, 86) << err;
  const std::string out = d + "/m.ep1-of-2.pack";
  ASSERT_TRUE(PathExists(CheckpointPathFor(out)));
  auto [rc2, err2] = RunCli(Pack(d + "/m.pack", ep));
  ASSERT_EQ(rc2, 0) << err2;
  EXPECT_NE(err2.find("resuming " + PartialPathFor(out) + " at object "), std::string::npos) << err2;
  auto [rc3, err3] = RunCli(Pack(ref + "/m.pack", ep));
  ASSERT_EQ(rc3, 0) << err3;
  EXPECT_TRUE(ReadAll(out) == ReadAll(ref + "/m.ep1-of-2.pack"));
  EXPECT_TRUE(ReadAll(DigestsPathFor(out)) == ReadAll(DigestsPathFor(ref + "/m.ep1-of-2.pack")));
}

// build writes one manifest per rank: SGLang's sections as for the full
// pack (expert_pack.index_sha256 included), plus k3pack.ep; verify --full
// passes on it, then names a damaged and a punched owned object.
TEST_F(EpCli, BuildManifestsAndVerifyOfRankPacks) {
  const std::string full = Dir("b-full"), d = Dir("b-ep");
  auto [rc, err] = RunCli(Build(full + "/m.pack"));
  ASSERT_EQ(rc, 0) << err;
  auto [rc2, err2] = RunCli(Build(d + "/m.pack", {"--ep-size", "2", "--ep-rank", "all"}));
  ASSERT_EQ(rc2, 0) << err2;
  const nlohmann::json fm = Json(full + "/kimi-k3-expert-pack.manifest.json");
  const uint32_t E = model_->experts.num_experts;
  for (uint32_t r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const std::string mpath = d + "/kimi-k3-expert-pack.ep" + std::to_string(r) + "-of-2.manifest.json";
    ASSERT_TRUE(PathExists(mpath));
    const nlohmann::json m = Json(mpath);
    const ep::ExpertRange owned = ep::OwnedExperts({2, r}, E);
    EXPECT_EQ(m["k3pack"]["ep"], (nlohmann::json{{"size", 2}, {"rank", r}, {"first_expert", owned.first},
                                                 {"end_expert", owned.end}}));
    EXPECT_EQ(m["k3pack"]["profile"], "scaled");
    EXPECT_EQ(m["k3pack"]["layer_roles"], fm["k3pack"]["layer_roles"]);
    for (const char* key : {"format", "complete", "model", "source", "verification"}) {
      EXPECT_EQ(m[key], fm[key]) << key;
    }
    // SGLang's dict plus the key that makes SGLang's store refuse a rank pack.
    nlohmann::json hc = fm["hard_constraints"];
    hc["k3pack_expert_parallel_rank_pack"] = true;
    EXPECT_EQ(m["hard_constraints"], hc);
    nlohmann::json ep_section = m["expert_pack"], full_section = fm["expert_pack"];
    EXPECT_EQ(ep_section["index_sha256"], full_section["index_sha256"]);
    EXPECT_EQ(ep_section["path"], d + "/m.ep" + std::to_string(r) + "-of-2.pack");
    ep_section.erase("path");
    full_section.erase("path");
    EXPECT_EQ(ep_section, full_section);
    auto [vrc, verr] = RunCli({"verify", "--manifest", mpath, "--full", "--progress", "none"});
    EXPECT_EQ(vrc, 0) << verr;
    // doctor samples only the rank's payloads too.
    auto [drc, derr] = RunCli({"doctor", mpath, "--progress", "none"});
    EXPECT_EQ(drc, 0) << derr;
  }
  // Rank 1 (experts 8..15): flip a byte of one owned payload, punch another.
  const PackLayout layout = *LayoutOf(model_->experts);
  const std::string pack = d + "/m.ep1-of-2.pack";
  const EntrySlot flipped = layout.Slot(2, 8, Role::kDown), holed = layout.Slot(0, 15, Role::kUp);
  int fd = ::open(pack.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char c = 0;
  ASSERT_EQ(::pread(fd, &c, 1, flipped.offset), 1);
  c ^= 0x10;
  ASSERT_EQ(::pwrite(fd, &c, 1, flipped.offset), 1);
  ASSERT_EQ(::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(holed.offset),
                        static_cast<off_t>(holed.nbytes)),
            0);
  ::close(fd);
  const std::string mpath = d + "/kimi-k3-expert-pack.ep1-of-2.manifest.json";
  auto [vrc, verr] = RunCli({"verify", "--manifest", mpath, "--full", "--progress", "none"});
  EXPECT_EQ(vrc, 1) << verr;
  const auto& ex = model_->experts;
  EXPECT_NE(verr.find(ex.by_layer[2][2].tensor.name + " expert 8 (entry " + std::to_string(flipped.entry_index) +
                      ", offset " + std::to_string(flipped.offset) + ")"),
            std::string::npos)
      << verr;
  EXPECT_NE(verr.find(ex.by_layer[0][0].tensor.name + " expert 15 (entry " + std::to_string(holed.entry_index) +
                      ", offset " + std::to_string(holed.offset) + "): it is a hole where the data of rank 1 of 2"),
            std::string::npos)
      << verr;
  // The hint's repair command names the rank; it restores the rank pack.
  EXPECT_NE(verr.find("--ep-size 2 --ep-rank 1`"), std::string::npos) << verr;
  auto [prc, perr] = RunCli(Pack(d + "/m.pack", {"--ep-size", "2", "--ep-rank", "1", "--repair-damaged"}));
  ASSERT_EQ(prc, 0) << perr;
  auto [vrc2, verr2] = RunCli({"verify", "--manifest", mpath, "--full", "--progress", "none"});
  EXPECT_EQ(vrc2, 0) << verr2;
  // The repair kept the other rank's objects holes.
  auto opened = OpenReadOnly(pack);
  ASSERT_TRUE(opened.ok());
  const EntrySlot other = layout.Slot(1, 3, Role::kGate);
  const auto segs = MapRange(opened->get(), other.offset, other.nbytes);
  EXPECT_TRUE(segs.size() == 1 && segs[0].hole);
}

// ep-merge: the full pack's name comes from the rank packs' names, the
// result is the direct build byte for byte; a rerun on the finished merge is
// reported as built (exit 0, as every writer), a changed output is refused.
TEST_F(EpCli, EpMergeRebuildsTheFullPack) {
  const std::string full = Dir("m-full"), d = Dir("m-ep");
  ASSERT_EQ(RunCli(Pack(full + "/m.pack")).first, 0);
  ASSERT_EQ(RunCli(Pack(d + "/m.pack", {"--ep-size", "8", "--ep-rank", "all"})).first, 0);
  std::vector<std::string> args = {"ep-merge", "--progress", "none"};
  for (int r = 7; r >= 0; --r) args.push_back(d + "/m.ep" + std::to_string(r) + "-of-8.pack");
  auto [rc, err] = RunCli(args);
  ASSERT_EQ(rc, 0) << err;
  EXPECT_TRUE(ReadAll(d + "/m.pack") == ReadAll(full + "/m.pack"));
  EXPECT_TRUE(ReadAll(DigestsPathFor(d + "/m.pack")) == ReadAll(DigestsPathFor(full + "/m.pack")));
  std::vector<std::string> again = args;
  again.push_back("--json");  // the "already built" line then goes to stderr
  auto [rc2, err2] = RunCli(again);
  EXPECT_EQ(rc2, 0) << err2;
  EXPECT_NE(err2.find("already built: " + d + "/m.pack"), std::string::npos) << err2;
  // A damaged first payload (one of the sampled ones): no longer the merge.
  {
    std::string bytes = ReadAll(d + "/m.pack");
    uint64_t data_start = 0;
    for (int i = 7; i >= 0; --i) data_start = (data_start << 8) | static_cast<uint8_t>(bytes[32 + i]);
    std::fstream f(d + "/m.pack", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(data_start));
    const char c = static_cast<char>(bytes[data_start] ^ 0x5a);
    f.write(&c, 1);
  }
  auto [rc3, err3] = RunCli(args);
  EXPECT_EQ(rc3, 1);
  EXPECT_NE(err3.find("refusing to overwrite existing " + d + "/m.pack (--pack): it is not the merge of these rank "
                      "packs: payload"),
            std::string::npos)
      << err3;
  args.push_back("--force");
  EXPECT_EQ(RunCli(args).first, 0);
  EXPECT_TRUE(ReadAll(d + "/m.pack") == ReadAll(full + "/m.pack"));
}

// A merge killed between writing its two files (K3PACK_TEST_KILL_IN_MERGE=1)
// is finished by the plain rerun. Session 13: the pack was renamed into place
// before its sidecar was written, so a crash there left a pack without its
// .digests, which the rerun refused ("not the merge of these rank packs").
TEST_F(EpCli, EpMergeKilledBeforeItsLastFileIsFinishedByTheRerun) {
  const std::string full = Dir("k-full"), d = Dir("k-ep");
  ASSERT_EQ(RunCli(Pack(full + "/m.pack")).first, 0);
  ASSERT_EQ(RunCli(Pack(d + "/m.pack", {"--ep-size", "2", "--ep-rank", "all"})).first, 0);
  const std::vector<std::string> args = {"ep-merge", "--progress", "none", d + "/m.ep0-of-2.pack",
                                         d + "/m.ep1-of-2.pack"};
  auto [rc, err] = RunCli(args, {"K3PACK_TEST_KILL_IN_MERGE=1"});
  ASSERT_EQ(rc, 128 + SIGKILL) << err;
  auto [rc2, err2] = RunCli(args);
  ASSERT_EQ(rc2, 0) << err2;
  EXPECT_TRUE(ReadAll(d + "/m.pack") == ReadAll(full + "/m.pack"));
  EXPECT_TRUE(ReadAll(DigestsPathFor(d + "/m.pack")) == ReadAll(DigestsPathFor(full + "/m.pack")));
}

// Rank packs that cannot be merged (a rank given twice, a rank missing) are
// refused before anything is made beside --pack. Session 38: the checks ran
// under the output's lock, so each refusal left m.pack.lock behind.
TEST_F(EpCli, EpMergeOfBadRanksLeavesNothingBesideThePack) {
  const std::string d = Dir("dup");
  ASSERT_EQ(RunCli(Pack(d + "/m.pack", {"--ep-size", "2", "--ep-rank", "all"})).first, 0);
  const auto before = std::distance(std::filesystem::directory_iterator(d), std::filesystem::directory_iterator());
  const std::string r0 = d + "/m.ep0-of-2.pack", r1 = d + "/m.ep1-of-2.pack";
  auto [rc, err] = RunCli({"ep-merge", "--progress", "none", r0, r0});
  EXPECT_EQ(rc, 1);
  EXPECT_NE(err.find("rank 0 of 2 is given twice: " + r0 + " and " + r0), std::string::npos) << err;
  auto [rc2, err2] = RunCli({"ep-merge", "--progress", "none", r1});
  EXPECT_EQ(rc2, 1);
  EXPECT_NE(err2.find("rank(s) 0 of 2 missing"), std::string::npos) << err2;
  EXPECT_FALSE(PathExists(d + "/m.pack.lock"));
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(d), std::filesystem::directory_iterator()), before);
}

// Bad --ep-size / --ep-rank: usage errors (exit 2), ep.h's texts.
TEST_F(EpCli, BadEpOptionsAreUsageErrors) {
  const std::string d = Dir("bad");
  struct Case {
    std::vector<std::string> extra;
    std::string text;
  };
  const std::vector<Case> cases = {
      {{"--ep-size", "3", "--ep-rank", "0"}, "--ep-size 3 does not divide the 16 routed experts"},
      {{"--ep-size", "4", "--ep-rank", "4"}, "--ep-rank 4 is out of range for --ep-size 4 (ranks are 0..3)"},
      {{"--ep-size", "0", "--ep-rank", "0"}, "--ep-size must be at least 1, got 0"},
      // Session 13: the two below said "must be at least 1" and "--ep-rank 4294967295".
      {{"--ep-size", "99999999999", "--ep-rank", "0"}, "--ep-size must be at most 1048576, got 99999999999"},
      {{"--ep-size", "4", "--ep-rank", "99999999999"},
       "--ep-rank 99999999999 is out of range for --ep-size 4 (ranks are 0..3)"},
      {{"--ep-size", "4", "--ep-rank", "x"}, "--ep-rank must be an integer 0..3 or `all`, got 'x'"},
      {{"--ep-size", "4", "--ep-rank", "-1"}, "--ep-rank must be non-negative, got -1"},
      {{"--ep-rank", "1"}, "--ep-rank needs --ep-size"},
      {{"--ep-size", "4"}, "--ep-size needs --ep-rank (give the rank R (0..N-1) to write, or `all`)"},
  };
  for (const auto& c : cases) {
    for (auto args : {Pack(d + "/m.pack", c.extra), Build(d + "/m.pack", c.extra)}) {
      SCOPED_TRACE(args[0] + " " + c.text);
      auto [rc, err] = RunCli(args);
      EXPECT_EQ(rc, 2) << err;
      EXPECT_NE(err.find(c.text), std::string::npos) << err;
    }
  }
  EXPECT_TRUE(std::filesystem::is_empty(d));
}

}  // namespace
}  // namespace k3pack::pack
