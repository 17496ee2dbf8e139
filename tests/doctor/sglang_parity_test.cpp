// Every model-level fault SGLang's scan, spec, expert, manifest-iterator and
// model stages reject (spec §3, §4, §6.1, §6.4) gets a doctor finding whose
// `SGLang:` line is SGLang's text verbatim, with this case's values. Each
// fault is built here from the clean tiny model (byte patches in place, or a
// rewrite of the set); docs/doctor.md lists the same mapping.
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <functional>

#include <nlohmann/json.hpp>

#include "doctor_test_util.h"
#include "k3pack/names.h"
#include "k3pack/store.h"

namespace dtest {
namespace {

using doctor::Report;
using synth::Fault;

std::string Real(const fs::path& p) {
  auto r = ResolvePath(p.string());
  return r.ok() ? *r : p.string();
}

// The SGLang text of the finding with `code` (the first one; "" when none).
std::string Sglang(const Report& r, const std::string& code) {
  auto v = r.With(code);
  return v.empty() ? "<no " + code + " finding>" : v.front()->sglang_error;
}

fs::path Shard(const fs::path& dir, int number, int count = 3) {
  char name[64];
  std::snprintf(name, sizeof name, "KIMI-K3-SYNTH-%05d-of-%05d.gguf", number, count);
  return dir / name;
}

const gguf::KeyValue* FindKv(const gguf::GgufFile& f, const std::string& key) {
  for (const auto& kv : f.metadata()) {
    if (kv.key == key) return &kv;
  }
  return nullptr;
}

// Overwrites an integer metadata value in place (its own width).
void PatchIntKv(const fs::path& path, const std::string& key, int64_t value) {
  auto f = gguf::GgufFile::Open(path.string());
  ASSERT_TRUE(f.ok()) << f.error().message();
  const gguf::KeyValue* kv = FindKv(**f, key);
  ASSERT_NE(kv, nullptr) << key;
  const uint64_t at = kv->offset + 8 + kv->key.size() + 4;
  size_t width = 0;
  switch (static_cast<int>(kv->value.type)) {
    case 0: case 1: width = 1; break;
    case 2: case 3: width = 2; break;
    case 4: case 5: width = 4; break;
    case 10: case 11: width = 8; break;
    default: FAIL() << key << " is not an integer";
  }
  (*f).reset();
  WriteAt(path, at, &value, width);  // little-endian low bytes
}

// Renames a metadata key in place (same length).
void RenameKey(const fs::path& path, const std::string& key, const std::string& to) {
  ASSERT_EQ(key.size(), to.size());
  auto f = gguf::GgufFile::Open(path.string());
  ASSERT_TRUE(f.ok());
  const gguf::KeyValue* kv = FindKv(**f, key);
  ASSERT_NE(kv, nullptr) << key;
  const uint64_t at = kv->offset + 8;
  WriteAt(path, at, to.data(), to.size());
}

// Overwrites a string metadata value in place (same length).
void PatchStrKv(const fs::path& path, const std::string& key, const std::string& value) {
  auto f = gguf::GgufFile::Open(path.string());
  ASSERT_TRUE(f.ok());
  const gguf::KeyValue* kv = FindKv(**f, key);
  ASSERT_NE(kv, nullptr) << key;
  const gguf::Value* v = (*f)->Find(key);
  ASSERT_EQ(v->AsString().value_or("").size(), value.size());
  WriteAt(path, kv->offset + 8 + kv->key.size() + 4 + 8, value.data(), value.size());
}

// Renames a tensor in place (same length) / changes its type id in place.
void RenameTensor(const fs::path& path, const std::string& name, const std::string& to) {
  ASSERT_EQ(name.size(), to.size());
  auto f = gguf::GgufFile::Open(path.string());
  ASSERT_TRUE(f.ok());
  const gguf::TensorInfo* t = (*f)->FindTensor(name);
  ASSERT_NE(t, nullptr) << name;
  WriteAt(path, t->info_offset + 8, to.data(), to.size());
}
void RetypeTensor(const fs::path& path, const std::string& name, GgmlType type) {
  auto f = gguf::GgufFile::Open(path.string());
  ASSERT_TRUE(f.ok());
  const gguf::TensorInfo* t = (*f)->FindTensor(name);
  ASSERT_NE(t, nullptr) << name;
  const uint32_t id = static_cast<uint32_t>(type);
  WriteAt(path, t->info_offset + 8 + t->name.size() + 4 + 8 * t->n_dims, &id, 4);
}

// The shard holding `name`.
fs::path Holder(const fs::path& dir, const std::string& name) {
  for (int i = 1; i <= 3; ++i) {
    auto f = gguf::GgufFile::Open(Shard(dir, i).string());
    if (f.ok() && (*f)->FindTensor(name)) return Shard(dir, i);
  }
  return {};
}

const gguf::TensorInfo* Info(const fs::path& dir, const std::string& name,
                             std::shared_ptr<const gguf::GgufFile>* keep) {
  auto f = gguf::GgufFile::Open(Holder(dir, name).string());
  if (!f.ok()) return nullptr;
  *keep = *f;
  return (*keep)->FindTensor(name);
}

// Rewrites the clean set of `src` into `dst` letting `edit` change the tensor
// list (add, drop, retype) and each tensor's shard.
void RewriteSpecs(const fs::path& src, const fs::path& dst,
                  const std::function<void(std::vector<gguf::TensorSpec>&, std::vector<uint32_t>&)>& edit) {
  auto set = gguf::ShardSet::Open(src.string());
  ASSERT_TRUE(set.ok()) << set.error().message();
  const gguf::GgufFile& f0 = set->first();
  gguf::MetadataBuilder meta, per_shard;
  CopyShard0Metadata(f0, &meta, &per_shard);
  std::vector<gguf::TensorSpec> specs;
  std::vector<uint32_t> shard_of;
  for (const auto& loc : set->AllTensors()) {
    gguf::TensorSpec s;
    s.name = loc.info->name;
    s.type = loc.info->type;
    s.ne = loc.info->shape();
    auto data = set->shards()[loc.shard_index]->TensorData(*loc.info);
    auto keep = set->shards()[loc.shard_index];
    s.fill = [data, keep](uint64_t off, std::span<uint8_t> out) { std::memcpy(out.data(), data.data() + off, out.size()); };
    specs.push_back(std::move(s));
    shard_of.push_back(loc.shard_index);
  }
  edit(specs, shard_of);
  fs::create_directories(dst);
  auto paths = gguf::WriteGgufSplit(dst.string(), "KIMI-K3-SYNTH", meta, per_shard, specs, shard_of);
  ASSERT_TRUE(paths.ok()) << paths.error().message();
  fs::copy_file(src / "config.json", dst / "config.json");
}

gguf::TensorSpec* Spec(std::vector<gguf::TensorSpec>& specs, const std::string& name) {
  for (auto& s : specs) {
    if (s.name == name) return &s;
  }
  ADD_FAILURE() << "no tensor " << name;
  return &specs.front();
}

std::function<void(uint64_t, std::span<uint8_t>)> Bytes(std::vector<uint8_t> b) {
  auto p = std::make_shared<std::vector<uint8_t>>(std::move(b));
  return [p](uint64_t off, std::span<uint8_t> out) { std::memcpy(out.data(), p->data() + off, out.size()); };
}

struct Clean {
  fs::path dir;
  explicit Clean(const std::string& tag, const std::vector<Fault>& faults = {}) : dir(TempDir(tag)) {
    Synth(dir, faults);
  }
};

// ------------------------------------------------------------ scan (§3, §6.1)

TEST(SglangParity, Discovery) {
  auto empty = TempDir("p-empty");
  Report r = Scaled({empty.string()});
  EXPECT_EQ(Sglang(r, "no-gguf-files"), "no GGUF files found in " + Real(empty));

  Clean stray("p-stray");
  fs::copy_file(Shard(stray.dir, 1), stray.dir / "mmproj.gguf");
  r = Scaled({stray.dir.string()});
  EXPECT_EQ(Sglang(r, "stray-gguf"), "GGUF shard name does not contain NNNNN-of-NNNNN: " + Real(stray.dir / "mmproj.gguf"));

  Clean counts("p-counts");
  fs::rename(Shard(counts.dir, 3), Shard(counts.dir, 3, 4));
  r = Scaled({counts.dir.string()});
  EXPECT_EQ(Sglang(r, "shard-count-disagree"), "GGUF shard filenames disagree on split count: {3, 4}");

  Clean gap("p-gap");
  fs::remove(Shard(gap.dir, 2));
  r = Scaled({gap.dir.string()});
  EXPECT_EQ(Sglang(r, "shard-set-incomplete"), "GGUF shard set is incomplete: count=3, numbers=[1, 3]");
}

// Field audit (session 11): a second numbered set in the directory (another
// quantization with its own -of-NNNNN, or a renamed copy of one shard) fails
// SGLang's discovery, which takes every numbered *.gguf as one set; the
// finding carries that text, computed over all the files.
TEST(SglangParity, SeveralShardSetsCarryTheDiscoveryText) {
  Clean other("p-other-quant");
  fs::copy_file(Shard(other.dir, 1), other.dir / "KIMI-K3-Q1-00001-of-00002.gguf");
  Report r = Scaled({other.dir.string()});
  EXPECT_EQ(Sglang(r, "several-shard-sets"), "GGUF shard filenames disagree on split count: {2, 3}") << Dump(r);

  Clean copy("p-copy");
  fs::copy_file(Shard(copy.dir, 2), copy.dir / "Copy of KIMI-K3-SYNTH-00002-of-00003.gguf");
  r = Scaled({copy.dir.string()});
  EXPECT_EQ(Sglang(r, "several-shard-sets"), "GGUF shard set is incomplete: count=3, numbers=[1, 2, 2, 3]") << Dump(r);
  ASSERT_FALSE(r.With("several-shard-sets").empty());
  EXPECT_NE(r.With("several-shard-sets").front()->message.find("Copy of KIMI-K3-SYNTH-00002-of-00003.gguf"),
            std::string::npos);
}

TEST(SglangParity, SplitKeys) {
  Clean no("p-splitno");
  PatchIntKv(Shard(no.dir, 2), "split.no", 2);
  Report r = Scaled({no.dir.string()});
  EXPECT_EQ(Sglang(r, "split-no-mismatch"), "GGUF split.no mismatch for " + Real(Shard(no.dir, 2)) + ": 2 != 1");

  Clean meta("p-splitmeta");
  PatchIntKv(Shard(meta.dir, 2), "split.tensors.count", 7);
  r = Scaled({meta.dir.string()});
  EXPECT_EQ(Sglang(r, "split-metadata-mismatch"), "GGUF split metadata mismatch at " + Real(Shard(meta.dir, 2)));

  Clean missing("p-splitkey");
  RenameKey(Shard(missing.dir, 2), "split.count", "split.COUNT");
  r = Scaled({missing.dir.string()});
  EXPECT_EQ(Sglang(r, "split-key-missing"), "GGUF metadata is missing required field 'split.count'");

  Clean count("p-splitcount");
  for (int i = 1; i <= 3; ++i) PatchIntKv(Shard(count.dir, i), "split.count", 4);
  r = Scaled({count.dir.string()});
  EXPECT_EQ(Sglang(r, "split-count-mismatch"), "GGUF split.count=4, found 3 files");

  Clean stale("p-stale", {Fault::kStaleTensorCount});
  r = Scaled({stale.dir.string()});
  uint64_t total = 0;
  for (int i = 1; i <= 3; ++i) total += gguf::GgufFile::Open(Shard(stale.dir, i).string()).value()->tensors().size();
  EXPECT_EQ(Sglang(r, "split-tensor-count-mismatch"),
            "GGUF split.tensors.count=" + std::to_string(total + 1) + ", found " + std::to_string(total));

  // Before, doctor took a negative count for "no key" and called the set healthy.
  Clean negative("p-negative");
  for (int i = 1; i <= 3; ++i) PatchIntKv(Shard(negative.dir, i), "split.tensors.count", -1);
  r = Scaled({negative.dir.string()});
  EXPECT_EQ(Sglang(r, "split-tensor-count-mismatch"), "GGUF split.tensors.count=-1, found " + std::to_string(total));
  EXPECT_FALSE(gguf::ShardSet::Open(negative.dir.string()).ok());
}

TEST(SglangParity, ArchitectureInTheFirstShardOnly) {
  // llama.cpp's gguf-split layout: k3pack accepts it, SGLang's scanner does not.
  Clean c("p-arch1");
  RenameKey(Shard(c.dir, 2), "general.architecture", "general.ARCHITECTURE");
  RenameKey(Shard(c.dir, 3), "general.architecture", "general.ARCHITECTURE");
  EXPECT_TRUE(gguf::ShardSet::Open(c.dir.string()).ok());
  Report r = Scaled({c.dir.string()});
  auto fs = r.With("architecture-first-shard-only");
  ASSERT_EQ(fs.size(), 2u) << Dump(r);
  for (const doctor::Finding* f : fs) {
    EXPECT_EQ(f->sglang_error, "GGUF metadata is missing required field 'general.architecture'");
    EXPECT_EQ(f->severity, doctor::Severity::kError);
    EXPECT_NE(f->message.find("k3pack accepts this set"), std::string::npos) << f->message;
  }
  EXPECT_EQ(fs[0]->file, Shard(c.dir, 2).string());
  EXPECT_NE(std::string(fs[0]->fix).find("general.architecture = 'kimi-k3'"), std::string::npos);
  EXPECT_FALSE(r.Has("split-key-missing")) << Dump(r);

  Clean w("p-arch");
  for (int i = 1; i <= 3; ++i) PatchStrKv(Shard(w.dir, i), "general.architecture", "kimi-k4");
  r = Scaled({w.dir.string()});
  EXPECT_EQ(Sglang(r, "architecture-mismatch"), "expected GGUF architecture 'kimi-k3', got 'kimi-k4'");
}

TEST(SglangParity, DuplicateTensorAcrossShards) {
  Clean c("p-dup");
  // A tensor of shard 3 renamed to a same-length name that shard 1 holds.
  auto f1 = gguf::GgufFile::Open(Shard(c.dir, 1).string()).value();
  auto f3 = gguf::GgufFile::Open(Shard(c.dir, 3).string()).value();
  std::string from, to;
  for (const auto& a : f3->tensors()) {
    for (const auto& b : f1->tensors()) {
      if (a.name.size() == b.name.size() && a.name != b.name && !kimi::IsRoutedExpertAggregate(b.name)) {
        from = a.name, to = b.name;
        break;
      }
    }
    if (!from.empty()) break;
  }
  ASSERT_FALSE(from.empty());
  RenameTensor(Shard(c.dir, 3), from, to);
  Report r = Scaled({c.dir.string()});
  EXPECT_EQ(Sglang(r, "duplicate-tensor"), "duplicate GGUF tensor across shards: " + to);
}

// ----------------------------------------------------------------- spec (§4)

TEST(SglangParity, ConfigSpec) {
  Clean c("p-spec");
  auto cfg = nlohmann::json::parse(ReadAll(c.dir / "config.json"));
  nlohmann::json& text = cfg.contains("text_config") ? cfg["text_config"] : cfg;
  text.erase("num_experts");
  std::ofstream(c.dir / "config.json", std::ios::trunc) << cfg.dump(2);
  Report r = Scaled({c.dir.string()});
  auto f = r.With("config-invalid");
  ASSERT_FALSE(f.empty()) << Dump(r);
  EXPECT_EQ(f[0]->sglang_error, "'num_experts'");
  EXPECT_EQ(f[0]->sglang_exception, "KeyError");

  Clean k3("p-invariants");
  r = doctor::Diagnose({k3.dir.string()});
  EXPECT_EQ(Sglang(r, "config-invalid"),
            "Kimi K3 model invariants do not match the audited model: expected={'num_hidden_layers': 93, "
            "'first_k_dense_replace': 1, 'num_experts': 896, 'top_k': 16, 'num_shared_experts': 2, 'hidden_size': "
            "7168, 'routed_expert_hidden_size': 3584, 'moe_intermediate_size': 3072, 'hidden_act': 'situ'}, "
            "actual={'num_hidden_layers': 4, 'first_k_dense_replace': 1, 'num_experts': 16, 'top_k': 4, "
            "'num_shared_experts': 2, 'hidden_size': 512, 'routed_expert_hidden_size': 512, "
            "'moe_intermediate_size': 1024, 'hidden_act': 'situ'}");
}

// ------------------------------------------------------------ experts (§6.1)

TEST(SglangParity, ExpertCoverageAndDuplicates) {
  Clean c("p-exp");
  auto dup = TempDir("p-exp-dup");
  RewriteSpecs(c.dir, dup, [](auto& specs, auto& shard_of) {
    gguf::TensorSpec copy = *Spec(specs, "blk.1.ffn_up_exps.weight");
    copy.name = "blk.01.ffn_up_exps.weight";  // SGLang's int(layer) makes it layer 1 again
    specs.push_back(copy);
    shard_of.push_back(2);
  });
  Report r = Scaled({dup.string()});
  EXPECT_EQ(Sglang(r, "expert-duplicate"), "duplicate routed expert tensor (1, 'up')");

  auto extra = TempDir("p-exp-extra");
  RewriteSpecs(c.dir, extra, [](auto& specs, auto& shard_of) {
    gguf::TensorSpec copy = *Spec(specs, "blk.1.ffn_up_exps.weight");
    copy.name = "blk.0.ffn_up_exps.weight";  // layer 0 is dense
    specs.push_back(copy);
    shard_of.push_back(2);  // the writer takes shards in order
  });
  r = Scaled({extra.string()});
  EXPECT_EQ(Sglang(r, "expert-extra"), "routed expert tensor coverage mismatch: missing=[], extra=[(0, 'up')]");

  // SGLang keys a stack by int() of Python's `\d+`: an Arabic-Indic one is
  // layer 1 again; a layer past uint32 is kept whole (it was cut to 32 bits,
  // 4294967297 -> 1), and one past uint64 threw std::out_of_range here.
  auto unicode = TempDir("p-exp-unicode");
  RewriteSpecs(c.dir, unicode, [](auto& specs, auto& shard_of) {
    gguf::TensorSpec copy = *Spec(specs, "blk.1.ffn_up_exps.weight");
    copy.name = "blk.\u0661.ffn_up_exps.weight";
    specs.push_back(copy);
    shard_of.push_back(2);
  });
  r = Scaled({unicode.string()});
  EXPECT_EQ(Sglang(r, "expert-duplicate"), "duplicate routed expert tensor (1, 'up')") << Dump(r);
  auto wide = TempDir("p-exp-wide");
  RewriteSpecs(c.dir, wide, [](auto& specs, auto& shard_of) {
    gguf::TensorSpec copy = *Spec(specs, "blk.1.ffn_up_exps.weight");
    copy.name = "blk.4294967297.ffn_up_exps.weight";
    specs.push_back(copy);
    shard_of.push_back(2);
  });
  r = Scaled({wide.string()});
  EXPECT_EQ(Sglang(r, "expert-extra"),
            "routed expert tensor coverage mismatch: missing=[], extra=[(4294967297, 'up')]") << Dump(r);
  ASSERT_EQ(r.With("expert-extra").size(), 1u);
  EXPECT_EQ(r.With("expert-extra")[0]->object, "blk.4294967297.ffn_up_exps.weight");
  auto huge = TempDir("p-exp-huge");
  RewriteSpecs(c.dir, huge, [](auto& specs, auto& shard_of) {
    gguf::TensorSpec copy = *Spec(specs, "blk.1.ffn_up_exps.weight");
    copy.name = "blk.99999999999999999999.ffn_up_exps.weight";
    specs.push_back(copy);
    shard_of.push_back(2);
  });
  EXPECT_NO_THROW(r = Scaled({huge.string()}));
  // Python's int holds it, so SGLang lists it as extra; here it was no stack.
  EXPECT_EQ(Sglang(r, "expert-extra"),
            "routed expert tensor coverage mismatch: missing=[], extra=[(99999999999999999999, 'up')]") << Dump(r);
  ASSERT_EQ(r.With("expert-extra").size(), 1u);
  EXPECT_EQ(r.With("expert-extra")[0]->object, "blk.99999999999999999999.ffn_up_exps.weight");
  auto edge = TempDir("p-exp-edge");
  RewriteSpecs(c.dir, edge, [](auto& specs, auto& shard_of) {
    for (const char* name : {"blk.18446744073709551615.ffn_up_exps.weight", "blk.018446744073709551615.ffn_up_exps.weight"}) {
      gguf::TensorSpec copy = *Spec(specs, "blk.1.ffn_up_exps.weight");
      copy.name = name;
      specs.push_back(copy);
      shard_of.push_back(2);
    }
  });
  r = Scaled({edge.string()});
  EXPECT_EQ(Sglang(r, "expert-duplicate"), "duplicate routed expert tensor (18446744073709551615, 'up')") << Dump(r);
  EXPECT_EQ(Sglang(r, "expert-extra"),
            "routed expert tensor coverage mismatch: missing=[], extra=[(18446744073709551615, 'up')]") << Dump(r);

  Clean missing("p-exp-missing", {Fault::kMissingExpert});
  r = Scaled({missing.dir.string()});
  EXPECT_EQ(Sglang(r, "expert-missing"), "routed expert tensor coverage mismatch: missing=[(3, 'gate')], extra=[]");

  auto shape = TempDir("p-exp-shape");
  RewriteSpecs(c.dir, shape, [](auto& specs, auto&) {
    Spec(specs, "blk.2.ffn_down_exps.weight")->ne = {512, 1024, 16};  // same bytes, up's shape
  });
  r = Scaled({shape.string()});
  EXPECT_EQ(Sglang(r, "expert-shape"), "unexpected expert shape for (2, 'down'): (512, 1024, 16)");
}

TEST(SglangParity, ExpertDtypeNamesTheOddTensor) {
  // Issue 11.4: layer 1's up is Q4_K, every other up/gate Q2_K. SGLang names
  // (1, 'up'); taking the first tensor's type as the reference named a
  // healthy gate instead. Same text from doctor and from `k3pack pack`.
  auto dir = TempDir("p-dtype");
  auto o = synth::PresetOptions("tiny").value();
  o.out_dir = dir.string();
  o.layer_expert_types[1] = {GgmlType::Q4_K, GgmlType::Q2_K, GgmlType::Q3_K};
  ASSERT_TRUE(synth::WriteSynthModel(o).ok());
  Report r = Scaled({dir.string()});
  EXPECT_EQ(Sglang(r, "expert-dtype"), "unexpected expert dtype for (1, 'up'): Q4_K");
  EXPECT_EQ(r.With("expert-dtype").size(), 1u) << Dump(r);
  auto cli = RunCli("pack --profile scaled --progress none --safety-margin-gib 0 --gguf-dir " + dir.string() +
                    " --model-config " + (dir / "config.json").string() + " --out " + (dir / "x.pack").string() +
                    " 2>&1");
  EXPECT_EQ(cli.exit_code, 1);
  EXPECT_NE(cli.out.find("unexpected expert dtype for (1, 'up'): Q4_K\n"), std::string::npos) << cli.out;

  Clean gate("p-dtype-gate", {Fault::kWrongExpertDtype});
  std::shared_ptr<const gguf::GgufFile> keep;
  const gguf::TensorInfo* t = Info(gate.dir, "blk.1.ffn_gate_exps.weight", &keep);
  ASSERT_NE(t, nullptr);
  r = Scaled({gate.dir.string()});
  EXPECT_EQ(Sglang(r, "expert-dtype"), "unexpected expert dtype for (1, 'gate'): " + std::string(GgmlTypeName(t->type)));
}

TEST(SglangParity, RoleSizesThatAreNotMultiplesOf4096) {
  // Issue 17.11: up/gate of 129,024 bytes (31.5 pages). The pack pads each
  // role, so an object spans more than its roles add up to, which both
  // stores refuse (check 10, before they would find the gap itself).
  auto dir = TempDir("p-unaligned");
  auto o = synth::PresetOptions("tiny").value();
  o.out_dir = dir.string();
  o.dims.moe_intermediate = 768;
  ASSERT_TRUE(synth::WriteSynthModel(o).ok());
  Report r = Scaled({dir.string()});
  auto f = r.With("expert-role-size-unaligned");
  ASSERT_EQ(f.size(), 1u) << Dump(r);
  EXPECT_EQ(f[0]->sglang_error, "Kimi expert-pack role sizes do not match object bytes");
  EXPECT_EQ(f[0]->object, "blk.1.ffn_up_exps.weight");
  // k3pack's store on the real pack says the same.
  const std::string d = dir.string(), pack = d + "/u.pack", manifest = d + "/u.json";
  ASSERT_EQ(RunCli("pack --profile scaled --progress none --safety-margin-gib 0 --gguf-dir " + d + " --model-config " +
                   d + "/config.json --out " + pack)
                .exit_code,
            0);
  ASSERT_EQ(RunCli("manifest --profile scaled --progress none --gguf-dir " + d + " --expert-pack " + pack +
                   " --model-config " + d + "/config.json --tokenizer-dir " + d + "/tokenizer --output " + manifest)
                .exit_code,
            0);
  auto store = store::ExpertStore::Open(pack, manifest, {});
  ASSERT_FALSE(store.ok());
  const std::string e = store.error().message();
  EXPECT_EQ(e.substr(0, e.find('\n')), f[0]->sglang_error);

  // Only down unaligned (Q4_K up/gate, Q3_K down): objects stay contiguous,
  // k3pack's store opens the pack; SGLang's refuses it with direct I/O.
  auto down = TempDir("p-unaligned-down");
  o.out_dir = down.string();
  o.expert_types = {GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q3_K};
  ASSERT_TRUE(synth::WriteSynthModel(o).ok());
  r = Scaled({down.string()});
  f = r.With("expert-role-size-unaligned");
  ASSERT_EQ(f.size(), 1u) << Dump(r);
  EXPECT_EQ(f[0]->severity, doctor::Severity::kWarning);
  EXPECT_EQ(f[0]->sglang_error, "expert-pack direct I/O requires aligned read ranges");
  EXPECT_EQ(r.ExitCode(), 0) << Dump(r);
  const std::string dd = down.string(), dpack = dd + "/d.pack", dman = dd + "/d.json";
  ASSERT_EQ(RunCli("pack --profile scaled --progress none --safety-margin-gib 0 --gguf-dir " + dd + " --model-config " +
                   dd + "/config.json --out " + dpack)
                .exit_code,
            0);
  ASSERT_EQ(RunCli("manifest --profile scaled --progress none --gguf-dir " + dd + " --expert-pack " + dpack +
                   " --model-config " + dd + "/config.json --tokenizer-dir " + dd + "/tokenizer --output " + dman)
                .exit_code,
            0);
  auto ok = store::ExpertStore::Open(dpack, dman, {});
  EXPECT_TRUE(ok.ok()) << ok.error().message();
}

// ---------------------------------------------------- iterator, model (§6.4)

TEST(SglangParity, IteratorNamesAndValues) {
  Clean unknown("p-name", {Fault::kUnknownTensorName});
  Report r = Scaled({unknown.dir.string()});
  EXPECT_EQ(Sglang(r, "tensor-name-unknown"), "unsupported Kimi-K3 GGUF tensor name: blk.1.ffn_mystery.weight");

  Clean c("p-iter");
  auto res = TempDir("p-res");
  RewriteSpecs(c.dir, res, [](auto& specs, auto&) {
    gguf::TensorSpec* s = Spec(specs, "output_res_score.weight");
    s->ne = {256, 2};  // 512 values as a matrix
  });
  r = Scaled({res.string()});
  EXPECT_EQ(Sglang(r, "res-score-not-vector"), "Kimi-K3 attention-residual score must be a vector, got (2, 256)");
  // SGLang splits only the residual scores of its name table; another name
  // ending in _res_score.weight is its KeyError, never the vector check (the
  // doctor went by the suffix and reported both).
  auto odd = TempDir("p-res-odd");
  RewriteSpecs(c.dir, odd, [](auto& specs, auto&) {
    gguf::TensorSpec* s = Spec(specs, "output_res_score.weight");
    s->name = "blk.1.shexp_res_score.weight";
    s->ne = {256, 2};
  });
  r = Scaled({odd.string()});
  EXPECT_EQ(Sglang(r, "tensor-name-unknown"), "unsupported Kimi-K3 GGUF tensor name: blk.1.shexp_res_score.weight")
      << Dump(r);
  EXPECT_TRUE(r.With("res-score-not-vector").empty()) << Dump(r);

  Clean nan("p-nan", {Fault::kNanSsmA});
  EXPECT_EQ(Sglang(Scaled({nan.dir.string()}), "ssm-a-nonfinite"), "Kimi-K3 GGUF ssm_a must contain finite floating values");
  Clean raw("p-raw", {Fault::kRawSsmA});
  EXPECT_EQ(Sglang(Scaled({raw.dir.string()}), "ssm-a-raw-a-log"),
            "Kimi-K3 GGUF ssm_a must contain only -exp(A_log) values");
  Clean zero("p-zero", {Fault::kZeroSsmA});
  EXPECT_EQ(Sglang(Scaled({zero.dir.string()}), "ssm-a-zero"), "Kimi-K3 GGUF ssm_a must contain only -exp(A_log) values");

  auto bf = TempDir("p-bf16");
  RewriteSpecs(c.dir, bf, [](auto& specs, auto&) {
    gguf::TensorSpec* s = Spec(specs, "blk.0.ssm_a");
    s->type = GgmlType::BF16;  // gguf-py hands BF16 out as uint8: not floating
    s->fill = Bytes(std::vector<uint8_t>(2 * 4, 0x80));
  });
  r = Scaled({bf.string()});
  EXPECT_EQ(Sglang(r, "ssm-a-not-float"), "Kimi-K3 GGUF ssm_a must contain finite floating values");
}

TEST(SglangParity, DuplicateTargetParameter) {
  // attn_gate (MLA) next to ssm_g (KDA) in layer 1: both are self_attn.g_proj.
  Clean c("p-target");
  std::shared_ptr<const gguf::GgufFile> keep;
  const gguf::TensorInfo* g = Info(c.dir, "blk.1.ssm_g.weight", &keep);
  ASSERT_NE(g, nullptr);
  const bool quantized = kimi::IsSglangQuantized(g->type);
  auto dir = TempDir("p-target-out");
  RewriteSpecs(c.dir, dir, [](auto& specs, auto& shard_of) {
    gguf::TensorSpec copy = *Spec(specs, "blk.1.ssm_g.weight");
    copy.name = "blk.1.attn_gate.weight";
    specs.push_back(copy);
    shard_of.push_back(2);  // after ssm_g in stream order
  });
  Report r = Scaled({dir.string()});
  // SGLang checks the runtime name (qweight) before its qweight_type, as the
  // stream does (tests/loader/stream_test.cpp); the doctor named qweight_type.
  EXPECT_EQ(Sglang(r, "duplicate-target"), std::string("duplicate Kimi-K3 target parameter: ") +
                                               "model.layers.1.self_attn.g_proj." +
                                               (quantized ? "qweight" : "weight"));
  EXPECT_EQ(r.With("duplicate-target")[0]->object, "blk.1.attn_gate.weight");
}

// SGLang writes a layer as int(layer): blk.07.attn_norm.weight is layer 7's
// norm to it, loaded as blk.7.attn_norm.weight is. The doctor compared names
// with the layout's spelling and reported it as a misspelling of the (then
// "missing") blk.7 name; a second spelling beside the first is SGLang's
// duplicate target.
TEST(SglangParity, ALayerSpelledWithOtherDigitsIsThatLayersTensor) {
  Clean c("p-spelling");
  auto dir = TempDir("p-spelling-out");
  RewriteSpecs(c.dir, dir, [](auto& specs, auto&) {
    Spec(specs, "blk.2.attn_norm.weight")->name = "blk.02.attn_norm.weight";
    Spec(specs, "blk.1.ssm_g.weight")->name = "blk.\u0661.ssm_g.weight";
  });
  Report r = Scaled({dir.string()});
  EXPECT_TRUE(r.With("tensor-name-misspelled").empty()) << Dump(r);
  EXPECT_TRUE(r.With("tensor-name-unknown").empty()) << Dump(r);
  EXPECT_TRUE(r.With("tensor-missing").empty()) << Dump(r);
  auto notes = r.With("tensor-layer-spelling");
  ASSERT_EQ(notes.size(), 2u) << Dump(r);
  EXPECT_EQ(notes[0]->severity, doctor::Severity::kInfo);
  std::set<std::string> objects = {notes[0]->object, notes[1]->object};
  EXPECT_EQ(objects, (std::set<std::string>{"blk.02.attn_norm.weight", "blk.\u0661.ssm_g.weight"}));
  EXPECT_EQ(r.Count(doctor::Severity::kError), 0u) << Dump(r);

  // The tensor is still checked as the one it fills: a wrong shape is named.
  auto bad = TempDir("p-spelling-shape");
  RewriteSpecs(c.dir, bad, [](auto& specs, auto&) {
    gguf::TensorSpec* s = Spec(specs, "blk.2.attn_norm.weight");
    s->name = "blk.002.attn_norm.weight";
    s->ne[0] /= 2;
    s->fill = Bytes(std::vector<uint8_t>(s->ne[0] * 4, 0));
  });
  r = Scaled({bad.string()});
  ASSERT_EQ(r.With("tensor-shape-mismatch").size(), 1u) << Dump(r);
  EXPECT_EQ(r.With("tensor-shape-mismatch")[0]->object, "blk.002.attn_norm.weight");

  // Both spellings: one parameter filled twice, as SGLang's iterator says.
  auto both = TempDir("p-spelling-both");
  RewriteSpecs(c.dir, both, [](auto& specs, auto& shard_of) {
    gguf::TensorSpec copy = *Spec(specs, "blk.2.attn_norm.weight");
    copy.name = "blk.02.attn_norm.weight";
    specs.push_back(copy);
    shard_of.push_back(2);
  });
  r = Scaled({both.string()});
  EXPECT_EQ(Sglang(r, "duplicate-target"),
            "duplicate Kimi-K3 target parameter: model.layers.2.input_layernorm.weight") << Dump(r);
  EXPECT_TRUE(r.With("tensor-name-misspelled").empty()) << Dump(r);
}

TEST(SglangParity, MlaProjectionTypes) {
  Clean c("p-mla");
  std::shared_ptr<const gguf::GgufFile> keep;
  const gguf::TensorInfo* kb = Info(c.dir, "blk.3.attn_k_b.weight", &keep);
  ASSERT_NE(kb, nullptr);
  ASSERT_EQ(kb->type, GgmlType::Q4_0);
  // Q4_0 and IQ4_NL share the block size and bytes: a same-size retype.
  RetypeTensor(Holder(c.dir, "blk.3.attn_k_b.weight"), "blk.3.attn_k_b.weight", GgmlType::IQ4_NL);
  auto vdir = TempDir("p-mla-v");
  Clean v("p-mla-v-src");
  RewriteSpecs(v.dir, vdir, [](auto& specs, auto&) {
    gguf::TensorSpec* s = Spec(specs, "blk.3.attn_v_b.weight");
    const uint64_t blocks = static_cast<uint64_t>(s->ne[0] / 256) * s->ne[1] * (s->ne.size() > 2 ? s->ne[2] : 1);
    s->type = GgmlType::Q3_K;
    s->fill = Bytes(std::vector<uint8_t>(blocks * 110, 0));
  });
  EXPECT_EQ(Sglang(Scaled({c.dir.string()}), "mla-k-b-dtype"), "Kimi-K3 MLA K projection must remain GGUF Q4_0");
  EXPECT_EQ(Sglang(Scaled({vdir.string()}), "mla-v-b-dtype"), "Kimi-K3 MLA V projection must remain GGUF Q2_K");
}

// The iterator's checks of the shards against a manifest (the model changed
// after the manifest was written).
TEST(SglangParity, ShardsChangedAfterTheManifest) {
  auto make = [](const std::string& tag) {
    Clean c(tag);
    const std::string d = c.dir.string();
    EXPECT_EQ(RunCli("pack --profile scaled --progress none --safety-margin-gib 0 --gguf-dir " + d +
                     " --model-config " + d + "/config.json --out " + d + "/p.pack")
                  .exit_code,
              0);
    EXPECT_EQ(RunCli("manifest --profile scaled --progress none --gguf-dir " + d + " --expert-pack " + d +
                     "/p.pack --model-config " + d + "/config.json --tokenizer-dir " + d + "/tokenizer --output " + d +
                     "/m.json")
                  .exit_code,
              0);
    return c.dir;
  };
  auto inv = make("p-m-inv");
  const std::string moved = "blk.0.attn_norm.weight";
  const fs::path holder = Holder(inv, moved);
  RenameTensor(holder, moved, "blk.0.attn_norx.weight");
  Report r = Scaled({(inv / "m.json").string()});
  EXPECT_EQ(Sglang(r, "manifest-shard-inventory"), "Kimi-K3 GGUF shard inventory changed: " + Real(holder));

  auto type = make("p-m-type");
  RetypeTensor(Holder(type, "blk.3.attn_k_b.weight"), "blk.3.attn_k_b.weight", GgmlType::IQ4_NL);
  r = Scaled({(type / "m.json").string()});
  EXPECT_EQ(Sglang(r, "manifest-tensor-type"), "Kimi-K3 GGUF tensor type changed: blk.3.attn_k_b.weight");

  auto size = make("p-m-size");
  { std::ofstream(Shard(size, 2), std::ios::app) << "x"; }
  r = Scaled({(size / "m.json").string()});
  EXPECT_EQ(Sglang(r, "manifest-shard-changed"), "Kimi-K3 GGUF shard is missing or changed: " + Real(Shard(size, 2)));
}

// Issue 11.6 in doctor: a scaled manifest whose active layers disagree with
// the ones its pack was built for, worded as SGLang's store check.
TEST(SglangParity, ScaledManifestActiveLayers) {
  Clean c("p-m-active");
  const std::string d = c.dir.string();
  ASSERT_EQ(RunCli("pack --profile scaled --progress none --safety-margin-gib 0 --gguf-dir " + d + " --model-config " +
                   d + "/config.json --out " + d + "/p.pack")
                .exit_code,
            0);
  ASSERT_EQ(RunCli("manifest --profile scaled --progress none --gguf-dir " + d + " --expert-pack " + d +
                   "/p.pack --model-config " + d + "/config.json --tokenizer-dir " + d + "/tokenizer --output " + d +
                   "/m.json")
                .exit_code,
            0);
  auto j = nlohmann::json::parse(ReadAll(c.dir / "m.json"));
  j["model"]["active_moe_layer_ids"] = {1, 2};
  std::ofstream(c.dir / "m.json", std::ios::trunc) << j.dump(2);
  Report r = Scaled({(c.dir / "m.json").string()});
  EXPECT_EQ(Sglang(r, "manifest-dimensions"), "Kimi active routed MoE layers must be exactly 1..3");
}

// ------------------------------------------------- manifest shards elsewhere

// Issue 11.8: the shards are examined as the loader opens them, from the
// paths the manifest records, not by discovering their directory.
TEST(SglangParity, ManifestWhoseShardsLiveElsewhere) {
  auto root = TempDir("p-elsewhere");
  const fs::path models = root / "models", out = root / "artifacts";
  Synth(models);
  fs::create_directories(out);
  // Another (larger, incomplete) set in the same directory.
  for (int i = 1; i <= 4; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "OTHER-%05d-of-00005.gguf", i);
    fs::copy_file(Shard(models, 1), models / name);
  }
  const std::string m = models.string(), pack = (out / "p.pack").string(), manifest = (out / "m.json").string();
  ASSERT_EQ(RunCli("pack --profile scaled --progress none --safety-margin-gib 0 --gguf-dir " + m + " --model-config " +
                   m + "/config.json --out " + pack)
                .exit_code,
            0);
  ASSERT_EQ(RunCli("manifest --profile scaled --progress none --gguf-dir " + m + " --expert-pack " + pack +
                   " --model-config " + m + "/config.json --tokenizer-dir " + m + "/tokenizer --output " + manifest)
                .exit_code,
            0);
  Report r = Scaled({manifest});
  EXPECT_EQ(r.ExitCode(), 0) << Dump(r);
  EXPECT_EQ(r.files.size(), 4u) << Dump(r);  // the manifest + its 3 shards, not the other set
  for (const char* code : {"shard-set-incomplete", "split-count-mismatch", "several-shard-sets"}) {
    EXPECT_FALSE(r.Has(code)) << code << "\n" << Dump(r);
  }

  // Shards reached through symlinks: the manifest records the files they
  // resolve to, whose names are not shard names.
  const fs::path blobs = root / "blobs", links = root / "links";
  fs::create_directories(blobs);
  fs::create_directories(links);
  for (int i = 1; i <= 3; ++i) {
    const fs::path blob = blobs / ("sha256-" + std::to_string(i));
    fs::copy_file(Shard(models, i), blob);
    fs::create_symlink(blob, Shard(links, i));
  }
  fs::copy_file(models / "config.json", links / "config.json");
  const std::string l = links.string(), manifest2 = (out / "m2.json").string();
  ASSERT_EQ(RunCli("manifest --profile scaled --progress none --gguf-dir " + l + " --expert-pack " + pack +
                   " --model-config " + l + "/config.json --tokenizer-dir " + m + "/tokenizer --output " + manifest2)
                .exit_code,
            0);
  r = Scaled({manifest2});
  EXPECT_EQ(r.ExitCode(), 0) << Dump(r);
}

}  // namespace
}  // namespace dtest
