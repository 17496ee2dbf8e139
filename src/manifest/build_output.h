// The manifest a build writes beside its pack: `k3pack build` and Python's
// k3pack.build() judge it with this one rule, so both take over the same
// manifests and refuse the same ones, with the same texts.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "manifest/manifest_output.h"
#include "util/output_guard.h"

namespace k3pack::manifest {

struct BuildManifestRequest {
  std::string path;                    // where the manifest goes
  std::string option = "--manifest";   // how the caller names it in messages
  std::string force_option = "--force";
  bool force = false;
  // The pack the manifest will record: the pack plan's decision about it,
  // its path, and (kAlreadyBuilt) the validator's expert_pack section.
  std::string pack_path;
  OutputAction pack_action = OutputAction::kWrite;
  nlohmann::json pack_section;
  // A re-check of a finished pack (`build --restart`): the manifest of that
  // pack is written anew.
  bool pack_repair = false;
  // The files the manifest reads beside the pack (and its .digests): the
  // pack plan's inputs (config, shards) and the tokenizer directory's files.
  // None may be the manifest; each must be a path it can record (UTF-8).
  std::vector<NamedPath> inputs;
  std::string tokenizer_dir;
  // What the manifest is asked to record beyond its inputs: the payload
  // sample count (nullopt: not given, not judged) and the whole pack's SHA-256. A
  // finished manifest of this pack that records other ones (or another
  // tokenizer directory) is written anew: reported as built, it kept what
  // the rerun's options asked to change.
  std::optional<int64_t> payload_samples;
  bool full_pack_hash = false;
  InputNames names;  // how the caller names the pack and tokenizer directory
  // Told why an existing manifest is written over without force (a moved
  // model, a rebuild under way, an old rank manifest). The plan's pass may run
  // twice: the caller prints each text once.
  std::function<void(const std::string&)> note;
};

// kWrite, kReplace or kAlreadyBuilt (this pack and its manifest are done).
// An existing manifest is taken over without force when it
//   - is of the pack `pack_repair` re-checks (records that pack's path);
//   - records this very pack (same index digest) at a place where none of
//     its files is any more: the model directory was moved;
//   - records this pack path while a rebuild of it is under way (an
//     interrupted forced build; the old pack stays until the new one is done);
//   - is a rank manifest of this pack that SGLang's store would serve with the
//     other ranks' experts as zeros;
//   - records this pack, but a shard it records was written after it or has
//     another size (the pack was repaired to edited shards on its own);
//   - records this pack, but another tokenizer directory, payload sample
//     count or no whole-pack SHA-256 where the request asks for them.
// Anything else there is refused ("it is not the manifest of this pack"),
// saying whose model it records when it is a copied directory's.
Result<OutputAction> DecideBuildManifest(const BuildManifestRequest& request);

}  // namespace k3pack::manifest
