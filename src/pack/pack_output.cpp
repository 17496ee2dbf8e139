#include "pack/pack_output.h"

#include <unistd.h>

#include "pack/build_inputs.h"
#include "pack/checkpoint_file.h"
#include "pack/inputs_record.h"
#include "pack/sidecar_upgrade.h"
#include "pack/sidecar_kinds.h"
#include "util/file.h"
#include "util/process_limits.h"

namespace k3pack::pack {

namespace {

// A finalize killed between removing the checkpoint's spare and the
// checkpoint (an older k3pack removed them the other way round) left a
// spare that no later step removed: the finished pack's run does, under
// the pack's lock. Only a file of k3pack's own (checked up front).
void RemoveLeftoverSpare(const std::string& out) {
  const std::string ckpt = CheckpointPathFor(out);
  const std::string spare = CheckpointSparePathFor(ckpt);
  if (PathExists(ckpt) || !PathExists(spare) || !NotOurSidecar(spare, SidecarKind::kCheckpoint).empty()) return;
  if (::unlink(spare.c_str()) == 0) (void)FsyncParentDir(out);
}

}  // namespace

std::string NotAPackFile(const std::string& path) {
  return NotAFileOf(path, FileStart::kExpertPack, "an Expert Pack");
}

namespace {

// A check of the pack at `out` that failed because the process could not
// read it (permissions, `ulimit -n`, `ulimit -v`) says nothing of the pack:
// that error, not "not a valid pack" and a --force that would copy the whole
// model again. OK for a failure that does judge the pack.
Status CouldNotCheck(const std::string& out, const Error& e) {
  if (!IsProcessCannotRead(e.sys_errno())) return Status::OK();
  return e.WithContext("cannot check the existing pack " + out);
}

// Every payload of the pack at req.path compared with the source, said
// first with `why` and what follows (`after`); false (the reason in
// plan.invalid_reason: `why`, then the payload that differs) when one differs.
Result<bool> SameAsTheShards(const PackOutputRequest& req, const ExpertSet& experts, const std::string& why,
                             const std::string& after, PackOutputPlan& plan) {
  const std::string& out = req.path;
  VerifyOptions full;
  full.against_digests = false;
  full.against_source = true;
  full.ep = req.ep;
  if (req.note) req.note(why + "; comparing every payload of " + out + " with the shards" + after);
  if (req.progress) {
    full.progress = [&req](const Progress& p) {
      Progress shown = p;
      shown.phase = "compare";  // not the user's `verify`: why the whole pack is read is the caller's note
      req.progress(shown);
    };
  }
  auto same = VerifyPayloads(out, experts, full);
  if (same.ok()) return true;
  K3_RETURN_IF_ERROR(CouldNotCheck(out, same.error()));
  plan.invalid_reason = why + "; " + same.error().message();
  return false;
}

// A judgement that must write beside the pack (a record of the shards, a
// sidecar written anew) where the user may not write: refused before the
// hours of reading it takes, not after them.
Status CanWriteForJudgement(const Status& writable, const std::string& what) {
  if (writable.ok()) return Status::OK();
  return Error(writable.error().headline() + ", and judging the existing pack means " + what, ErrorKind::kOS,
               writable.error().sys_errno())
      .WithHint(writable.error().hint());
}

// Whether the pack already at req.path is a finished pack of these shards
// (then plan.valid_section holds its validation); when not, why is in
// plan.invalid_reason. `writable`: whether the user may write beside it
// (CheckOutputWritable).
Result<bool> IsFinishedPackOf(const PackOutputRequest& req, const ExpertSet& experts, const Status& writable,
                              PackOutputPlan& plan) {
  const std::string& out = req.path;
  // The sampled payloads cannot tell a pack of edited shards (its build
  // killed before the manifest was written) from a current one. Shards
  // that only look different (copied without their times) are compared
  // in full: every payload against the source.
  if (std::string why = WhyInputsChanged(out, experts); !why.empty()) {
    K3_RETURN_IF_ERROR(CanWriteForJudgement(writable, "comparing every payload with the shards and recording them (" +
                                                          why + ")"));
    K3_ASSIGN_OR_RETURN(const bool same, SameAsTheShards(req, experts, why, " (reads it once)", plan));
    if (!same) return false;
    // Every payload is these shards' now: record them, or every later
    // run read the whole pack again.
    K3_RETURN_IF_ERROR(RecordCurrentInputs(out, experts));
  }
  // A damaged sidecar (a flipped byte, cut short, emptied, another pack's)
  // made every store refuse a pack the rerun called "already built". The
  // pack is compared with the shards and the sidecar written anew from it
  // (a second read: the hashes). A rank pack's sidecar is not: which rank
  // it was for is in the damaged header, and the rank check below refuses it.
  if (std::string why = req.ep ? "" : WhySidecarIsUnusable(out, experts); !why.empty()) {
    K3_RETURN_IF_ERROR(CanWriteForJudgement(writable, "writing its digest sidecar anew (" + why + ")"));
    K3_ASSIGN_OR_RETURN(const bool same,
                        SameAsTheShards(req, experts, why + " (every store refuses it)",
                                        ", then writing the sidecar anew from the pack (reads it twice)", plan));
    if (!same) {
      // --restart repairs against the sidecar where it cannot be read (a
      // readable one of another pack or rank is replaced by the shards).
      if (!ReadPackDigests(DigestsPathFor(out)).ok())
        plan.invalid_reason += "; with the sidecar damaged, only a rebuild (--force) can replace the pack";
      return false;
    }
    K3_RETURN_IF_ERROR(RewriteSidecarFromPack(out, experts, 4, req.progress));
  }
  // A pack SGLang's writer made, or one copied without its sidecar, is
  // sound but served unchecked: said, with the repair that writes it.
  if (!req.ep && req.note && !PathExists(DigestsPathFor(out))) {
    req.note(out + " has no digest sidecar (" + DigestsPathFor(out) + "), so k3pack's stores serve it "
             "without checking its reads (CRC32C); " +
             (writable.ok() ? req.repair_hint + " compares every payload with the shards, rewrites any that differ "
                                                "and writes it"
                            : "the repair that writes it needs a directory you may write: build the pack elsewhere"));
  }
  ValidateOptions vopts;
  vopts.payload_samples = 6;
  vopts.ep = req.ep;
  auto valid = ValidatePack(out, experts, vopts);
  if (valid.ok() && req.ep) {
    // Only the rank's payloads were sampled: the sidecar must say it is this rank's pack.
    const std::string dpath = DigestsPathFor(out);
    if (!PathExists(dpath)) {
      plan.invalid_reason = "it has no digest sidecar (" + dpath + ") to record it as the pack of expert-parallel " +
                            ep::Describe(*req.ep, experts.num_experts);
      return false;
    }
    auto d = ReadPackDigests(dpath);
    if (!d.ok() || !d->ep || d->ep->size != req.ep->size || d->ep->rank != req.ep->rank) {
      plan.invalid_reason = "its digest sidecar does not record it as the pack of expert-parallel " +
                            ep::Describe(*req.ep, experts.num_experts);
      return false;
    }
  }
  if (valid.ok()) {
    // SGLang's validator reads a name only up to its NUL, so a changed
    // byte of the padding (or of any field it skips) passes it; the
    // header and index of these shards are one byte string.
    K3_ASSIGN_OR_RETURN(PackLayout layout, LayoutOf(experts));
    const std::string got = valid->value("index_sha256", std::string());
    if (got != layout.IndexSha256()) {
      plan.invalid_reason = "its header/index hashes to " + got + ", the layout of these shards to " +
                            layout.IndexSha256();
      return false;
    }
    plan.valid_section = *valid;
    return true;
  }
  K3_RETURN_IF_ERROR(CouldNotCheck(out, valid.error()));
  plan.invalid_reason = valid.error().message();
  return false;
}

}  // namespace

bool BuildUnderWayAt(const std::string& out) {
  if (PathExists(CheckpointPathFor(out))) return true;
  return PathExists(PartialPathFor(out)) && !PathExists(out);
}

Status PreflightPackOutput(const PackOutputRequest& req) {
  const std::string& out = req.path;
  const std::string& opt = req.option;
  // Before anything is created beside the pack (its lock file included).
  K3_RETURN_IF_ERROR(CheckSideFileNamesFit(opt, out, /*building=*/true));
  K3_RETURN_IF_ERROR(CheckOutputsAreNotInputs({{opt, out},
                                              {opt + " (its .digests)", DigestsPathFor(out)},
                                              {opt + " (its .partial)", PartialPathFor(out)},
                                              {opt + " (its .lock)", LockPathFor(out)}},
                                             req.inputs));
  K3_RETURN_IF_ERROR(CheckOutputWritableUnlessThere(opt, out, req.force || req.repair_existing));
  // Before the overwrite rule: a user's file at `<pack>.partial` was taken
  // for a build to resume, and --restart deleted it.
  K3_RETURN_IF_ERROR(CheckSidecarsAreOurs(opt, out, req.force_option, /*building=*/true));
  {
    // Also before the repair of an existing pack, which opens it for writing.
    OutputSpec kind;
    kind.option = opt;
    kind.path = out;
    kind.force = req.force;
    kind.force_option = req.force_option;
    // As the decision judges it: a pack being resumed or repaired is not.
    const bool has_partial = BuildUnderWayAt(out);
    if (!req.repair_existing && !has_partial) kind.not_own_kind = [&] { return NotAPackFile(out); };
    return CheckOutputKind(kind);
  }
}

Result<PackOutputPlan> PlanPackOutput(const PackOutputRequest& req, const ExpertSet& experts) {
  const std::string& out = req.path;
  const std::string& opt = req.option;
  K3_RETURN_IF_ERROR(PreflightPackOutput(req));
  if (req.before_judging) K3_RETURN_IF_ERROR(req.before_judging());
  PackOutputPlan plan;
  const Status writable = CheckOutputWritable(opt, out);
  // From the first look at what is there to the last write: another build,
  // `--force` or repair of the same pack never acts on what this one judged
  // (a `--force` removing the pack a repair was rewriting lost both).
  auto decide = [&]() -> Status {
    plan = PackOutputPlan{};
    const bool has_partial = BuildUnderWayAt(out);
    if (req.repair_existing && !has_partial && PathExists(out)) {
      plan.repair = true;  // the preflight held it to a writable directory
      return req.then ? req.then(plan) : Status::OK();
    }
    OutputSpec spec;
    spec.option = opt;
    spec.path = out;
    spec.force = req.force;
    spec.force_option = req.force_option;
    spec.has_partial = has_partial;
    spec.not_own_kind = [&] { return NotAPackFile(out); };
    spec.is_finished = [&] { return IsFinishedPackOf(req, experts, writable, plan); };
    spec.why_refused = "it is not a valid pack of these shards";
    auto action = DecideOutput(spec);
    if (!action.ok()) {
      if (!plan.invalid_reason.empty()) {
        // The validator's text says what is wrong with it; the hint what to do.
        return Error("refusing to overwrite existing " + out + " (" + opt +
                         "): it is not a valid pack of these shards: " + plan.invalid_reason,
                     ErrorKind::kFileExists)
            .WithHint("pass " + req.force_option + " to rebuild it, " + req.repair_hint +
                      " to rewrite only what differs from the shards, or another " + opt + " path");
      }
      return action.error();
    }
    plan.action = *action;
    // Passed over by the preflight where the pack was there: a finished one
    // needs no write.
    if (plan.action != OutputAction::kAlreadyBuilt) K3_RETURN_IF_ERROR(CheckOutputWritable(opt, out));
    return req.then ? req.then(plan) : Status::OK();
  };
  if (!writable.ok() && !PathExists(LockPathFor(out))) {
    // No lock file can be made where the user may not write, and no build
    // can be at work there without one: a finished pack is judged unlocked.
    // Anything else (the directory became writable meanwhile) is decided
    // again under the lock.
    K3_RETURN_IF_ERROR(decide());
    if (plan.action == OutputAction::kAlreadyBuilt && !plan.repair) return plan;
  }
  K3_ASSIGN_OR_RETURN(LockFile lock, DecideUnderPackLock(out, decide));
  plan.lock = std::move(lock);
  if (plan.action == OutputAction::kAlreadyBuilt) {
    RemoveLeftoverSpare(out);
    // An older k3pack's pack reused as it is gets the sidecar this one writes
    // (where the user may write: the stores serve it without the records).
    if (writable.ok()) K3_RETURN_IF_ERROR(AddCrcRecordsToOldSidecar(out, experts, 4, req.note, req.progress));
  }
  return plan;
}

}  // namespace k3pack::pack
