// WriteSynthModel: tensor table -> TensorSpecs with deterministic payloads ->
// shard assignment -> gguf::WriteGgufSplit -> config.json + tokenizer dir,
// with the requested faults applied before (list edits) or after (byte
// patches) the write.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>

#include "k3pack/gguf.h"
#include "k3pack/names.h"
#include "k3pack/synth.h"
#include "kimi/synth_fill.h"
#include "kimi/synth_vocab.h"
#include "kimi/tensors.h"
#include "util/file.h"

namespace k3pack::synth {
namespace {

using kimi::ExpectedTensor;
using kimi::TensorRole;
namespace fs = std::filesystem;

bool Has(const SynthOptions& o, Fault f) { return std::find(o.faults.begin(), o.faults.end(), f) != o.faults.end(); }

uint64_t TensorBytes(const ExpectedTensor& t) {
  uint64_t rows = 1;
  for (size_t i = 1; i < t.ne.size(); ++i) rows *= static_cast<uint64_t>(t.ne[i]);
  return GgmlRowBytes(t.type, static_cast<uint64_t>(t.ne[0])) * rows;
}

ValueKind KindFor(TensorRole r) {
  switch (r) {
    case TensorRole::kNorm: return ValueKind::kNorm;
    case TensorRole::kResScore: return ValueKind::kResScore;
    case TensorRole::kSsmA: return ValueKind::kSsmA;
    case TensorRole::kBias: return ValueKind::kBias;
    case TensorRole::kConv: return ValueKind::kConv;
    default: return ValueKind::kWeight;
  }
}

// llama_ftype named after the routed experts' type (they are ~98% of bytes).
std::optional<uint32_t> FileTypeFor(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return 0;     case GgmlType::F16: return 1;     case GgmlType::Q4_0: return 2;
    case GgmlType::Q4_1: return 3;    case GgmlType::Q8_0: return 7;    case GgmlType::Q5_0: return 8;
    case GgmlType::Q5_1: return 9;    case GgmlType::Q2_K: return 10;   case GgmlType::Q3_K: return 12;
    case GgmlType::Q4_K: return 15;   case GgmlType::Q5_K: return 17;   case GgmlType::Q6_K: return 18;
    case GgmlType::IQ2_XXS: return 19; case GgmlType::IQ2_XS: return 20; case GgmlType::IQ3_XXS: return 23;
    case GgmlType::IQ1_S: return 24;  case GgmlType::IQ4_NL: return 25; case GgmlType::IQ3_S: return 26;
    case GgmlType::IQ2_S: return 28;  case GgmlType::IQ4_XS: return 30; case GgmlType::IQ1_M: return 31;
    case GgmlType::BF16: return 32;   case GgmlType::TQ1_0: return 36;  case GgmlType::TQ2_0: return 37;
    case GgmlType::MXFP4: return 38;
    default: return std::nullopt;
  }
}

// Contiguous ranges of roughly equal bytes, every shard non-empty.
std::vector<uint32_t> AssignShards(const std::vector<uint64_t>& padded, uint32_t shards) {
  uint64_t total = 0;
  for (uint64_t b : padded) total += b;
  std::vector<uint32_t> out(padded.size());
  uint32_t s = 0;
  uint64_t before = 0, in_shard = 0;
  const size_t n = padded.size();
  for (size_t i = 0; i < n; ++i) {
    const size_t left = n - i;
    const uint64_t boundary = static_cast<uint64_t>(static_cast<long double>(total) * (s + 1) / shards);
    if (s + 1 < shards && in_shard > 0 && (before >= boundary || left == shards - 1 - s)) {
      ++s;
      in_shard = 0;
    }
    out[i] = s;
    before += padded[i];
    ++in_shard;
  }
  return out;
}

Status RemoveOldSet(const std::string& dir, const std::string& prefix) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    auto parsed = gguf::ParseShardName(name);
    if (parsed && parsed->prefix == prefix) {
      if (!fs::remove(e.path(), ec) && ec) return Error::FromErrno("cannot remove old shard " + e.path().string(), ec.value());
    }
  }
  if (ec) return Error::FromErrno("cannot list " + dir, ec.value());
  return Status::OK();
}

// Absolute file offset of the value of metadata key `key`.
Result<uint64_t> ValueOffset(const std::string& path, std::string_view key) {
  K3_ASSIGN_OR_RETURN(auto file, gguf::GgufFile::Open(path));
  for (const auto& kv : file->metadata()) {
    if (kv.key != key) continue;
    const uint8_t* p = file->mapping()->data() + kv.offset;
    uint64_t len = 0;
    std::memcpy(&len, p, 8);
    if (len == key.size() && std::memcmp(p + 8, key.data(), key.size()) == 0) return kv.offset + 8 + len + 4;
    if (std::memcmp(p, key.data(), key.size()) == 0) return kv.offset + key.size() + 4;  // offset of the key text
    return Error(path + ": cannot locate the value of " + std::string(key));
  }
  return Error(path + ": no metadata key " + std::string(key), ErrorKind::kKey);
}

Status PatchFile(const std::string& path, uint64_t offset, const void* bytes, size_t n) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd.valid()) return Error::FromErrno("cannot open " + path + " for writing", errno);
  if (Status st = PwriteFull(fd.get(), bytes, n, offset); !st.ok()) return st.error().WithContext("cannot write " + path);
  if (::fsync(fd.get()) != 0) return Error::FromErrno("fsync failed for " + path, errno);
  return Status::OK();
}

gguf::MetadataBuilder BuildMetadata(const SynthOptions& o, const SynthDims& d, const SynthVocab& v) {
  gguf::MetadataBuilder m;
  const std::string a = "kimi-k3.";
  m.Str("general.type", "model");
  m.Str("general.name", "Kimi-K3 synthetic");
  if (auto ft = FileTypeFor(o.expert_types.gate)) m.U32("general.file_type", *ft);
  m.U32("general.quantization_version", 2);
  m.U32(a + "block_count", d.num_layers);
  m.U32(a + "context_length", d.context_length);
  m.U32(a + "embedding_length", d.hidden);
  m.U32(a + "feed_forward_length", d.dense_intermediate);
  m.U32(a + "vocab_size", d.vocab);
  m.U32(a + "attention.head_count", d.heads);
  std::vector<int32_t> kv;
  for (uint32_t il = 0; il < d.num_layers; ++il) kv.push_back(IsMlaLayer(d, il) ? 1 : 0);
  m.I32Array(a + "attention.head_count_kv", kv);
  m.F32(a + "attention.layer_norm_rms_epsilon", 1e-5f);
  m.U32(a + "attention.key_length", d.kv_lora_rank + d.qk_rope);
  m.U32(a + "attention.value_length", d.kv_lora_rank);
  m.U32(a + "attention.key_length_mla", MlaQkNope(d) + d.qk_rope);
  m.U32(a + "attention.value_length_mla", MlaVHead(d));
  m.U32(a + "attention.q_lora_rank", d.q_lora_rank);
  m.U32(a + "attention.kv_lora_rank", d.kv_lora_rank);
  m.U32(a + "rope.dimension_count", d.qk_rope);
  m.U32(a + "ssm.conv_kernel", d.conv_kernel);
  m.U32(a + "kda.head_dim", d.head_dim);
  m.F32(a + "kda.gate_lower_bound", -5.0f);
  m.U32(a + "expert_count", d.num_experts);
  m.U32(a + "expert_used_count", d.top_k);
  m.U32(a + "expert_group_used_count", 1);
  m.U32(a + "expert_feed_forward_length", d.moe_intermediate);
  m.U32(a + "expert_shared_count", d.num_shared_experts);
  m.U32(a + "leading_dense_block_count", d.first_k_dense);
  m.F32(a + "expert_weights_scale", 1.0f);
  m.Bool(a + "expert_weights_norm", true);
  m.U32(a + "expert_gating_func", 2);  // SIGMOID
  m.U32(a + "expert_latent_length", d.latent);
  m.F32(a + "activation.situ_beta", 4.0f);
  m.F32(a + "activation.situ_linear_beta", 25.0f);
  m.U32(a + "attn_res.block_size", d.attn_res_block_size);
  AddTokenizerMetadata(m, v);
  return m;
}

// Quantized (block) types get random quant blocks; element types can hold
// computed values.
bool IsBlockType(GgmlType type) {
  const GgmlTypeInfo* info = GgmlTypeInfoFor(type);
  return info != nullptr && info->quantized;
}

// Values of one ssm_a tensor, with the requested defect.
std::vector<float> SsmAValues(uint64_t seed, int64_t n, std::optional<Fault> fault) {
  std::vector<float> v(static_cast<size_t>(n));
  const ValueKind kind = fault == Fault::kRawSsmA ? ValueKind::kRawALog : ValueKind::kSsmA;
  for (int64_t i = 0; i < n; ++i) v[i] = ElementValue(kind, seed, static_cast<uint64_t>(i));
  if (fault == Fault::kRawSsmA) {
    v[0] = std::fabs(v[0]) + 0.01f;  // guarantee both signs
    if (n > 1) v[1] = -std::fabs(v[1]) - 0.01f;
  } else if (fault == Fault::kNanSsmA) {
    v[static_cast<size_t>(n / 2)] = std::nanf("");
  } else if (fault == Fault::kZeroSsmA) {
    std::fill(v.begin(), v.end(), 0.0f);
  }
  return v;
}

// What WriteSynthModel writes, decided before any byte is: the checked
// dimensions, the tensor table with the faults that change it applied, and
// the SSM faults by tensor.
struct ModelPlan {
  SynthDims d;
  std::vector<ExpectedTensor> table;
  SynthResult res;  // mla_layers and the planned fault notes
  std::map<std::string, Fault> ssm_faults;
};

Result<ModelPlan> PlanModel(const SynthOptions& o) {
  if (o.prefix.empty() || o.prefix.find('/') != std::string::npos) {
    return Error("synth: prefix '" + o.prefix + "' must be a non-empty file name without '/'");
  }
  // Said before anything is written: the first shard's rename failed with
  // "File name too long" and left the output's partial marker behind.
  const size_t shard_name_bytes = o.prefix.size() + std::string("-00001-of-00001.gguf").size();
  if (shard_name_bytes > kFileNameMax) {
    return Error("synth: prefix of " + std::to_string(o.prefix.size()) + " bytes makes shard names of " +
                 std::to_string(shard_name_bytes) + " bytes (<prefix>-NNNNN-of-NNNNN.gguf), past the " +
                 std::to_string(kFileNameMax) + " bytes a file name may have");
  }
  ModelPlan p;
  SynthDims& d = p.d;
  d = o.dims;
  K3_RETURN_IF_ERROR(kimi::ValidateDims(d));
  std::vector<uint32_t> mla, kda;
  for (uint32_t il = 0; il < d.num_layers; ++il) (IsMlaLayer(d, il) ? mla : kda).push_back(il);
  d.mla_layers = mla;

  kimi::TypePlan plan;
  plan.matrix = o.matrix_type;
  plan.embedding = o.matrix_type;
  plan.experts = o.expert_types;
  plan.layer_experts = o.layer_expert_types;
  K3_ASSIGN_OR_RETURN(p.table, kimi::ExpectedTensors(d, plan));
  std::vector<ExpectedTensor>& table = p.table;
  for (ExpectedTensor& t : table) {
    for (const TensorTypeOverride& ov : o.tensor_types) {
      if (t.name.find(ov.pattern) == std::string::npos) continue;
      if (kimi::IsRoutedExpertAggregate(t.name)) {
        // Expert stacks are never substituted (the pack depends on the type).
        if (kimi::FallbackType(ov.type, t.ne[0]) != ov.type) {
          return Error("synth: tensor type " + ov.pattern + "=" + std::string(GgmlTypeName(ov.type)) + ": " + t.name +
                       " has ne[0]=" + std::to_string(t.ne[0]) + ", not a multiple of the type's block");
        }
        t.type = ov.type;
      } else {
        t.type = kimi::FallbackType(ov.type, t.ne[0]);
      }
      break;  // the first matching override wins
    }
  }
  SynthResult& res = p.res;
  res.mla_layers = mla;
  const uint32_t first_moe = d.first_k_dense, last_moe = d.num_layers - 1;
  auto find = [&](const std::string& name) {
    return std::find_if(table.begin(), table.end(), [&](const ExpectedTensor& t) { return t.name == name; });
  };
  // Faults that change the tensor list.
  if (Has(o, Fault::kMissingExpert)) {
    const std::string name = "blk." + std::to_string(last_moe) + ".ffn_gate_exps.weight";
    table.erase(find(name));
    res.fault_notes.push_back("missing-expert: " + name + " is absent");
  }
  if (Has(o, Fault::kWrongExpertDtype)) {
    auto it = find("blk." + std::to_string(first_moe) + ".ffn_gate_exps.weight");
    if (it == table.end()) it = find("blk." + std::to_string(first_moe) + ".ffn_up_exps.weight");  // gate removed above
    for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::F16}) {
      if (t != it->type && kimi::FallbackType(t, it->ne[0]) == t) {
        res.fault_notes.push_back("wrong-expert-dtype: " + it->name + " is " + std::string(GgmlTypeName(t)) +
                                  " instead of " + std::string(GgmlTypeName(it->type)));
        it->type = t;
        break;
      }
    }
  }
  if (Has(o, Fault::kUnknownTensorName)) {
    const std::string p = "blk." + std::to_string(first_moe) + ".";
    ExpectedTensor extra{p + "ffn_mystery.weight", {int64_t{d.hidden}}, GgmlType::F32, TensorRole::kNorm,
                         static_cast<int32_t>(first_moe)};
    table.insert(find(p + "ffn_norm.weight") + 1, extra);
    res.fault_notes.push_back("unknown-tensor-name: extra tensor " + extra.name);
  }
  std::map<std::string, Fault>& ssm_faults = p.ssm_faults;
  const Fault ssm_kinds[] = {Fault::kRawSsmA, Fault::kNanSsmA, Fault::kZeroSsmA};
  for (size_t k = 0; k < 3; ++k) {
    if (!Has(o, ssm_kinds[k])) continue;
    if (kda.empty()) return Error("synth: fault " + std::string(FaultName(ssm_kinds[k])) + " needs a KDA layer");
    const std::string name = "blk." + std::to_string(kda[std::min(k, kda.size() - 1)]) + ".ssm_a";
    if (const auto t = find(name); t != table.end() && IsBlockType(t->type)) {
      // The defect is a value pattern; random quant blocks cannot carry it.
      return Error("synth: fault " + std::string(FaultName(ssm_kinds[k])) + " needs a float " + name + ", not " +
                   std::string(GgmlTypeName(t->type)) + " (see --tensor-type)");
    }
    if (!ssm_faults.emplace(name, ssm_kinds[k]).second) {
      return Error("synth: faults " + std::string(FaultName(ssm_faults[name])) + " and " +
                   std::string(FaultName(ssm_kinds[k])) + " would both hit " + name +
                   "; use a model with more KDA layers");
    }
    res.fault_notes.push_back(std::string(FaultName(ssm_kinds[k])) + ": " + name);
  }
  return p;
}

struct TensorSpecs {
  std::vector<gguf::TensorSpec> specs;
  std::vector<uint64_t> padded_bytes;  // each tensor's bytes padded to 32, for the shard assignment
};

// The writer's tensor specs: deterministic payloads per (seed, name), holes
// for tensors above the hole threshold, progress counted as ranges are filled.
TensorSpecs SpecsOf(const ModelPlan& plan, const SynthOptions& o) {
  TensorSpecs out;
  std::vector<gguf::TensorSpec>& specs = out.specs;
  auto progress = std::make_shared<Progress>();
  progress->phase = "synth";
  progress->unit = "tensors";
  const std::vector<ExpectedTensor>& table = plan.table;
  const std::map<std::string, Fault>& ssm_faults = plan.ssm_faults;
  specs.reserve(table.size());
  for (const ExpectedTensor& t : table) {
    gguf::TensorSpec s;
    s.name = t.name;
    s.type = t.type;
    s.ne = t.ne;
    const uint64_t bytes = TensorBytes(t);
    out.padded_bytes.push_back((bytes + 31) / 32 * 32);
    const uint64_t seed = TensorSeed(o.seed, t.name);
    if (t.role == TensorRole::kSsmA && !IsBlockType(t.type)) {
      auto it = ssm_faults.find(t.name);
      auto vals = std::make_shared<std::vector<float>>(
          SsmAValues(seed, t.ne[0], it == ssm_faults.end() ? std::nullopt : std::optional<Fault>(it->second)));
      s.fill = [vals, type = t.type](uint64_t off, std::span<uint8_t> out) { EncodeFloats(type, *vals, off, out); };
    } else if (bytes <= o.hole_threshold_bytes) {
      const FillPlan fp{t.type, KindFor(t.role), seed};
      s.fill = [fp](uint64_t off, std::span<uint8_t> out) { FillRange(fp, off, out); };
    }  // else: a hole
    if (s.fill && o.progress) {
      // Count what the writer fills; a tensor is done when its last range is.
      progress->total_bytes += bytes;
      progress->total_objects += 1;
      s.fill = [inner = std::move(s.fill), progress, bytes, report = o.progress](uint64_t off, std::span<uint8_t> out) {
        inner(off, out);
        progress->done_bytes += out.size();
        if (off + out.size() >= bytes) progress->done_objects += 1;
        report(*progress);
      };
    }
    specs.push_back(std::move(s));
  }
  return out;
}

// The faults that patch bytes the writer wrote, each noted in res.
Status ApplyWrittenFaults(const SynthOptions& o, SynthResult& res) {
  const uint64_t tensor_count = res.tensor_count;
  if (Has(o, Fault::kBadSplitNo)) {
    const uint32_t target = res.shard_paths.size() >= 2 ? 1 : 0;
    const uint16_t bad = static_cast<uint16_t>(target + 1);
    K3_ASSIGN_OR_RETURN(uint64_t at, ValueOffset(res.shard_paths[target], "split.no"));
    K3_RETURN_IF_ERROR(PatchFile(res.shard_paths[target], at, &bad, 2));
    res.fault_notes.push_back("bad-split-no: " + fs::path(res.shard_paths[target]).filename().string() +
                              " has split.no " + std::to_string(bad) + " instead of " + std::to_string(target));
  }
  if (Has(o, Fault::kStaleTensorCount)) {
    const int32_t stale = static_cast<int32_t>(tensor_count + 1);
    for (const std::string& p : res.shard_paths) {
      K3_ASSIGN_OR_RETURN(uint64_t at, ValueOffset(p, "split.tensors.count"));
      K3_RETURN_IF_ERROR(PatchFile(p, at, &stale, 4));
    }
    res.fault_notes.push_back("stale-tensor-count: split.tensors.count is " + std::to_string(stale) + ", " +
                              std::to_string(tensor_count) + " tensors written");
  }
  if (Has(o, Fault::kTruncatedShard)) {
    const std::string& last = res.shard_paths.back();
    uint64_t cut = 0;
    std::string victim;
    {
      K3_ASSIGN_OR_RETURN(auto file, gguf::GgufFile::Open(last));
      const gguf::TensorInfo* t = nullptr;
      for (const auto& ti : file->tensors()) {
        if (t == nullptr || ti.data_offset > t->data_offset) t = &ti;
      }
      cut = t->data_offset + t->nbytes / 2;
      victim = t->name;
    }
    if (::truncate(last.c_str(), static_cast<off_t>(cut)) != 0) return Error::FromErrno("cannot truncate " + last, errno);
    K3_RETURN_IF_ERROR(FsyncPath(last));
    res.fault_notes.push_back("truncated-shard: " + fs::path(last).filename().string() + " cut to " +
                              std::to_string(cut) + " bytes, inside " + victim);
  }

  return Status::OK();
}

// config.json beside the shards, and the tokenizer directory.
Status WriteConfigAndTokenizer(const SynthOptions& o, const SynthDims& d, const SynthVocab& vocab, SynthResult& res) {
  std::error_code ec;
  const std::string config = ConfigJson(d, vocab).dump(2) + "\n";
  res.config_path = (fs::path(o.out_dir) / "config.json").string();
  res.tokenizer_dir = (fs::path(o.out_dir) / "tokenizer").string();
  fs::create_directories(res.tokenizer_dir, ec);
  if (ec) return Error::FromErrno("cannot create directory " + res.tokenizer_dir, ec.value());
  K3_RETURN_IF_ERROR(WriteFileAtomic(res.config_path, config));
  K3_RETURN_IF_ERROR(WriteFileAtomic(res.tokenizer_dir + "/config.json", config));
  K3_RETURN_IF_ERROR(
      WriteFileAtomic(res.tokenizer_dir + "/tokenizer_config.json", TokenizerConfigJson(vocab, d).dump(2) + "\n"));
  K3_RETURN_IF_ERROR(WriteFileAtomic(res.tokenizer_dir + "/tiktoken.model", TiktokenModel(vocab)));

  return Status::OK();
}

}  // namespace

Result<uint64_t> PlannedTensorCount(const SynthOptions& o) {
  K3_ASSIGN_OR_RETURN(ModelPlan p, PlanModel(o));
  return p.table.size();
}

Result<SynthResult> WriteSynthModel(const SynthOptions& o) {
  if (o.out_dir.empty()) return Error("synth: no output directory given");
  if (o.alignment == 0 || (o.alignment & (o.alignment - 1)) != 0) {
    return Error("synth: alignment must be a nonzero power of two, got " + std::to_string(o.alignment));
  }
  if (o.shards < 1 || o.shards > 65535) {
    return Error("synth: shard count must be in 1..65535 (split.count is UINT16)");
  }
  K3_ASSIGN_OR_RETURN(ModelPlan plan, PlanModel(o));
  const SynthDims& d = plan.d;
  const std::vector<ExpectedTensor>& table = plan.table;
  SynthResult& res = plan.res;
  if (o.shards > table.size()) {
    return Error("synth: " + std::to_string(o.shards) + " shards requested for only " + std::to_string(table.size()) +
                 " tensors");
  }

  const TensorSpecs tensors = SpecsOf(plan, o);
  const std::vector<gguf::TensorSpec>& specs = tensors.specs;
  const std::vector<uint32_t> shard_of = AssignShards(tensors.padded_bytes, o.shards);

  const SynthVocab vocab = MakeVocab(d.vocab);
  const gguf::MetadataBuilder meta = BuildMetadata(o, d, vocab);
  gguf::MetadataBuilder per_shard;
  per_shard.Str("general.architecture", "kimi-k3");
  if (o.metadata_in_every_shard) {
    for (const auto& e : meta.entries()) per_shard.Raw(e.key, e.type, e.encoded);
  }

  std::error_code ec;
  fs::create_directories(o.out_dir, ec);
  if (ec) return Error::FromErrno("cannot create directory " + o.out_dir, ec.value());
  K3_RETURN_IF_ERROR(RemoveOldSet(o.out_dir, o.prefix));
  gguf::WriteOptions wopts;
  wopts.alignment = o.alignment;
  K3_ASSIGN_OR_RETURN(res.shard_paths,
                      gguf::WriteGgufSplit(o.out_dir, o.prefix, o.metadata_in_every_shard ? gguf::MetadataBuilder{} : meta,
                                           per_shard, specs, shard_of, wopts));
  res.tensor_count = specs.size();

  K3_RETURN_IF_ERROR(ApplyWrittenFaults(o, res));
  K3_RETURN_IF_ERROR(WriteConfigAndTokenizer(o, d, vocab, res));
  for (const std::string& p : res.shard_paths) {
    K3_ASSIGN_OR_RETURN(uint64_t size, FileSize(p));
    res.total_bytes += size;
  }
  return res;
}

}  // namespace k3pack::synth
