#include "cli/ep_options.h"

#include "k3pack/kimi.h"

namespace k3pack::cli {

std::vector<ep::Rank> EpChoice::Ranks() const {
  std::vector<ep::Rank> out;
  if (!given()) return out;
  if (!all) return {ep::Rank{size, *rank}};
  for (uint32_t r = 0; r < size; ++r) out.push_back(ep::Rank{size, r});
  return out;
}

Result<nlohmann::json> RunPerRank(const EpChoice& choice, const std::string& list_key,
                                  const std::function<Result<nlohmann::json>(std::optional<ep::Rank>)>& one) {
  if (!choice.given()) return one(std::nullopt);
  nlohmann::json results = nlohmann::json::array();
  bool all_built = true;
  for (const ep::Rank& rank : choice.Ranks()) {
    K3_ASSIGN_OR_RETURN(nlohmann::json r, one(rank));
    if (!r.contains("ep")) r["ep"] = {{"size", rank.size}, {"rank", rank.rank}};
    // As a single already-built output reports it: its path under "path" too.
    if (r.value("already_built", false)) {
      if (!r.contains("path")) r["path"] = r.contains("manifest") ? r["manifest"] : r.value("pack", nlohmann::json());
    } else {
      all_built = false;
    }
    results.push_back(std::move(r));
  }
  if (!choice.all) return results[0];
  // `already_built` at the top as for one output (true only when every rank is).
  return nlohmann::json{{"ep_size", choice.size}, {list_key, results}, {"already_built", all_built}};
}

void AddEpOptions(Args& args) {
  args.Option("--ep-size", "write expert-parallel rank packs for N ranks (SGLang --ep-size N): each holds only "
                           "its rank's experts, the rest of the full pack's layout is holes")
      .Option("--ep-rank", "with --ep-size: the rank R (0..N-1) to write, or `all` for the N rank packs; rank R's "
                           "pack is <pack stem>.epR-of-N.pack")
      .Requires("--ep-rank", {"--ep-size"}, "a rank is one of N")
      .Requires("--ep-size", {"--ep-rank"}, "give the rank R (0..N-1) to write, or `all`");
}

Result<EpChoice> ParseEpOptions(const Args& args) {
  EpChoice c;
  const bool size = args.Has("--ep-size"), rank = args.Has("--ep-rank");
  if (!size && !rank) return c;
  if (!size || !rank) return Error("--ep-size and --ep-rank go together");  // declared Requires: parse refuses first
  K3_ASSIGN_OR_RETURN(int64_t n, args.GetInt("--ep-size"));
  constexpr int64_t kMaxSize = int64_t{1} << 20;
  if (n < 1) return Error("--ep-size must be at least 1, got " + std::to_string(n));
  // Say the bound that was broken (a size above it could never divide the experts).
  if (n > kMaxSize) {
    return Error("--ep-size must be at most " + std::to_string(kMaxSize) + ", got " + std::to_string(n));
  }
  c.size = static_cast<uint32_t>(n);
  if (args.Get("--ep-rank") == "all") {
    c.all = true;
  } else {
    auto r = args.GetInt("--ep-rank");
    if (!r.ok()) return Error("--ep-rank must be an integer 0.." + std::to_string(n - 1) + " or `all`, got '" +
                              args.Get("--ep-rank") + "'");
    if (*r < 0) return Error("--ep-rank must be non-negative, got " + std::to_string(*r));
    // Checked here, on the value given: a rank past UINT32_MAX would otherwise
    // be reported clamped, as a number the user never typed.
    if (*r >= n)
      return Error("--ep-rank " + std::to_string(*r) + " is out of range for --ep-size " + std::to_string(n) +
                   " (ranks are 0.." + std::to_string(n - 1) + ")");
    c.rank = static_cast<uint32_t>(*r);
  }
  return c;
}

Status CheckEpChoiceForConfig(const EpChoice& choice, const std::string& model_config) {
  if (!choice.given()) return Status::OK();
  // The divisibility rule needs the expert count: take it from the config
  // when it reads (a bad config is reported later, by the preflight).
  for (kimi::Profile p : {kimi::Profile::kKimiK3, kimi::Profile::kScaled}) {
    if (auto spec = kimi::LoadModelSpec(model_config, p); spec.ok()) {
      for (const ep::Rank& r : choice.Ranks()) K3_RETURN_IF_ERROR(ep::CheckRank(r, spec->num_experts, ep::kCliNames));
      break;
    }
  }
  return Status::OK();
}

std::string RankManifestName(const std::string& name, const ep::Rank& rank) {
  const std::string tag = rank.FileTag();
  const std::string ext = ".manifest.json";
  if (name.size() > ext.size() && name.ends_with(ext))
    return ep::WithoutFileTag(name.substr(0, name.size() - ext.size())) + tag + ext;
  if (name.size() > 5 && name.ends_with(".json")) return ep::WithoutFileTag(name.substr(0, name.size() - 5)) + tag + ".json";
  return ep::WithoutFileTag(name) + tag;
}

}  // namespace k3pack::cli
