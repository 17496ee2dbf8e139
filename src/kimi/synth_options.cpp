// Presets, layer pattern and the option parsers of the synthetic writer.
#include <array>
#include <charconv>

#include "k3pack/synth.h"

namespace k3pack::synth {

SynthDims TinyDims() { return SynthDims{}; }

SynthDims K3StructureDims() {
  SynthDims d;
  d.num_layers = 93;
  d.first_k_dense = 1;
  d.num_experts = 896;
  d.top_k = 16;
  d.num_shared_experts = 2;
  d.hidden = 7168;
  d.latent = 3584;
  d.moe_intermediate = 3072;
  d.dense_intermediate = 33792;
  d.heads = 96;
  d.head_dim = 128;
  d.qk_rope = 64;
  d.q_lora_rank = 1536;
  d.kv_lora_rank = 512;
  d.conv_kernel = 4;
  d.vocab = 163840;
  d.context_length = 1048576;
  d.attn_res_block_size = 12;
  return d;
}

bool IsMlaLayer(const SynthDims& dims, uint32_t il) {
  if (dims.mla_layers) {
    for (uint32_t m : *dims.mla_layers) {
      if (m == il) return true;
    }
    return false;
  }
  // K3: 1-based full_attn_layers = {4, 8, ..., 92, 93}.
  return (il + 1) % 4 == 0 || il + 1 == dims.num_layers;
}

Result<SynthOptions> PresetOptions(std::string_view preset) {
  SynthOptions o;
  if (preset == "tiny") {
    o.dims = TinyDims();
    o.shards = 3;
    return o;
  }
  if (preset == "k3-structure") {
    o.dims = K3StructureDims();
    o.shards = 19;
    // Only vectors and small tensors carry data (norms, ssm_a, residual
    // scores, conv taps); matrices and expert stacks are sparse holes.
    o.hole_threshold_bytes = 256 * 1024;
    return o;
  }
  return Error("unknown preset '" + std::string(preset) + "' (expected tiny or k3-structure)");
}

Result<ExpertTypes> ParseExpertTypes(std::string_view text) {
  std::array<GgmlType, 3> t{};
  size_t pos = 0;
  for (int i = 0; i < 3; ++i) {
    const size_t comma = text.find(',', pos);
    if ((i < 2) != (comma != std::string_view::npos)) {
      return Error("expert types must be three type names 'up,gate,down' (e.g. Q2_K,Q2_K,Q3_K), got '" +
                   std::string(text) + "'");
    }
    const std::string_view name = text.substr(pos, i < 2 ? comma - pos : std::string_view::npos);
    auto type = GgmlTypeFromTypedName(name);
    if (!type) return Error("unknown ggml type '" + std::string(name) + "' in expert types '" + std::string(text) + "'");
    t[i] = *type;
    pos = comma + 1;
  }
  return ExpertTypes{t[0], t[1], t[2]};
}

namespace {

// Each non-empty ';'-separated item of every (repeatable) option value, in order.
template <class Fn>
Status ForEachItem(const std::vector<std::string>& values, Fn&& fn) {
  for (const std::string& joined : values) {
    size_t pos = 0;
    while (pos <= joined.size()) {
      size_t end = joined.find(';', pos);
      if (end == std::string::npos) end = joined.size();
      const std::string_view item = std::string_view(joined).substr(pos, end - pos);
      pos = end + 1;
      if (!item.empty()) K3_RETURN_IF_ERROR(fn(item));
    }
  }
  return Status::OK();
}

}  // namespace

Result<std::map<uint32_t, ExpertTypes>> ParseLayerExpertTypes(const std::vector<std::string>& items) {
  std::map<uint32_t, ExpertTypes> out;
  K3_RETURN_IF_ERROR(ForEachItem(items, [&](std::string_view item) -> Status {
    const size_t colon = item.find(':');
    uint32_t layer = 0;
    auto [p, ec] = std::from_chars(item.data(), item.data() + (colon == std::string_view::npos ? 0 : colon), layer);
    if (colon == std::string_view::npos || colon == 0 || ec != std::errc() || p != item.data() + colon) {
      return Error("layer expert types must look like 'L:up,gate,down' (e.g. 3:IQ2_XS,IQ2_XS,IQ3_XXS), got '" +
                   std::string(item) + "'");
    }
    K3_ASSIGN_OR_RETURN(ExpertTypes types, ParseExpertTypes(item.substr(colon + 1)));
    if (!out.emplace(layer, types).second) {
      return Error("layer " + std::to_string(layer) + " is given expert types twice");
    }
    return Status::OK();
  }));
  return out;
}

Result<std::vector<TensorTypeOverride>> ParseTensorTypes(const std::vector<std::string>& items) {
  std::vector<TensorTypeOverride> out;
  K3_RETURN_IF_ERROR(ForEachItem(items, [&](std::string_view item) -> Status {
    const size_t eq = item.rfind('=');
    if (eq == std::string_view::npos || eq == 0 || eq + 1 == item.size()) {
      return Error("tensor types must look like 'PATTERN=TYPE' (e.g. attn_q_b=BF16), got '" + std::string(item) + "'");
    }
    auto type = GgmlTypeFromTypedName(item.substr(eq + 1));
    if (!type) {
      return Error("unknown ggml type '" + std::string(item.substr(eq + 1)) + "' in tensor type '" +
                   std::string(item) + "'");
    }
    out.push_back({std::string(item.substr(0, eq)), *type});
    return Status::OK();
  }));
  return out;
}

namespace {
constexpr std::array<std::pair<Fault, std::string_view>, 9> kFaults = {{
    {Fault::kRawSsmA, "raw-ssm-a"},
    {Fault::kNanSsmA, "nan-ssm-a"},
    {Fault::kZeroSsmA, "zero-ssm-a"},
    {Fault::kBadSplitNo, "bad-split-no"},
    {Fault::kStaleTensorCount, "stale-tensor-count"},
    {Fault::kMissingExpert, "missing-expert"},
    {Fault::kWrongExpertDtype, "wrong-expert-dtype"},
    {Fault::kUnknownTensorName, "unknown-tensor-name"},
    {Fault::kTruncatedShard, "truncated-shard"},
}};
}  // namespace

std::string_view FaultName(Fault f) {
  for (const auto& [fault, name] : kFaults) {
    if (fault == f) return name;
  }
  return "?";
}

Result<Fault> ParseFault(std::string_view name) {
  std::string all;
  for (const auto& [fault, n] : kFaults) {
    if (n == name) return fault;
    all += (all.empty() ? "" : ", ") + std::string(n);
  }
  return Error("unknown fault '" + std::string(name) + "' (known: " + all + ")");
}

std::vector<Fault> AllFaults() {
  std::vector<Fault> out;
  for (const auto& [fault, name] : kFaults) out.push_back(fault);
  return out;
}

}  // namespace k3pack::synth
