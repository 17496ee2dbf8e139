// `k3pack repair IN OUT --fix ssm-a`: write a repaired copy of a shard set.
#include <iostream>

#include "cli/command.h"
#include "k3pack/doctor.h"

namespace {

int RunRepair(const std::vector<std::string>& argv) {
  k3pack::cli::Args args(
      "repair", "IN OUT --fix ssm-a [--json] [--profile kimi-k3|scaled] [--no-sidecars]",
      "Writes a repaired copy of the shard set IN (a shard or its directory) into OUT, which must not\n"
      "exist or be empty. The input is never modified. --fix ssm-a rewrites ssm_a tensors that hold raw\n"
      "A_log as -exp(A_log); every other byte is copied unchanged (holes kept). It refuses, writing\n"
      "nothing, when an ssm_a tensor fails SGLang's check but is not unambiguously raw A_log.\n"
      "config.json and tokenizer/ beside the shards are copied too (unless --no-sidecars).");
  args.Positional("IN OUT", "input shard set, output directory", 2, 2)
      .Option("--fix", "what to repair (only: ssm-a)", std::nullopt, true)
      .Flag("--json", "print the result as JSON")
      .Option("--profile", "profile of the doctor check run on the output", "kimi-k3")
      .Flag("--no-sidecars", "do not copy config.json and tokenizer/");
  int code = 0;
  if (!args.Parse(argv, &code)) return code;
  auto profile = k3pack::kimi::ParseProfile(args.Get("--profile"));
  if (!profile.ok()) return k3pack::cli::ReportError("repair", profile.error(), 2);
  if (args.Get("--fix") != "ssm-a") {
    return k3pack::cli::ReportError("repair", k3pack::Error("unknown --fix '" + args.Get("--fix") + "' (available: ssm-a)"),
                                    2);
  }
  k3pack::doctor::RepairOptions opt;
  opt.fixes = {args.Get("--fix")};
  opt.profile = *profile;
  opt.copy_sidecars = !args.Has("--no-sidecars");
  if (k3pack::cli::StderrIsTty()) opt.progress = [](const std::string& s) { std::cerr << s << "\n"; };
  const auto& pos = args.positionals();
  auto r = k3pack::doctor::Repair(pos[0], pos[1], opt);
  if (!r.ok()) return k3pack::cli::ReportError("repair", r.error(), 1);
  if (args.Has("--json")) {
    std::cout << r->ToJson().dump(2) << "\n";
    return 0;
  }
  for (const auto& t : r->repaired) {
    std::cout << "repaired " << t.name << " (" << t.before.count << " values, were in [" << t.before.min << ", "
              << t.before.max << "]) -> -exp(A_log) in " << t.file << "\n";
  }
  std::cout << "wrote " << r->shards_written.size() << " shard(s)";
  if (!r->sidecars_copied.empty()) std::cout << " + " << r->sidecars_copied.size() << " sidecar file(s)";
  std::cout << " to " << r->out_dir << "\n";
  if (!r->remaining_problems.empty()) {
    std::cout << "still reported by doctor (not touched by this fix):\n";
    for (const auto& p : r->remaining_problems) std::cout << "  " << p << "\n";
  }
  return 0;
}

}  // namespace

K3_COMMAND("repair", "write a repaired copy of a shard set (--fix ssm-a: raw A_log -> -exp(A_log))", RunRepair);
