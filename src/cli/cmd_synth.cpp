// k3pack synth: writes a synthetic Kimi-K3 split GGUF set + config + tokenizer.
#include <algorithm>
#include <chrono>
#include <iostream>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/output_rule.h"
#include "cli/profile.h"
#include "kimi/synth_output.h"
#include "util/utf8.h"
#include "k3pack/synth.h"

namespace k3pack::cli {
namespace {

constexpr const char* kCmd = "synth";
// Overrides a dimension when its option was given.
Status SetDim(const Args& args, const std::string& opt, uint32_t* field) {
  if (!args.Has(opt)) return Status::OK();
  K3_ASSIGN_OR_RETURN(int64_t v, args.GetInt(opt));
  if (v < 1 || v > UINT32_MAX) return Error(opt + " must be a positive 32-bit integer, got " + std::to_string(v));
  *field = static_cast<uint32_t>(v);
  return Status::OK();
}

Result<synth::SynthOptions> BuildOptions(const Args& args, const std::vector<std::string>& layer_types) {
  K3_ASSIGN_OR_RETURN(synth::SynthOptions o, synth::PresetOptions(args.Get("--preset")));
  o.out_dir = args.Get("--out");
  o.prefix = args.Get("--prefix");
  if (args.Has("--seed")) {
    K3_ASSIGN_OR_RETURN(int64_t seed, args.GetInt("--seed"));
    if (seed < 0) return Error("--seed must be a non-negative integer, got " + args.Get("--seed"));
    o.seed = static_cast<uint64_t>(seed);
  }
  synth::SynthDims& d = o.dims;
  K3_RETURN_IF_ERROR(SetDim(args, "--layers", &d.num_layers));
  K3_RETURN_IF_ERROR(SetDim(args, "--experts", &d.num_experts));
  K3_RETURN_IF_ERROR(SetDim(args, "--top-k", &d.top_k));
  K3_RETURN_IF_ERROR(SetDim(args, "--hidden", &d.hidden));
  K3_RETURN_IF_ERROR(SetDim(args, "--latent", &d.latent));
  K3_RETURN_IF_ERROR(SetDim(args, "--moe-intermediate", &d.moe_intermediate));
  K3_RETURN_IF_ERROR(SetDim(args, "--heads", &d.heads));
  K3_RETURN_IF_ERROR(SetDim(args, "--head-dim", &d.head_dim));
  K3_RETURN_IF_ERROR(SetDim(args, "--vocab", &d.vocab));
  K3_RETURN_IF_ERROR(SetDim(args, "--shards", &o.shards));
  if (args.Has("--expert-types")) {
    K3_ASSIGN_OR_RETURN(o.expert_types, synth::ParseExpertTypes(args.Get("--expert-types")));
  }
  K3_ASSIGN_OR_RETURN(o.layer_expert_types, synth::ParseLayerExpertTypes(layer_types));
  if (args.Has("--matrix-type")) {
    auto t = GgmlTypeFromTypedName(args.Get("--matrix-type"));
    if (!t) return Error("--matrix-type: unknown ggml type '" + args.Get("--matrix-type") + "'");
    o.matrix_type = *t;
  }
  if (args.Has("--fault")) {
    const std::string list = args.Get("--fault");
    size_t pos = 0;
    while (pos <= list.size()) {
      size_t end = list.find(',', pos);
      if (end == std::string::npos) end = list.size();
      if (end > pos) {
        K3_ASSIGN_OR_RETURN(synth::Fault f, synth::ParseFault(list.substr(pos, end - pos)));
        o.faults.push_back(f);
      }
      pos = end + 1;
    }
  }
  K3_ASSIGN_OR_RETURN(o.tensor_types, synth::ParseTensorTypes(args.GetAll("--tensor-type")));
  if (args.Has("--alignment")) {
    K3_ASSIGN_OR_RETURN(int64_t al, args.GetInt("--alignment"));
    if (al < 1 || al > UINT32_MAX || (al & (al - 1)) != 0)
      return Error("--alignment must be a power of two that fits a u32 (general.alignment), got " + args.Get("--alignment"));
    o.alignment = static_cast<uint32_t>(al);
  }
  if (args.Has("--metadata-in-every-shard")) o.metadata_in_every_shard = true;
  if (args.Has("--all-data")) o.hole_threshold_bytes = UINT64_MAX;
  // The writer's rules on these values, checked here to name the option.
  if (d.num_layers <= d.first_k_dense)
    return Error("--layers must be at least " + std::to_string(d.first_k_dense + 1) + " (" +
                 std::to_string(d.first_k_dense) + " dense layer(s), then at least one MoE layer), got " +
                 std::to_string(d.num_layers));
  if (d.top_k > d.num_experts)
    return Error("--top-k " + std::to_string(d.top_k) + " must be at most --experts (" +
                 std::to_string(d.num_experts) + ")");
  if (o.shards > 65535)
    return Error("--shards must be in 1..65535 (split.count is UINT16), got " + std::to_string(o.shards));
  K3_ASSIGN_OR_RETURN(uint64_t tensors, synth::PlannedTensorCount(o));
  if (o.shards > tensors)
    return Error("--shards " + std::to_string(o.shards) + " is more than the model's " + std::to_string(tensors) +
                 " tensors (every shard holds at least one)");
  return o;
}

// The arguments as the model's sidecar records them. A sidecar of an
// earlier k3pack recorded them as given, with the per-layer types moved last:
// the same arguments are still the same model.
nlohmann::json ArgsAsRecorded(const std::vector<std::string>& argv, const std::vector<std::string>& layer_types) {
  nlohmann::json recorded = nlohmann::json::array();
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a == "--layer-expert-types") {
      ++i;  // its value, recorded below
    } else if (a.rfind("--layer-expert-types=", 0) != 0 && a != "--force" && a != "--json") {
      recorded.push_back(a);
    }
  }
  for (const auto& l : layer_types) recorded.push_back("--layer-expert-types=" + l);
  return recorded;
}

void PrintWritten(const kimi::SynthOutput& written, const std::string& out_dir, uint64_t seed, double secs,
                  bool as_json) {
  const synth::SynthResult& res = written.written;
  const kimi::Profile profile = written.profile;
  if (as_json) {
    nlohmann::json j = {{"out_dir", out_dir},
                        {"shards", res.shard_paths},
                        {"config", res.config_path},
                        {"tokenizer_dir", res.tokenizer_dir},
                        {"tensor_count", res.tensor_count},
                        {"total_bytes", res.total_bytes},
                        {"mla_layers", res.mla_layers},
                        {"seed", seed},
                        {"faults", res.fault_notes},
                        {"profile", kimi::ProfileName(profile)},
                        {"seconds", secs}};
    PrintJson(j);
    return;
  }
  std::cout << "wrote " << res.shard_paths.size() << " shards, " << res.tensor_count << " tensors, "
            << res.total_bytes << " bytes (apparent) to " << out_dir << " in " << secs << " s\n"
            << "config: " << res.config_path << "\ntokenizer: " << res.tokenizer_dir << "\n"
            << "profile: " << kimi::ProfileName(profile) << " (recorded in " << out_dir << "/" << kProfileSidecar
            << ")\n";
  for (const auto& n : res.fault_notes) std::cout << "fault " << n << "\n";
}

int RunSynth(const std::vector<std::string>& argv_in) {
  std::string faults;
  for (synth::Fault f : synth::AllFaults()) faults += (faults.empty() ? "" : ", ") + std::string(synth::FaultName(f));
  Args args(kCmd, "--out DIR [--preset tiny|k3-structure] [options]",
            "Writes a synthetic Kimi-K3 checkpoint in llama.cpp's exact layout: a split GGUF set\n"
            "DIR/<prefix>-NNNNN-of-NNNNN.gguf, DIR/config.json and DIR/tokenizer/. Deterministic per --seed.");
  args.Option("--out", "output directory", std::nullopt, true)
      .Option("--preset", "tiny (test model) or k3-structure (real dimensions, sparse data)", "tiny")
      .Option("--seed", "seed of every payload byte", "0")
      .Option("--prefix", "shard file name prefix", "KIMI-K3-SYNTH")
      .Option("--layers", "override: number of layers (layer 0 dense, the rest MoE)")
      .Option("--experts", "override: routed experts per MoE layer")
      .Option("--top-k", "override: experts used per token")
      .Option("--hidden", "override: hidden size")
      .Option("--latent", "override: routed expert hidden size (latent)")
      .Option("--moe-intermediate", "override: expert intermediate size")
      .Option("--heads", "override: attention heads")
      .Option("--head-dim", "override: KDA head dim (also MLA qk_nope and v_head)")
      .Option("--vocab", "override: vocabulary size")
      .Option("--shards", "override: number of shards")
      .Option("--expert-types", "routed expert types up,gate,down", "Q2_K,Q2_K,Q3_K")
      .Option("--layer-expert-types", "per-layer override L:up,gate,down (or several, ';'-separated)")
      .Repeatable("--layer-expert-types")
      .Option("--matrix-type", "type of the other 2-D weights (falls back like llama-quantize)", "Q8_0")
      .Option("--tensor-type", "override PATTERN=TYPE: tensors whose name contains PATTERN get TYPE (first match wins; "
                               "';'-separated or repeated), e.g. attn_=BF16 or ffn_down_exps=IQ3_XXS")
      .Repeatable("--tensor-type")
      .Option("--alignment", "general.alignment of every shard (a power of two)", "32")
      .Flag("--metadata-in-every-shard", "write the model metadata into every shard, not only shard 0")
      .Option("--fault", "inject defects (comma-separated): " + faults)
      .Flag("--all-data", "write real data for every tensor (no sparse holes)")
      .Flag("--force", "write into a non-empty --out (otherwise refused; the same model already there is reported)")
      .Flag("--json", "print the result as JSON");
  AddProgressOption(args);
  AddWaitOption(args);
  int code = 0;
  if (!args.Parse(argv_in, &code)) return code;
  auto wait = LockWaitOf(args, kCmd);
  if (!wait.ok()) return ReportError(kCmd, wait.error(), kExitUsage);
  const k3pack::ScopedLockWait waiting(*wait);
  const std::vector<std::string> layer_types = args.GetAll("--layer-expert-types");
  // Every value is checked before --out is looked at.
  auto opts = BuildOptions(args, layer_types);
  if (!opts.ok()) return ReportError(kCmd, opts.error(), kExitUsage);
  auto mode = ProgressModeOf(args);
  if (!mode.ok()) return ReportError(kCmd, mode.error(), kExitUsage);

  kimi::SynthOutputRequest request;
  request.options = *opts;
  request.force = args.Has("--force");
  request.why_refused = "it is not a model written by `k3pack synth` with these options";
  request.args_given = ArgsAsRecorded(argv_in, layer_types);
  request.note = [](const std::string& line) { Narrate("synth", "note: " + line); };
  auto progress = StartProgress(*mode);
  request.options.progress = progress->Fn();

  const auto t0 = std::chrono::steady_clock::now();
  auto written = kimi::WriteSynthModelInto(request);
  progress->Finish();
  if (!written.ok()) return ReportError(kCmd, written.error());
  if (written->already_built) {
    ReportAlreadyBuilt(kCmd, opts->out_dir, args.Has("--json"), "out_dir");
    return kExitOk;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  PrintWritten(*written, opts->out_dir, opts->seed, secs, args.Has("--json"));
  return 0;
}

}  // namespace

K3_COMMAND("synth", "write a synthetic Kimi-K3 GGUF set (tiny or real dimensions), optionally with faults", RunSynth);

}  // namespace k3pack::cli
