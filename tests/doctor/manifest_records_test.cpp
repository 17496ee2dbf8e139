// Doctor on a manifest whose source records were edited (what `k3pack verify`
// catches): a tensor record, a shard record's tensor_count, size or
// whole-file sha256. Each edit is a finding naming the shard (or tensor) and
// the field, its fix is a command that works (run here, after which doctor is
// healthy again), and the report says which shard directory it checked.
#include <algorithm>
#include <functional>

#include <nlohmann/json.hpp>

#include "doctor_test_util.h"

namespace dtest {
namespace {

using nlohmann::json;

std::string Q(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

class DoctorManifestRecords : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // The CLI's synth (it records the model's profile, so no command below needs --profile).
    dir_ = new fs::path(fs::canonical(TempDir("records")));
    const std::string d = dir_->string();
    auto r = RunCli("synth --preset tiny --progress none --out " + Q(d) + " 2>&1");
    ASSERT_EQ(r.exit_code, 0) << r.out;
    r = RunCli("build " + Q(d) + " --model-config " + Q(d + "/config.json") + " --tokenizer-dir " + Q(d + "/tokenizer") +
               " --progress none --safety-margin-gib 0 2>&1");
    ASSERT_EQ(r.exit_code, 0) << r.out;
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string Manifest() { return (*dir_ / "kimi-k3-expert-pack.manifest.json").string(); }
  static json Doc() { return json::parse(ReadAll(Manifest())); }
  // The manifest with `edit` applied, written beside it under `name`.
  static std::string Edited(const std::string& name, const std::function<void(json&)>& edit) {
    json d = Doc();
    edit(d);
    const std::string path = (*dir_ / name).string();
    std::ofstream(path, std::ios::trunc) << d.dump(2);
    return path;
  }
  static json Doctor(const std::string& manifest, int want_exit) {
    auto r = RunCli("doctor --json --progress none " + Q(manifest));
    EXPECT_EQ(r.exit_code, want_exit) << r.out;
    const size_t at = r.out.find('{');
    return at == std::string::npos ? json() : json::parse(r.out.substr(at), nullptr, false);
  }
  static std::vector<json> FindingsWith(const json& report, const std::string& code) {
    std::vector<json> out;
    for (const json& f : report.value("findings", json::array())) {
      if (f["code"] == code) out.push_back(f);
    }
    return out;
  }
  // Runs the first `k3pack ...` command of a finding's fix with this binary.
  static void RunFix(const json& finding) {
    const std::string fix = finding["fix"];
    const size_t a = fix.find("`k3pack "), b = fix.find('`', a + 1);
    ASSERT_NE(a, std::string::npos) << fix;
    ASSERT_NE(b, std::string::npos) << fix;
    const std::string cmd = fix.substr(a + 8, b - a - 8);
    auto r = RunCli(cmd + " --progress none 2>&1");
    ASSERT_EQ(r.exit_code, 0) << cmd << "\n" << r.out;
  }
  static fs::path* dir_;
};
fs::path* DoctorManifestRecords::dir_ = nullptr;

TEST_F(DoctorManifestRecords, UneditedManifestIsHealthyAndNamesTheShardDirectory) {
  const json report = Doctor(Manifest(), 0);
  EXPECT_EQ(report["status"], "healthy") << report.dump(2);
  EXPECT_EQ(report["shard_dirs"], json::array({dir_->string()})) << report.dump(2);
  auto text = RunCli("doctor --progress none " + Q(Manifest()));
  EXPECT_EQ(text.exit_code, 0) << text.out;
  EXPECT_NE(text.out.find("shards checked in " + dir_->string() + "\n"), std::string::npos) << text.out;
  // Given as a directory, the same line.
  text = RunCli("doctor --progress none --no-values " + Q(dir_->string() + "/"));
  EXPECT_NE(text.out.find("shards checked in " + dir_->string() + "\n"), std::string::npos) << text.out;
}

TEST_F(DoctorManifestRecords, EditedTensorRecordIsNamedWithItsShardAndField) {
  const json doc = Doc();
  size_t at = 0;
  for (; at < doc["source"]["tensors"].size(); ++at) {
    if (doc["source"]["tensors"][at]["name"].get<std::string>().find("_exps") == std::string::npos) break;
  }
  ASSERT_LT(at, doc["source"]["tensors"].size());
  const std::string name = doc["source"]["tensors"][at]["name"];
  const std::string shard =
      doc["source"]["shards"][doc["source"]["tensors"][at]["shard_index"].get<size_t>()]["path"];
  for (const std::string field : {"data_offset", "nbytes"}) {
    SCOPED_TRACE(field);
    const std::string m = Edited("tensor-" + field + ".json", [&](json& d) {
      d["source"]["tensors"][at][field] = d["source"]["tensors"][at][field].get<uint64_t>() + 32;
    });
    const json report = Doctor(m, 1);
    const auto found = FindingsWith(report, "manifest-source-record");
    ASSERT_EQ(found.size(), 1u) << report.dump(2);
    EXPECT_EQ(found[0]["object"], name);
    EXPECT_EQ(found[0]["details"]["tensor"], name);
    EXPECT_EQ(found[0]["details"]["shard"], shard);
    EXPECT_EQ(found[0]["details"]["field"], field);
    EXPECT_NE(found[0]["message"].get<std::string>().find(field), std::string::npos) << found[0].dump(2);
    RunFix(found[0]);
    EXPECT_EQ(Doctor(m, 0)["status"], "healthy");
  }
}

TEST_F(DoctorManifestRecords, EditedShardRecordIsNamedWithTheShardAndField) {
  const std::string shard = Doc()["source"]["shards"][1]["path"];
  const std::string m = Edited("shard-count.json", [](json& d) {
    d["source"]["shards"][1]["tensor_count"] = d["source"]["shards"][1]["tensor_count"].get<uint64_t>() + 1;
  });
  const json report = Doctor(m, 1);
  const auto found = FindingsWith(report, "manifest-source-record");
  ASSERT_EQ(found.size(), 1u) << report.dump(2);
  EXPECT_EQ(found[0]["object"], shard);
  EXPECT_EQ(found[0]["details"]["shard"], shard);
  EXPECT_EQ(found[0]["details"]["field"], "tensor_count");
  RunFix(found[0]);
  EXPECT_EQ(Doctor(m, 0)["status"], "healthy");
}

TEST_F(DoctorManifestRecords, EditedShardSizeIsNamedAndTheFixWorks) {
  const std::string shard = Doc()["source"]["shards"][2]["path"];
  const std::string m = Edited("shard-size.json", [](json& d) {
    d["source"]["shards"][2]["size"] = d["source"]["shards"][2]["size"].get<uint64_t>() + 4096;
  });
  const json report = Doctor(m, 1);
  const auto found = FindingsWith(report, "manifest-shard-changed");
  ASSERT_EQ(found.size(), 1u) << report.dump(2);
  EXPECT_EQ(found[0]["object"], shard);
  EXPECT_EQ(found[0]["details"]["field"], "size");
  EXPECT_NE(found[0]["message"].get<std::string>().find("size is "), std::string::npos);
  RunFix(found[0]);
  EXPECT_EQ(Doctor(m, 0)["status"], "healthy");
}

// Doctor does not hash whole shards, so an edited whole-file sha256 shows as
// the inventory digest that no longer matches, naming the field and the
// shards whose digest was taken as recorded; verify --full names the shard.
TEST_F(DoctorManifestRecords, EditedShardSha256IsNamed) {
  const json doc = Doc();
  ASSERT_TRUE(doc["source"]["shards"][0].contains("sha256")) << "the build records whole-shard digests";
  const std::string shard = doc["source"]["shards"][0]["path"];
  const std::string m = Edited("shard-sha.json", [](json& d) { d["source"]["shards"][0]["sha256"] = std::string(64, 'e'); });
  const json report = Doctor(m, 1);
  const auto found = FindingsWith(report, "manifest-source-record");
  ASSERT_EQ(found.size(), 1u) << report.dump(2);
  EXPECT_EQ(found[0]["details"]["field"], "inventory_sha256");
  const json unhashed = found[0]["details"]["unhashed_sha256"];
  EXPECT_NE(std::find(unhashed.begin(), unhashed.end(), json(shard)), unhashed.end()) << found[0].dump(2);
  EXPECT_NE(found[0]["message"].get<std::string>().find("whole-file sha256"), std::string::npos);
  EXPECT_NE(found[0]["fix"].get<std::string>().find("verify --manifest " + m + " --full"), std::string::npos);
  auto full = RunCli("verify --progress none --full --manifest " + Q(m) + " 2>&1");
  EXPECT_EQ(full.exit_code, 1) << full.out;
  EXPECT_NE(full.out.find("GGUF shard " + shard + " changed since the manifest was written: sha256"), std::string::npos)
      << full.out;
  RunFix(found[0]);
  EXPECT_EQ(Doctor(m, 0)["status"], "healthy");
}

}  // namespace
}  // namespace dtest
