// End to end: `k3pack manifest` on the tiny synthetic model against an
// independent Python reimplementation of SGLang's create_manifest
// (sglang_manifest_ref.py), plus every §6.1 error that applies.
#include <gtest/gtest.h>

#include <filesystem>

#include "k3pack/manifest.h"
#include "manifest/pyjson.h"
#include "util/sha256.h"
#include "test_util.h"

namespace fs = std::filesystem;
using k3test::Bin;
using k3test::RunCmd;
using k3test::ShellQuote;
using nlohmann::json;

namespace {

// One synthetic model + pack shared by the suite (built once, read-only).
struct Paths {
  std::string gguf_dir, config, tokenizer, pack;
};
struct Model : Paths {
  k3test::TempDir root{"k3manifest-model"};
};
Model* g_model = nullptr;

bool MakeModel(const std::string& dir, const std::string& extra, std::string* log) {
  auto r = RunCmd(Bin() + " synth --preset tiny --out " + ShellQuote(dir) + " " + extra);
  *log = r.out;
  return r.rc == 0;
}

std::string PackCmd(const std::string& gguf_dir, const std::string& config, const std::string& out) {
  return Bin() + " pack --profile scaled --progress none --gguf-dir " + ShellQuote(gguf_dir) + " --model-config " +
         ShellQuote(config) + " --out " + ShellQuote(out);
}

std::string ManifestCmd(const Paths& m, const std::string& out, const std::string& extra = "--profile scaled") {
  return Bin() + " manifest --progress none --gguf-dir " + ShellQuote(m.gguf_dir) + " --expert-pack " +
         ShellQuote(m.pack) + " --model-config " + ShellQuote(m.config) + " --tokenizer-dir " +
         ShellQuote(m.tokenizer) + " --output " + ShellQuote(out) + " --json --force " + extra;
}

class ManifestE2E : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    g_model = new Model;
    Model& m = *g_model;
    m.gguf_dir = m.root / "model";
    std::string log;
    ASSERT_TRUE(MakeModel(m.gguf_dir, "--shards 3", &log)) << log;
    m.config = m.gguf_dir + "/config.json";
    m.tokenizer = m.gguf_dir + "/tokenizer";
    // Tokenizer edge cases: a non-ASCII name, a symlink (followed), a
    // sub-directory (skipped) and a broken link (skipped).
    k3test::WriteFile(m.tokenizer + "/\xc3\xa9t\xc3\xa9.txt", "caf\xc3\xa9\n");
    fs::create_symlink(m.tokenizer + "/config.json", m.tokenizer + "/linked.json");
    fs::create_directory(m.tokenizer + "/subdir");
    k3test::WriteFile(m.tokenizer + "/subdir/ignored.txt", "x");
    fs::create_symlink(m.tokenizer + "/nowhere", m.tokenizer + "/broken-link");
    fs::create_directory(m.root / "pack");
    m.pack = m.root / "pack/KIMI-K3-SYNTH.expert-major.pack";
    auto r = RunCmd(PackCmd(m.gguf_dir, m.config, m.pack));
    ASSERT_EQ(r.rc, 0) << r.out;
  }
  static void TearDownTestSuite() {
    delete g_model;
    g_model = nullptr;
  }
};

// Runs the Python reference with our created_at / git sha and returns its bytes.
std::string ReferenceManifest(const Paths& m, const json& ours, const std::string& extra) {
  k3test::TempDir dir;
  const std::string out = dir / "ref.json";
  auto r = RunCmd(k3test::Python() + " " + ShellQuote(k3test::SourceFile("tests/manifest/sglang_manifest_ref.py")) +
                  " --gguf-dir " + ShellQuote(m.gguf_dir) + " --expert-pack " + ShellQuote(m.pack) +
                  " --model-config " + ShellQuote(m.config) + " --tokenizer-dir " + ShellQuote(m.tokenizer) +
                  " --output " + ShellQuote(out) + " --created-at " + ShellQuote(ours["created_at"].get<std::string>()) +
                  " --git-sha " + ShellQuote(ours["sglang_git_sha"].get<std::string>()) + " " + extra);
  EXPECT_EQ(r.rc, 0) << r.out;
  return k3test::ReadFile(out);
}

}  // namespace

TEST_F(ManifestE2E, ByteIdenticalToPythonReference) {
  const Model& m = *g_model;
  k3test::TempDir dir;
  struct Case { std::string flags, ref_flags; };
  const Case cases[] = {
      // Whole-shard hashes are k3pack's default (SGLang's --full-source-hashes).
      {"--profile scaled", "--profile scaled --full-source-hashes"},
      {"--profile scaled --no-full-source-hashes", "--profile scaled"},
      {"--profile scaled --payload-samples 3 --full-source-hashes --full-pack-hash",
       "--profile scaled --payload-samples 3 --full-source-hashes --full-pack-hash"},
      {"--profile scaled --payload-samples 0 --no-full-source-hashes", "--profile scaled --payload-samples 0"},
      {"--profile scaled --payload-samples 1 --no-full-source-hashes", "--profile scaled --payload-samples 1"},
      {"--profile scaled --payload-samples 100000 --no-full-source-hashes",
       "--profile scaled --payload-samples 100000"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.flags);
    const std::string out = dir / "m.json";
    auto r = RunCmd(ManifestCmd(m, out, c.flags), false);
    ASSERT_EQ(r.rc, 0) << r.out;
    const std::string ours = k3test::ReadFile(out);
    json doc = json::parse(ours);
    const std::string ref = ReferenceManifest(m, doc, c.ref_flags);
    ASSERT_FALSE(ref.empty());
    EXPECT_EQ(ours, ref);
    EXPECT_FALSE(fs::exists(out + ".tmp"));

    // The printed summary (§8.2) agrees with the file.
    json summary = json::parse(r.out);
    EXPECT_EQ(summary["manifest"], fs::canonical(out).string());
    EXPECT_EQ(summary["format"], "SGLANG-KIMI-GGMLMOEPACK-ADAPTER-v1");
    EXPECT_EQ(summary["source_shards"], 3);
    EXPECT_EQ(summary["source_tensors"], doc["source"]["summary"]["tensor_count"]);
    EXPECT_EQ(summary["pack_entries"], doc["expert_pack"]["index_count"]);
    EXPECT_EQ(summary["pack_index_sha256"], doc["expert_pack"]["index_sha256"]);
    EXPECT_EQ(summary["top_k"], 4);
    EXPECT_EQ(summary["payload_samples_verified"], doc["expert_pack"]["payload_samples_verified"]);
    EXPECT_EQ(summary.size(), 8u);
  }
}

// Other shapes: one shard and top-2; top-16 with IQ expert types. SGLang's
// hard_constraints.top_k is the literal 16 on every one of them.
TEST_F(ManifestE2E, ByteIdenticalOnOtherShapes) {
  const std::string shapes[] = {"--shards 1 --top-k 2",
                                "--shards 2 --top-k 16 --expert-types IQ2_XXS,IQ2_XXS,IQ3_XXS"};
  for (const std::string& shape : shapes) {
    SCOPED_TRACE(shape);
    Model sm;
    sm.gguf_dir = sm.root / "model";
    std::string log;
    ASSERT_TRUE(MakeModel(sm.gguf_dir, shape, &log)) << log;
    sm.config = sm.gguf_dir + "/config.json";
    sm.tokenizer = sm.gguf_dir + "/tokenizer";
    sm.pack = sm.root / "shape.expert-major.pack";
    auto r = RunCmd(PackCmd(sm.gguf_dir, sm.config, sm.pack));
    ASSERT_EQ(r.rc, 0) << r.out;
    const std::string out = sm.root / "m.json";
    r = RunCmd(ManifestCmd(sm, out), false);
    ASSERT_EQ(r.rc, 0) << r.out;
    const std::string ours = k3test::ReadFile(out);
    json doc = json::parse(ours);
    EXPECT_EQ(doc["hard_constraints"]["top_k"], 16);
    EXPECT_NE(doc["model"]["num_experts_per_token"], 4);  // not the tiny default: the shape took effect
    // Whole-shard hashes are the default: SGLang's tool with --full-source-hashes.
    EXPECT_EQ(ours, ReferenceManifest(sm, doc, "--profile scaled --full-source-hashes"));
  }
}

TEST_F(ManifestE2E, FieldsAndTypedReader) {
  const Model& m = *g_model;
  k3test::TempDir dir;
  auto r = RunCmd(ManifestCmd(m, dir / "m.json"), false);
  ASSERT_EQ(r.rc, 0) << r.out;
  auto parsed = k3pack::manifest::ReadManifest(dir / "m.json");
  ASSERT_TRUE(parsed.ok()) << parsed.error().message();
  const auto& mf = *parsed;
  EXPECT_TRUE(mf.complete);
  EXPECT_EQ(mf.format, "SGLANG-KIMI-GGMLMOEPACK-ADAPTER-v1");
  EXPECT_EQ(mf.sglang_git_sha.rfind("k3pack-", 0), 0u);
  // created_at: Python isoformat, UTC.
  EXPECT_TRUE(mf.created_at.size() == 25 || mf.created_at.size() == 32) << mf.created_at;
  EXPECT_EQ(mf.created_at.substr(mf.created_at.size() - 6), "+00:00");
  // SGLang's literal top_k 16 although this model routes to 4 experts: the
  // runtime top-k lives in model.num_experts_per_token / expert_pack.top_k.
  EXPECT_EQ(mf.hard_constraints, k3pack::manifest::HardConstraintsJson());
  EXPECT_EQ(mf.hard_constraints["top_k"], 16);
  EXPECT_EQ(mf.model.num_experts_per_token, 4u);
  EXPECT_EQ(mf.expert_pack.top_k, 4u);
  EXPECT_EQ(mf.model.architecture, "KimiLinearForCausalLM");
  EXPECT_EQ(mf.model.active_moe_layer_ids, (std::vector<uint32_t>{1, 2, 3}));
  EXPECT_EQ(mf.source.shards.size(), 3u);
  for (size_t i = 0; i < mf.source.shards.size(); ++i) EXPECT_EQ(mf.source.shards[i].index, i);
  // Whole-shard hashes are the default now.
  ASSERT_TRUE(mf.source.shards[0].sha256.has_value());
  EXPECT_EQ(*mf.source.shards[0].sha256, *k3pack::Sha256File(mf.source.shards[0].path));
  EXPECT_TRUE(mf.source.summary.full_source_hashes);
  for (size_t i = 1; i < mf.source.tensors.size(); ++i) {
    EXPECT_LT(mf.source.tensors[i - 1].name, mf.source.tensors[i].name);
  }
  EXPECT_EQ(mf.expert_pack.physical_role_order, (std::vector<std::string>{"up", "gate", "down"}));
  EXPECT_EQ(mf.expert_pack.index_count, 3u * 16u * 3u);
  EXPECT_EQ(mf.expert_pack.roles[2].dtype, "Q3_K");
  ASSERT_TRUE(mf.k3pack.has_value());
  EXPECT_EQ(mf.k3pack->profile, "scaled");
  ASSERT_EQ(mf.k3pack->layer_roles.size(), 3u);
  EXPECT_EQ(mf.k3pack->layer_roles[0].layer, 1u);
  EXPECT_EQ(mf.profile(), k3pack::kimi::Profile::kScaled);
  // Tokenizer: sorted by name; symlink followed; directory and broken link skipped.
  std::vector<std::string> names;
  for (const auto& f : mf.tokenizer.files) names.push_back(f.name);
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  EXPECT_NE(std::find(names.begin(), names.end(), "linked.json"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "\xc3\xa9t\xc3\xa9.txt"), names.end());
  EXPECT_EQ(std::find(names.begin(), names.end(), "subdir"), names.end());
  EXPECT_EQ(std::find(names.begin(), names.end(), "broken-link"), names.end());
  // Digests recomputed independently by python3 from the written file.
  const std::string script =
      "import hashlib,json,sys\n"
      "m=json.load(open(sys.argv[1],encoding='utf-8'))\n"
      "c=lambda v: hashlib.sha256(json.dumps(v,ensure_ascii=False,sort_keys=True,separators=(',',':')).encode()).hexdigest()\n"
      "s=dict(m['source']); inv=s.pop('inventory_sha256')\n"
      "assert c(s)==inv, 'source inventory'\n"
      "assert c(m['tokenizer']['files'])==m['tokenizer']['inventory_sha256'], 'tokenizer inventory'\n"
      "p=m['expert_pack']; d=open(p['path'],'rb').read(40+152*p['index_count'])\n"
      "assert hashlib.sha256(d).hexdigest()==p['index_sha256'], 'index'\n"
      "assert hashlib.sha256(open(m['model']['config_path'],'rb').read()).hexdigest()==m['model']['config_sha256']\n"
      "for sh in m['source']['shards']:\n"
      "  b=open(sh['path'],'rb').read(sh['metadata_nbytes'])\n"
      "  assert hashlib.sha256(b).hexdigest()==sh['metadata_sha256'], sh['path']\n"
      "print('ok')\n";
  k3test::WriteFile(dir / "check.py", script);
  auto py = RunCmd(k3test::Python() + " " + ShellQuote(dir / "check.py") + " " + ShellQuote(dir / "m.json"));
  EXPECT_EQ(py.rc, 0) << py.out;
  EXPECT_EQ(py.out, "ok\n");
}

TEST_F(ManifestE2E, ErrorsSurfaceWithSglangTexts) {
  const Model& m = *g_model;
  k3test::TempDir dir;
  const std::string out = dir / "m.json";
  struct Case { std::string what, cmd, expect; };
  // Config copies with a missing key / wrong values.
  json cfg = json::parse(k3test::ReadFile(m.config));
  json& text = cfg.contains("text_config") ? cfg["text_config"] : cfg;
  json missing = cfg;
  (missing.contains("text_config") ? missing["text_config"] : missing).erase("num_experts");
  k3test::WriteFile(dir / "missing.json", missing.dump());
  json wrong_experts = cfg;
  (wrong_experts.contains("text_config") ? wrong_experts["text_config"] : wrong_experts)["num_experts"] =
      text["num_experts"].get<int>() / 2;
  k3test::WriteFile(dir / "wrong_experts.json", wrong_experts.dump());
  fs::create_directory(dir / "empty");

  auto with = [&](auto mutate, const std::string& extra = "--profile scaled") {
    Paths c = m;
    mutate(c);
    return ManifestCmd(c, out, extra);
  };
  const Case cases[] = {
      {"negative samples", ManifestCmd(m, out, "--profile scaled --payload-samples -1"),
       "--payload-samples must be non-negative"},
      {"audited profile on the tiny model", ManifestCmd(m, out, "--profile kimi-k3"),
       "Kimi K3 model invariants do not match the audited model: expected={'num_hidden_layers': 93, "
       "'first_k_dense_replace': 1, 'num_experts': 896, 'top_k': 16, 'num_shared_experts': 2, 'hidden_size': 7168, "
       "'routed_expert_hidden_size': 3584, 'moe_intermediate_size': 3072, 'hidden_act': 'situ'}, actual={"},
      {"missing config key", with([&](Paths& c) { c.config = dir / "missing.json"; }), "error: 'num_experts'"},
      {"GGUF disagrees with config", with([&](Paths& c) { c.config = dir / "wrong_experts.json"; }),
       "GGUF metadata kimi-k3.expert_count=16 disagrees with model config num_experts=8"},
      {"no shards", with([&](Paths& c) { c.gguf_dir = dir / "empty"; }), "no GGUF files found in"},
      {"missing pack", with([&](Paths& c) { c.pack = dir / "nope.pack"; }), "nope.pack"},
      {"missing tokenizer dir", with([&](Paths& c) { c.tokenizer = dir / "no-tokenizer"; }), "no-tokenizer"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    auto r = RunCmd(c.cmd);
    EXPECT_EQ(r.rc, c.what == "negative samples" ? 2 : 1) << r.out;  // a bad value is a usage error
    EXPECT_NE(r.out.find(c.expect), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(out)) << "no manifest may be written on failure";
  }
}

TEST_F(ManifestE2E, ShardAndExpertFaultsSurface) {
  k3test::TempDir dir;
  struct Case { std::string fault, expect; };
  const Case cases[] = {
      {"bad-split-no", "GGUF split.no mismatch for "},
      {"missing-expert", "routed expert tensor coverage mismatch: missing=[(3, 'gate')], extra=[]"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.fault);
    Model fm;
    fm.gguf_dir = fm.root / "model";
    std::string log;
    ASSERT_TRUE(MakeModel(fm.gguf_dir, "--fault " + c.fault, &log)) << log;
    fm.config = fm.gguf_dir + "/config.json";
    fm.tokenizer = fm.gguf_dir + "/tokenizer";
    fm.pack = g_model->pack;  // a valid pack of the clean model
    auto r = RunCmd(ManifestCmd(fm, dir / "m.json"));
    EXPECT_EQ(r.rc, 1) << r.out;
    EXPECT_NE(r.out.find(c.expect), std::string::npos) << r.out;
  }
}

TEST_F(ManifestE2E, CorruptPackSurfacesValidatorText) {
  const Model& m = *g_model;
  k3test::TempDir dir;
  Paths c = m;
  c.pack = dir / "bad.pack";
  fs::copy_file(m.pack, c.pack);
  {
    std::fstream f(c.pack, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(0);
    f.write("X", 1);
  }
  auto r = RunCmd(ManifestCmd(c, dir / "m.json"));
  EXPECT_EQ(r.rc, 1);
  EXPECT_NE(r.out.find("GGML expert-pack magic or version does not match"), std::string::npos) << r.out;
}

TEST_F(ManifestE2E, BuildCommandPacksThenWritesManifest) {
  k3test::TempDir dir;
  Model b;
  b.gguf_dir = b.root / "model";
  std::string log;
  ASSERT_TRUE(MakeModel(b.gguf_dir, "--shards 2", &log)) << log;
  b.config = b.gguf_dir + "/config.json";
  b.tokenizer = b.gguf_dir + "/tokenizer";
  b.pack = dir / "out.pack";
  const std::string cmd = Bin() + " build --profile scaled --progress none --json --gguf-dir " +
                          ShellQuote(b.gguf_dir) + " --model-config " + ShellQuote(b.config) + " --tokenizer-dir " +
                          ShellQuote(b.tokenizer) + " --out " + ShellQuote(b.pack) + " --manifest " +
                          ShellQuote(dir / "m.json");
  auto r = RunCmd(cmd, false);
  ASSERT_EQ(r.rc, 0) << r.out;
  json s = json::parse(r.out);
  EXPECT_EQ(s["pack_reused"], false);
  EXPECT_EQ(s["source_shards"], 2);
  const std::string first = k3test::ReadFile(dir / "m.json");
  json doc = json::parse(first);
  // Whole-shard hashes are the default, computed beside the copy: the same
  // bytes as SGLang's tool with --full-source-hashes.
  EXPECT_EQ(first, ReferenceManifest(b, doc, "--profile scaled --full-source-hashes"));
  // Second run: pack and manifest are finished, nothing is written.
  r = RunCmd(cmd, false);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(json::parse(r.out)["already_built"], true);
  // The manifest under the key a fresh run names it by, as well as `path`.
  EXPECT_EQ(json::parse(r.out)["manifest"], s["manifest"]);
  EXPECT_EQ(json::parse(r.out)["path"], s["manifest"]);
  EXPECT_EQ(k3test::ReadFile(dir / "m.json"), first);
  // Without the manifest: the pack is validated and reused.
  fs::remove(dir / "m.json");
  r = RunCmd(cmd, false);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(json::parse(r.out)["pack_reused"], true);
}

TEST(ManifestRead, MissingKeysAndWrongTypes) {
  k3test::TempDir dir;
  auto r = k3pack::manifest::ReadManifestJson(dir / "none.json");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().kind(), k3pack::ErrorKind::kFileNotFound);
  k3test::WriteFile(dir / "bad.json", "{\"complete\": tru");
  r = k3pack::manifest::ReadManifestJson(dir / "bad.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("bad.json"), std::string::npos);

  auto m = k3pack::manifest::ParseManifest(json{{"complete", true}});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().kind(), k3pack::ErrorKind::kKey);
  EXPECT_EQ(m.error().message(), "'format'");

  json shard = {{"index", 0}, {"path", "/x"}, {"size", -5}, {"metadata_nbytes", 1},
                {"metadata_sha256", "a"}, {"tensor_count", 1}};
  auto s = k3pack::manifest::ParseShardRecord(shard);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().message(), "manifest shard.size: expected an unsigned integer");
  shard["size"] = 10;
  s = k3pack::manifest::ParseShardRecord(shard);
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE(s->sha256.has_value());
  shard["sha256"] = "ff";
  EXPECT_EQ(k3pack::manifest::ParseShardRecord(shard)->sha256, "ff");
  auto t = k3pack::manifest::ParseTensorRecord(json{{"name", "x"}});
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.error().message(), "'shape'");
}

// The real dimensions under the strict profile: 93 layers, 896 experts,
// 19 shards, 247,296 pack entries (tensor data as sparse holes), built and
// described by `k3pack build`, then checked byte for byte against the
// Python reference: exactly SGLang's keys, no "k3pack" extension.
TEST(ManifestFullScale, K3StructureUnderKimiK3ProfileMatchesPython) {
  k3test::TempDir dir("k3manifest-k3s");
  Paths p;
  p.gguf_dir = dir / "model";
  auto r = RunCmd(Bin() + " synth --preset k3-structure --out " + ShellQuote(p.gguf_dir));
  ASSERT_EQ(r.rc, 0) << r.out;
  p.config = p.gguf_dir + "/config.json";
  p.tokenizer = p.gguf_dir + "/tokenizer";
  p.pack = dir / "KIMI-K3.expert-major.pack";
  // --no-full-source-hashes: SGLang's default manifest (compared below), and
  // no hashing of ~1 TB of sparse shards.
  r = RunCmd(Bin() + " build --progress none --json --no-full-source-hashes --gguf-dir " + ShellQuote(p.gguf_dir) +
                 " --model-config " +
                 ShellQuote(p.config) + " --tokenizer-dir " + ShellQuote(p.tokenizer) + " --out " +
                 ShellQuote(p.pack) + " --manifest " + ShellQuote(dir / "m.json"),
             false);
  ASSERT_EQ(r.rc, 0) << r.out;
  json s = json::parse(r.out);
  EXPECT_EQ(s["pack_entries"], 247296);
  EXPECT_EQ(s["top_k"], 16);
  EXPECT_EQ(s["source_shards"], 19);
  EXPECT_EQ(s["pack_size"], 985613049856ULL);
  const std::string ours = k3test::ReadFile(dir / "m.json");
  json doc = json::parse(ours);
  EXPECT_FALSE(doc.contains("k3pack"));
  EXPECT_EQ(doc["hard_constraints"], k3pack::manifest::HardConstraintsJson());
  EXPECT_EQ(doc["expert_pack"]["data_start"], 37593088);
  EXPECT_EQ(doc["expert_pack"]["object_bytes"], 11956224);
  EXPECT_EQ(doc["expert_pack"]["roles"]["down"]["payload_bytes"], 389975900160ULL);
  EXPECT_EQ(ours, ReferenceManifest(p, doc, "--profile kimi-k3"));
  auto parsed = k3pack::manifest::ParseManifest(doc);
  ASSERT_TRUE(parsed.ok()) << parsed.error().message();
  EXPECT_EQ(parsed->profile(), k3pack::kimi::Profile::kKimiK3);
}

namespace k3pack::manifest {
namespace {

TEST(ManifestExtension, ReadsTheRankOfAnExpertParallelPack) {
  nlohmann::json m = {{"k3pack", {{"profile", "kimi-k3"}, {"ep", {{"size", 4}, {"rank", 2}, {"first_expert", 448}, {"end_expert", 672}}}}}};
  auto ext = ParseK3packExtension(m);
  ASSERT_TRUE(ext.ok()) << ext.error().message();
  ASSERT_TRUE(ext->has_value());
  EXPECT_FALSE((*ext)->scaled());
  ASSERT_TRUE((*ext)->ep.has_value());
  EXPECT_EQ((*ext)->ep->rank, 2u);
  EXPECT_EQ((*ext)->ep->end_expert, 672u);

  m["k3pack"]["ep"]["first_expert"] = 440;  // not rank 2's block
  auto edited = ParseK3packExtension(m);
  ASSERT_FALSE(edited.ok());
  EXPECT_NE(edited.error().message().find("not the block EP rank 2 of 4 owns"), std::string::npos);
}

}  // namespace
}  // namespace k3pack::manifest
