// `k3pack doctor PATH...`: diagnose GGUF shards / a manifest, every problem
// with SGLang's error text, its meaning and the fix.
#include <iostream>

#include "cli/command.h"
#include "cli/preflight.h"
#include "cli/profile.h"
#include "k3pack/doctor.h"

namespace {

int RunDoctor(const std::vector<std::string>& argv) {
  k3pack::cli::Args args(
      "doctor", "PATH... [--json] [--profile kimi-k3|scaled] [--model-config FILE] [--tokenizer-dir DIR] [--no-values]",
      "Diagnoses Kimi-K3 GGUF shard sets (a shard, a shard directory or a manifest JSON) and reports\n"
      "every problem found: severity, code, object, the SGLang error it would cause, what it means and\n"
      "how to fix it. Exit code: 0 healthy, 1 problems found or unusable input, 2 usage error.");
  args.Positional("PATH", "GGUF shard, directory of shards, or *.manifest.json", 1, -1)
      .Flag("--json", "print the report as JSON (schema k3pack-doctor-v1, see docs)")
      .Option("--model-config", "config.json to check against (default: config.json beside the shards)")
      .Deprecated("--config", "--model-config")
      .Option("--tokenizer-dir",
              "the tokenizer directory SGLang's server builds its model from (its config.json is checked against "
              "the GGUF too; default: a manifest's recorded tokenizer, else the one `k3pack build` finds beside the "
              "shards)")
      .Flag("--no-values", "skip the tensor value checks (ssm_a, residual scores, NaN scan)")
      .Flag("--allow-mixed-types",
            "with --profile scaled: routed experts may differ in type between layers (and gate from up), as "
            "`k3pack pack --allow-mixed-types` packs them");
  k3pack::cli::AddProfileOption(args);
  k3pack::cli::AddProgressOption(args);
  int code = 0;
  if (!args.Parse(argv, &code)) return code;
  auto mode = k3pack::cli::ProgressModeOf(args);
  if (!mode.ok()) return k3pack::cli::ReportError("doctor", mode.error(), k3pack::cli::kExitUsage);
  // Scaled manifests and synthetic models record their profile: checking them
  // against the full-size invariants would report false errors.
  auto profile = k3pack::cli::ResolveProfile(args, args.positionals());
  if (!profile.ok()) return k3pack::cli::ReportError("doctor", profile.error(), k3pack::cli::ProfileErrorExit(args));

  if (k3pack::Status mixed = k3pack::cli::CheckMixedTypesProfile(args, *profile); !mixed.ok())
    return k3pack::cli::ReportError("doctor", mixed.error(), k3pack::cli::kExitUsage);
  // A directory given that SGLang would not take is said, not checked past.
  if (args.Has("--tokenizer-dir")) {
    if (k3pack::Status tok = k3pack::cli::CheckIsTokenizerDir("--tokenizer-dir", args.Get("--tokenizer-dir")); !tok.ok())
      return k3pack::cli::ReportError("doctor", tok.error(), k3pack::cli::kExitFailed);
  }
  k3pack::doctor::DiagnoseOptions opt;
  opt.profile = *profile;
  opt.allow_mixed_types = args.Has("--allow-mixed-types");
  opt.config_path = args.Get("--model-config");
  opt.tokenizer_dir = args.Get("--tokenizer-dir");
  opt.check_values = !args.Has("--no-values");
  auto progress = k3pack::cli::StartProgress(*mode);
  if (progress->mode() != k3pack::ProgressMode::kNone) {
    opt.progress = [&](const std::string& s) {
      const std::string prefix = "doctor: ";
      progress->Note("doctor", s.rfind(prefix, 0) == 0 ? s.substr(prefix.size()) : s);
    };
    opt.value_progress = progress->Fn();
  }
  const k3pack::doctor::Report report = k3pack::doctor::Diagnose(args.positionals(), opt);
  progress->Finish();
  if (args.Has("--json")) {
    k3pack::cli::PrintJson(report.ToJson());
  } else {
    std::cout << report.ToText();
  }
  return report.ExitCode();
}

}  // namespace

K3_COMMAND("doctor", "diagnose GGUF shards or a manifest: every problem, SGLang's error, meaning and fix",
           RunDoctor);
