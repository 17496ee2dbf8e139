// Writing a synthetic model into a directory under the output rules, one
// procedure for `k3pack synth` and k3pack.synth: the directory's lock from
// the look at it to the last file (a second writer into it waits or is
// refused), a partial marker that makes an interrupted write the next one's
// to start over, and the sidecar that makes the same model "already built".
#pragma once

#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "k3pack/synth.h"
#include "kimi/profile_sidecar.h"

namespace k3pack::kimi {

struct SynthOutputRequest {
  synth::SynthOptions options;  // options.out_dir is the directory written
  // How the caller spells the directory and force, for the refusal.
  std::string option = "--out";
  std::string force_option = "--force";
  bool force = false;
  std::string why_refused;  // "it is not a model written by `k3pack synth` with these options"
  // An earlier k3pack's sidecar recorded the CLI's arguments as given: the
  // same arguments are still the same model (null: no such comparison).
  nlohmann::json args_given;
  // Told when an interrupted synth's files are removed before starting over.
  std::function<void(const std::string&)> note;
};

struct SynthOutput {
  bool already_built = false;  // the same model was there: nothing was written
  synth::SynthResult written;  // when !already_built
  Profile profile{};           // the profile recorded in the sidecar (when written)
};

// Marker present in the directory while a synth writes it.
inline constexpr const char* kSynthPartialMarker = ".k3pack-synth.partial";

Result<SynthOutput> WriteSynthModelInto(const SynthOutputRequest& request);

}  // namespace k3pack::kimi
