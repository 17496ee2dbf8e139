#include "cli/pack_plan.h"

#include <cstdlib>
#include <iostream>
#include <memory>
#include <set>

#include "cli/preflight.h"
#include "cli/profile.h"
#include "pack/pack_output.h"
#include "pack/progress.h"
#include "util/file.h"
#include "util/progress.h"

namespace k3pack::cli {

Status CheckMixedTypesBeforeRun(const Args& args) {
  if (!args.Has("--allow-mixed-types")) return Status::OK();
  auto profile = ResolveProfile(args, {args.Get("--model-config"), args.Get("--gguf-dir")});
  return profile.ok() ? CheckMixedTypesProfile(args, *profile) : Status::OK();
}

namespace {

// Inputs checked, experts collected, the pack path chosen (the rank's for
// `rank`): everything before the output is judged.
Result<PackPlan> PlanInputs(const Args& args, bool allow_mixed_types, const std::optional<ep::Rank>& rank) {
  const std::string gguf_dir = args.Get("--gguf-dir"), config = args.Get("--model-config");
  K3_RETURN_IF_ERROR(CheckGgufDir("--gguf-dir", gguf_dir));
  K3_RETURN_IF_ERROR(CheckModelConfig("--model-config", config));
  PackPlan plan;
  K3_ASSIGN_OR_RETURN(plan.profile, ResolveProfile(args, {config, gguf_dir}));
  pack::CollectOptions copts;
  copts.allow_mixed_types = allow_mixed_types;
  K3_ASSIGN_OR_RETURN(plan.experts, pack::CollectExpertsFromGguf(gguf_dir, config, plan.profile, copts));
  plan.pack = args.Get("--pack");
  if (plan.pack.empty()) {
    K3_ASSIGN_OR_RETURN(plan.pack, pack::DefaultPackPath(plan.experts.shard_paths.front()));
  }
  if (rank) {
    K3_RETURN_IF_ERROR(ep::CheckRank(*rank, plan.experts.num_experts, ep::kCliNames));
    plan.ep = rank;
    plan.pack = pack::RankPackPath(plan.pack, *rank);
  }
  plan.inputs = {{"--model-config", config}};
  for (const auto& s : plan.experts.shard_paths) plan.inputs.push_back({"source shard", s});
  for (const auto& s : kimi::ProfileSidecarsNear({config, gguf_dir})) plan.inputs.push_back({"the profile record", s});
  return plan;
}

pack::PackOutputRequest OutputRequestOf(const Args& args, const PackPlan& plan, bool repair_existing) {
  pack::PackOutputRequest req;
  req.path = plan.pack;
  req.inputs = plan.inputs;
  req.force = args.Has("--force");
  req.repair_existing = repair_existing;
  req.repair_hint = args.command() == "build" ? "--restart" : "--repair-damaged";
  req.ep = plan.ep;
  return req;
}

}  // namespace

Status PreflightEveryRank(const Args& args, const EpChoice& choice, bool allow_mixed_types, bool repair_existing,
                          const std::function<Status(const std::string&, const ep::Rank&)>& also) {
  if (!choice.all) return Status::OK();
  K3_ASSIGN_OR_RETURN(PackPlan whole, PlanInputs(args, allow_mixed_types, std::nullopt));
  for (const ep::Rank& rank : choice.Ranks()) {
    K3_RETURN_IF_ERROR(ep::CheckRank(rank, whole.experts.num_experts, ep::kCliNames));
    PackPlan one;
    one.pack = pack::RankPackPath(whole.pack, rank);
    one.inputs = whole.inputs;
    one.ep = rank;
    K3_RETURN_IF_ERROR(pack::PreflightPackOutput(OutputRequestOf(args, one, repair_existing)));
    if (also) K3_RETURN_IF_ERROR(also(one.pack, rank));
  }
  return Status::OK();
}

// The shared front half of `pack` and `build`: preflight the inputs, collect
// the experts, pick the pack path, and apply the overwrite rule to it.
Result<PackPlan> PlanPack(const Args& args, bool allow_mixed_types, bool repair_existing,
                          const std::optional<ep::Rank>& rank, const std::function<Status(const PackPlan&)>& then,
                          const std::function<Status(const PackPlan&)>& before) {
  K3_ASSIGN_OR_RETURN(PackPlan plan, PlanInputs(args, allow_mixed_types, rank));
  pack::PackOutputRequest req = OutputRequestOf(args, plan, repair_existing);
  if (before) req.before_judging = [&] { return before(plan); };
  K3_ASSIGN_OR_RETURN(const pack::ProgressMode mode, ProgressModeOf(args));
  req.progress = pack::MakeProgressPrinter(mode, rank);
  // Once each: the plan's pass runs twice where no lock file could be made.
  auto told = std::make_shared<std::set<std::string>>();
  req.note = [&args, told](const std::string& why) {
    if (told->insert(why).second) Narrate(args.command(), "note: " + why);
  };
  auto take = [&plan](const pack::PackOutputPlan& out) {
    plan.action = out.action;
    plan.repair = out.repair;
    plan.invalid_reason = out.invalid_reason;
    plan.valid_section = out.valid_section;
  };
  if (then) {
    req.then = [&](const pack::PackOutputPlan& out) {
      take(out);
      return then(plan);
    };
  }
  K3_ASSIGN_OR_RETURN(pack::PackOutputPlan out, pack::PlanPackOutput(req, plan.experts));
  take(out);
  plan.lock = std::move(out.lock);
  return plan;
}

void StopCleanlyOnSignals(const std::string& command) {
  StopOnSignals(command, "rerun the same command to continue");
}

}  // namespace k3pack::cli
