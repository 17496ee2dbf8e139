#include "kimi/profile_sidecar.h"

#include <algorithm>
#include <filesystem>

#include "util/file.h"
#include "util/utf8.h"
#include "util/json_text.h"

namespace k3pack::kimi {

namespace fs = std::filesystem;

namespace {

using Recorded = std::optional<std::string>;

// The profile a JSON file records: the sidecar's "profile", or a manifest's
// "k3pack" section (whose presence means scaled). A sidecar that is there but
// cannot be read (another user's, mode 0600) is an error: taken as absent, a
// scaled model was checked as kimi-k3 and its config blamed. A manifest that
// cannot be read is left to the reader of the manifest to report.
Result<Recorded> RecordedIn(const std::string& path) {
  auto text = ReadFileToString(path);
  if (!text.ok()) {
    const int err = text.error().sys_errno();
    if (fs::path(path).filename() != kProfileSidecar || err == ENOENT || err == ENOTDIR) return Recorded();
    return text.error().WithHint(std::string("it records the validation profile of the model `k3pack synth` wrote; "
                                             "make it readable for this user, or pass --profile kimi-k3|scaled (from Python, "
                                             "profile='kimi-k3' or 'scaled')"));
  }
  nlohmann::json j = ParseJsonOrDiscarded(*text);
  if (j.is_discarded() || !j.is_object()) return Recorded();
  if (auto it = j.find("k3pack"); it != j.end() && it->is_object()) {
    if (auto p = it->find("profile"); p != it->end() && p->is_string()) return Recorded(p->get<std::string>());
  }
  if (fs::path(path).filename() == kProfileSidecar) {
    if (auto p = j.find("profile"); p != j.end() && p->is_string()) return Recorded(p->get<std::string>());
  }
  return Recorded();
}

// The files that may record the profile of `near`, in the order they are
// asked: a directory's sidecar; a *.json file itself, then its directory's sidecar.
std::vector<std::string> Candidates(const std::vector<std::string>& near) {
  std::vector<std::string> candidates;
  for (const std::string& p : near) {
    if (p.empty()) continue;
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      candidates.push_back((fs::path(p) / kProfileSidecar).string());
    } else {
      if (fs::path(p).extension() == ".json") candidates.push_back(p);
      fs::path dir = fs::path(p).parent_path();
      candidates.push_back(((dir.empty() ? fs::path(".") : dir) / kProfileSidecar).string());
    }
  }
  return candidates;
}

}  // namespace

Result<Profile> ProfileRecordedNear(const std::vector<std::string>& near) {
  for (const std::string& c : Candidates(near)) {
    K3_ASSIGN_OR_RETURN(Recorded name, RecordedIn(c));
    if (name) return ParseProfile(*name);
  }
  return Profile::kKimiK3;
}

std::vector<std::string> ProfileSidecarsNear(const std::vector<std::string>& near) {
  std::vector<std::string> out;
  for (const std::string& c : Candidates(near)) {
    std::error_code ec;
    if (fs::path(c).filename() == kProfileSidecar && fs::exists(c, ec) &&
        std::find(out.begin(), out.end(), c) == out.end())
      out.push_back(c);
  }
  return out;
}

// The options that decide the model's bytes, normalized: the same model is
// recognized whatever the spelling of --out, the order of the flags, or
// whether a default was given explicitly (--progress, --json and --force
// change nothing in it).
nlohmann::json SynthRecipe(const synth::SynthOptions& o) {
  using nlohmann::json;
  const synth::SynthDims& d = o.dims;
  auto types = [](const synth::ExpertTypes& t) {
    return json::array({GgmlTypeName(t.up), GgmlTypeName(t.gate), GgmlTypeName(t.down)});
  };
  json layer_types = json::object();
  for (const auto& [layer, t] : o.layer_expert_types) layer_types[std::to_string(layer)] = types(t);
  std::vector<std::string> faults;
  for (synth::Fault f : o.faults) faults.emplace_back(synth::FaultName(f));
  std::sort(faults.begin(), faults.end());
  faults.erase(std::unique(faults.begin(), faults.end()), faults.end());
  json dims = {{"num_layers", d.num_layers},
               {"first_k_dense", d.first_k_dense},
               {"num_experts", d.num_experts},
               {"top_k", d.top_k},
               {"num_shared_experts", d.num_shared_experts},
               {"hidden", d.hidden},
               {"latent", d.latent},
               {"moe_intermediate", d.moe_intermediate},
               {"dense_intermediate", d.dense_intermediate},
               {"heads", d.heads},
               {"head_dim", d.head_dim},
               {"qk_rope", d.qk_rope},
               {"q_lora_rank", d.q_lora_rank},
               {"kv_lora_rank", d.kv_lora_rank},
               {"conv_kernel", d.conv_kernel},
               {"vocab", d.vocab},
               {"context_length", d.context_length},
               {"attn_res_block_size", d.attn_res_block_size},
               {"mla_layers", d.mla_layers ? json(*d.mla_layers) : json()}};
  json recipe = {{"prefix", o.prefix},
          {"seed", o.seed},
          {"dims", dims},
          {"shards", o.shards},
          {"expert_types", types(o.expert_types)},
          {"layer_expert_types", layer_types},
          {"matrix_type", GgmlTypeName(o.matrix_type)},
          {"hole_threshold_bytes", o.hole_threshold_bytes},
          {"faults", faults}};
  // Options added later are recorded only when they differ from their
  // default, so models recorded before them are still recognized.
  if (!o.tensor_types.empty()) {
    json list = json::array();
    for (const auto& t : o.tensor_types) list.push_back(json::array({t.pattern, GgmlTypeName(t.type)}));
    recipe["tensor_types"] = list;
  }
  if (o.alignment != 32) recipe["alignment"] = o.alignment;
  if (o.metadata_in_every_shard) recipe["metadata_in_every_shard"] = true;
  return recipe;
}

Result<Profile> WriteSynthSidecar(const std::string& out_dir, const std::string& config_path,
                                  const nlohmann::json& recipe) {
  // Record the profile the model passes, so later commands need no profile.
  const Profile profile = LoadModelSpec(config_path, Profile::kKimiK3).ok() ? Profile::kKimiK3 : Profile::kScaled;
  nlohmann::json side = {{"profile", ProfileName(profile)},
                         {"written_by", "k3pack synth"},
                         {"synth_options", recipe},
                         {"note", "read by k3pack commands when --profile is not given"}};
  K3_RETURN_IF_ERROR(WriteFileAtomic((fs::path(out_dir) / kProfileSidecar).string(), DumpJsonEscaped(side) + "\n"));
  return profile;
}

bool SynthSidecarRecords(const std::string& out_dir, const nlohmann::json& recipe,
                         const nlohmann::json& args_given) {
  auto text = ReadFileToString((fs::path(out_dir) / kProfileSidecar).string());
  if (!text.ok()) return false;
  nlohmann::json j = ParseJsonOrDiscarded(*text);
  if (j.is_discarded() || !j.is_object()) return false;
  if (j.contains("synth_options")) return j["synth_options"] == recipe;
  return !args_given.is_null() && j.value("synth_args", nlohmann::json()) == args_given;
}

}  // namespace k3pack::kimi
