#include "manifest/build_output.h"

#include <algorithm>
#include <filesystem>

#include "k3pack/manifest.h"
#include "k3pack/pack.h"
#include "manifest/loader_rules.h"
#include "pack/sidecars.h"
#include "util/file.h"

namespace k3pack::manifest {
namespace {

namespace fs = std::filesystem;

// Names none of the files it records where they are: a model directory moved
// (or renamed) with its manifest.
bool NamesNothingThatIsThere(const Manifest& old) {
  return old.complete && !PathExists(old.expert_pack.path) &&
         std::none_of(old.source.shards.begin(), old.source.shards.end(),
                      [](const auto& shard) { return PathExists(shard.path); });
}

// A moved model's manifest of this very pack (same index digest): writing the
// new one loses nothing and the pack there is reused.
bool RecordsThisPackMovedAway(const Manifest& old, const nlohmann::json& section) {
  return old.expert_pack.index_sha256 == section.value("index_sha256", std::string()) && NamesNothingThatIsThere(old);
}

// Whether `old` records the pack at `pack_path` (the same file, however named).
bool RecordsPackAt(const Manifest& old, const std::string& pack_path) {
  auto recorded = ResolvePath(old.expert_pack.path);
  auto here = ResolvePath(pack_path);
  return recorded.ok() && here.ok() && *recorded == *here;
}

// Why a manifest of this very pack no longer describes its shards, or "": a
// shard it records has another size now, or the pack was brought to the
// shards as they are after the manifest was written (its record of them,
// `<pack>.inputs`, is newer: `pack --repair-damaged` after a shard was
// edited in place, same size and header, which only a whole-file digest
// would tell). A rerun of build called such a manifest finished. Both files
// are k3pack's, written beside each other by one clock; a shard's own time
// is not compared (one from a host whose clock runs ahead made every rerun
// rewrite the manifest).
std::string ShardsChangedSince(const std::string& manifest_path, const Manifest& old, const std::string& pack_path) {
  for (const ShardRecord& shard : old.source.shards) {
    auto now = StampFile(shard.path);
    if (!now.ok()) continue;  // a moved model: judged by the rules above
    if (static_cast<uint64_t>(now->size) != shard.size) {
      return "shard " + shard.path + " is " + std::to_string(now->size) + " bytes now, " + std::to_string(shard.size) +
             " when it was written";
    }
  }
  auto written = StampFile(manifest_path);
  auto inputs = StampFile(pack::InputsRecordPathFor(pack_path));
  if (written.ok() && inputs.ok() && inputs->mtime_ns > written->mtime_ns) {
    return "the pack was brought to the shards as they are now after it was written (" +
           pack::InputsRecordPathFor(pack_path) + ")";
  }
  return "";
}

// Why a manifest of this pack does not record what the request asks for
// (its tokenizer directory, payload samples, whole-pack digest), or "".
std::string RecordsOtherOptions(const Manifest& old, const BuildManifestRequest& r) {
  if (!r.tokenizer_dir.empty() && old.tokenizer.recorded) {
    const std::string wanted = ResolvedPathOrGiven(r.tokenizer_dir);
    if (wanted != old.tokenizer.path) {
      return "it records the tokenizer directory " + old.tokenizer.path + ", not " + wanted;
    }
  }
  if (r.full_pack_hash && !old.expert_pack.full_pack_hash) return "it records no SHA-256 of the whole pack";
  if (r.payload_samples) {
    std::optional<ep::Rank> rank;
    if (old.k3pack && old.k3pack->ep) rank = ep::Rank{old.k3pack->ep->size, old.k3pack->ep->rank};
    const uint64_t wanted =
        pack::SampleEntries(old.expert_pack.index_count, old.expert_pack.num_experts, *r.payload_samples, rank).size();
    if (wanted != old.expert_pack.payload_samples_verified) {
      return "it records " + std::to_string(old.expert_pack.payload_samples_verified) + " payload sample(s) verified, " +
             "not " + std::to_string(wanted);
    }
  }
  return "";
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
  auto tell = [&](const std::string& why) {
    if (r.note) r.note(why);
    return true;
  };
  // The manifest of the pack being re-checked; not any readable one. Moved
  // with its model directory, it records the pack's name where none of its
  // files is any more (the repair re-checks the pack's every byte).
  auto moved = [&] {
    return tell(r.path + " records this pack at " + old->expert_pack.path +
                ", where none of its files is any more (the model was moved): writing a new manifest");
  };
  if (r.pack_repair) {
    if (!old.ok()) return false;
    if (RecordsPackAt(*old, r.pack_path)) return true;
    return fs::path(old->expert_pack.path).filename() == fs::path(r.pack_path).filename() &&
           NamesNothingThatIsThere(*old) && moved();
  }
  if (r.pack_action == OutputAction::kAlreadyBuilt && old.ok() && RecordsThisPackMovedAway(*old, r.pack_section)) {
    return moved();
  }
  if (r.pack_action == OutputAction::kResume && old.ok()) {
    if (RecordsPackAt(*old, r.pack_path)) {
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
    if (old.ok()) {
      if (const std::string why = ShardsChangedSince(r.path, *old, r.pack_path); !why.empty()) {
        return tell(r.path + " records this pack, but " + why + ": writing a new manifest of the shards as they are");
      }
      if (const std::string why = RecordsOtherOptions(*old, r); !why.empty()) {
        return tell(r.path + " records this pack, but " + why + ": writing a new manifest as asked");
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
