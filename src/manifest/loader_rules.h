// SGLang's store checks that read the manifest alone (spec §2.7 steps 2-5:
// complete and format, hard_constraints, the dimensions, the active routed
// layers), in order and with its texts. ExpertStore::Open runs them before
// it looks at the pack; `k3pack verify` runs them too, since a manifest
// edited there passes every comparison with the pack and the source yet the
// server refuses it. Under the "scaled" profile the Kimi-K3 constants give way
// to the manifest's own dimensions and its k3pack.layer_roles.
//
// Each rule is also callable on its own: `doctor` reports every rule a
// manifest breaks (not only the first), and the non-expert stream states
// step 2's conditions with texts of its own. Every reader calls these, so a
// rule exists once.
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

// --- The rules one by one (`kimi`: the Kimi-K3 constants hold; false: scaled).

// Step 2's two conditions, as Python reads `manifest.get(...)`: `format` is
// the adapter format; `complete` is true by Python's truth rules (1 and
// "yes" are, 0, "" and null are not). The store says both with one text
// (CheckStoreFormatAndComplete), the non-expert loader with one each.
bool FormatSupported(const nlohmann::json& m);
bool MarkedComplete(const nlohmann::json& m);
// Step 2 with the store's text.
Status CheckStoreFormatAndComplete(const nlohmann::json& m);
// What step 2 finds wrong with the JSON file at `path`, for a hint after
// SGLang's text (which names neither): "PATH: it has no \"format\" key (...)".
// Empty when both conditions hold.
std::string WhyNotAFinishedManifest(const nlohmann::json& m, const std::string& path);
// SGLang's bare KeyError for a key `reader` reads (its repr, the only line)
// with a hint naming the manifest: "manifest PATH has no key 'model' that
// SGLang's loader reads; regenerate it ...". Any other error is as given.
Error WithMissingKeyHint(const Error& error, const std::string& path, const std::string& reader);
// Step 7 refused: SGLang's text, and a hint naming both files, both sizes and
// what to run.
Error PackSizeMismatch(const std::string& pack_path, uint64_t pack_size, const std::string& manifest_path,
                       int64_t recorded_size, const nlohmann::json& manifest);
// Step 3: SGLang's exact hard_constraints dict (a missing one fails too).
Status CheckHardConstraints(const nlohmann::json& m, bool kimi);
// Step 4: model.num_hidden_layers / num_experts / num_experts_per_token
// against `expected` (unset: K3's under kimi, the manifest's own otherwise)
// and the sizes any store needs. A missing key is a KeyError (ErrorKind::kKey).
struct ModelDims {
  uint64_t layers = 0, experts = 0, top_k = 0;
};
// The sizes step 4 holds every profile to: 1..65536 experts (an expert id
// is 16 bits), a top-k of 1..experts.
bool DimensionsUsable(uint64_t experts, uint64_t top_k);
Result<ModelDims> CheckDimensions(const nlohmann::json& model, bool kimi, const ExpectedDims& expected = {});
// Step 5: model.active_moe_layer_ids is exactly 1..92 (kimi) or the layers
// `layer_roles` records (scaled; ids below `num_layers`).
Result<std::vector<uint32_t>> CheckActiveLayers(const nlohmann::json& model, bool kimi, uint64_t num_layers,
                                                const std::vector<LayerRolesRecord>& layer_roles = {});

// Whether SGLang's own store, with its Kimi-K3 constants, refuses `m` from
// the manifest alone (steps 2-5; k3pack's extension plays no part, as in
// SGLang). `verify` tells the user of a rank manifest what SGLang would do.
bool SglangStoreRefuses(const nlohmann::json& m);

}  // namespace k3pack::manifest
