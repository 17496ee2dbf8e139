// Routed-expert tensor selection and validation (spec §6.1, exact texts).
#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "k3pack/gguf.h"
#include "k3pack/kimi.h"
#include "k3pack/pack.h"
#include "pack/format.h"
#include "util/pyrepr.h"

namespace k3pack::pack {
namespace {

// (str(int(layer)), role): SGLang's key holds a Python int, which has no
// bound, so a stack of layer 2^64 is a key like any other.
using Key = std::pair<std::string, uint32_t>;

Key KeyOf(uint32_t layer, Role role) { return {std::to_string(layer), static_cast<uint32_t>(role)}; }

// Python repr of the (layer, role) tuple: (1, 'up').
std::string KeyRepr(const Key& k) {
  return "(" + k.first + ", " + PyRepr(RoleName(static_cast<Role>(k.second))) + ")";
}

// Python sorts (layer, role-string) tuples: by layer, then role name.
bool PyKeyLess(const Key& a, const Key& b) {
  if (a.first != b.first) return PyIntTextLess(a.first, b.first);
  return std::string_view(RoleName(static_cast<Role>(a.second))) <
         std::string_view(RoleName(static_cast<Role>(b.second)));
}

std::string KeyListRepr(std::vector<Key> keys) {
  std::sort(keys.begin(), keys.end(), PyKeyLess);
  if (keys.size() > 8) keys.resize(8);
  std::string out = "[";
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i) out += ", ";
    out += KeyRepr(keys[i]);
  }
  return out + "]";
}

std::string TupleRepr(const std::vector<int64_t>& v) {
  std::string out = "(";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(v[i]);
  }
  if (v.size() == 1) out += ",";
  return out + ")";
}

std::string DtypeName(uint32_t id) {
  const GgmlTypeInfo* info = GgmlTypeInfoFor(id);
  if (info && info->name && info->name[0]) return info->name;
  return std::to_string(id);
}

}  // namespace

std::array<uint32_t, 3> ExpectedScaledExpertTypes(const std::vector<std::array<uint32_t, 3>>& layer_types) {
  // Majority with ties to the earliest: count, and remember first appearance.
  auto pick = [&](std::initializer_list<int> roles) {
    std::map<uint32_t, std::pair<uint64_t, size_t>> votes;  // type -> (count, first position)
    size_t pos = 0;
    for (const auto& row : layer_types) {
      for (int r : roles) {
        auto [it, fresh] = votes.emplace(row[r], std::make_pair(uint64_t{0}, pos));
        it->second.first++;
        ++pos;
      }
    }
    uint32_t best = 0;
    std::pair<uint64_t, size_t> best_v{0, SIZE_MAX};
    for (const auto& [type, v] : votes) {
      if (v.first > best_v.first || (v.first == best_v.first && v.second < best_v.second)) best = type, best_v = v;
    }
    return best;
  };
  const uint32_t up_gate = pick({0, 1});
  return {up_gate, up_gate, pick({2})};
}

uint64_t ExpertSet::EstimatedPackBytes() const {
  std::vector<LayerRoleBytes> v;
  for (size_t i = 0; i < layers.size(); ++i) {
    v.push_back({layers[i], {by_layer[i][0].expert_bytes, by_layer[i][1].expert_bytes, by_layer[i][2].expert_bytes}});
  }
  auto layout = PackLayout::Make(std::move(v), num_experts);
  return layout.ok() ? layout->final_size() : 0;
}

Status CheckMixedTypesAllowed(const CollectOptions& options, kimi::Profile profile) {
  if (!options.allow_mixed_types || profile == kimi::Profile::kScaled) return Status::OK();
  return Error(options.mixed_types_option + " requires " + options.scaled_profile_option +
               " (Kimi K3 experts are Q2_K/Q2_K/Q3_K)");
}

Result<ExpertSet> CollectExperts(const std::vector<SourceTensor>& tensors, const std::vector<std::string>& shard_paths,
                                 const kimi::ModelSpec& spec, const CollectOptions& options) {
  const bool k3 = spec.profile == kimi::Profile::kKimiK3;
  K3_RETURN_IF_ERROR(CheckMixedTypesAllowed(options, spec.profile));
  if (spec.num_experts == 0) return Error("num_experts must be positive");

  std::map<Key, const SourceTensor*> found;
  std::vector<Key> scan_order;  // SGLang's dict insertion order: shard order, then each file's tensor order
  for (const auto& t : tensors) {
    auto parsed = ParseExpertTensorName(t.name);
    if (!parsed) continue;
    Key key{parsed->layer_text, static_cast<uint32_t>(parsed->role)};
    if (found.count(key)) return Error("duplicate routed expert tensor " + KeyRepr(key));
    found[key] = &t;
    scan_order.push_back(key);
  }
  std::set<Key> expected;
  for (uint32_t layer : spec.active_moe_layer_ids) {
    for (Role r : kRoleOrder) expected.insert(KeyOf(layer, r));
  }
  std::vector<Key> missing, extra;
  for (const Key& k : expected) {
    if (!found.count(k)) missing.push_back(k);
  }
  for (const auto& [k, t] : found) {
    if (!expected.count(k)) extra.push_back(k);
  }
  if (!missing.empty() || !extra.empty()) {
    return Error("routed expert tensor coverage mismatch: missing=" + KeyListRepr(missing) +
                 ", extra=" + KeyListRepr(extra));
  }

  const auto E = static_cast<int64_t>(spec.num_experts);
  const auto H = static_cast<int64_t>(spec.routed_expert_hidden_size);
  const auto I = static_cast<int64_t>(spec.moe_intermediate_size);
  ExpertSet out;
  out.layers = spec.active_moe_layer_ids;
  out.num_experts = spec.num_experts;
  out.top_k = spec.top_k;
  out.shard_paths = shard_paths;
  std::array<uint32_t, 3> first_dtype{};
  std::array<uint32_t, 3> scaled_types{};
  if (!k3 && !options.allow_mixed_types) {
    std::vector<std::array<uint32_t, 3>> layer_types;
    for (uint32_t layer : spec.active_moe_layer_ids) {
      std::array<uint32_t, 3> row{};
      for (Role r : kRoleOrder) row[static_cast<uint32_t>(r)] = found.at(KeyOf(layer, r))->dtype_id;
      layer_types.push_back(row);
    }
    scaled_types = ExpectedScaledExpertTypes(layer_types);
  }
  // Pass 1, SGLang's validate_expert_tensors: every routed tensor in scan
  // order (its dict's insertion order, not layer order), shape, then dtype,
  // then sliceability, so of several bad tensors the first in the files is
  // named. Pass 2 below (layer order) then only collects.
  auto check = [&](const Key& key) -> Status {
    const Role r = static_cast<Role>(key.second);
    const auto ri = key.second;
    const SourceTensor& t = *found.at(key);
    std::vector<int64_t> want = (r == Role::kDown) ? std::vector<int64_t>{I, H, E} : std::vector<int64_t>{H, I, E};
    if (t.shape != want) return Error("unexpected expert shape for " + KeyRepr(key) + ": " + TupleRepr(t.shape));
    if (k3) {
      const uint32_t want_type =
          (r == Role::kDown) ? static_cast<uint32_t>(GgmlType::Q3_K) : static_cast<uint32_t>(GgmlType::Q2_K);
      if (t.dtype_id != want_type)
        return Error("unexpected expert dtype for " + KeyRepr(key) + ": " + DtypeName(t.dtype_id));
    } else {
      if (!IsValidGgmlType(t.dtype_id))
        return Error("unexpected expert dtype for " + KeyRepr(key) + ": " + DtypeName(t.dtype_id));
      if (!options.allow_mixed_types && t.dtype_id != scaled_types[ri]) {
        return Error("unexpected expert dtype for " + KeyRepr(key) + ": " + DtypeName(t.dtype_id))
            .WithHint(std::string("the other layers' ") + (r == Role::kDown ? "down" : "up/gate") + " experts are " +
                      DtypeName(scaled_types[ri]) +
                      "; pass " + options.mixed_types_option +
                      " to pack mixed types (entry sizes then vary by layer)");
      }
    }
    if (t.nbytes % spec.num_experts != 0 || t.nbytes == 0) return Error("expert tensor is not evenly sliceable: " + t.name);
    return Status::OK();
  };
  for (const Key& key : scan_order) K3_RETURN_IF_ERROR(check(key));
  for (size_t li = 0; li < spec.active_moe_layer_ids.size(); ++li) {
    const uint32_t layer = spec.active_moe_layer_ids[li];
    std::array<ExpertTensor, 3> row;
    for (Role r : kRoleOrder) {
      const auto ri = static_cast<uint32_t>(r);
      const Key key = KeyOf(layer, r);
      const SourceTensor& t = *found.at(key);  // checked by pass 1
      if (!k3 && options.allow_mixed_types) {
        if (li == 0) first_dtype[ri] = t.dtype_id;
        if ((li > 0 && t.dtype_id != first_dtype[ri]) || (r == Role::kGate && t.dtype_id != row[0].tensor.dtype_id))
          out.mixed = true;
      }
      if (t.shard_index >= shard_paths.size()) {
        return Error("expert tensor " + t.name + " names shard " + std::to_string(t.shard_index) + " of " +
                     std::to_string(shard_paths.size()));
      }
      ExpertTensor& et = row[ri];
      et.layer = layer;
      et.role = ri;
      et.tensor = t;
      et.shard_path = shard_paths[t.shard_index];
      et.expert_bytes = t.nbytes / spec.num_experts;
    }
    out.by_layer.push_back(std::move(row));
  }
  for (size_t li = 1; li < out.by_layer.size(); ++li) {
    for (int r = 0; r < 3; ++r) {
      if (out.by_layer[li][r].expert_bytes != out.by_layer[0][r].expert_bytes) out.mixed = true;
    }
  }
  if (out.layers.empty()) return Error("the model has no active MoE layers");
  return out;
}

std::vector<SourceTensor> SourceTensorsOf(const gguf::ShardSet& shards) {
  std::vector<SourceTensor> out;
  for (const auto& loc : shards.AllTensors()) {
    SourceTensor t;
    t.name = loc.info->name;
    t.shape = loc.info->shape();
    t.dtype_id = static_cast<uint32_t>(loc.info->type);
    t.shard_index = loc.shard_index;
    t.data_offset = loc.info->data_offset;
    t.nbytes = loc.info->nbytes;
    out.push_back(std::move(t));
  }
  return out;
}

Result<ExpertSet> CollectExperts(const gguf::ShardSet& shards, const kimi::ModelSpec& spec,
                                 const CollectOptions& options) {
  std::vector<std::string> paths;
  for (const auto& s : shards.shards()) paths.push_back(s->path());
  return CollectExperts(SourceTensorsOf(shards), paths, spec, options);
}

Result<ExpertSet> CollectCheckedExperts(const gguf::ShardSet& shards, const kimi::ModelSpec& spec,
                                        const CollectOptions& options) {
  // SGLang's expert checks run first, so a fault they catch gets their text
  // (a 895-expert checkpoint whose metadata says so is SGLang's "unexpected
  // expert shape", not k3pack's metadata line); the cross-check of the config
  // against the GGUF metadata, which SGLang does not make, follows, and its
  // finding is the hint of SGLang's error when both fail.
  Status cross = kimi::CrossCheckGguf(spec, shards);
  auto experts = CollectExperts(shards, spec, options);
  if (!experts.ok()) {
    if (cross.ok()) return experts.error();
    return experts.error().WithHint(cross.error().headline());
  }
  if (!cross.ok()) return cross.error();
  return experts;
}

Result<ExpertSet> CollectExpertsFromGguf(const std::string& gguf_dir, const std::string& model_config,
                                         kimi::Profile profile, const CollectOptions& options) {
  // SGLang's prepare_kimi_pack order: discover the shards, then the spec from
  // the config, then the scan. An empty directory with a config of another
  // model says "no GGUF files found", not the invariants mismatch.
  K3_RETURN_IF_ERROR(gguf::ShardSet::Discover(gguf_dir).status());
  K3_ASSIGN_OR_RETURN(kimi::ModelSpec spec, kimi::LoadModelSpec(model_config, profile));
  K3_ASSIGN_OR_RETURN(gguf::ShardSet shards, gguf::ShardSet::Open(gguf_dir));
  return CollectCheckedExperts(shards, spec, options);
}

Result<std::string> DefaultPackPath(const std::string& any_shard_path) {
  auto slash = any_shard_path.find_last_of('/');
  std::string dir = slash == std::string::npos ? "." : any_shard_path.substr(0, slash);
  std::string file = slash == std::string::npos ? any_shard_path : any_shard_path.substr(slash + 1);
  auto name = gguf::ParseShardName(file);
  if (!name) return Error("Kimi GGUF name is not a numbered shard: " + any_shard_path);
  return dir + "/" + name->prefix + ".expert-major.pack";
}

std::string RankPackPath(const std::string& full, const ep::Rank& rank) {
  const std::string tag = rank.FileTag();
  if (full.size() > 5 && full.ends_with(".pack")) return ep::WithoutFileTag(full.substr(0, full.size() - 5)) + tag + ".pack";
  return ep::WithoutFileTag(full) + tag;
}

nlohmann::json LayerRolesJson(const ExpertSet& experts) {
  nlohmann::json list = nlohmann::json::array();
  for (size_t li = 0; li < experts.layers.size(); ++li) {
    std::vector<LayerRoleBytes> one = {{experts.layers[li],
                                        {experts.by_layer[li][0].expert_bytes, experts.by_layer[li][1].expert_bytes,
                                         experts.by_layer[li][2].expert_bytes}}};
    auto layout = PackLayout::Make(one, 1);
    nlohmann::json item;
    item["layer"] = experts.layers[li];
    item["object_bytes"] = layout.ok() ? layout->ObjectBytes(0) : 0;
    for (Role r : kRoleOrder) {
      const ExpertTensor& t = experts.by_layer[li][static_cast<uint32_t>(r)];
      item[RoleName(r)] = {{"dtype", DtypeName(t.tensor.dtype_id)},
                           {"dtype_id", t.tensor.dtype_id},
                           {"expert_bytes", t.expert_bytes}};
    }
    list.push_back(std::move(item));
  }
  return list;
}

}  // namespace k3pack::pack
