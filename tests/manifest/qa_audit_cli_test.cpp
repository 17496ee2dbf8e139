// End-to-end checks of a QA audit's findings, through the real binary on a
// tiny synthetic model: verify applies SGLang's loader rules to the manifest
// (hard_constraints), build refuses ssm_a values SGLang's loader rejects,
// doctor's facts and fixes on a truncated pack and a missing shard,
// run-experts with another model's --gguf-dir, build on a pack with a damaged
// payload, ep-merge rerun on its finished output, and verify's messages on a
// truncated pack and on a manifest without `source`.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace fs = std::filesystem;
using k3test::CmdResult;
using k3test::Bin;
using k3test::RunCmd;
using k3test::ShellQuote;
using nlohmann::json;

namespace {

std::string Q(const std::string& s) { return ShellQuote(s); }

// The message after "k3pack CMD: error: " on its first line.
std::string MessageAfterError(const std::string& s) {
  const size_t at = s.find("error: ");
  const std::string from = at == std::string::npos ? s : s.substr(at + 7);
  return from.substr(0, from.find('\n'));
}

void FlipBytes(const std::string& path, uint64_t at, int n) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  for (int i = 0; i < n; ++i) {
    f.seekg(static_cast<std::streamoff>(at + i));
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(static_cast<std::streamoff>(at + i));
    f.write(&c, 1);
  }
}

class QaAudit : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new k3test::TempDir("k3qa");
    auto r = RunCmd(Bin() + " synth --out " + Q(*root_ / "m1"));
    ASSERT_EQ(r.rc, 0) << r.out;
  }
  static void TearDownTestSuite() {
    delete root_;
    root_ = nullptr;
  }
  // A copy of the synthetic model in `name`, built (pack + manifest) in place.
  static std::string Built(const std::string& name) {
    const std::string dir = *root_ / name;
    fs::copy(*root_ / "m1", dir, fs::copy_options::recursive);
    auto r = Build(dir);
    EXPECT_EQ(r.rc, 0) << r.out;
    return dir;
  }
  static CmdResult Build(const std::string& dir, const std::string& extra = "") {
    return RunCmd(Bin() + " build " + Q(dir) + " --model-config " + Q(dir + "/config.json") + " --tokenizer-dir " +
                  Q(dir + "/tokenizer") + " --progress none " + extra);
  }
  static std::string ManifestOf(const std::string& dir) { return dir + "/kimi-k3-expert-pack.manifest.json"; }
  static std::string PackOf(const std::string& dir) { return dir + "/KIMI-K3-SYNTH.expert-major.pack"; }
  static CmdResult Verify(const std::string& manifest) {
    return RunCmd(Bin() + " verify --progress none --manifest " + Q(manifest));
  }
  static k3test::TempDir* root_;
};
k3test::TempDir* QaAudit::root_ = nullptr;

// Item 1: SGLang's store compares hard_constraints with its exact dict; a
// manifest edited there passes every pack and source comparison, so verify
// must apply the loader's rule itself.
TEST_F(QaAudit, VerifyRejectsEditedHardConstraints) {
  const std::string dir = Built("hc");
  ASSERT_EQ(Verify(ManifestOf(dir)).rc, 0);
  json doc = json::parse(k3test::ReadFile(ManifestOf(dir)));
  for (const auto& [key, value] : std::vector<std::pair<std::string, json>>{
           {"top_k", 8}, {"expert_pruning_allowed", true}, {"extra_key", 1}}) {
    SCOPED_TRACE(key);
    json edited = doc;
    edited["hard_constraints"][key] = value;
    const std::string copy = dir + "/copy.json";
    k3test::WriteFile(copy, edited.dump(2));
    auto r = Verify(copy);
    EXPECT_EQ(r.rc, 1) << r.out;
    EXPECT_EQ(MessageAfterError(r.out), "Kimi manifest hard constraints do not match runtime policy") << r.out;
    EXPECT_NE(r.out.find("hint: " + copy), std::string::npos) << r.out;
  }
  // Without the key SGLang's `manifest["hard_constraints"]` raises a bare
  // KeyError; the hint names the manifest.
  json removed = doc;
  removed.erase("hard_constraints");
  k3test::WriteFile(dir + "/copy.json", removed.dump(2));
  auto r = Verify(dir + "/copy.json");
  EXPECT_EQ(MessageAfterError(r.out), "'hard_constraints'") << r.out;
  EXPECT_NE(r.out.find("manifest " + dir + "/copy.json has no key 'hard_constraints'"), std::string::npos) << r.out;
}

// Item 2: build runs doctor's ssm_a value checks (SGLang's loader rejects
// raw A_log, NaN and zeros at start-up) and refuses without
// --allow-unsupported; load's error names the tensor and the file.
TEST_F(QaAudit, BuildRefusesSsmAValuesTheLoaderRejects) {
  for (const std::string fault : {"raw-ssm-a", "nan-ssm-a", "zero-ssm-a"}) {
    SCOPED_TRACE(fault);
    const std::string dir = *root_ / ("f-" + fault);
    ASSERT_EQ(RunCmd(Bin() + " synth --out " + Q(dir) + " --fault " + fault).rc, 0);
    auto r = Build(dir);
    EXPECT_EQ(r.rc, 1) << r.out;
    EXPECT_NE(r.out.find("SGLang cannot load this checkpoint"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("ssm-a-"), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(ManifestOf(dir))) << r.out;
    r = Build(dir, "--allow-unsupported");
    ASSERT_EQ(r.rc, 0) << r.out;
    r = RunCmd(Bin() + " load --manifest " + Q(ManifestOf(dir)));
    EXPECT_EQ(r.rc, 1) << r.out;
    EXPECT_NE(MessageAfterError(r.out).find("Kimi-K3 GGUF ssm_a must contain"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("hint: tensor blk."), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(".ssm_a in " + dir), std::string::npos) << r.out;
  }
}

// Item 3a: on a truncated pack doctor's fix is a command that works (`pack
// --restart` refuses a finished pack): run it, and the pack verifies.
TEST_F(QaAudit, DoctorFixForTruncatedPackWorks) {
  const std::string dir = Built("trunc");
  fs::resize_file(PackOf(dir), fs::file_size(PackOf(dir)) - 5000);
  auto r = RunCmd(Bin() + " doctor --json " + Q(ManifestOf(dir)), /*merge_stderr=*/false);
  EXPECT_EQ(r.rc, 1) << r.out;
  const json report = json::parse(r.out);
  std::string fix;
  for (const json& f : report["findings"]) {
    const std::string code = f["code"];
    if (code == "pack-size" || code == "pack-invalid") {
      EXPECT_EQ(f["fix"].get<std::string>().find("--restart"), std::string::npos) << f.dump();
      if (code == "pack-size") fix = f["fix"];
    }
  }
  ASSERT_FALSE(fix.empty()) << r.out;
  const size_t a = fix.find('`'), b = fix.find('`', a + 1);
  ASSERT_NE(b, std::string::npos) << fix;
  const std::string cmd = fix.substr(a + 1, b - a - 1);
  ASSERT_EQ(cmd.rfind("k3pack build ", 0), 0u) << cmd;
  r = RunCmd(Bin() + cmd.substr(6) + " --progress none");
  ASSERT_EQ(r.rc, 0) << cmd << "\n" << r.out;
  r = Verify(ManifestOf(dir));
  EXPECT_EQ(r.rc, 0) << r.out;
}

// Item 3b: a deleted middle shard is reported as missing; the shard after it
// is not said to have a wrong split.no, and the pack (fine) is not called
// invalid when doctor starts from the manifest.
TEST_F(QaAudit, DoctorReportsMissingMiddleShardOnly) {
  const std::string dir = Built("gap");
  fs::remove(dir + "/KIMI-K3-SYNTH-00002-of-00003.gguf");
  for (const std::string& input : {dir, ManifestOf(dir)}) {
    SCOPED_TRACE(input);
    auto r = RunCmd(Bin() + " doctor --json " + Q(input), /*merge_stderr=*/false);
    EXPECT_EQ(r.rc, 1) << r.out;
    const json report = json::parse(r.out);
    std::set<std::string> codes;
    for (const json& f : report["findings"]) codes.insert(f["code"].get<std::string>());
    EXPECT_EQ(codes.count("split-no-mismatch"), 0u) << r.out;
    EXPECT_EQ(codes.count("pack-invalid"), 0u) << r.out;
    EXPECT_TRUE(codes.count("shard-set-incomplete") || codes.count("manifest-shard-changed")) << r.out;
  }
}

// Item 4: --gguf-dir of another model is named as such before any run, not
// reported as wrong bytes served by the pack.
TEST_F(QaAudit, RunExpertsBlamesAnotherModelsGgufDir) {
  const std::string dir = Built("re");
  const std::string other = *root_ / "other-model";
  ASSERT_EQ(RunCmd(Bin() + " synth --seed 7 --out " + Q(other)).rc, 0);
  auto r = RunCmd(Bin() + " run-experts --manifest " + Q(ManifestOf(dir)) + " --gguf-dir " + Q(other));
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_EQ(r.out.find("MISMATCH"), std::string::npos) << r.out;
  // Another seed of the same preset has the same headers: refused as what
  // the headers cannot tell apart from a copy (session 44).
  EXPECT_NE(MessageAfterError(r.out).find("--gguf-dir " + other +
                                          " holds shards whose headers and tensor records match the ones the manifest"),
            std::string::npos)
      << r.out;
  r = RunCmd(Bin() + " run-experts --manifest " + Q(ManifestOf(dir)) + " --gguf-dir " + Q(dir));
  EXPECT_EQ(r.rc, 0) << r.out;
  // The model's own directory given relative to the working directory.
  r = RunCmd("cd " + Q(dir) + " && " + Bin() + " run-experts --manifest " + Q(ManifestOf(dir)) + " --gguf-dir .");
  EXPECT_EQ(r.rc, 0) << r.out;
}

// Item 7: verify on a truncated pack says SGLang's size text and names the
// file; a manifest without `source` names the manifest and the key.
TEST_F(QaAudit, VerifyNamesTruncatedPackAndMissingKey) {
  const std::string dir = Built("v7");
  fs::resize_file(PackOf(dir), fs::file_size(PackOf(dir)) - 5000);
  auto r = Verify(ManifestOf(dir));
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_EQ(MessageAfterError(r.out), "Kimi expert-pack size does not match its manifest") << r.out;
  EXPECT_NE(r.out.find("hint: " + PackOf(dir)), std::string::npos) << r.out;

  json doc = json::parse(k3test::ReadFile(ManifestOf(dir)));
  doc.erase("source");
  const std::string copy = dir + "/nosource.json";
  k3test::WriteFile(copy, doc.dump(2));
  r = Verify(copy);
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_EQ(MessageAfterError(r.out), "'source'") << r.out;
  EXPECT_NE(r.out.find("manifest " + copy + " has no key 'source'"), std::string::npos) << r.out;
}

// A moved model directory: the manifest there records the same pack at the
// old place, where nothing is any more. Rebuilding in the new place writes a
// new manifest and reuses the pack (no rebuild); a copy whose original is
// still in place keeps the refusal (that manifest still describes a model).
TEST_F(QaAudit, BuildInAMovedModelDirectoryReusesThePack) {
  const std::string from = Built("moved-from"), to = *root_ / "moved-to";
  fs::rename(from, to);
  const auto pack_time = fs::last_write_time(PackOf(to));
  auto r = Build(to);
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("the model was moved"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(reused)"), std::string::npos) << r.out;
  EXPECT_EQ(fs::last_write_time(PackOf(to)), pack_time);
  EXPECT_EQ(Verify(ManifestOf(to)).rc, 0);
  const std::string copy = *root_ / "copied";
  fs::copy(to, copy, fs::copy_options::recursive);
  r = Build(copy);
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("refusing to overwrite"), std::string::npos) << r.out;
}

// More samples than entries: every entry is checked, and the run says so
// instead of capping the request silently.
TEST_F(QaAudit, VerifySaysWhenSamplesCoverEveryEntry) {
  const std::string dir = Built("samples");
  auto r = RunCmd(Bin() + " verify --progress none --manifest " + Q(ManifestOf(dir)) + " --samples 100000");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("note: --samples 100000 is more than the 144 entries"), std::string::npos) << r.out;
  r = RunCmd(Bin() + " verify --progress none --manifest " + Q(ManifestOf(dir)) + " --samples 3");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.out.find("note:"), std::string::npos) << r.out;
}

// Item 5: a pack damaged where SGLang's validator does not look (a name's NUL
// padding in the index) or in a payload: build names the pack as damaged
// (the index: its digest against the shards' layout), not its manifest as
// foreign, and `build --restart` repairs it in place.
TEST_F(QaAudit, BuildNamesDamagedPackAndRestartRepairsIt) {
  const std::string dir = Built("dmg");
  const std::string original = k3test::ReadFile(PackOf(dir));
  const uint64_t data_start = [&] {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(original[32 + i]);
    return v;
  }();
  struct Case {
    const char* what;
    uint64_t at;
    const char* says;
  };
  for (const Case& c : {Case{"index name padding", 40 + 152 * 3 + 100, "it is not a valid pack of these shards: its header/index hashes to "},
                        Case{"first payload", data_start, "it is not a valid pack of these shards"}}) {
    SCOPED_TRACE(c.what);
    FlipBytes(PackOf(dir), c.at, 16);
    auto r = Build(dir);
    EXPECT_EQ(r.rc, 1) << r.out;
    EXPECT_EQ(r.out.find("it is not the manifest of this pack"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("--restart"), std::string::npos) << r.out;
    r = Build(dir, "--restart");
    EXPECT_EQ(r.rc, 0) << r.out;
    EXPECT_TRUE(k3test::ReadFile(PackOf(dir)) == original);
    r = RunCmd(Bin() + " verify --full --progress none --manifest " + Q(ManifestOf(dir)));
    EXPECT_EQ(r.rc, 0) << r.out;
    // The other repair named: `pack --repair-damaged` (manifest untouched).
    FlipBytes(PackOf(dir), c.at, 16);
    r = RunCmd(Bin() + " pack --repair-damaged --progress none --gguf-dir " + Q(dir) + " --model-config " +
               Q(dir + "/config.json"));
    EXPECT_EQ(r.rc, 0) << r.out;
    EXPECT_TRUE(k3test::ReadFile(PackOf(dir)) == original);
    EXPECT_EQ(Verify(ManifestOf(dir)).rc, 0);
  }
}

}  // namespace
