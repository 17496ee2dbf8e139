// Files an older k3pack left beside a pack, read by this one (the
// upgrade-compatibility audit, session 32). The old files are made here by
// the rules the old code followed, not by an old binary.
#include <cstring>

#include <nlohmann/json.hpp>

#include "pack/sidecars.h"
#include "pack_fixture.h"
#include "spawn.h"
#include "util/crc32c.h"
#include "util/file.h"

namespace k3pack::pack {
namespace {

using testing::ReadAll;

struct PackUpgradeModel {
  static constexpr const char* kName = "upgrade";
  static constexpr uint64_t kSeed = 5;
};

class PackUpgrade : public testing::SharedModelTest<PackUpgradeModel> {};

uint32_t U32At(const std::string& b, size_t at) {
  uint32_t v;
  std::memcpy(&v, b.data() + at, 4);
  return v;
}

// The digest sidecar k3pack wrote before CRC32C records (before f50badc):
// version 1, the SHA-256 records only, the records digest over them.
std::string VersionOneSidecarOf(const std::string& v2) {
  const uint64_t n = (v2.size() - kDigestsHeaderBytes) / (kDigestBytes + kCrcBytes);
  std::string out = v2.substr(0, kDigestsHeaderBytes + n * kDigestBytes);
  const uint32_t one = 1;
  std::memcpy(out.data() + 16, &one, 4);
  const auto records = Sha256Raw(out.data() + kDigestsHeaderBytes, n * kDigestBytes);
  std::memcpy(out.data() + 80, records.data(), 32);
  return out;
}

// A pack built by an older k3pack has a version-1 sidecar: its store ran
// unchecked for good ("rebuild the pack's digests with this k3pack", which
// no command did; `pack` only said it was built). A rerun of the same
// command checks every payload against the old SHA-256 records once and
// writes the sidecar this k3pack writes, CRC32C records included.
TEST_F(PackUpgrade, RerunAddsCrcRecordsToAnOlderK3packsSidecar) {
  const std::string out = *root_ + "/v1/p.pack";
  auto [rc, err] = RunCli(PackArgs(out));
  ASSERT_EQ(rc, 0) << err;
  const std::string fresh = ReadAll(DigestsPathFor(out));
  ASSERT_EQ(U32At(fresh, 16), 2u);
  testing::WriteAll(DigestsPathFor(out), VersionOneSidecarOf(fresh));
  ASSERT_TRUE(ReadPackDigests(DigestsPathFor(out)).ok());

  auto [rc2, err2] = RunCli(PackArgs(out));
  ASSERT_EQ(rc2, 0) << err2;
  EXPECT_NE(err2.find("predates CRC32C records"), std::string::npos) << err2;
  EXPECT_TRUE(ReadAll(out) == *expected_) << "the pack itself must not change";
  EXPECT_TRUE(ReadAll(DigestsPathFor(out)) == fresh) << "the sidecar must be the one this k3pack writes";
}

// A payload that no longer matches the old sidecar's SHA-256 record: the
// pack is damaged; nothing is vouched for with new CRCs and the old sidecar
// stays as it was.
TEST_F(PackUpgrade, DamagedPayloadIsNamedAndTheOldSidecarKept) {
  const std::string out = *root_ + "/v1-damaged/p.pack";
  auto [rc, err] = RunCli(PackArgs(out));
  ASSERT_EQ(rc, 0) << err;
  const std::string old = VersionOneSidecarOf(ReadAll(DigestsPathFor(out)));
  testing::WriteAll(DigestsPathFor(out), old);
  // Damage the sidecar's last SHA-256 record instead of the pack (the
  // sampled payload check of an existing pack compares with the GGUF
  // source, which would catch a flipped pack byte first).
  std::string damaged = old;
  damaged[damaged.size() - 1] ^= 0x01;
  const uint64_t n = (damaged.size() - kDigestsHeaderBytes) / kDigestBytes;
  const auto records = Sha256Raw(damaged.data() + kDigestsHeaderBytes, n * kDigestBytes);
  std::memcpy(damaged.data() + 80, records.data(), 32);
  testing::WriteAll(DigestsPathFor(out), damaged);

  auto [rc2, err2] = RunCli(PackArgs(out));
  EXPECT_EQ(rc2, 1) << err2;
  EXPECT_NE(err2.find("entry " + std::to_string(n - 1)), std::string::npos) << err2;
  EXPECT_NE(err2.find("k3pack verify"), std::string::npos) << err2;
  EXPECT_TRUE(ReadAll(DigestsPathFor(out)) == damaged);
  EXPECT_TRUE(ReadAll(out) == *expected_);
}

// A manifest an older k3pack wrote for this pack, with hard_constraints.top_k
// the model's top-k (before it was SGLang's literal 16): SGLang's store,
// verify and run-experts refuse it and say to regenerate it with `k3pack
// build`, which reported it as already built. The rerun writes a new one.
TEST_F(PackUpgrade, BuildRewritesAnOlderK3packsManifestSglangRefuses) {
  const std::string out = *root_ + "/old-manifest/p.pack", manifest = out + ".json";
  const std::vector<std::string> args = {"build", "--gguf-dir", model_->dir, "--model-config", model_->config,
                                         "--tokenizer-dir", model_->dir + "/tokenizer", "--profile", "scaled",
                                         "--out", out, "--manifest", manifest, "--safety-margin-gib", "0"};
  auto [rc, err] = RunCli(args);
  ASSERT_EQ(rc, 0) << err;
  auto m = nlohmann::json::parse(ReadAll(manifest));
  const auto top_k = m["model"]["num_experts_per_token"];
  ASSERT_NE(top_k, 16);
  m["hard_constraints"]["top_k"] = top_k;
  testing::WriteAll(manifest, m.dump(2) + "\n");

  auto [rc2, err2] = RunCli(args);
  ASSERT_EQ(rc2, 0) << err2;
  EXPECT_NE(err2.find("SGLang's store refuses it"), std::string::npos) << err2;
  EXPECT_EQ(nlohmann::json::parse(ReadAll(manifest))["hard_constraints"]["top_k"], 16);
  auto [rc3, err3] = RunCli({"verify", "--manifest", manifest});
  EXPECT_EQ(rc3, 0) << err3;
}

}  // namespace
}  // namespace k3pack::pack
