// k3pack manifest: SGLang's prepare_kimi_manifest.py. Scans the GGUF shards,
// validates the expert pack, inventories the tokenizer and writes the
// SGLANG-KIMI-GGMLMOEPACK-ADAPTER-v1 manifest atomically.
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "cli/command.h"
#include "cli/implied_inputs.h"
#include "cli/output_rule.h"
#include "cli/pack_plan.h"
#include "cli/preflight.h"
#include "cli/profile.h"
#include "k3pack/manifest.h"
#include "k3pack/pack.h"
#include "manifest/manifest_output.h"
#include "manifest/pyjson.h"
#include "pack/progress.h"
#include "util/file.h"
#include "util/format.h"
#include "util/progress.h"

namespace k3pack::cli {
namespace {

constexpr const char* kCmd = "manifest";

struct Values {
  kimi::Profile profile{};
  int64_t samples = 0;
  pack::ProgressMode mode{};
};

Result<nlohmann::json> Run(const Args& args, const Values& v) {
  manifest::CreateOptions o;
  o.profile = v.profile;
  o.payload_samples = v.samples;
  o.gguf_dir = args.Get("--gguf-dir");
  o.expert_pack = args.Get("--pack");
  o.model_config = args.Get("--model-config");
  o.tokenizer_dir = args.Get("--tokenizer-dir");
  o.full_source_hashes = !args.Has("--no-full-source-hashes");
  o.full_pack_hash = args.Has("--full-pack-hash");
  std::string output = args.Get("--manifest");
  if (output.empty()) output = (std::filesystem::path(o.expert_pack).parent_path() / kDefaultManifestName).string();

  // Preflight: every input is what its option says, the output is none of them.
  K3_RETURN_IF_ERROR(CheckGgufDir("--gguf-dir", o.gguf_dir));
  K3_RETURN_IF_ERROR(CheckInputExists("--pack", o.expert_pack, ".pack"));
  K3_RETURN_IF_ERROR(CheckModelConfig("--model-config", o.model_config));
  K3_RETURN_IF_ERROR(CheckTokenizerDir("--tokenizer-dir", o.tokenizer_dir));
  // Before the shards are hashed: the output's path.
  K3_ASSIGN_OR_RETURN(std::vector<NamedPath> inputs,
                      manifest::PreflightManifestOutput("--manifest", output, args.Has("--force"), "--force", o.gguf_dir,
                                                        o.expert_pack, o.model_config, o.tokenizer_dir));
  inputs.push_back({"--manifest", output});
  K3_RETURN_IF_ERROR(CheckManifestRecordablePaths(inputs));

  std::unique_ptr<ProgressReporter> reporter;
  if (v.mode != pack::ProgressMode::kNone) {
    reporter = StartProgress(v.mode);
    // Steps as notes (JSON objects with --progress json); logs get the 10 s
    // lines of the long steps only.
    if (v.mode != pack::ProgressMode::kLines)
      o.progress = [r = reporter.get()](const std::string& s) { r->Note(kCmd, s); };
    o.pack_progress = reporter->Fn();
  }
  if (o.full_source_hashes && v.mode != pack::ProgressMode::kNone) {
    // The one long step (18 min for a full-scale model at 0.9 GB/s), said
    // before it starts: a log showed nothing for its first 10 s.
    uint64_t shard_bytes = 0;
    for (const NamedPath& in : inputs)
      if (auto size = FileSize(in.path); size.ok() && in.path.ends_with(".gguf")) shard_bytes += *size;
    Narrate(kCmd, "hashing every shard whole (" + HumanBytes(shard_bytes) +
                      ") for the manifest's whole-shard SHA-256; --no-full-source-hashes skips it");
  }
  const std::optional<FileStamp> seen = SeeOutput(output);
  K3_ASSIGN_OR_RETURN(nlohmann::json m, manifest::CreateManifest(o));
  OutputSpec spec;
  spec.option = "--manifest";
  spec.path = output;
  spec.force = args.Has("--force");
  spec.not_own_kind = [&] { return manifest::NotAManifestFile(output); };
  spec.is_finished = [&]() -> Result<bool> { return manifest::SameManifest(output, m); };
  spec.why_refused = "it differs from the manifest of these inputs";
  K3_ASSIGN_OR_RETURN(OutputAction action, DecideOutput(spec));
  if (action == OutputAction::kAlreadyBuilt) return nlohmann::json{{"already_built", true}, {"manifest", output}};
  K3_RETURN_IF_ERROR(CheckOutputWritable("--manifest", output));
  K3_RETURN_IF_ERROR(WriteIfStillAsSeen("--manifest", output, seen, [&] { return manifest::WriteManifest(output, m); }));
  K3_ASSIGN_OR_RETURN(std::string resolved, ResolvePath(output));
  return manifest::ManifestSummary(resolved, m);
}

int RunManifest(const std::vector<std::string>& argv) {
  Args args(kCmd,
            "[--gguf-dir] DIR [--pack PACK] [--model-config CONFIG] [--tokenizer-dir TOK] [--manifest M.json] [options]",
            "Prepare the small, zero-copy Kimi K3 GGUF/expert-pack adapter manifest "
            "(SGLANG-KIMI-GGMLMOEPACK-ADAPTER-v1, byte-compatible with SGLang's prepare_kimi_manifest.py).\n"
            "With --json prints SGLang's JSON summary on stdout, otherwise a line of text.");
  args.Option("--gguf-dir", "directory holding the <prefix>-NNNNN-of-NNNNN.gguf shards", std::nullopt, true)
      .PositionalAsOption("--gguf-dir")
      .Option("--pack", "the GGMLMOEPACKv1 pack built from these shards (default: <dir>/<prefix>.expert-major.pack, where `k3pack pack` writes it)")
      .Deprecated("--expert-pack", "--pack")
      .Option("--model-config", "HF config.json of the model (its text_config is used when present; default: "
                                "config.json beside the shards, else the tokenizer directory's)")
      .Option("--tokenizer-dir", "tokenizer/config directory the server loads (default: found beside the shards as SGLang's server finds it)")
      .Option("--manifest", std::string("manifest path, written atomically (default: ") + kDefaultManifestName +
                                " beside the pack)")
      .Deprecated("--output", "--manifest")
      .Option("--payload-samples", "evenly spaced pack entries compared byte-for-byte with GGUF", "6")
      .Flag("--full-source-hashes", "record the SHA-256 of every whole shard (the default; reads all shards)")
      .Flag("--no-full-source-hashes", "skip the whole-shard SHA-256s (then same-size edits outside the "
                                       "metadata go unnoticed)")
      .Exclusive({"--full-source-hashes", "--no-full-source-hashes"})
      .Flag("--full-pack-hash", "also record the SHA-256 of the whole pack (reads the whole pack)")
      .Option("--progress", "auto | bar | json | none (on stderr)", "auto")
      .Flag("--json", "print SGLang's JSON summary (otherwise text)");
  AddProfileOption(args);
  AddForceFlag(args, "manifest");
  int code = 0;
  if (!args.Parse(argv, &code)) return code;
  // The manifest is renamed into place whole: an interrupted run leaves the old one as it was.
  StopOnSignals(kCmd, "nothing was written, rerun the command to start over");
  if (Status s = FillImpliedInputs(args, kCmd, {.tokenizer_dir = true, .model_config = true, .pack = true}); !s.ok())
    return ReportError(kCmd, s.error(), kExitUsage);
  Values v;
  Status usage = [&]() -> Status {
    K3_ASSIGN_OR_RETURN(v.profile, ResolveProfile(args, {args.Get("--pack"), args.Get("--model-config"),
                                                          args.Get("--gguf-dir")}));
    K3_ASSIGN_OR_RETURN(v.samples, args.GetInt("--payload-samples"));
    if (v.samples < 0) return Error("--payload-samples must be non-negative");
    K3_ASSIGN_OR_RETURN(v.mode, pack::ParseProgressMode(args.Get("--progress"), StderrIsTty()));
    return Status::OK();
  }();
  if (!usage.ok()) return ReportError(kCmd, usage.error(), kExitUsage);
  auto r = Run(args, v);
  if (!r.ok()) return ReportError(kCmd, r.error());
  if (r->contains("already_built")) {
    const std::string path = (*r)["manifest"].get<std::string>();
    ReportAlreadyBuilt(kCmd, path, args.Has("--json"), "manifest",
                       {{"manifest", ResolvedPathOrGiven(path)}, {"path", ResolvedPathOrGiven(path)}});
    return kExitOk;
  }
  if (args.Has("--json")) {
    // print(json.dumps(summary, indent=2, sort_keys=True)), as SGLang's CLI.
    std::cout << manifest::PyJsonDumps(*r, manifest::PyJsonStyle::kIndent2Ascii) << "\n";
  } else {
    const auto& j = *r;
    std::printf("MANIFEST_READY path=%s shards=%s tensors=%s pack_entries=%s payload_samples_verified=%s\n",
                j["manifest"].get<std::string>().c_str(), j["source_shards"].dump().c_str(),
                j["source_tensors"].dump().c_str(), j["pack_entries"].dump().c_str(),
                j["payload_samples_verified"].dump().c_str());
  }
  return 0;
}

}  // namespace

K3_COMMAND("manifest", "write the SGLang adapter manifest for shards + pack + tokenizer", RunManifest);

}  // namespace k3pack::cli
