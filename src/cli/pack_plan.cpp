#include "cli/pack_plan.h"

#include <filesystem>

#include "cli/preflight.h"
#include "cli/profile.h"
#include "util/file.h"

namespace k3pack::cli {

// The shared front half of `pack` and `build`: preflight the inputs, collect
// the experts, pick the pack path, and apply the overwrite rule to it.
Result<PackPlan> PlanPack(const Args& args, bool allow_mixed_types,
                          bool repair_existing, const std::optional<ep::Rank>& rank) {
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
    K3_RETURN_IF_ERROR(ep::CheckRank(*rank, plan.experts.num_experts));
    plan.ep = rank;
    plan.pack = pack::RankPackPath(plan.pack, *rank);
  }
  plan.inputs = {{"--model-config", config}};
  for (const auto& s : plan.experts.shard_paths) plan.inputs.push_back({"source shard", s});
  const std::string& out = plan.pack;
  K3_RETURN_IF_ERROR(CheckOutputsAreNotInputs({{"--pack", out},
                                              {"--pack (its .digests)", pack::DigestsPathFor(out)},
                                              {"--pack (its .partial)", pack::PartialPathFor(out)},
                                              {"--pack (its .lock)", pack::LockPathFor(out)}},
                                             plan.inputs));
  K3_RETURN_IF_ERROR(CheckOutputWritable("--pack", out));
  const bool has_partial = PathExists(pack::CheckpointPathFor(out)) || PathExists(pack::PartialPathFor(out));
  if (repair_existing && !has_partial && PathExists(out)) {
    plan.repair = true;
    return plan;
  }
  OutputSpec spec;
  spec.option = "--pack";
  spec.path = out;
  spec.force = args.Has("--force");
  spec.has_partial = has_partial;
  spec.is_finished = [&]() -> Result<bool> {
    pack::ValidateOptions vopts;
    vopts.payload_samples = 6;
    vopts.ep = plan.ep;
    auto valid = pack::ValidatePack(out, plan.experts, vopts);
    if (valid.ok() && plan.ep) {
      // Only the rank's payloads were sampled: the sidecar must say it is this rank's pack.
      auto d = pack::ReadPackDigests(pack::DigestsPathFor(out));
      if (!d.ok() || !d->ep || d->ep->size != plan.ep->size || d->ep->rank != plan.ep->rank) {
        plan.invalid_reason = "its digest sidecar does not record it as the pack of expert-parallel " +
                              ep::Describe(*plan.ep, plan.experts.num_experts);
        return false;
      }
    }
    if (valid.ok()) {
      plan.valid_section = *valid;
      return true;
    }
    plan.invalid_reason = valid.error().message();
    return false;
  };
  spec.why_refused = "it is not a valid pack of these shards";
  auto action = DecideOutput(spec);
  if (!action.ok()) {
    if (!plan.invalid_reason.empty()) {
      // The validator's text says what is wrong with it; the hint what to do.
      return Error("refusing to overwrite existing " + out + " (--pack): it is not a valid pack of these shards: " +
                       plan.invalid_reason,
                   ErrorKind::kFileExists)
          .WithHint("pass --force to rebuild it, --repair-damaged (pack) or --restart (build) when only payloads "
                    "are damaged, or another --pack path");
    }
    return action.error();
  }
  plan.action = *action;
  return plan;
}

Status RemovePackOutput(const std::string& pack_path) {
  for (const std::string& p : {pack_path, pack::DigestsPathFor(pack_path)}) {
    std::error_code ec;
    std::filesystem::remove(p, ec);
    if (ec) return Error::FromErrno("cannot remove " + p + " to rebuild it (--force)", ec.value());
  }
  return Status::OK();
}

}  // namespace k3pack::cli
