#include "manifest/loader_rules.h"

#include <string>

#include "k3pack/kimi.h"
#include "manifest/json_fields.h"
#include "manifest/manifest_output.h"
#include "manifest/pyjson.h"

namespace k3pack::manifest {
namespace {

using nlohmann::json;
using fields::At;

std::string Tuple3(uint64_t a, uint64_t b, uint64_t c) {
  return "(" + std::to_string(a) + ", " + std::to_string(b) + ", " + std::to_string(c) + ")";
}

// SGLang writes the K3 layer set as "1..92"; the same form for any
// consecutive run, else the Python list.
std::string LayerRangeText(const std::vector<uint32_t>& layers) {
  bool consecutive = !layers.empty();
  for (size_t i = 1; consecutive && i < layers.size(); ++i) consecutive = layers[i] == layers[i - 1] + 1;
  if (consecutive) return std::to_string(layers.front()) + ".." + std::to_string(layers.back());
  std::string s = "[";
  for (size_t i = 0; i < layers.size(); ++i) s += (i ? ", " : "") + std::to_string(layers[i]);
  return s + "]";
}

}  // namespace

Status CheckStoreFormatAndComplete(const json& m) {
  if (!MarkedComplete(m) || !FormatSupported(m)) return Error("Kimi expert-pack manifest is incomplete or unsupported");
  return Status::OK();
}

Error PackSizeMismatch(const std::string& pack_path, uint64_t pack_size, const std::string& manifest_path,
                       int64_t recorded_size, const json& manifest) {
  // A rank pack's rebuild is its rank's: `build --force` alone wrote the full pack.
  return Error("Kimi expert-pack size does not match its manifest")
      .WithHint(pack_path + " is " + std::to_string(pack_size) + " bytes, the manifest " + manifest_path +
                " records " + std::to_string(recorded_size) +
                ": the pack was truncated or replaced; rebuild the pack and its manifest with `k3pack build " +
                RecordedShardDirOr(manifest) + RankFlagsOf(manifest) +
                " --force` (or, if the pack is the one you want, regenerate the manifest with `k3pack manifest`)");
}

Status CheckHardConstraints(const json& m, bool kimi) {
  // SGLang's exact dict (top_k the literal 16 under every profile), compared
  // as Python compares dicts. The runtime top-k is model.num_experts_per_token
  // (step 4), never this field.
  const json* hc = m.is_object() && m.contains("hard_constraints") ? &m["hard_constraints"] : nullptr;
  if (hc != nullptr && HardConstraintsMatch(*hc)) return Status::OK();
  // A rank pack's manifest adds a key SGLang refuses (RankPackHardConstraintsJson);
  // k3pack's readers take it where k3pack.ep says which experts the pack holds.
  const bool rank_marked = hc != nullptr && PyJsonEqual(*hc, RankPackHardConstraintsJson());
  const json* ep = fields::Find(m, {"k3pack", "ep"});
  if (rank_marked && ep != nullptr && ep->is_object()) return Status::OK();
  Error e("Kimi manifest hard constraints do not match runtime policy");
  if (rank_marked)
    return e.WithHint("hard_constraints." + std::string(kRankPackConstraint) +
                      " marks the manifest of an expert-parallel rank pack, but there is no k3pack.ep object saying "
                      "which experts the pack holds; regenerate the manifest with `k3pack manifest DIR --pack PACK "
                      "--manifest M.json --force`");
  const json* model = m.is_object() && m.contains("model") ? &m["model"] : nullptr;
  if (!kimi && hc != nullptr && hc->is_object() && hc->contains("top_k") && model != nullptr && model->is_object() &&
      model->contains("num_experts_per_token") && (*hc)["top_k"] == (*model)["num_experts_per_token"] &&
      (*hc)["top_k"] != 16)
    return e.WithHint("hard_constraints.top_k is the model's top-k, as k3pack wrote it before it wrote SGLang's "
                      "literal 16; regenerate the manifest with `k3pack manifest`");
  return e;
}

bool DimensionsUsable(uint64_t experts, uint64_t top_k) {
  return experts != 0 && experts <= 65536 && top_k != 0 && top_k <= experts;
}

// The fix for counts no k3pack reader can hold: the manifest is damaged.
constexpr const char* kRegenerateManifest =
    "regenerate it with `k3pack manifest DIR --pack PACK --manifest M.json --force`";

Result<ModelDims> CheckDimensions(const json& model, bool kimi, const ExpectedDims& expected) {
  // SGLang builds the tuple (int(num_hidden_layers), int(num_experts),
  // int(num_experts_per_token)) (Python int(): "16" and 16.0 are 16; "x" is
  // int()'s ValueError) and compares it with the expected one, printing both.
  K3_ASSIGN_OR_RETURN(const int64_t layers, fields::IntAt(model, "num_hidden_layers"));
  K3_ASSIGN_OR_RETURN(const int64_t experts, fields::IntAt(model, "num_experts"));
  K3_ASSIGN_OR_RETURN(const int64_t top_k, fields::IntAt(model, "num_experts_per_token"));
  // Under the scaled profile the manifest's own values are expected; under
  // kimi-k3 SGLang's constants.
  const bool counts = layers >= 0 && experts >= 0 && top_k >= 0;
  ModelDims want;
  want.layers = expected.layers.value_or(kimi ? 93 : counts ? uint64_t(layers) : 0);
  want.experts = expected.experts.value_or(kimi ? 896 : counts ? uint64_t(experts) : 0);
  want.top_k = expected.top_k.value_or(kimi ? 16 : counts ? uint64_t(top_k) : 0);
  const bool equal = counts && uint64_t(layers) == want.layers && uint64_t(experts) == want.experts &&
                     uint64_t(top_k) == want.top_k;
  // SGLang would go on with any count; each reader here holds per-layer
  // state (2^32 wrapped to 0 and crashed the store, 2^31 asked for GBs).
  if (equal && want.layers > kimi::kMaxLayers)
    return Error("model.num_hidden_layers is " + std::to_string(layers) + ", more than k3pack's limit of " +
                 std::to_string(kimi::kMaxLayers) + " layers: the manifest is damaged")
        .WithHint(kRegenerateManifest);
  // The tuples compared equal: SGLang's "A != A" named no problem.
  if (equal && !kimi && !DimensionsUsable(want.experts, want.top_k))
    return Error("model.num_experts " + std::to_string(experts) + " and num_experts_per_token " +
                 std::to_string(top_k) + " are not dimensions k3pack serves: 1..65536 experts and a top-k of 1 to " +
                 "the expert count")
        .WithHint(kRegenerateManifest);
  if (!equal || (kimi && want.top_k != 16) || !DimensionsUsable(want.experts, want.top_k))
    return Error("Kimi expert-pack dimensions (" + std::to_string(layers) + ", " + std::to_string(experts) + ", " +
                 std::to_string(top_k) + ") != " + Tuple3(want.layers, want.experts, want.top_k) +
                 "; Top-K is immutable at 16");
  return want;
}

Result<std::vector<uint32_t>> CheckActiveLayers(const json& model, bool kimi, uint64_t num_layers,
                                                const std::vector<LayerRolesRecord>& layer_roles) {
  K3_ASSIGN_OR_RETURN(const json* active_j, At(model, "active_moe_layer_ids"));
  std::vector<uint32_t> active;
  if (kimi) {
    // tuple(int(v) for v in the list) against 1..92: every element through
    // int() first (its error first), then the whole tuple (an extra element
    // after a correct 1..92 prefix is a mismatch), whatever num_hidden_layers
    // says.
    std::vector<int64_t> ints;
    if (active_j->is_array()) {
      for (const auto& v : *active_j) {
        K3_ASSIGN_OR_RETURN(int64_t i, fields::PyInt(v));
        ints.push_back(i);
      }
    }
    bool same = active_j->is_array() && ints.size() == 92;
    for (size_t i = 0; same && i < 92; ++i) same = ints[i] == int64_t(i) + 1;
    if (!same) return Error("Kimi active routed MoE layers must be exactly 1..92");
    for (uint32_t l = 1; l <= 92; ++l) active.push_back(l);
    return active;
  }
  bool active_ok = active_j->is_array() && !active_j->empty();
  if (active_ok) {
    for (const auto& v : *active_j) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= int64_t(num_layers) ||
          (!active.empty() && v.get<int64_t>() <= int64_t(active.back()))) {
        active_ok = false;
        break;
      }
      active.push_back(v.get<uint32_t>());
    }
  }
  // SGLang holds the list to the layers the pack was built for (1..92 for
  // K3); a scaled pack's are the ones its k3pack.layer_roles records.
  std::vector<uint32_t> want;
  for (const auto& lr : layer_roles) want.push_back(lr.layer);
  if (!active_ok || active != want) {
    Error e("Kimi active routed MoE layers must be exactly " + LayerRangeText(want));
    if (!active_ok)
      return e.WithHint("model.active_moe_layer_ids must be ascending layer ids below num_hidden_layers (" +
                        std::to_string(num_layers) + ")");
    return e.WithHint("model.active_moe_layer_ids has " + std::to_string(active.size()) + " layers (" +
                      LayerRangeText(active) + "), but k3pack.layer_roles records " + std::to_string(want.size()) +
                      ", one per active routed layer of the pack");
  }
  return active;
}

bool SglangStoreRefuses(const json& m) {
  if (!CheckStoreFormatAndComplete(m).ok()) return true;
  if (!m.contains("hard_constraints") || !HardConstraintsMatch(m["hard_constraints"])) return true;
  if (!m.contains("model")) return true;
  const json& model = m["model"];
  return !CheckDimensions(model, /*kimi=*/true).ok() || !CheckActiveLayers(model, /*kimi=*/true, 93).ok();
}

Result<LoaderLayout> CheckLoaderManifestRules(const json& m, const ExpectedDims& expected) {
  LoaderLayout out;
  // 2. complete + format.
  K3_RETURN_IF_ERROR(CheckStoreFormatAndComplete(m));
  K3_ASSIGN_OR_RETURN(out.ext, ParseK3packExtension(m));
  const bool kimi = out.kimi = !out.ext.has_value() || !out.ext->scaled();
  K3_ASSIGN_OR_RETURN(const json* model, At(m, "model"));
  // 3. hard constraints.
  K3_RETURN_IF_ERROR(CheckHardConstraints(m, kimi));
  // 4. dimensions.
  K3_ASSIGN_OR_RETURN(const ModelDims dims, CheckDimensions(*model, kimi, expected));
  out.num_layers = dims.layers;
  out.num_experts = dims.experts;
  out.top_k = dims.top_k;
  // 5. active layers.
  K3_ASSIGN_OR_RETURN(out.active,
                      CheckActiveLayers(*model, kimi, dims.layers, kimi ? std::vector<LayerRolesRecord>{}
                                                                         : out.ext->layer_roles));
  return out;
}

}  // namespace k3pack::manifest
