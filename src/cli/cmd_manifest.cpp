// k3pack manifest: SGLang's prepare_kimi_manifest.py. Scans the GGUF shards,
// validates the expert pack, inventories the tokenizer and writes the
// SGLANG-KIMI-GGMLMOEPACK-ADAPTER-v1 manifest atomically.
#include <cstdio>
#include <iostream>

#include "cli/command.h"
#include "k3pack/manifest.h"
#include "manifest/pyjson.h"
#include "pack/progress.h"
#include "util/file.h"

namespace k3pack::cli {
namespace {

constexpr const char* kCmd = "manifest";

Result<nlohmann::json> Run(const Args& args) {
  manifest::CreateOptions o;
  K3_ASSIGN_OR_RETURN(o.profile, kimi::ParseProfile(args.Get("--profile")));
  K3_ASSIGN_OR_RETURN(o.payload_samples, args.GetInt("--payload-samples"));
  if (o.payload_samples < 0) return Error("--payload-samples must be non-negative");
  K3_ASSIGN_OR_RETURN(pack::ProgressMode mode, pack::ParseProgressMode(args.Get("--progress"), StderrIsTty()));
  o.gguf_dir = args.Get("--gguf-dir");
  o.expert_pack = args.Get("--expert-pack");
  o.model_config = args.Get("--model-config");
  o.tokenizer_dir = args.Get("--tokenizer-dir");
  o.full_source_hashes = args.Has("--full-source-hashes");
  o.full_pack_hash = args.Has("--full-pack-hash");
  if (mode != pack::ProgressMode::kNone) {
    // Step lines on a terminal or with json; logs get the 10 s lines only.
    if (mode != pack::ProgressMode::kLines)
      o.progress = [](const std::string& s) { std::fprintf(stderr, "k3pack manifest: %s\n", s.c_str()); };
    o.pack_progress = pack::MakeProgressPrinter(mode);
  }
  K3_ASSIGN_OR_RETURN(nlohmann::json m, manifest::CreateManifest(o));
  const std::string output = args.Get("--output");
  K3_RETURN_IF_ERROR(manifest::WriteManifest(output, m));
  K3_ASSIGN_OR_RETURN(std::string resolved, ResolvePath(output));
  return manifest::ManifestSummary(resolved, m);
}

int RunManifest(const std::vector<std::string>& argv) {
  Args args(kCmd,
            "--gguf-dir DIR --expert-pack PACK --model-config CONFIG --tokenizer-dir TOK --output M.json [options]",
            "Prepare the small, zero-copy Kimi K3 GGUF/expert-pack adapter manifest "
            "(SGLANG-KIMI-GGMLMOEPACK-ADAPTER-v1, byte-compatible with SGLang's prepare_kimi_manifest.py).\n"
            "Prints a JSON summary on stdout.");
  args.Option("--gguf-dir", "directory holding the <prefix>-NNNNN-of-NNNNN.gguf shards", std::nullopt, true)
      .Option("--expert-pack", "the GGMLMOEPACKv1 pack built from these shards", std::nullopt, true)
      .Option("--model-config", "HF config.json of the model (its text_config is used when present)", std::nullopt,
              true)
      .Option("--tokenizer-dir", "tokenizer/config directory the server loads", std::nullopt, true)
      .Option("--output", "manifest path (written atomically)", std::nullopt, true)
      .Option("--payload-samples", "evenly spaced pack entries compared byte-for-byte with GGUF", "6")
      .Flag("--full-source-hashes", "also record the SHA-256 of every whole shard (reads all shards)")
      .Flag("--full-pack-hash", "also record the SHA-256 of the whole pack (reads the whole pack)")
      .Option("--profile", "kimi-k3 (SGLang's audited invariants) or scaled (any dimensions)", "kimi-k3")
      .Option("--progress", "auto | bar | json | none (on stderr)", "auto");
  int code = 0;
  if (!args.Parse(argv, &code)) return code;
  auto r = Run(args);
  if (!r.ok()) return ReportError(kCmd, r.error());
  // print(json.dumps(summary, indent=2, sort_keys=True)), as SGLang's CLI.
  std::cout << manifest::PyJsonDumps(*r, manifest::PyJsonStyle::kIndent2Ascii) << "\n";
  return 0;
}

}  // namespace

K3_COMMAND("manifest", "write the SGLang adapter manifest for shards + pack + tokenizer", RunManifest);

}  // namespace k3pack::cli
