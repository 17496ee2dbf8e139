// k3pack pack: builds the expert-major GGMLMOEPACKv1 pack from a GGUF shard
// set (crash-safe and resumable; see BuildPack in k3pack/pack.h).
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/implied_inputs.h"
#include "cli/ep_options.h"
#include "cli/output_rule.h"
#include "cli/pack_plan.h"
#include "cli/preflight.h"
#include "cli/profile.h"
#include "k3pack/gguf.h"
#include "k3pack/kimi.h"
#include "k3pack/pack.h"
#include "pack/pack_output.h"
#include "pack/progress.h"
#include "pack/repair_damaged.h"
#include "util/file.h"
#include "util/format.h"

namespace k3pack::cli {
namespace {

constexpr const char* kCmd = "pack";

// Option values (a bad one is a usage error, exit 2).
struct Values : CopyValues {
  EpChoice ep;
};

Result<Values> ParseValues(const Args& args) {
  if (args.Has("--profile")) K3_RETURN_IF_ERROR(kimi::ParseProfile(args.Get("--profile")).status());
  Values v;
  K3_ASSIGN_OR_RETURN(static_cast<CopyValues&>(v), ParseCopyValues(args));
  K3_ASSIGN_OR_RETURN(v.ep, ParseEpOptions(args));
  // A given config is checked here, before the "using ..." lines; an implied
  // one once it is found.
  K3_RETURN_IF_ERROR(CheckEpChoiceForConfig(v.ep, args.Get("--model-config")));
  return v;
}

// --repair-damaged needs a finished pack: the refusal of one that is
// missing or unfinished.
Status CheckRepairable(const std::string& pack) {
  K3_RETURN_IF_ERROR(CheckInputExists("--pack", pack, ".pack"));
  return Error("--repair-damaged: " + pack + " is an unfinished build, not a finished pack")
      .WithHint("rerun the same command without --repair-damaged to resume the build");
}

// One pack: the full pack, or the rank pack of `rank`.
Result<nlohmann::json> RunOne(const Args& args, const Values& v, const std::optional<ep::Rank>& rank) {
  // Refused in the plan's own pass (plan.repair: a finished pack is there).
  auto repairable = [&](const PackPlan& plan) -> Status {
    if (!args.Has("--repair-damaged") || plan.repair) return Status::OK();
    return CheckRepairable(plan.pack);
  };
  K3_ASSIGN_OR_RETURN(PackPlan plan, PlanPack(args, args.Has("--allow-mixed-types"),
                                                args.Has("--repair-damaged"), rank, repairable));
  const std::string out = plan.pack;
  if (args.Has("--repair-damaged")) {
    K3_ASSIGN_OR_RETURN(pack::RepairDamagedResult rep,
                        pack::RepairDamagedPayloads(out, plan.experts, pack::MakeProgressPrinter(v.mode, rank), rank));
    nlohmann::json j{{"pack", out}, {"repaired_damaged", rep.repaired}, {"entries_checked", rep.entries_checked},
                     {"seconds", rep.seconds}};
    if (!rep.sidecar_written.empty()) j["sidecar_written"] = rep.sidecar_written;
    if (!rep.why_source.empty()) j["compared_with_shards_because"] = rep.why_source;
    return j;
  }
  const bool json = args.Has("--json");
  if (plan.action == OutputAction::kAlreadyBuilt) return nlohmann::json{{"already_built", true}, {"pack", out}};
  nlohmann::json ep_json;
  if (rank) {
    const ep::ExpertRange owned = ep::OwnedExperts(*rank, plan.experts.num_experts);
    ep_json = {{"size", rank->size}, {"rank", rank->rank}, {"first_expert", owned.first},
               {"end_expert", owned.end}};
  }
  const pack::ExpertSet& experts = plan.experts;
  const kimi::Profile profile = plan.profile;
  const double margin = v.margin;
  const int threads = v.threads;
  const pack::ProgressMode mode = v.mode;
  pack::BuildOptions bopts;
  bopts.out_path = out;
  bopts.safety_margin_gib = margin;
  bopts.restart = args.Has("--restart");
  bopts.replace_existing = plan.action == OutputAction::kReplace;  // kept until the new pack is done
  bopts.threads = threads;
  bopts.progress = pack::MakeProgressPrinter(mode, rank);
  bopts.log = [](const std::string& s) { Narrate(kCmd, s); };
  bopts.ep = rank;
  if (!json) {
    std::printf("building %s (%s, %llu entries) from %zu shard(s)%s\n", out.c_str(),
                HumanBytes(experts.EstimatedPackBytes()).c_str(),
                static_cast<unsigned long long>(experts.layers.size() * experts.num_experts * 3),
                experts.shard_paths.size(),
                rank ? (": expert-parallel " + ep::Describe(*rank, experts.num_experts)).c_str() : "");
    std::fflush(stdout);
  }
  K3_ASSIGN_OR_RETURN(pack::BuildResult r, pack::BuildPack(experts, bopts));

  // Re-validate as SGLang's preparation does (structure + 6 sampled payloads).
  pack::ValidateOptions vopts;
  vopts.payload_samples = 6;
  vopts.ep = rank;
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
                        // What this run copied: the pack's size counts other ranks' holes
                        // and what a resumed build copied before.
                        {"bytes_per_second", r.seconds > 0 ? static_cast<double>(r.copied_bytes) / r.seconds : 0.0},
                        {"payload_samples_verified", section["payload_samples_verified"]},
                        {"profile", kimi::ProfileName(profile)}};
  if (rank) res["ep"] = ep_json;
  return res;
}

Result<nlohmann::json> Run(const Args& args, const Values& v) {
  // --repair-damaged needs every rank's finished pack: a missing one was
  // found after the ranks before it were repaired.
  auto each_repairable = [&](const std::string& rank_pack, const ep::Rank&) -> Status {
    const bool finished = PathExists(rank_pack) && !pack::BuildUnderWayAt(rank_pack);
    return !args.Has("--repair-damaged") || finished ? Status::OK() : CheckRepairable(rank_pack);
  };
  K3_RETURN_IF_ERROR(PreflightEveryRank(args, v.ep, args.Has("--allow-mixed-types"), args.Has("--repair-damaged"),
                                        each_repairable));
  return RunPerRank(v.ep, "rank_packs", [&](std::optional<ep::Rank> rank) { return RunOne(args, v, rank); });
}

// What --repair-damaged did to one pack.
void PrintRepaired(const nlohmann::json& j) {
  for (const auto& w : j["repaired_damaged"]) std::printf("rewrote %s from the source\n", w.get<std::string>().c_str());
  std::string how = "each checked against its digest; the rewritten ones and a sample of the rest against the source";
  if (j.contains("compared_with_shards_because")) {
    how = "each compared with its source slice: " + j["compared_with_shards_because"].get<std::string>() +
          "; the digest sidecar " + j["sidecar_written"].get<std::string>() + " is written anew from them";
  } else if (j.contains("sidecar_written")) {
    how = "each compared with its source slice; the missing digest sidecar " +
          j["sidecar_written"].get<std::string>() + " is written from them";
  }
  std::printf("EXPERT_PACK_REPAIRED path=%s damaged=%zu of %llu entries (%s)\n", j["pack"].get<std::string>().c_str(),
              j["repaired_damaged"].size(), j["entries_checked"].get<unsigned long long>(), how.c_str());
}

void PrintBuilt(const nlohmann::json& j, bool json_mode) {
  if (j.contains("repaired_damaged")) {  // one rank of --ep-rank all --repair-damaged
    PrintRepaired(j);
    return;
  }
  if (j.contains("already_built")) {
    ReportAlreadyBuilt(kCmd, j["pack"].get<std::string>(), json_mode, "pack");
    return;
  }
  const double secs = j["seconds"].get<double>();
  std::string ep;
  if (j.contains("ep")) {
    ep = " ep_rank=" + j["ep"]["rank"].dump() + " ep_size=" + j["ep"]["size"].dump() + " experts=" +
         j["ep"]["first_expert"].dump() + ".." + std::to_string(j["ep"]["end_expert"].get<uint32_t>() - 1);
  }
  std::printf("EXPERT_PACK_READY path=%s entries=%llu size=%llu index_sha256=%s%s\n",
              j["pack"].get<std::string>().c_str(), j["index_count"].get<unsigned long long>(),
              j["size"].get<unsigned long long>(), j["index_sha256"].get<std::string>().c_str(), ep.c_str());
  std::printf("  copied %s (+%s kept as holes) in %s, %s; digests: %s\n",
              HumanBytes(j["copied_bytes"].get<uint64_t>()).c_str(),
              HumanBytes(j["hole_bytes"].get<uint64_t>()).c_str(), HumanDuration(secs).c_str(),
              HumanRate(j["bytes_per_second"].get<double>()).c_str(), j["digests"].get<std::string>().c_str());
}

int RunPack(const std::vector<std::string>& argv) {
  StopCleanlyOnSignals(kCmd);  // before any work: an early Ctrl-C is a clean stop too
  Args args(kCmd, "[--gguf-dir] DIR [--model-config CONFIG] [--pack PACK] [options]",
            "Build the expert-major GGMLMOEPACKv1 pack (byte-identical to SGLang's) from a Kimi GGUF shard set.\n"
            "Crash-safe: an interrupted build continues from its checkpoint when the same command is rerun.\n"
            "With --ep-size N --ep-rank R|all: expert-parallel rank packs (same header, index and offsets as the full\n"
            "pack; only the rank's experts on disk, the rest holes), named <pack stem>.epR-of-N.pack; `k3pack ep-merge`\n"
            "puts N of them back together.");
  args.Option("--gguf-dir", "directory holding the <prefix>-NNNNN-of-NNNNN.gguf shards (or one shard path)",
              std::nullopt, true)
      .PositionalAsOption("--gguf-dir")
      .Option("--model-config", "HF config.json of the model (default: config.json beside the shards, else the tokenizer directory's)")
      .Option("--pack", "pack path (default: <dir>/<prefix>.expert-major.pack beside the shards)", "")
      .Deprecated("--out", "--pack")
      .Flag("--allow-mixed-types", "allow expert dtypes to differ by role or layer (scaled profile)")
      .Flag("--repair-damaged", "check every payload of the finished pack against its digests and rewrite exactly "
                                "the damaged ones from the source, then verify them")
      .Flag("--json", "print the result as JSON");
  AddProfileOption(args);
  AddForceFlag(args, "pack (and its .digests)");
  AddWaitOption(args);
  AddCopyOptions(args);
  AddEpOptions(args);
  args.Exclusive({"--force", "--repair-damaged"}, "--force rebuilds the whole pack");
  int code = 0;
  if (!args.Parse(argv, &code)) return code;
  auto wait = LockWaitOf(args, kCmd);
  if (!wait.ok()) return ReportError(kCmd, wait.error(), kExitUsage);
  const k3pack::ScopedLockWait waiting(*wait);
  // Bad values first: a usage error comes before the "using ..." lines.
  auto v = ParseValues(args);
  if (!v.ok()) return ReportError(kCmd, v.error(), kExitUsage);
  if (Status s = FillImpliedInputs(args, kCmd, {.model_config = true}); !s.ok())
    return ReportError(kCmd, s.error(), kExitUsage);
  if (Status s = CheckEpChoiceForConfig(v->ep, args.Get("--model-config")); !s.ok())
    return ReportError(kCmd, s.error(), kExitUsage);
  if (Status s = CheckMixedTypesBeforeRun(args); !s.ok()) return ReportError(kCmd, s.error(), kExitUsage);
  auto r = Run(args, *v);
  if (!r.ok()) return ReportError(kCmd, r.error(), pack::InterruptExitCode(r.error()));
  const auto& j = *r;
  if (j.contains("already_built") && !j.contains("rank_packs")) {
    ReportAlreadyBuilt(kCmd, j["pack"].get<std::string>(), args.Has("--json"), "pack");
    return kExitOk;
  }
  if (args.Has("--json")) {
    PrintJson(j);
  } else if (j.contains("rank_packs")) {
    for (const auto& one : j["rank_packs"]) PrintBuilt(one, false);
  } else {
    PrintBuilt(j, false);
  }
  return 0;
}

}  // namespace

K3_COMMAND("pack", "build the expert-major pack from GGUF shards (resumable)", RunPack);

}  // namespace k3pack::cli
