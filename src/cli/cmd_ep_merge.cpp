// k3pack ep-merge: the full expert pack from the N rank packs of one
// expert-parallel group (pack::MergeRankPacks), byte-identical to a direct
// `k3pack pack`, with its digest sidecar.
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/output_rule.h"
#include "pack/pack_output.h"
#include "cli/pack_plan.h"
#include "cli/preflight.h"
#include "k3pack/ep.h"
#include "k3pack/pack.h"
#include "pack/build_inputs.h"
#include "pack/merge.h"
#include "pack/sidecar_kinds.h"
#include "pack/progress.h"
#include "util/progress.h"
#include "util/format.h"

namespace k3pack::cli {
namespace {

constexpr const char* kCmd = "ep-merge";

// The full pack's name a rank pack's name was derived from (RankPackPath's
// inverse): "X.ep2-of-4.pack" -> "X.pack"; empty when it is not such a name.
std::string FullPackPathOf(const std::string& rank_pack) {
  if (!rank_pack.ends_with(".pack")) return "";
  const std::string stem = rank_pack.substr(0, rank_pack.size() - 5);
  const std::string full = ep::WithoutFileTag(stem);
  return full == stem ? "" : full + ".pack";
}

// `out`: --pack, or the name the rank packs' names give (checked by the caller).
Result<nlohmann::json> Run(const Args& args, const std::string& out, pack::ProgressMode mode) {
  const std::vector<std::string>& ranks = args.positionals();
  std::vector<NamedPath> inputs;
  for (const auto& r : ranks) {
    K3_RETURN_IF_ERROR(CheckInputExists("rank pack", r, ".pack"));
    inputs.push_back({"rank pack", r});
    inputs.push_back({"rank pack (its .digests)", pack::DigestsPathFor(r)});
  }
  K3_RETURN_IF_ERROR(CheckOutputsAreNotInputs(
      {{"--pack", out}, {"--pack (its .digests)", pack::DigestsPathFor(out)}, {"--pack (its .partial)",
                                                                              pack::PartialPathFor(out)}},
      inputs));
  K3_RETURN_IF_ERROR(CheckOutputWritable("--pack", out));
  // Rank packs that cannot be merged are refused before --pack's lock file
  // is made (a refused merge left FULL.pack.lock behind).
  K3_RETURN_IF_ERROR(pack::CheckRankPacksMerge(ranks));
  // Before the overwrite rule, which takes a missing or unreadable sidecar
  // for "not this merge" and lets --force replace it.
  K3_RETURN_IF_ERROR(pack::CheckSidecarsAreOurs("--pack", out, "--force", /*building=*/false));
  OutputSpec spec;
  spec.option = "--pack";
  spec.path = out;
  spec.force = args.Has("--force");
  spec.not_own_kind = [&] { return pack::NotAPackFile(out); };
  // A finished merge of these rank packs is reported as built, as the other
  // writers do; anything else there is refused without --force.
  std::string why_not;
  spec.is_finished = [&]() -> Result<bool> {
    K3_ASSIGN_OR_RETURN(why_not, pack::WhyNotMergedPack(ranks, out));
    return why_not.empty();
  };
  spec.why_refused = "it is not the merge of these rank packs";
  OutputAction action{};
  auto decide = [&]() -> Status {
    why_not.clear();
    // A pack without its sidecar may be a merge interrupted between its two
    // renames: the merge compares it in full and finishes it, or (when it is
    // not this merge) refuses it without --force; the rule took it for "not
    // this merge" at once, so the plain rerun refused its own merge.
    if (PathExists(out) && !PathExists(pack::DigestsPathFor(out))) {
      K3_RETURN_IF_ERROR(CheckOutputKind(spec));
      action = OutputAction::kResume;
      return Status::OK();
    }
    auto decided = DecideOutput(spec);
    if (!decided.ok() && !why_not.empty()) {
      return Error(decided.error().message().substr(0, decided.error().message().find('\n')) + ": " + why_not,
                   decided.error().kind())
          .WithHint("pass --force to merge again, or write the merged pack to another --pack path");
    }
    K3_ASSIGN_OR_RETURN(action, std::move(decided));
    return Status::OK();
  };
  // Held from the decision to the merge's end (which takes it again): a
  // --force never removes what another writer of this pack is working on.
  K3_ASSIGN_OR_RETURN(LockFile lock, pack::DecideUnderPackLock(out, decide));
  if (action == OutputAction::kAlreadyBuilt) return nlohmann::json{{"already_built", true}, {"pack", out}};
  pack::MergeOptions o;
  o.out_path = out;
  o.replace_existing = args.Has("--force");  // kept until the merged pack is done
  o.progress = pack::MakeProgressPrinter(mode);
  o.log = [](const std::string& line) { Narrate(kCmd, line); };
  // Until the files are in place a stop leaves --pack as it was (the merged
  // bytes are an unnamed file); from then on the merge is done. Called with
  // the stop signals held back, so the advice is never half replaced.
  o.on_published = [out] {
    StopOnSignals(kCmd, "the merge was done: " + out + " and its digest sidecar are complete");
  };
  K3_ASSIGN_OR_RETURN(pack::MergeResult r, pack::MergeRankPacks(ranks, o));
  return nlohmann::json{{"pack", r.pack_path},       {"digests", r.digests_path}, {"ep_size", r.ep_size},
                        {"size", r.pack_bytes},      {"copied_bytes", r.copied_bytes},
                        {"index_sha256", r.index_sha256}, {"seconds", r.seconds},
                        {"finished_interrupted", r.finished_interrupted}};
}

int RunEpMerge(const std::vector<std::string>& argv) {
  Args args(kCmd, "RANK_PACK... [--pack FULL.pack] [options]",
            "Rebuild the full expert pack from the N rank packs of one expert-parallel group (written by\n"
            "`k3pack pack --ep-size N --ep-rank R|all`), byte-identical to a direct `k3pack pack`. Checks that the\n"
            "rank packs share the header and index and that ranks 0..N-1 are each given once; every payload is\n"
            "checked against its rank's digest sidecar while it is copied. Writes FULL.pack.digests too.");
  args.Positional("RANK_PACK", "the rank packs, any order (each with its .digests beside it)", 1, -1)
      .Option("--pack", "output pack (default: the rank packs' name without .epR-of-N)", "")
      .Flag("--json", "print the result as JSON");
  AddForceFlag(args, "pack (and its .digests)");
  AddWaitOption(args);
  AddProgressOption(args);
  int code = 0;
  if (!args.Parse(argv, &code)) return code;
  // The merged pack is an unnamed file until it is complete, and the files
  // are put in place with the stop signals held back (MergeRankPacks):
  // nothing is left to resume, and --pack is as it was. (Before, a stop in
  // the replacement left the old pack without its sidecar, or the new one
  // without its own, under this same line.)
  StopOnSignals(kCmd, "no merged pack was written and --pack is as it was, rerun the command to start over");
  auto wait = LockWaitOf(args, kCmd);
  if (!wait.ok()) return ReportError(kCmd, wait.error(), kExitUsage);
  const k3pack::ScopedLockWait waiting(*wait);
  auto mode = ProgressModeOf(args);
  if (!mode.ok()) return ReportError(kCmd, mode.error(), kExitUsage);
  // An output that cannot be derived is a usage error (README), as for an
  // implied --model-config: it was exit 1.
  const std::string out =
      !args.Get("--pack").empty() ? args.Get("--pack") : FullPackPathOf(args.positionals().front());
  if (out.empty()) {
    return ReportError(kCmd,
                       Error("--pack is required: " + args.positionals().front() +
                             " is not named <stem>.epR-of-N.pack, so the full pack's name cannot be derived from it"),
                       kExitUsage);
  }
  auto r = Run(args, out, *mode);
  if (!r.ok()) return ReportError(kCmd, r.error());
  const auto& j = *r;
  if (j.contains("already_built")) {
    ReportAlreadyBuilt(kCmd, j["pack"].get<std::string>(), args.Has("--json"), "pack");
    return kExitOk;
  }
  if (args.Has("--json")) {
    PrintJson(j);
  } else {
    std::printf("EXPERT_PACK_READY path=%s size=%llu index_sha256=%s merged_ranks=%u\n",
                j["pack"].get<std::string>().c_str(), j["size"].get<unsigned long long>(),
                j["index_sha256"].get<std::string>().c_str(), j["ep_size"].get<uint32_t>());
    std::printf("  copied %s in %s; digests: %s\n", HumanBytes(j["copied_bytes"].get<uint64_t>()).c_str(),
                HumanDuration(j["seconds"].get<double>()).c_str(), j["digests"].get<std::string>().c_str());
  }
  return kExitOk;
}

}  // namespace

K3_COMMAND("ep-merge", "rebuild the full pack from N expert-parallel rank packs", RunEpMerge);

}  // namespace k3pack::cli
