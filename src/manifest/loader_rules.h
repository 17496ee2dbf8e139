// SGLang's store checks that read the manifest alone (spec §2.7 steps 2-5:
// complete and format, hard_constraints, the dimensions, the active routed
// layers), in order and with its texts. ExpertStore::Open runs them before
// it looks at the pack; `k3pack verify` runs them too, since a manifest
// edited there passes every comparison with the pack and the source yet the
// server refuses it. Under the "scaled" profile the Kimi-K3 constants give way
// to the manifest's own dimensions and its k3pack.layer_roles.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "k3pack/manifest.h"

namespace k3pack::manifest {

// What the checks read, for the caller's later steps.
struct LoaderLayout {
  bool kimi = true;  // no scaled k3pack extension: the Kimi-K3 constants hold
  std::optional<K3packExtension> ext;
  uint64_t num_layers = 0, num_experts = 0, top_k = 0;
  std::vector<uint32_t> active;  // model.active_moe_layer_ids
};

// Dimensions a caller insists on (unset: K3's under kimi-k3, the manifest's
// own under scaled).
struct ExpectedDims {
  std::optional<uint64_t> layers, experts, top_k;
};

Result<LoaderLayout> CheckLoaderManifestRules(const nlohmann::json& m, const ExpectedDims& expected = {});

}  // namespace k3pack::manifest
