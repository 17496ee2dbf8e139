// k3pack build: the whole preparation in one command, GGUF shards ->
// expert pack -> adapter manifest (what SGLang's server start-up runs as two
// tools). An existing valid pack is reused; an interrupted build resumes.
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "cli/command.h"
#include "k3pack/gguf.h"
#include "k3pack/manifest.h"
#include "k3pack/pack.h"
#include "manifest/pyjson.h"
#include "pack/progress.h"
#include "util/file.h"

namespace k3pack::cli {
namespace {

constexpr const char* kCmd = "build";

void Say(bool json, const std::string& s) {
  if (!json) {
    std::printf("%s\n", s.c_str());
    std::fflush(stdout);
  }
}

Result<nlohmann::json> Run(const Args& args) {
  const bool json = args.Has("--json");
  K3_ASSIGN_OR_RETURN(kimi::Profile profile, kimi::ParseProfile(args.Get("--profile")));
  K3_ASSIGN_OR_RETURN(int64_t samples, args.GetInt("--payload-samples"));
  if (samples < 0) return Error("--payload-samples must be non-negative");
  K3_ASSIGN_OR_RETURN(double margin, args.GetDouble("--safety-margin-gib"));
  if (margin < 0) return Error("--safety-margin-gib must be non-negative");
  K3_ASSIGN_OR_RETURN(pack::ProgressMode mode, pack::ParseProgressMode(args.Get("--progress"), StderrIsTty()));
  K3_ASSIGN_OR_RETURN(int threads, ParseCopyThreads(args));

  // Pack: same checks as `k3pack pack`.
  pack::CollectOptions copts;
  copts.allow_mixed_types = profile == kimi::Profile::kScaled;
  K3_ASSIGN_OR_RETURN(pack::ExpertSet experts, pack::CollectExpertsFromGguf(args.Get("--gguf-dir"),
                                                                            args.Get("--model-config"), profile, copts));
  std::string out = args.Get("--out");
  if (out.empty()) {
    K3_ASSIGN_OR_RETURN(out, pack::DefaultPackPath(experts.shard_paths.front()));
  }

  bool reused = false;
  pack::BuildResult built;
  if (PathExists(out)) {
    pack::ValidateOptions vopts;
    vopts.payload_samples = 6;
    auto valid = pack::ValidatePack(out, experts, vopts);
    if (!valid.ok()) {
      return Error("EXPERT_PACK_INVALID path=" + out + " detail=" + valid.error().message())
          .WithHint("remove it (or pass another --out) to rebuild");
    }
    Say(json, "EXPERT_PACK_VALID path=" + out + " entries=" + (*valid)["index_count"].dump() +
                  " size=" + (*valid)["size"].dump() + " samples=" + (*valid)["payload_samples_verified"].dump());
    reused = true;
  } else {
    pack::BuildOptions bopts;
    bopts.out_path = out;
    bopts.safety_margin_gib = margin;
    bopts.restart = args.Has("--restart");
    bopts.threads = threads;
    bopts.progress = pack::MakeProgressPrinter(mode);
    bopts.log = [](const std::string& s) { std::fprintf(stderr, "k3pack build: %s\n", s.c_str()); };
    Say(json, "EXPERT_PACK_BUILD_START output=" + out + " size=" + std::to_string(experts.EstimatedPackBytes()));
    K3_ASSIGN_OR_RETURN(built, pack::BuildPack(experts, bopts));
  }

  // Manifest.
  std::string manifest_path = args.Get("--manifest");
  if (manifest_path.empty()) {
    manifest_path = (std::filesystem::path(out).parent_path() / "kimi-k3-expert-pack.manifest.json").string();
  }
  manifest::CreateOptions mo;
  mo.gguf_dir = args.Get("--gguf-dir");
  mo.expert_pack = out;
  mo.model_config = args.Get("--model-config");
  mo.tokenizer_dir = args.Get("--tokenizer-dir");
  mo.payload_samples = samples;
  mo.full_source_hashes = args.Has("--full-source-hashes");
  mo.full_pack_hash = args.Has("--full-pack-hash");
  mo.profile = profile;
  if (mode != pack::ProgressMode::kNone) {
    // Step lines on a terminal or with json; logs get the 10 s lines only.
    if (mode != pack::ProgressMode::kLines)
      mo.progress = [](const std::string& s) { std::fprintf(stderr, "k3pack build: %s\n", s.c_str()); };
    mo.pack_progress = pack::MakeProgressPrinter(mode);
  }
  if (std::filesystem::is_directory(mo.gguf_dir) == false) {
    mo.gguf_dir = std::filesystem::path(experts.shard_paths.front()).parent_path().string();  // a shard path was given
  }
  K3_ASSIGN_OR_RETURN(nlohmann::json m, manifest::CreateManifest(mo));
  K3_RETURN_IF_ERROR(manifest::WriteManifest(manifest_path, m));
  K3_ASSIGN_OR_RETURN(std::string resolved, ResolvePath(manifest_path));
  nlohmann::json summary = manifest::ManifestSummary(resolved, m);
  summary["pack"] = m["expert_pack"]["path"];
  summary["pack_size"] = m["expert_pack"]["size"];
  summary["pack_reused"] = reused;
  summary["profile"] = kimi::ProfileName(profile);
  if (!reused) {
    summary["pack_seconds"] = built.seconds;
    summary["copied_bytes"] = built.copied_bytes;
    summary["resumed_objects"] = built.resumed_objects;
  }
  return summary;
}

int RunBuild(const std::vector<std::string>& argv) {
  Args args(kCmd, "--gguf-dir DIR --model-config CONFIG --tokenizer-dir TOK [--out PACK] [--manifest M.json] [options]",
            "Build the expert pack (resumable) and then write the SGLang adapter manifest, in one command.\n"
            "An existing pack at --out is validated and reused.");
  args.Option("--gguf-dir", "directory holding the <prefix>-NNNNN-of-NNNNN.gguf shards", std::nullopt, true)
      .Option("--model-config", "HF config.json of the model", std::nullopt, true)
      .Option("--tokenizer-dir", "tokenizer/config directory the server loads", std::nullopt, true)
      .Option("--out", "pack path (default: <dir>/<prefix>.expert-major.pack beside the shards)", "")
      .Option("--manifest", "manifest path (default: kimi-k3-expert-pack.manifest.json beside the pack)", "")
      .Option("--profile", "kimi-k3 (SGLang's audited invariants) or scaled (any dimensions)", "kimi-k3")
      .Option("--payload-samples", "pack entries byte-compared with GGUF for the manifest", "6")
      .Flag("--full-source-hashes", "record the SHA-256 of every whole shard")
      .Flag("--full-pack-hash", "record the SHA-256 of the whole pack")
      .Flag("--json", "print only the result as JSON");
  AddCopyOptions(args);
  int code = 0;
  if (!args.Parse(argv, &code)) return code;
  auto r = Run(args);
  if (!r.ok()) return ReportError(kCmd, r.error());
  std::cout << manifest::PyJsonDumps(*r, manifest::PyJsonStyle::kIndent2Ascii) << "\n";
  return 0;
}

}  // namespace

K3_COMMAND("build", "GGUF shards -> expert pack -> adapter manifest, in one command", RunBuild);

}  // namespace k3pack::cli
