// The validation profile is found, not asked for: an explicit --profile wins;
// otherwise a manifest's "k3pack" section (scaled manifests carry it), or the
// sidecar `k3pack-profile.json` that `k3pack synth` writes beside its
// config.json, says which; otherwise kimi-k3 (SGLang's audited invariants).
#pragma once

#include <string>
#include <vector>

#include "cli/command.h"
#include "k3pack/kimi.h"
#include "kimi/profile_sidecar.h"

namespace k3pack::cli {

using kimi::kProfileSidecar;  // kimi/profile_sidecar.h, shared with the Python binding

// Adds --profile with the help text saying how it is found when omitted.
void AddProfileOption(Args& args);

// `near`: paths (files or directories) of the inputs. A directory is searched
// for the sidecar, a file's directory too; a *.json file that is a manifest
// contributes its k3pack section. A bad --profile value is an error the
// caller reports as a usage error; a sidecar that is there but cannot be
// read, as a bad input (ProfileErrorExit gives which).
Result<kimi::Profile> ResolveProfile(const Args& args, const std::vector<std::string>& near);

// The exit code of a ResolveProfile failure.
int ProfileErrorExit(const Args& args);

// --allow-mixed-types packs what SGLang's Kimi-K3 invariants refuse, so it
// needs the scaled profile: otherwise a usage error (exit 2) in every
// command that takes it.
Status CheckMixedTypesProfile(const Args& args, kimi::Profile profile);

}  // namespace k3pack::cli
