// Layout checks: the model spec (config.json and kimi-k3.* metadata), every
// tensor name against SGLang's name table and the converter's layout, shapes
// and storage types, and the routed-expert stacks the pack is built from.
#include <algorithm>
#include <filesystem>
#include <set>

#include "doctor/internal.h"
#include "k3pack/names.h"
#include "k3pack/pack.h"
#include "manifest/tokenizer_dir.h"
#include "pack/format.h"
#include "util/pyrepr.h"

namespace k3pack::doctor::internal {

namespace fs = std::filesystem;

namespace {

const char* kRoleNames[3] = {"up", "gate", "down"};  // pack::Role order

std::string PyTuple(const std::vector<int64_t>& v) {
  std::string s = "(";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  if (v.size() == 1) s += ",";
  return s + ")";
}

// A routed stack's (layer, role) as SGLang keys it: the layer is
// str(int(...)), a Python int of any size.
using StackKey = std::pair<std::string, int>;
StackKey KeyOf(uint32_t layer, int role) { return {std::to_string(layer), role}; }

std::string LayerRoleRepr(const StackKey& key) {
  return "(" + key.first + ", '" + kRoleNames[key.second] + "')";
}

std::string TypeName(GgmlType t) { return std::string(GgmlTypeName(t)); }

// The name without a trailing ".weight" / ".bias" (ssm_a has neither).
std::string_view WithoutParamSuffix(std::string_view name) {
  for (std::string_view suffix : {std::string_view(".weight"), std::string_view(".bias")}) {
    if (name.size() > suffix.size() && name.substr(name.size() - suffix.size()) == suffix) {
      return name.substr(0, name.size() - suffix.size());
    }
  }
  return name;
}

bool IsFloatStorage(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }

// Whether SGLang's stream renames a target of this tensor when quantized
// (a final "weight" becomes "qweight"): the parameter is then never loaded.
bool RenamedAsQuantized(const std::string& name) {
  auto mapped = kimi::MapTensorName(name);
  if (!mapped.ok()) return false;
  for (const kimi::Target& target : mapped->targets)
    if (kimi::RuntimeName(target.name, true) != target.name) return true;
  return false;
}

// A spec as SGLang's KimiK3Spec would build it from a config carrying the
// GGUF's own dimensions (used when no config.json is available).
nlohmann::json ConfigFromDims(const kimi::SynthDims& d) {
  return {{"num_hidden_layers", d.num_layers},
          {"first_k_dense_replace", d.first_k_dense},
          {"num_experts", d.num_experts},
          {"num_experts_per_token", d.top_k},
          {"num_shared_experts", d.num_shared_experts},
          {"hidden_size", d.hidden},
          {"routed_expert_hidden_size", d.latent},
          {"moe_intermediate_size", d.moe_intermediate},
          {"hidden_act", "situ"}};
}

struct NameIndex {
  std::set<std::string> kda_suffixes, mla_suffixes;
};
const NameIndex& Index() {
  static const NameIndex idx = [] {
    NameIndex i;
    for (const kimi::TableRow& r : kimi::LayerTableRows()) {
      if (r.table == kimi::NameTable::kKda) i.kda_suffixes.insert(r.gguf_suffix);
      if (r.table == kimi::NameTable::kMla) i.mla_suffixes.insert(r.gguf_suffix);
    }
    return i;
  }();
  return idx;
}

// SGLang meets these three faults only in its strict coverage check, which
// fails once over every parameter left unloaded: each of them gets that one
// text, built from all of them (the first 16 names, sorted).
void AttachCoverageError(const ModelContext& m, std::vector<Finding>& findings, size_t from) {
  std::set<std::string> unloaded;
  std::vector<size_t> causes;
  for (size_t i = from; i < findings.size(); ++i) {
    const Finding& f = findings[i];
    if (f.code != "tensor-missing" && f.code != "tensor-must-be-float" && f.code != "tensor-must-be-quantized") continue;
    auto want = m.expected.find(kimi::ConverterSpelling(f.object));
    auto mapped = kimi::MapTensorName(f.object);
    if (want == m.expected.end() || !mapped.ok()) continue;
    // The model's parameter is what the tensor should have been: a GGUF
    // linear has qweight + qweight_type, a plain module its weight.
    const bool gguf_linear = !kimi::RoleIsF32(want->second.role);
    for (const kimi::Target& t : mapped->targets) {
      if (!gguf_linear) {
        unloaded.insert(t.name);
        continue;
      }
      const std::string qweight = kimi::RuntimeName(t.name, true);
      unloaded.insert(qweight);
      unloaded.insert(kimi::QweightTypeName(qweight));
    }
    causes.push_back(i);
  }
  if (unloaded.empty()) return;
  std::string preview;
  size_t shown = 0;
  for (const std::string& name : unloaded) {
    if (shown++ == 16) break;
    preview += (preview.empty() ? "" : ", ") + name;
  }
  const std::string text = "Kimi-K3 GGUF did not initialize all model parameters: missing=" +
                           std::to_string(unloaded.size()) + " [" + preview + "]";
  for (size_t i : causes) {
    findings[i].sglang_error = text;
    findings[i].sglang_exception = "RuntimeError";
  }
}

// The layout the kimi-k3.* metadata of shard 0 implies (m.dims, m.expected).
void ReadLayout(const ShardView& view, const gguf::GgufFile& first, ModelContext& m, Collector& out) {
  auto dims = kimi::DimsFromGguf(first);
  if (!dims.ok()) {
    out.Add("model-metadata-invalid", "kimi-k3.*", dims.error().message(), {}, view.shards.front().path);
    return;
  }
  kimi::TypePlan plan;
  plan.experts = {GgmlType::F32, GgmlType::F32, GgmlType::F32};  // types are checked separately
  auto table = kimi::ExpectedTensors(*dims, plan);
  if (!table.ok()) {
    out.Add("model-metadata-invalid", "kimi-k3.*", table.error().message(), {}, view.shards.front().path);
    return;
  }
  m.dims = *dims;
  for (auto& t : *table) m.expected.emplace(t.name, t);
}

// The config.json of the tokenizer directory: SGLang's server builds the
// model from it (the model-meta it generates from its text_config), and it
// may be another file than the config the manifest records. Given, recorded
// in the manifest, or found beside the shards as `k3pack build` finds it.
std::string ServerConfigPath(const ShardView& view, const DiagnoseOptions& options) {
  std::string tokenizer_dir = options.tokenizer_dir;
  if (tokenizer_dir.empty()) {
    auto derived = manifest::DeriveTokenizerDir(view.dir);
    if (!derived.ok()) return {};
    tokenizer_dir = *derived;
  }
  const std::string path = (fs::path(tokenizer_dir) / "config.json").string();
  std::error_code ec;
  return fs::is_regular_file(path, ec) ? path : std::string();
}

// The same model keys (a flattened model-meta config and the HF config it
// was made from are the same model): checked once. One that cannot be read
// or parsed is checked on its own, and its finding names it.
bool SameConfig(const std::string& a, const std::string& b) {
  std::error_code ec;
  if (fs::equivalent(a, b, ec)) return true;
  const auto x = ModelKeysOf(a), y = ModelKeysOf(b);
  return x && y && *x == *y;
}

// Loads `config` as KimiK3Spec and checks it against the GGUF; the spec, or
// nullopt (the finding made).
std::optional<kimi::ModelSpec> CheckConfigFile(const std::string& config, const DiagnoseOptions& options,
                                               const ModelContext& m, Collector& out) {
  auto spec = kimi::LoadModelSpec(config, options.profile);
  if (!spec.ok()) {
    const Error& e = spec.error();
    // A config this user may not read breaks no rule of the model.
    if (ReportProcessCannotRead(e, config, out)) return std::nullopt;
    Finding& f = out.Add("config-invalid", config, e.message(), e.headline(), config);
    f.sglang_exception = ErrorKindName(e.kind());
    return std::nullopt;
  }
  if (m.dims) CrossCheckConfig(*spec, config, *m.dims, out);
  return *spec;
}

// The spec (m.spec): config.json when there is one (beside the shards, else
// the tokenizer directory's, as `k3pack build` takes it), else the GGUF's
// own dimensions. The tokenizer directory's config is checked as well.
void ReadSpec(const ShardView& view, const DiagnoseOptions& options, ModelContext& m, Collector& out) {
  std::string config = options.config_path;
  std::error_code ec;
  if (config.empty() && fs::exists(fs::path(view.dir) / "config.json", ec)) {
    config = (fs::path(view.dir) / "config.json").string();
  }
  const std::string server = ServerConfigPath(view, options);
  if (config.empty()) config = server;
  if (!server.empty() && !HasTextConfig(server)) {
    // SGLang's server builds its model-meta from this file's text_config.
    const std::string text = "Kimi tokenizer config does not contain text_config";
    Finding& f = out.Add("config-invalid", server, server + ": " + text, text, server);
    f.sglang_exception = "ValueError";
  }
  if (!config.empty()) {
    m.spec = CheckConfigFile(config, options, m, out);
    if (!server.empty() && !SameConfig(server, config)) (void)CheckConfigFile(server, options, m, out);
    return;
  }
  out.Add("config-missing", view.dir + "/config.json",
          "no config.json beside the shards or in a tokenizer directory, and no --model-config");
  if (!m.dims) return;
  auto spec = kimi::ModelSpecFromConfig(ConfigFromDims(*m.dims), options.profile);
  if (!spec.ok()) {
    const Error& e = spec.error();
    Finding& f = out.Add("config-invalid", "kimi-k3.* (GGUF metadata)",
                         "the GGUF's own dimensions fail the " + std::string(kimi::ProfileName(options.profile)) +
                             " profile: " + e.message(),
                         e.headline(), view.shards.front().path);
    f.sglang_exception = ErrorKindName(e.kind());
    f.fix = "Use --profile scaled for synthetic or scaled-down models; a real Kimi-K3 must have these values.";
  } else {
    m.spec = *spec;
  }
}

// A tensor the layout expects: its shape and its storage type.
void CheckExpectedTensor(const std::string& name, const kimi::ExpectedTensor& want, const gguf::TensorInfo& t,
                         const std::string& file, Collector& out) {
  // ssm_a's shape and a residual score that is no vector have findings of
  // their own; a residual vector of the wrong length is loaded by SGLang as
  // a [1, d] projection into a [1, E] weight, which its loader refuses.
  const bool own_finding = want.role == kimi::TensorRole::kSsmA ||
                           (want.role == kimi::TensorRole::kResScore && t.n_dims != 1);
  if (!own_finding && !want.ShapeMatches(t.shape())) {
    Finding& f = out.Add("tensor-shape-mismatch", name,
                         "shape " + NeList(t.shape()) + ", the metadata implies " + NeList(want.ne) +
                             (want.alt_ne.empty() ? "" : " or " + NeList(want.alt_ne)),
                         {}, file);
    f.details = {{"shape", t.shape()}, {"expected", want.ne}};
  }
  const GgmlTypeInfo* ti = GgmlTypeInfoFor(t.type);
  if (want.role == kimi::TensorRole::kSsmA) {
    // CheckValues reports ssm_a types with the ssm_a diagnoses.
  } else if (kimi::RoleIsF32(want.role) && want.role != kimi::TensorRole::kF32Matrix) {
    if (t.type == GgmlType::BF16) {
      out.Add("tensor-bf16", name, "stored as BF16", {}, file);
    } else if (ti != nullptr && ti->quantized) {
      out.Add("tensor-must-be-float", name, "stored as " + TypeName(t.type) + ", must stay F32", {}, file);
    } else if (kimi::IsSglangQuantized(t.type) && RenamedAsQuantized(name)) {
      // F64 and the integer types are "quantized" to SGLang's stream too: a
      // .weight target is yielded as .qweight, which a plain module lacks.
      // (Another target keeps its name and loads, converted.)
      out.Add("tensor-must-be-float", name,
              "stored as " + TypeName(t.type) + ", must stay F32 (SGLang counts every type but F32/F16/BF16 as "
              "quantized and yields it as qweight)",
              {}, file);
    }
  } else if (want.role == kimi::TensorRole::kAttnKB && t.type != GgmlType::Q4_0) {
    out.Add("mla-k-b-dtype", name, "stored as " + TypeName(t.type), "Kimi-K3 MLA K projection must remain GGUF Q4_0",
            file);
  } else if (want.role == kimi::TensorRole::kAttnVB && t.type != GgmlType::Q2_K) {
    out.Add("mla-v-b-dtype", name, "stored as " + TypeName(t.type), "Kimi-K3 MLA V projection must remain GGUF Q2_K",
            file);
  } else if ((want.role == kimi::TensorRole::kMatrix || want.role == kimi::TensorRole::kEmbedding) &&
             IsFloatStorage(t.type)) {
    out.Add("tensor-must-be-quantized", name, "stored as " + TypeName(t.type), {}, file);
  }
}

// A KDA name on an MLA layer or the reverse (SGLang maps it anyway); true
// when reported.
bool ReportWrongLayerKind(const std::string& name, const kimi::Mapping& mapped, const ModelContext& m,
                          const std::string& file, Collector& out) {
  if (!mapped.layer || !m.dims || *mapped.layer >= m.dims->num_layers) return false;
  const std::string suffix = name.substr(name.find('.', 4) + 1);
  const bool kda = Index().kda_suffixes.count(suffix) > 0, mla = Index().mla_suffixes.count(suffix) > 0;
  if (!kda && !mla) return false;
  const bool layer_mla = kimi::LayerKindOf(*m.dims, *mapped.layer) == kimi::LayerKind::kMla;
  if (!((kda && layer_mla) || (mla && !layer_mla))) return false;
  out.Add("tensor-wrong-layer-kind", name,
          std::string(kda ? "a KDA" : "an MLA") + " tensor in " + (layer_mla ? "MLA" : "KDA") + " layer " +
              std::to_string(*mapped.layer),
          {}, file);
  return true;
}

// A name outside the layout: the nearest missing expected name when close
// (claimed in `suggested`), else what SGLang makes of it.
void ReportUnexpectedName(const ShardView& view, const std::string& name, const Result<kimi::Mapping>& mapped,
                          const ModelContext& m, const std::string& file, const std::set<std::string>& respelled,
                          std::set<std::string>& suggested, Collector& out) {
  // A missing name that differs only in its .weight/.bias suffix (the
  // commonest converter rename: `blk.N.ssm_a.weight` for `blk.N.ssm_a`,
  // `ssm_dt.weight` for `ssm_dt.bias`) wins whatever its edit distance.
  std::string best;
  size_t best_d = SIZE_MAX;
  bool suffix_only = false;
  for (const auto& [ename, et] : m.expected) {
    if (view.Find(ename) != nullptr || respelled.count(ename)) continue;
    const size_t d = EditDistance(name, ename);
    const bool same_stem = WithoutParamSuffix(name) == WithoutParamSuffix(ename);
    if ((same_stem && !suffix_only) || (same_stem == suffix_only && d < best_d)) {
      best_d = d, best = ename, suffix_only = same_stem;
    }
  }
  const size_t limit = std::max<size_t>(2, name.size() / 8);
  const std::string sg = mapped.ok() ? std::string() : mapped.error().message();
  if (!best.empty() && (best_d <= limit || suffix_only)) {
    suggested.insert(best);
    Finding& f = out.Add("tensor-name-misspelled", name,
                         "unknown name, " +
                             (suffix_only ? std::string("only its .weight/.bias suffix differs from")
                                          : std::to_string(best_d) + " edit(s) from") +
                             " the missing '" + best + "'",
                         sg, file);
    f.fix = "Rename '" + name + "' to '" + best + "' (the converter's scheme), or re-convert the model.";
    f.details = {{"suggestion", best}, {"distance", best_d}};
  } else if (mapped.ok()) {
    out.Add("tensor-name-unknown", name,
            "SGLang maps it, but the kimi-k3.* layout has no such tensor (the model never uses it)", {}, file)
        .severity = Severity::kWarning;
  } else {
    out.Add("tensor-name-unknown", name, "not in SGLang's name table nor in the Kimi-K3 layout", sg, file);
  }
}

// The expected names that a tensor fills under another spelling of its
// layer (blk.07.x for blk.7.x): SGLang reads the layer as int(), so it loads
// that tensor as the expected one.
std::set<std::string> RespelledExpectedNames(const ShardView& view, const ModelContext& m) {
  std::set<std::string> respelled;
  for (const std::string& name : view.order) {
    const std::string spelled = kimi::ConverterSpelling(name);
    if (spelled != name && m.expected.count(spelled)) respelled.insert(spelled);
  }
  return respelled;
}

// Every non-expert tensor against the layout, or against SGLang's name table
// when there is no layout. Returns the expected names claimed by a near miss
// or filled under another spelling of their layer.
std::set<std::string> CheckNames(const ShardView& view, const ModelContext& m, Collector& out) {
  const std::set<std::string> respelled = RespelledExpectedNames(view, m);
  std::set<std::string> suggested;
  for (const std::string& name : view.order) {
    if (kimi::IsRoutedExpertAggregate(name)) continue;  // CheckExperts
    const Located& loc = *view.Find(name);
    const std::string& file = view.shards[loc.shard].path;
    const std::string spelled = kimi::ConverterSpelling(name);
    auto it = m.expected.find(spelled);
    if (it != m.expected.end()) {
      if (spelled != name) {
        Finding& f = out.Add("tensor-layer-spelling", name,
                             "SGLang reads the layer as int(), so it loads this tensor as " + spelled +
                                 " (the converter writes that name)",
                             {}, file);
        f.details = {{"converter_name", spelled}};
      }
      CheckExpectedTensor(name, it->second, *loc.info, file, out);
      continue;
    }
    auto mapped = kimi::MapTensorName(name);
    if (m.expected.empty()) {
      // No layout to compare with: SGLang's name table is all we have.
      if (!mapped.ok()) out.Add("tensor-name-unknown", name, "not in SGLang's name table", mapped.error().message(), file);
      continue;
    }
    if (mapped.ok() && ReportWrongLayerKind(name, *mapped, m, file, out)) continue;
    ReportUnexpectedName(view, name, mapped, m, file, respelled, suggested, out);
  }
  suggested.insert(respelled.begin(), respelled.end());
  return suggested;
}

// SGLang's iterator emits each parameter name once; a later tensor mapping
// to a name already emitted stops it (ssm_g and attn_gate share g_proj). It
// checks the runtime name first, then a quantized target's qweight_type, as
// the stream does.
void CheckDuplicateTargets(const ShardView& view, Collector& out) {
  std::set<std::string> emitted;
  for (const std::string& name : view.order) {
    if (kimi::IsRoutedExpertAggregate(name)) continue;
    auto mapped = kimi::MapTensorName(name);
    if (!mapped.ok()) continue;
    const Located& loc = *view.Find(name);
    const bool quantized = kimi::IsSglangQuantized(loc.info->type);
    for (const kimi::Target& target : mapped->targets) {
      const std::string runtime = kimi::RuntimeName(target.name, quantized);
      std::string repeated;
      if (emitted.count(runtime)) {
        repeated = runtime;
      } else if (quantized && !emitted.insert(kimi::QweightTypeName(runtime)).second) {
        repeated = kimi::QweightTypeName(runtime);
      }
      if (repeated.empty()) {
        emitted.insert(runtime);
        continue;
      }
      Finding& f = out.Add("duplicate-target", name, "maps to " + repeated + ", which an earlier tensor already fills",
                           "duplicate Kimi-K3 target parameter: " + repeated, view.shards[loc.shard].path);
      f.details = {{"parameter", repeated}};
      break;
    }
  }
}

// Expected tensors that are absent (experts: CheckExperts), unless a near
// miss already named them.
void CheckMissingTensors(const ShardView& view, const ModelContext& m, const std::set<std::string>& suggested,
                         Collector& out) {
  std::vector<std::string> missing;
  for (const auto& [ename, et] : m.expected) {
    if (kimi::RoleIsExpert(et.role) || view.Find(ename) != nullptr || suggested.count(ename)) continue;
    missing.push_back(ename);
  }
  if (!missing.empty() && !view.all_readable) {
    out.Add("check-skipped", "tensor coverage",
            std::to_string(missing.size()) + " expected tensor(s) not found, but unreadable shards may hold them");
    return;
  }
  for (const std::string& ename : missing) {
    Finding& f = out.Add("tensor-missing", ename, "expected " + NeList(m.expected.at(ename).ne) + " tensor is absent");
    f.details = {{"expected_shape", m.expected.at(ename).ne}};
  }
}

}  // namespace

ModelContext CheckModel(const ShardView& view, const DiagnoseOptions& options, Collector& out) {
  ModelContext m;
  const size_t first_finding = out.report().findings.size();
  const gguf::GgufFile* first = view.first();
  if (first == nullptr) {
    out.Add("check-skipped", "model layout", "shard 0 is unreadable, so the kimi-k3.* metadata is unknown");
    return m;
  }
  ReadLayout(view, *first, m, out);
  ReadSpec(view, options, m, out);
  const std::set<std::string> suggested = CheckNames(view, m, out);
  CheckDuplicateTargets(view, out);
  CheckMissingTensors(view, m, suggested, out);
  AttachCoverageError(m, out.report().findings, first_finding);
  return m;
}

// The pack aligns every role payload to 4096 bytes, but the stores (SGLang's
// and k3pack's) need an object's three roles byte-contiguous, its span equal
// to their sum: an up or gate size that is not a multiple of 4096 puts
// padding inside the object, and the stores refuse the pack. A down size that is not a multiple
// only leaves the object's length unaligned, which SGLang's store refuses
// with direct I/O (its loader's default); k3pack's store reads it.
namespace {

void CheckRoleAlignment(const std::vector<uint32_t>& active, const std::map<StackKey, std::string>& found,
                        const ShardView& view,
                        uint64_t X, Collector& out) {
  if (X == 0) return;
  bool reported_contiguity = false, reported_direct_io = false;
  for (size_t li = 0; li < active.size(); ++li) {
    std::array<uint64_t, 3> bytes{};
    std::array<const std::string*, 3> names{};
    bool complete = true;
    for (int r = 0; r < 3; ++r) {
      auto it = found.find(KeyOf(active[li], r));
      if (it == found.end() || view.Find(it->second)->info->nbytes % X != 0) {
        complete = false;
        break;
      }
      names[r] = &it->second;
      bytes[r] = view.Find(it->second)->info->nbytes / X;
    }
    if (!complete) continue;
    const int odd = bytes[0] % 4096 != 0 ? 0 : bytes[1] % 4096 != 0 ? 1 : bytes[2] % 4096 != 0 ? 2 : -1;
    if (odd < 0) continue;
    const std::string& name = *names[odd];
    const std::string& file = view.shards[view.Find(name)->shard].path;
    const std::string what = std::to_string(bytes[odd]) + " bytes per expert (" + kRoleNames[odd] +
                             "), not a multiple of 4096";
    if (odd < 2 && !reported_contiguity) {
      // The manifest's object_bytes is the object's span, padding included,
      // so the stores' check of the role sizes against it fails first (and
      // the roles are not contiguous either).
      Finding& f = out.Add("expert-role-size-unaligned", name,
                           what + ": the pack pads it to 4 KiB, so each object spans more than its three roles and "
                                  "the stores refuse the pack",
                           "Kimi expert-pack role sizes do not match object bytes", file);
      f.details = {{"expert_bytes", bytes[odd]}, {"role", kRoleNames[odd]}, {"layer", active[li]}};
      reported_contiguity = true;
    } else if (odd == 2 && !reported_direct_io) {
      Finding& f = out.Add("expert-role-size-unaligned", name,
                           what + ": objects are contiguous but their length is unaligned; k3pack's store reads "
                                  "them, SGLang's refuses them with direct I/O (its loader's default)",
                           "expert-pack direct I/O requires aligned read ranges", file);
      f.severity = Severity::kWarning;
      f.details = {{"expert_bytes", bytes[odd]}, {"role", kRoleNames[odd]}};
      reported_direct_io = true;
    }
  }
}

// What the routed stacks are checked against: the active MoE layers and the
// experts' dimensions (X experts of L x Fe), from the spec or the metadata.
struct ExpertDims {
  std::vector<uint32_t> active;
  uint64_t X = 0, L = 0, Fe = 0;
};

std::optional<ExpertDims> ExpertDimsOf(const ModelContext& m) {
  ExpertDims d;
  if (m.spec) {
    d.active = m.spec->active_moe_layer_ids;
    d.X = m.spec->num_experts, d.L = m.spec->routed_expert_hidden_size, d.Fe = m.spec->moe_intermediate_size;
  } else if (m.dims) {
    for (uint32_t l = m.dims->first_k_dense; l < m.dims->num_layers; ++l) d.active.push_back(l);
    d.X = m.dims->num_experts, d.L = m.dims->latent, d.Fe = m.dims->moe_intermediate;
  } else {
    return std::nullopt;
  }
  return d;
}

// The routed stacks by (int(layer), role), each with its first name; a
// second name of one (layer, role) is SGLang's duplicate.
std::map<StackKey, std::string> FindStacks(const ShardView& view, Collector& out) {
  std::map<StackKey, std::string> found;
  for (const std::string& name : view.order) {
    // int() of Python's \d+: "01" and "\u0663" are layers 1 and 3.
    const std::optional<pack::ParsedExpertName> parsed = pack::ParseExpertTensorName(name);
    if (!parsed) continue;
    const StackKey key{parsed->layer_text, static_cast<int>(parsed->role)};
    auto [it, fresh] = found.emplace(key, name);
    if (!fresh) {
      Finding& f = out.Add("expert-duplicate", name, "names the same (layer, role) as " + it->second,
                           "duplicate routed expert tensor " + LayerRoleRepr(key),
                           view.shards[view.Find(name)->shard].path);
      f.details = {{"other", it->second}};
    }
  }
  return found;
}

// SGLang's coverage check: the active layers' missing stacks and the
// stacks of other layers, in its text (sorted tuples, first 8 of each).
void CheckCoverage(const ShardView& view, const std::vector<uint32_t>& active, const std::set<std::string>& active_set,
                   const std::map<StackKey, std::string>& found, Collector& out) {
  std::vector<StackKey> miss, extra;
  for (uint32_t l : active) {
    for (int r = 0; r < 3; ++r) {
      if (!found.count(KeyOf(l, r))) miss.push_back(KeyOf(l, r));
    }
  }
  for (const auto& [key, name] : found) {
    if (!active_set.count(key.first)) extra.push_back(key);
  }
  // Python orders the tuples by layer, then by the role's name.
  auto py_less = [](const StackKey& a, const StackKey& b) {
    if (a.first != b.first) return pack::PyIntTextLess(a.first, b.first);
    return std::string_view(kRoleNames[a.second]) < std::string_view(kRoleNames[b.second]);
  };
  std::sort(miss.begin(), miss.end(), py_less);
  std::sort(extra.begin(), extra.end(), py_less);
  auto list = [](const std::vector<StackKey>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size() && i < 8; ++i) s += (i ? ", " : "") + LayerRoleRepr(v[i]);
    return s + "]";
  };
  const std::string coverage = "routed expert tensor coverage mismatch: missing=" + list(miss) + ", extra=" + list(extra);
  if (!miss.empty() && !view.all_readable) {
    out.Add("check-skipped", "routed expert coverage",
            std::to_string(miss.size()) + " expert stack(s) not found, but unreadable shards may hold them");
  } else {
    for (const auto& [l, r] : miss) {
      out.Add("expert-missing", "blk." + l + ".ffn_" + kRoleNames[r] + "_exps.weight",
              "layer " + l + " has no " + kRoleNames[r] + " expert stack", coverage);
    }
  }
  for (const StackKey& key : extra) {
    out.Add("expert-extra", found.at(key), "layer " + key.first + " is not an active MoE layer", coverage);
  }
}

// The type each role must have: Kimi-K3's fixed ones, or (scaled) the ones
// `k3pack pack` holds each role to (the type most active layers use, up and
// gate together).
std::array<GgmlType, 3> ExpectedExpertTypes(const ShardView& view, const std::vector<uint32_t>& active,
                                            const std::map<StackKey, std::string>& found,
                                            const DiagnoseOptions& options) {
  std::array<GgmlType, 3> want = {GgmlType::Q2_K, GgmlType::Q2_K, GgmlType::Q3_K};
  if (options.profile != kimi::Profile::kScaled) return want;
  std::vector<std::array<uint32_t, 3>> layer_types;
  for (uint32_t l : active) {
    if (!found.count(KeyOf(l, 0)) || !found.count(KeyOf(l, 1)) || !found.count(KeyOf(l, 2))) continue;
    std::array<uint32_t, 3> row{};
    for (int r = 0; r < 3; ++r) row[r] = static_cast<uint32_t>(view.Find(found.at(KeyOf(l, r)))->info->type);
    layer_types.push_back(row);
  }
  if (!layer_types.empty()) {
    const auto types = pack::ExpectedScaledExpertTypes(layer_types);
    for (int r = 0; r < 3; ++r) want[r] = static_cast<GgmlType>(types[r]);
  }
  return want;
}

// One active layer's stack: its shape, its type and whether it slices into
// X equal experts.
void CheckStack(const ShardView& view, const StackKey& key, const std::string& name, const ExpertDims& d,
                GgmlType want, const DiagnoseOptions& options, Collector& out) {
  const Located& loc = *view.Find(name);
  const gguf::TensorInfo& t = *loc.info;
  const std::string& file = view.shards[loc.shard].path;
  const std::vector<int64_t> shape = t.shape();
  const std::vector<int64_t> ws = key.second == 2 ? std::vector<int64_t>{int64_t(d.Fe), int64_t(d.L), int64_t(d.X)}
                                                  : std::vector<int64_t>{int64_t(d.L), int64_t(d.Fe), int64_t(d.X)};
  if (shape != ws) {
    Finding& f = out.Add("expert-shape", name, "shape " + NeList(shape) + ", the spec needs " + NeList(ws),
                         "unexpected expert shape for " + LayerRoleRepr(key) + ": " + PyTuple(shape), file);
    f.details = {{"shape", shape}, {"expected", ws}};
  }
  const bool mixed_ok = options.allow_mixed_types && options.profile == kimi::Profile::kScaled;
  if (t.type != want && !mixed_ok) {
    Finding& f = out.Add("expert-dtype", name,
                         "stored as " + TypeName(t.type) + ", expected " + TypeName(want) +
                             (options.profile == kimi::Profile::kScaled ? " (the type of the other layers)" : ""),
                         "unexpected expert dtype for " + LayerRoleRepr(key) + ": " + TypeName(t.type), file);
    f.details = {{"dtype", TypeName(t.type)}, {"expected", TypeName(want)}};
  }
  if (d.X == 0 || t.nbytes % d.X != 0) {
    out.Add("expert-not-sliceable", name,
            std::to_string(t.nbytes) + " bytes is not a multiple of " + std::to_string(d.X) + " experts",
            "expert tensor is not evenly sliceable: " + name, file);
  }
}

}  // namespace

void CheckExperts(const ShardView& view, const ModelContext& m, const DiagnoseOptions& options, Collector& out) {
  const std::optional<ExpertDims> dims = ExpertDimsOf(m);
  if (!dims) {
    out.Add("check-skipped", "routed experts", "no model spec (config.json or kimi-k3.* metadata) to check against");
    return;
  }
  const std::map<StackKey, std::string> found = FindStacks(view, out);
  std::set<std::string> active_set;
  for (uint32_t l : dims->active) active_set.insert(std::to_string(l));
  CheckCoverage(view, dims->active, active_set, found, out);
  const std::array<GgmlType, 3> want = ExpectedExpertTypes(view, dims->active, found, options);
  for (const auto& [key, name] : found) {
    if (active_set.count(key.first)) CheckStack(view, key, name, *dims, want[key.second], options, out);
  }
  CheckRoleAlignment(dims->active, found, view, dims->X, out);
}

}  // namespace k3pack::doctor::internal
