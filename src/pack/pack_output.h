// The overwrite rule (util/output_guard.h) applied to a pack path, shared by
// `k3pack pack`, `k3pack build` and the Python binding's build_pack/build:
// the pack and its sidecars are none of the inputs, the directory is
// writable, and an existing pack is resumed, reported as already built (it
// validates against these shards), replaced (force) or refused. Decided under
// the pack's lock, which the plan keeps; a refusal where no writer was ever
// here leaves no lock file (DecideUnderPackLock).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "k3pack/ep.h"
#include "k3pack/pack.h"
#include "util/lock_file.h"
#include "util/output_guard.h"

namespace k3pack::pack {

struct PackOutputPlan;

// For OutputSpec::not_own_kind: "" when the file at `path` starts as an
// Expert Pack does (or is empty or shorter than the magic), else what it is:
// force replaces a pack, never a shard or config given as the pack path.
std::string NotAPackFile(const std::string& path);

struct PackOutputRequest {
  std::string path;                       // the pack (a rank pack's own path for `ep`)
  std::vector<NamedPath> inputs;          // config + shards
  std::string option = "--pack";          // how the caller names the pack, for messages
  std::string force_option = "--force";   // how the caller spells force
  // What else the refusal of a damaged pack suggests.
  std::string repair_hint = "--repair-damaged";  // the option that rewrites only what differs
  bool force = false;
  // A finished pack is not judged: the caller repairs its damaged payloads.
  bool repair_existing = false;
  std::optional<ep::Rank> ep;
  // Progress of the one long step a decision can take: comparing every
  // payload of an existing pack with shards whose stamps changed. May be empty.
  ProgressFn progress;
  // Told why that comparison is made, before it starts. May be empty.
  std::function<void(const std::string&)> note;
  // The caller's own look at the rest of its outputs, on this decision
  // (build: the checkpoint is one SGLang loads, and its manifest). Made in the
  // same pass, so its refusals too come before a lock file is made.
  std::function<Status(const PackOutputPlan&)> then;
  // The caller's checks of its other outputs that read nothing (`build`'s
  // manifest path): after this pack's preflight, before the pack is judged
  // (which may read all of it).
  std::function<Status()> before_judging;
};

struct PackOutputPlan {
  OutputAction action = OutputAction::kWrite;
  bool repair = false;            // repair_existing and a finished pack is there
  std::string invalid_reason;     // why an existing pack is not taken as finished
  nlohmann::json valid_section;   // kAlreadyBuilt: ValidatePack's expert_pack section
  // The pack's lock, taken before the decision; the caller keeps the plan
  // (and so the lock) until its last write (BuildPack shares it).
  std::optional<LockFile> lock;
};

Result<PackOutputPlan> PlanPackOutput(const PackOutputRequest& req, const ExpertSet& experts);

// Whether a build of `out` is under way (to resume): its checkpoint, which
// a build makes first, or a partial file where no pack is. A stray
// `<pack>.partial` without a checkpoint beside a finished pack (an older
// k3pack's, a user's copy) was taken for a rebuild to resume: that dropped
// --force, and the build then refused the pack, pointing to --force, on
// every rerun.
bool BuildUnderWayAt(const std::string& out);

// The checks PlanPackOutput makes before it takes the pack's lock, none of
// which reads the pack: side-file names, outputs that are inputs, a writable
// directory, side files that are ours, and the kind of thing at the path (a
// file of another kind is refused, as the decision would). `--ep-rank all`
// makes them for every rank's pack before it writes the first rank's.
Status PreflightPackOutput(const PackOutputRequest& req);


}  // namespace k3pack::pack
