// The front half `pack` and `build` share: preflight the inputs (shard dir,
// model config), resolve the profile, collect the experts, choose the pack
// path, check it is writable and not an input, and apply the overwrite rule.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/ep_options.h"
#include "cli/output_rule.h"
#include "cli/preflight.h"
#include "k3pack/ep.h"
#include "k3pack/pack.h"
#include "manifest/manifest_output.h"
#include "util/lock_file.h"
#include <nlohmann/json.hpp>

namespace k3pack::cli {

struct PackPlan {
  kimi::Profile profile = kimi::Profile::kKimiK3;
  pack::ExpertSet experts;
  std::string pack;              // --pack or the default beside the shards
  std::vector<NamedPath> inputs;  // config + shards, for the callers' own overlap checks
  OutputAction action = OutputAction::kWrite;
  bool repair = false;  // repair_existing and a finished pack is there
  std::string invalid_reason;  // why an existing pack is not taken as finished
  nlohmann::json valid_section;  // kAlreadyBuilt: ValidatePack's expert_pack section
  std::optional<ep::Rank> ep;    // a rank pack: `pack` is the rank's path
  // The pack's lock, held from the overwrite decision until the plan goes:
  // `build` writes its manifest under it too.
  std::optional<LockFile> lock;
};

// SGLang's artifact name for the manifest, the default of every command.
using manifest::kDefaultManifestName;

// Uses --gguf-dir, --model-config, --pack, --profile, --force. Expert types
// may differ by role/layer only when `allow_mixed_types`.
// With `repair_existing` the finished pack at --pack is not judged by the
// overwrite rule: the caller repairs its damaged payloads (plan.repair).
// With `rank`, the output is that rank's pack (pack::RankPackPath of --pack
// or the default), judged as a rank pack (a repair rewrites only the rank's
// own damaged payloads: its digest sidecar marks the others absent).
// `then` is the caller's own look at the rest of its outputs on the plan
// (pack::PackOutputRequest::then): its refusals come before a lock file is
// made too. `before` (plan.pack and plan.inputs set) is its look that needs
// no judgement of the pack: before the pack is judged, which may read all of
// it (a refused manifest path came after that read, and after it recorded
// the shards beside the pack).
Result<PackPlan> PlanPack(const Args& args, bool allow_mixed_types, bool repair_existing = false,
                          const std::optional<ep::Rank>& rank = std::nullopt,
                          const std::function<Status(const PackPlan&)>& then = {},
                          const std::function<Status(const PackPlan&)>& before = {});

// `--ep-rank all` writes the N rank packs (and, for build, their manifests)
// one after another: an output refused at rank 2 was found after ranks 0 and
// 1 were built (hours at full scale). Before the first is written, every
// rank's pack gets the checks that read no pack (pack::PreflightPackOutput)
// and `also` the caller's own (build: the rank's manifest). OK without `all`.
Status PreflightEveryRank(const Args& args, const EpChoice& choice, bool allow_mixed_types, bool repair_existing,
                          const std::function<Status(const std::string& rank_pack, const ep::Rank&)>& also = {});

// `pack` and `build` check --allow-mixed-types against the profile with the
// other usage errors (exit 2), before the run; a profile that cannot be
// found here is left for the run to report.
Status CheckMixedTypesBeforeRun(const Args& args);

// The first thing `pack` and `build` do, before any work: from the moment
// their words parsed a SIGINT / SIGTERM ends the command with one line,
// "k3pack CMD: interrupted; rerun the same command to continue", and exit
// 130 / 143 (StopOnSignals), never a bare death by signal. Outside the copy
// (which checkpoints on its own, see RunCopy) the files on disk are at every
// moment ones the rerun continues from, as after a `kill -9`.
void StopCleanlyOnSignals(const std::string& command);

}  // namespace k3pack::cli
