// Doctor on a manifest: a good one is healthy; each break is its own finding.
#include <functional>

#include <nlohmann/json.hpp>

#include "doctor_test_util.h"

namespace dtest {
namespace {

struct Prepared {
  fs::path dir, pack, manifest;
};

Prepared Prepare(const std::string& tag) {
  Prepared p;
  p.dir = TempDir(tag);
  Synth(p.dir);
  p.pack = p.dir / "KIMI-K3-SYNTH.expert-major.pack";
  p.manifest = p.dir / "kimi-k3-expert-pack.manifest.json";
  const std::string d = p.dir.string();
  auto r1 = RunCli("pack --profile scaled --progress none --safety-margin-gib 0 --gguf-dir " + d + " --model-config " + d +
                   "/config.json --out " + p.pack.string());
  EXPECT_EQ(r1.exit_code, 0) << r1.out;
  auto r2 = RunCli("manifest --profile scaled --progress none --gguf-dir " + d + " --expert-pack " + p.pack.string() +
                   " --model-config " + d + "/config.json --tokenizer-dir " + d + "/tokenizer --output " +
                   p.manifest.string());
  EXPECT_EQ(r2.exit_code, 0) << r2.out;
  return p;
}

void EditJson(const fs::path& path, const std::function<void(nlohmann::json&)>& edit) {
  auto j = nlohmann::json::parse(ReadAll(path));
  edit(j);
  std::ofstream(path, std::ios::trunc) << j.dump(2);
}

TEST(DoctorManifest, GoodManifestIsHealthy) {
  Prepared p = Prepare("man-ok");
  doctor::Report r = Scaled({p.manifest.string()});
  EXPECT_EQ(r.ExitCode(), 0) << Dump(r);
  EXPECT_EQ(r.Count(doctor::Severity::kError), 0u) << Dump(r);
  EXPECT_EQ(r.files.size(), 4u);  // the manifest + 3 shards
}

TEST(DoctorManifest, EveryBrokenPartIsReported) {
  Prepared p = Prepare("man-bad");
  EditJson(p.manifest, [](nlohmann::json& j) {
    j["format"] = "SOMETHING-ELSE";
    j["complete"] = false;
    j["hard_constraints"]["expert_pruning_allowed"] = true;
  });
  { std::ofstream(p.pack, std::ios::app) << "tail"; }  // pack grows by 4 bytes
  doctor::Report r = Scaled({p.manifest.string()});
  EXPECT_EQ(r.ExitCode(), 1);
  for (const char* code : {"manifest-format", "manifest-incomplete", "manifest-hard-constraints", "pack-size", "pack-invalid"}) {
    EXPECT_TRUE(r.Has(code)) << code << "\n" << Dump(r);
  }
  EXPECT_EQ(r.With("manifest-format")[0]->sglang_error, "Kimi-K3 manifest format is unsupported");
  EXPECT_EQ(r.With("manifest-incomplete")[0]->sglang_error, "Kimi-K3 manifest is incomplete");
  EXPECT_EQ(r.With("pack-size")[0]->sglang_error, "Kimi expert-pack size does not match its manifest");
  EXPECT_EQ(r.With("pack-invalid")[0]->sglang_error, "expert-pack has unexplained trailing bytes: 4");
}

TEST(DoctorManifest, ChangedShardAndKimiK3Dimensions) {
  Prepared p = Prepare("man-shard");
  auto j = nlohmann::json::parse(ReadAll(p.manifest));
  const std::string shard = j["source"]["shards"][1]["path"];
  { std::ofstream(shard, std::ios::app) << "x"; }
  doctor::Report r = Scaled({p.manifest.string()});
  ASSERT_TRUE(r.Has("manifest-shard-changed")) << Dump(r);
  EXPECT_EQ(r.With("manifest-shard-changed")[0]->sglang_error, "Kimi-K3 GGUF shard is missing or changed: " + shard);
  // Under the kimi-k3 profile the tiny manifest's dimensions are refused.
  doctor::Report k3 = doctor::Diagnose({p.manifest.string()});
  ASSERT_TRUE(k3.Has("manifest-dimensions")) << Dump(k3);
  bool dims = false;
  for (const auto* f : k3.With("manifest-dimensions")) {
    dims = dims || f->sglang_error == "Kimi expert-pack dimensions (4, 16, 4) != (93, 896, 16); Top-K is immutable at 16";
  }
  EXPECT_TRUE(dims) << Dump(k3);
}

// Shard and tensor records whose numbers are strings: doctor read them with
// json's get<uint64_t>(), whose type_error escaped Diagnose (doctor ended in
// std::terminate) instead of the records being reported.
TEST(DoctorManifest, RecordNumbersOfTheWrongTypeAreReported) {
  Prepared p = Prepare("man-types");
  EditJson(p.manifest, [](nlohmann::json& j) {
    j["source"]["shards"][0]["index"] = "0";
    j["source"]["shards"][1]["size"] = "big";
    j["source"]["shards"][2]["metadata_nbytes"] = "many";
    j["source"]["tensors"][0]["shard_index"] = "first";
  });
  doctor::Report r;
  ASSERT_NO_THROW(r = Scaled({p.manifest.string()}));
  EXPECT_EQ(r.ExitCode(), 1) << Dump(r);
  ASSERT_TRUE(r.Has("manifest-invalid")) << Dump(r);
  std::string invalid;
  for (const auto* f : r.With("manifest-invalid")) invalid += f->object + ": " + f->message + "\n";
  for (const char* field : {"index", "size", "metadata_nbytes"}) {
    EXPECT_NE(invalid.find(field), std::string::npos) << field << "\n" << Dump(r);
  }
}

// 40 + 152 x index_count was computed in uint64 unchecked: this count wraps
// it to 80 bytes, which hashed and read as a digest mismatch.
TEST(DoctorManifest, AnIndexCountPastAnyFileIsATruncatedIndex) {
  Prepared p = Prepare("man-index-count");
  EditJson(p.manifest, [](nlohmann::json& j) { j["expert_pack"]["index_count"] = uint64_t{121360158379668103}; });
  doctor::Report r;
  ASSERT_NO_THROW(r = Scaled({p.manifest.string()}));
  EXPECT_FALSE(r.Has("pack-index-digest")) << Dump(r);
  bool truncated = false;
  for (const auto* f : r.With("pack-invalid")) truncated |= f->message.find("index_count") != std::string::npos;
  EXPECT_TRUE(truncated) << Dump(r);
}

TEST(DoctorManifest, NotJsonIsUnusable) {
  auto dir = TempDir("man-junk");
  { std::ofstream(dir / "m.json") << "{ not json"; }
  doctor::Report r = doctor::Diagnose({(dir / "m.json").string()});
  EXPECT_EQ(r.ExitCode(), 1) << Dump(r);  // unusable input is a bad input (exit 1)
  EXPECT_EQ(r.ToJson()["status"], "unusable");
  EXPECT_TRUE(r.Has("input-unrecognized"));
}

// A manifest cut off mid-write was told "not a JSON object": the parser's
// position says it stops parsing, and where.
TEST(DoctorManifest, ACutOffManifestSaysWhereItStopsParsing) {
  auto dir = TempDir("man-cut");
  { std::ofstream(dir / "m.manifest.json") << "{\"format\": \"SGLANG-KIMI"; }
  { std::ofstream(dir / "list.json") << "[1, 2]"; }
  doctor::Report cut = doctor::Diagnose({(dir / "m.manifest.json").string()});
  ASSERT_TRUE(cut.Has("input-unrecognized")) << Dump(cut);
  const std::string message = cut.With("input-unrecognized").front()->message;
  EXPECT_NE(message.find("not valid JSON"), std::string::npos) << message;
  EXPECT_NE(message.find("line 1"), std::string::npos) << message;
  EXPECT_EQ(message.find("json.exception"), std::string::npos) << message;
  doctor::Report list = doctor::Diagnose({(dir / "list.json").string()});
  ASSERT_TRUE(list.Has("input-unrecognized")) << Dump(list);
  EXPECT_EQ(list.With("input-unrecognized").front()->message, "not a JSON object");
}

// Doctor's manifest checks are the loaders' own rules (manifest/loader_rules):
// where its restated copies differed from what the store and the non-expert
// loader do, it now says what they say.
TEST(DoctorManifest, LoaderRulesAreTheLoadersOwn) {
  Prepared p = Prepare("man-rules");
  const nlohmann::json good = nlohmann::json::parse(ReadAll(p.manifest));
  auto diagnose_with = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = good;
    edit(j);
    std::ofstream(p.manifest, std::ios::trunc) << j.dump(2);
    return Scaled({p.manifest.string()});
  };
  // `complete` is Python's truth value: 1 is complete for both loaders (doctor
  // used to want the boolean true), "" is not.
  doctor::Report r = diagnose_with([](nlohmann::json& j) { j["complete"] = 1; });
  EXPECT_FALSE(r.Has("manifest-incomplete")) << Dump(r);
  r = diagnose_with([](nlohmann::json& j) { j["complete"] = ""; });
  ASSERT_TRUE(r.Has("manifest-incomplete")) << Dump(r);
  EXPECT_EQ(r.With("manifest-incomplete")[0]->sglang_error, "Kimi-K3 manifest is incomplete");
  // No hard_constraints: the store's "do not match" (doctor said KeyError 'hard_constraints').
  r = diagnose_with([](nlohmann::json& j) { j.erase("hard_constraints"); });
  ASSERT_TRUE(r.Has("manifest-hard-constraints")) << Dump(r);
  EXPECT_EQ(r.With("manifest-hard-constraints")[0]->sglang_error,
            "Kimi manifest hard constraints do not match runtime policy");
  EXPECT_FALSE(r.Has("manifest-invalid")) << Dump(r);
  // Scaled: a top-k above the expert count, which the store refuses under
  // every profile (doctor checked dimensions under kimi-k3 only).
  r = diagnose_with([](nlohmann::json& j) { j["model"]["num_experts_per_token"] = 17; });
  ASSERT_TRUE(r.Has("manifest-dimensions")) << Dump(r);
  // (The tuples are equal: the store's own words say what is wrong, where
  // "(4, 16, 17) != (4, 16, 17)" named nothing.)
  EXPECT_EQ(r.With("manifest-dimensions")[0]->sglang_error,
            "model.num_experts 16 and num_experts_per_token 17 are not dimensions k3pack serves: 1..65536 experts "
            "and a top-k of 1 to the expert count");
  // The unedited manifest is healthy again.
  r = diagnose_with([](nlohmann::json&) {});
  EXPECT_EQ(r.ExitCode(), 0) << Dump(r);
}

// Doctor said "healthy" (exit 0) of manifests every reader refused for
// reasons its own copies of their rules did not name. The readers' own
// opens now run last, when nothing else found an error.
TEST(DoctorManifest, AManifestAReaderRefusesIsNeverHealthy) {
  Prepared p = Prepare("man-refused");
  const std::string good = ReadAll(p.manifest);
  ASSERT_EQ(Scaled({p.manifest.string()}).ExitCode(), 0);
  auto diagnose_text = [&](const std::string& text) {
    std::ofstream(p.manifest, std::ios::trunc | std::ios::binary) << text;
    return Scaled({p.manifest.string()});
  };
  auto diagnose_with = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = nlohmann::json::parse(good);
    edit(j);
    return diagnose_text(j.dump(2));
  };
  std::vector<std::pair<std::string, doctor::Report>> cases;
  cases.emplace_back("a UTF-8 BOM", diagnose_text("\xEF\xBB\xBF" + good));
  cases.emplace_back("no data_start", diagnose_with([](nlohmann::json& j) { j["expert_pack"].erase("data_start"); }));
  cases.emplace_back("no roles", diagnose_with([](nlohmann::json& j) { j["expert_pack"].erase("roles"); }));
  cases.emplace_back("a null pack path", diagnose_with([](nlohmann::json& j) { j["expert_pack"]["path"] = nullptr; }));
  for (const auto& [what, r] : cases) {
    SCOPED_TRACE(what);
    EXPECT_NE(r.ExitCode(), 0) << Dump(r);
    EXPECT_FALSE(r.findings.empty()) << Dump(r);
  }
  EXPECT_TRUE(cases[0].second.Has("manifest-refused")) << Dump(cases[0].second);
  EXPECT_EQ(diagnose_text(good).ExitCode(), 0);
}

}  // namespace
}  // namespace dtest
