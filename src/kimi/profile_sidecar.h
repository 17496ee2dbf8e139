// The validation-profile sidecar `k3pack-profile.json` that `k3pack synth`
// (and k3pack.synth) writes beside a synthetic model's config.json, and the
// search the CLI and the Python binding share when no profile is given: a
// manifest's "k3pack" section (scaled manifests carry it) or the sidecar
// says which; otherwise kimi-k3 (SGLang's audited invariants).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "k3pack/kimi.h"
#include "k3pack/synth.h"

namespace k3pack::kimi {

inline constexpr const char* kProfileSidecar = "k3pack-profile.json";

// `near`: paths (files or directories) of the inputs. A directory is searched
// for the sidecar, a file's directory too; a *.json file that is a manifest
// contributes its k3pack section. Nothing recorded: kimi-k3.
Result<Profile> ProfileRecordedNear(const std::vector<std::string>& near);

// The sidecars that search reads for `near` (those that exist): inputs of
// every command that resolves its profile so, which no output may replace.
std::vector<std::string> ProfileSidecarsNear(const std::vector<std::string>& near);

// The options that decide a synthetic model's bytes, normalized: the same
// model is recognized whatever the spelling of its directory, the order of
// the flags, whether a default was given explicitly, or whether the CLI or
// k3pack.synth wrote it.
nlohmann::json SynthRecipe(const synth::SynthOptions& o);

// The sidecar of a model `k3pack synth` wrote into `out_dir` from `recipe`
// (the options that determine its bytes): records the profile its config
// passes, and the recipe, so a rerun with the same one is "already built".
// Returns the profile recorded.
Result<Profile> WriteSynthSidecar(const std::string& out_dir, const std::string& config_path,
                                  const nlohmann::json& recipe);

// True when `out_dir`'s sidecar records exactly `recipe` (SynthRecipe), or,
// for a sidecar of an earlier k3pack, which recorded the CLI's arguments as
// given, exactly `args_given` (null: no such comparison).
bool SynthSidecarRecords(const std::string& out_dir, const nlohmann::json& recipe,
                         const nlohmann::json& args_given = nullptr);

}  // namespace k3pack::kimi
