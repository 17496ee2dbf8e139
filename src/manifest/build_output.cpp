#include "manifest/build_output.h"

#include <algorithm>

#include "k3pack/manifest.h"
#include "k3pack/pack.h"
#include "manifest/loader_rules.h"
#include "util/file.h"

namespace k3pack::manifest {
namespace {

// Names none of the files it records where they are: a model directory moved
// (or renamed) with its manifest. It records this very pack (same index
// digest), so writing the new one loses nothing and the pack there is reused.
bool RecordsThisPackMovedAway(const Manifest& old, const nlohmann::json& section) {
  return old.complete && old.expert_pack.index_sha256 == section.value("index_sha256", std::string()) &&
         !PathExists(old.expert_pack.path) &&
         std::none_of(old.source.shards.begin(), old.source.shards.end(),
                      [](const auto& shard) { return PathExists(shard.path); });
}

// A refusal of a manifest that records another model's shards and pack (a
// model directory copied with its manifest) says whose it is.
Error ExplainRefusal(const Error& refused, const BuildManifestRequest& r) {
  auto raw = ReadManifestJson(r.path);
  const std::string& message = refused.message();
  if (!raw.ok() && message.find("it is not the manifest of this pack") != std::string::npos) {
    // Empty, cut short, a BOM, not UTF-8: "not the manifest of this pack"
    // said nothing of why; the reader's words say where it stops.
    Error e(message.substr(0, message.find('\n')) + " (it cannot be read as a manifest: " + raw.error().headline() +
                ")",
            refused.kind());
    return refused.hint().empty() ? e : e.WithHint(refused.hint());
  }
  if (!raw.ok()) return refused;
  const std::string elsewhere = ModelDirRecordedElsewhere(*raw, r.path);
  if (elsewhere.empty()) return refused;
  return Error(message.substr(0, message.find('\n')) + " (it records the shards and pack of the model in " + elsewhere +
                   ": a model directory copied with its manifest?)",
               refused.kind())
      .WithHint("pass " + r.force_option + " to write this directory's own manifest (the model in " + elsewhere +
                " keeps its own), or another " + r.option + " path");
}

// Whether an existing manifest is written over without force, and why (told
// to the caller's note).
bool TakenOverWithoutForce(const BuildManifestRequest& r) {
  if (!PathExists(r.path)) return false;
  auto old = ReadManifest(r.path);
  if (r.pack_repair) return old.ok();
  auto tell = [&](const std::string& why) {
    if (r.note) r.note(why);
    return true;
  };
  if (r.pack_action == OutputAction::kAlreadyBuilt && old.ok() && RecordsThisPackMovedAway(*old, r.pack_section)) {
    return tell(r.path + " records this pack at " + old->expert_pack.path +
                ", where none of its files is any more (the model was moved): writing a new manifest");
  }
  if (r.pack_action == OutputAction::kResume && old.ok()) {
    auto recorded = ResolvePath(old->expert_pack.path);
    auto here = ResolvePath(r.pack_path);
    if (recorded.ok() && here.ok() && *recorded == *here) {
      return tell("resuming the rebuild of " + r.pack_path + "; " + r.path +
                  ", the manifest of the pack it replaces, is written anew when it is done");
    }
  }
  // An older k3pack's manifest of this very pack that SGLang's store now
  // refuses (hard_constraints.top_k was the model's top-k before it was
  // SGLang's literal 16): reporting it as built left verify, the stores and
  // run-experts refusing it, with a hint to run this `build` again.
  if (r.pack_action == OutputAction::kAlreadyBuilt && ManifestRecordsPack(r.path, r.pack_section)) {
    auto raw = ReadManifestJson(r.path);
    if (raw.ok()) {
      if (auto rules = CheckLoaderManifestRules(*raw); !rules.ok()) {
        return tell(r.path + " records this pack, but SGLang's store refuses it (" + rules.error().headline() +
                    "; an older k3pack wrote it, or it was edited): writing a new manifest");
      }
    }
  }
  if (r.pack_action == OutputAction::kAlreadyBuilt && RankManifestSglangWouldServe(r.path, r.pack_section)) {
    return tell(r.path +
                " is a rank manifest SGLang's store would take and serve with the other ranks' experts as zeros "
                "(written before rank manifests carried the key it refuses): writing a new manifest");
  }
  return false;
}

}  // namespace

Result<OutputAction> DecideBuildManifest(const BuildManifestRequest& r) {
  std::vector<NamedPath> inputs = r.inputs;
  K3_ASSIGN_OR_RETURN(std::vector<NamedPath> tokenizer_files,
                      FilesIn("a " + r.names.tokenizer_dir + " file", r.tokenizer_dir, "tokenizer directory"));
  for (auto& f : tokenizer_files) inputs.push_back(std::move(f));
  inputs.push_back({r.names.pack, r.pack_path});
  inputs.push_back({r.names.pack + " (its .digests)", pack::DigestsPathFor(r.pack_path)});
  K3_RETURN_IF_ERROR(CheckOutputsAreNotInputs({{r.option, r.path}}, inputs));
  K3_RETURN_IF_ERROR(CheckManifestPlace({r.option, r.path}, r.pack_path, r.tokenizer_dir, r.names));
  K3_RETURN_IF_ERROR(CheckOutputWritableUnlessThere(r.option, r.path, r.force));
  std::vector<NamedPath> recorded = std::move(inputs);
  recorded.push_back({r.option, r.path});
  K3_RETURN_IF_ERROR(CheckManifestRecordablePaths(recorded));
  OutputSpec spec;
  spec.option = r.option;
  spec.path = r.path;
  spec.force_option = r.force_option;
  spec.force = r.force || TakenOverWithoutForce(r);
  spec.is_finished = [&]() -> Result<bool> {
    return r.pack_action == OutputAction::kAlreadyBuilt && ManifestRecordsPack(r.path, r.pack_section);
  };
  spec.why_refused = "it is not the manifest of this pack";
  spec.not_own_kind = [&] { return NotAManifestFile(r.path); };
  auto decided = DecideOutput(spec);
  if (!decided.ok()) return ExplainRefusal(decided.error(), r);
  if (*decided != OutputAction::kAlreadyBuilt) K3_RETURN_IF_ERROR(CheckOutputWritable(r.option, r.path));
  return *decided;
}

}  // namespace k3pack::manifest
