// k3pack pack: builds the expert-major GGMLMOEPACKv1 pack from a GGUF shard
// set (crash-safe and resumable; see BuildPack in k3pack/pack.h).
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "k3pack/gguf.h"
#include "k3pack/kimi.h"
#include "k3pack/pack.h"
#include "pack/progress.h"
#include "util/file.h"
#include "util/format.h"

namespace k3pack::cli {
namespace {

constexpr const char* kCmd = "pack";

Result<nlohmann::json> Run(const Args& args) {
  K3_ASSIGN_OR_RETURN(kimi::Profile profile, kimi::ParseProfile(args.Get("--profile")));
  K3_ASSIGN_OR_RETURN(double margin, args.GetDouble("--safety-margin-gib"));
  if (margin < 0) return Error("--safety-margin-gib must be non-negative");
  K3_ASSIGN_OR_RETURN(pack::ProgressMode mode, pack::ParseProgressMode(args.Get("--progress"), StderrIsTty()));
  K3_ASSIGN_OR_RETURN(int threads, ParseCopyThreads(args));
  pack::CollectOptions copts;
  copts.allow_mixed_types = args.Has("--allow-mixed-types");
  K3_ASSIGN_OR_RETURN(pack::ExpertSet experts, pack::CollectExpertsFromGguf(args.Get("--gguf-dir"),
                                                                            args.Get("--model-config"), profile, copts));

  std::string out = args.Get("--out");
  if (out.empty()) {
    K3_ASSIGN_OR_RETURN(out, pack::DefaultPackPath(experts.shard_paths.front()));
  }
  const bool json = args.Has("--json");
  if (PathExists(out) && !PathExists(pack::CheckpointPathFor(out))) {
    return Error("refusing to overwrite existing Expert Pack: " + out, ErrorKind::kFileExists)
        .WithHint("remove it first if you really want to rebuild it");
  }
  pack::BuildOptions bopts;
  bopts.out_path = out;
  bopts.safety_margin_gib = margin;
  bopts.restart = args.Has("--restart");
  bopts.threads = threads;
  bopts.progress = pack::MakeProgressPrinter(mode);
  bopts.log = [](const std::string& s) { std::fprintf(stderr, "k3pack pack: %s\n", s.c_str()); };
  if (!json) {
    std::printf("building %s (%s, %llu entries) from %zu shard(s)\n", out.c_str(),
                HumanBytes(experts.EstimatedPackBytes()).c_str(),
                static_cast<unsigned long long>(experts.layers.size() * experts.num_experts * 3),
                experts.shard_paths.size());
    std::fflush(stdout);
  }
  K3_ASSIGN_OR_RETURN(pack::BuildResult r, pack::BuildPack(experts, bopts));

  // Re-validate as SGLang's preparation does (structure + 6 sampled payloads).
  pack::ValidateOptions vopts;
  vopts.payload_samples = 6;
  K3_ASSIGN_OR_RETURN(nlohmann::json section, pack::ValidatePack(r.pack_path, experts, vopts));
  nlohmann::json res = {{"pack", r.pack_path},
                        {"digests", r.digests_path},
                        {"size", r.pack_bytes},
                        {"index_count", r.index_count},
                        {"index_sha256", r.index_sha256},
                        {"copied_bytes", r.copied_bytes},
                        {"hole_bytes", r.hole_bytes},
                        {"resumed_objects", r.resumed_objects},
                        {"seconds", r.seconds},
                        {"bytes_per_second", r.seconds > 0 ? r.pack_bytes / r.seconds : 0.0},
                        {"payload_samples_verified", section["payload_samples_verified"]},
                        {"profile", kimi::ProfileName(profile)}};
  return res;
}

int RunPack(const std::vector<std::string>& argv) {
  Args args(kCmd, "k3pack pack --gguf-dir DIR --model-config CONFIG [options]",
            "Build the expert-major GGMLMOEPACKv1 pack (byte-identical to SGLang's) from a Kimi GGUF shard set.\n"
            "Crash-safe: an interrupted build continues from its checkpoint when the same command is rerun.");
  args.Option("--gguf-dir", "directory holding the <prefix>-NNNNN-of-NNNNN.gguf shards (or one shard path)",
              std::nullopt, true)
      .Option("--model-config", "HF config.json of the model", std::nullopt, true)
      .Option("--out", "pack path (default: <dir>/<prefix>.expert-major.pack beside the shards)", "")
      .Option("--profile", "kimi-k3 (SGLang's invariants) or scaled (dimensions from the config)", "kimi-k3")
      .Flag("--allow-mixed-types", "allow expert dtypes to differ by role or layer (scaled profile)")
      .Flag("--json", "print the result as JSON");
  AddCopyOptions(args);
  int code = 0;
  if (!args.Parse(argv, &code)) return code;
  auto r = Run(args);
  if (!r.ok()) return ReportError(kCmd, r.error(), pack::InterruptExitCode(r.error()));
  const auto& j = *r;
  if (args.Has("--json")) {
    std::cout << j.dump(2) << "\n";
  } else {
    const double secs = j["seconds"].get<double>();
    std::printf("EXPERT_PACK_READY path=%s entries=%llu size=%llu index_sha256=%s\n",
                j["pack"].get<std::string>().c_str(), j["index_count"].get<unsigned long long>(),
                j["size"].get<unsigned long long>(), j["index_sha256"].get<std::string>().c_str());
    std::printf("  copied %s (+%s kept as holes) in %s, %s; digests: %s\n",
                HumanBytes(j["copied_bytes"].get<uint64_t>()).c_str(),
                HumanBytes(j["hole_bytes"].get<uint64_t>()).c_str(), HumanDuration(secs).c_str(),
                HumanRate(j["bytes_per_second"].get<double>()).c_str(), j["digests"].get<std::string>().c_str());
  }
  return 0;
}

}  // namespace

K3_COMMAND("pack", "build the expert-major pack from GGUF shards (resumable)", RunPack);

}  // namespace k3pack::cli
