// The GGUF -> SGLang name table of kimi_k3_gguf.py (spec §5.1, §5.2).
#include "k3pack/names.h"

#include <array>

#include "util/utf8.h"

namespace k3pack::kimi {

namespace {

constexpr std::string_view kBlk = "blk.";

// Splits "blk.<digits>.<suffix>" (suffix non-empty) as SGLang's
// ^blk\.(?P<layer>\d+)\.(?P<suffix>.+)$ does; false otherwise. `\d` is
// Python's: any Unicode decimal digit, read as int() reads it (`layer`).
bool SplitLayerName(std::string_view name, PyDecimal* layer, std::string_view* suffix) {
  if (name.substr(0, kBlk.size()) != kBlk) return false;
  std::string_view rest = name.substr(kBlk.size());
  size_t dot = rest.find('.');
  if (dot == std::string_view::npos) return false;
  std::string_view tail = rest.substr(dot + 1);
  // `.+` in Python's re does not match a newline; names with one are unknown.
  if (tail.empty() || tail.find('\n') != std::string_view::npos) return false;
  std::optional<PyDecimal> digits = ParsePyDecimal(rest.substr(0, dot));
  if (!digits) return false;
  *layer = std::move(*digits);
  *suffix = tail;
  return true;
}

Error Unsupported(std::string_view name) {
  return Error("unsupported Kimi-K3 GGUF tensor name: " + std::string(name), ErrorKind::kKey);
}

}  // namespace

const char* TargetTransformName(TargetTransform t) {
  switch (t) {
    case TargetTransform::kNone: return "none";
    case TargetTransform::kALog: return "a_log";
    case TargetTransform::kResidualProjection: return "residual_projection";
    case TargetTransform::kResidualNorm: return "residual_norm";
  }
  return "?";
}

const char* NameTableName(NameTable t) {
  switch (t) {
    case NameTable::kTopLevel: return "top-level";
    case NameTable::kResidual: return "residual";
    case NameTable::kCommon: return "common";
    case NameTable::kKda: return "kda";
    case NameTable::kMla: return "mla";
  }
  return "?";
}

const std::vector<TableRow>& LayerTableRows() {
  static const std::vector<TableRow> rows = {
      // common
      {"attn_norm.weight", "input_layernorm.weight", NameTable::kCommon},
      {"ffn_norm.weight", "post_attention_layernorm.weight", NameTable::kCommon},
      {"attn_output.weight", "self_attn.o_proj.weight", NameTable::kCommon},
      {"ffn_gate.weight", "mlp.gate_proj.weight", NameTable::kCommon},
      {"ffn_up.weight", "mlp.up_proj.weight", NameTable::kCommon},
      {"ffn_down.weight", "mlp.down_proj.weight", NameTable::kCommon},
      {"exp_probs_b.bias", "mlp.gate.e_score_correction_bias", NameTable::kCommon},
      {"ffn_gate_inp.weight", "mlp.gate.weight", NameTable::kCommon},
      {"ffn_routed_down.weight", "mlp.routed_expert_down_proj.weight", NameTable::kCommon},
      {"ffn_routed_norm.weight", "mlp.routed_expert_norm.weight", NameTable::kCommon},
      {"ffn_routed_up.weight", "mlp.routed_expert_up_proj.weight", NameTable::kCommon},
      {"ffn_gate_shexp.weight", "mlp.shared_experts.gate_proj.weight", NameTable::kCommon},
      {"ffn_up_shexp.weight", "mlp.shared_experts.up_proj.weight", NameTable::kCommon},
      {"ffn_down_shexp.weight", "mlp.shared_experts.down_proj.weight", NameTable::kCommon},
      // KDA (recurrent) layers
      {"attn_q.weight", "self_attn.q_proj.weight", NameTable::kKda},
      {"attn_k.weight", "self_attn.k_proj.weight", NameTable::kKda},
      {"attn_v.weight", "self_attn.v_proj.weight", NameTable::kKda},
      {"ssm_g.weight", "self_attn.g_proj.weight", NameTable::kKda},
      {"ssm_beta.weight", "self_attn.b_proj.weight", NameTable::kKda},
      {"ssm_f_a.weight", "self_attn.f_a_proj.weight", NameTable::kKda},
      {"ssm_f_b.weight", "self_attn.f_b_proj.weight", NameTable::kKda},
      {"ssm_conv1d_q.weight", "self_attn.q_conv1d.weight", NameTable::kKda},
      {"ssm_conv1d_k.weight", "self_attn.k_conv1d.weight", NameTable::kKda},
      {"ssm_conv1d_v.weight", "self_attn.v_conv1d.weight", NameTable::kKda},
      {"ssm_a", "self_attn.A_log", NameTable::kKda},
      {"ssm_dt.bias", "self_attn.dt_bias", NameTable::kKda},
      {"ssm_norm.weight", "self_attn.o_norm.weight", NameTable::kKda},
      // MLA (full-attention) layers
      {"attn_q_a.weight", "self_attn.q_a_proj.weight", NameTable::kMla},
      {"attn_q_a_norm.weight", "self_attn.q_a_layernorm.weight", NameTable::kMla},
      {"attn_q_b.weight", "self_attn.q_b_proj.weight", NameTable::kMla},
      {"attn_kv_a_mqa.weight", "self_attn.kv_a_proj_with_mqa.weight", NameTable::kMla},
      {"attn_kv_a_norm.weight", "self_attn.kv_a_layernorm.weight", NameTable::kMla},
      {"attn_gate.weight", "self_attn.g_proj.weight", NameTable::kMla},
      {"attn_k_b.weight", "self_attn.k_b_qweight", NameTable::kMla},
      {"attn_v_b.weight", "self_attn.v_b_qweight", NameTable::kMla},
  };
  return rows;
}

Result<Mapping> MapTensorName(std::string_view name) {
  Mapping m;
  if (name == "output_res_score.weight") {
    m.table = NameTable::kResidual;
    m.targets = {{"model.output_attn_res_proj.weight", TargetTransform::kResidualProjection},
                 {"model.output_attn_res_norm.weight", TargetTransform::kResidualNorm}};
    return m;
  }
  static constexpr std::array<std::pair<std::string_view, std::string_view>, 3> kTop = {{
      {"token_embd.weight", "model.embed_tokens.weight"},
      {"output.weight", "lm_head.weight"},
      {"output_norm.weight", "model.norm.weight"},
  }};
  for (const auto& [g, s] : kTop) {
    if (name == g) {
      m.table = NameTable::kTopLevel;
      m.targets = {{std::string(s), TargetTransform::kNone}};
      return m;
    }
  }
  PyDecimal layer;
  std::string_view suffix;
  if (!SplitLayerName(name, &layer, &suffix)) return Unsupported(name);
  // SGLang's prefix is f"model.layers.{int(layer)}.": "01" and "\u0663" are
  // written 1 and 3, a number past 64 bits in full.
  const std::string prefix = "model.layers." + layer.text + ".";
  // Layer numbers beyond uint32 still map (the regex does not bound them);
  // `layer` is informational only.
  if (layer.value <= UINT32_MAX) m.layer = static_cast<uint32_t>(layer.value);
  if (suffix == "attn_res_score.weight" || suffix == "ffn_res_score.weight") {
    const std::string base = suffix == "attn_res_score.weight" ? "self_attention_res_" : "mlp_res_";
    m.table = NameTable::kResidual;
    m.targets = {{prefix + base + "proj.weight", TargetTransform::kResidualProjection},
                 {prefix + base + "norm.weight", TargetTransform::kResidualNorm}};
    return m;
  }
  for (const TableRow& row : LayerTableRows()) {
    if (suffix == row.gguf_suffix) {
      m.table = row.table;
      m.targets = {{prefix + row.sglang_suffix,
                    suffix == "ssm_a" ? TargetTransform::kALog : TargetTransform::kNone}};
      return m;
    }
  }
  return Unsupported(name);
}

std::string ConverterSpelling(std::string_view name) {
  PyDecimal layer;
  std::string_view suffix;
  if (!SplitLayerName(name, &layer, &suffix)) return std::string(name);
  return std::string(kBlk) + layer.text + "." + std::string(suffix);
}

bool IsRoutedExpertAggregate(std::string_view name) {
  PyDecimal layer;
  std::string_view suffix;
  if (!SplitLayerName(name, &layer, &suffix)) return false;
  return suffix == "ffn_gate_exps.weight" || suffix == "ffn_up_exps.weight" || suffix == "ffn_down_exps.weight";
}

bool IsSglangQuantized(GgmlType type) {
  return type != GgmlType::F32 && type != GgmlType::F16 && type != GgmlType::BF16;
}

int64_t SsmAHeadsOf(std::span<const int64_t> ne) {
  if (ne.size() == 1 && ne[0] > 0) return ne[0];
  if (ne.size() == 4 && ne[0] == 1 && ne[1] > 0 && ne[2] == 1 && ne[3] == 1) return ne[1];
  return -1;
}

std::string RuntimeName(std::string_view target, bool quantized) {
  constexpr std::string_view kWeight = ".weight";
  if (quantized && target.size() >= kWeight.size() && target.substr(target.size() - kWeight.size()) == kWeight) {
    return std::string(target.substr(0, target.size() - 6)) + "qweight";
  }
  return std::string(target);
}

std::string QweightTypeName(std::string_view runtime_name) {
  constexpr std::string_view kQ = "qweight";
  std::string_view base = runtime_name;
  if (base.size() >= kQ.size() && base.substr(base.size() - kQ.size()) == kQ) base.remove_suffix(kQ.size());
  return std::string(base) + "qweight_type";
}

}  // namespace k3pack::kimi
