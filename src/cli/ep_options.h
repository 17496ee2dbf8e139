// --ep-size N --ep-rank R|all of `k3pack pack` and `k3pack build`: which
// expert-parallel rank packs to write (include/k3pack/ep.h has the ownership
// rule). A rank pack's path is derived from the full pack's --pack path
// (pack::RankPackPath: X.pack -> X.ep<R>-of-<N>.pack) and its manifest's from
// the default manifest name (kimi-k3-expert-pack.ep<R>-of-<N>.manifest.json).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cli/command.h"
#include "k3pack/ep.h"

namespace k3pack::cli {

struct EpChoice {
  uint32_t size = 0;            // 0: no --ep-size (a full pack)
  std::optional<uint32_t> rank;  // unset with all
  bool all = false;
  bool given() const { return size != 0; }
  // The ranks to write, in order (one, or 0..size-1 for all).
  std::vector<ep::Rank> Ranks() const;
};

void AddEpOptions(Args& args);

// Runs `one` for the whole model (no --ep-size) or for each chosen rank, one
// after another: each rank copies only its own experts' bytes, so the source
// is read once in all. One rank's result is returned as is; with --ep-rank
// all they are gathered as {"ep_size": N, `list_key`: [...], "already_built":
// every rank was}, each carrying its "ep" {size, rank} (and, already built,
// its "path", as one already-built output reports it).
Result<nlohmann::json> RunPerRank(const EpChoice& choice, const std::string& list_key,
                                  const std::function<Result<nlohmann::json>(std::optional<ep::Rank>)>& one);

// Usage errors (exit 2): --ep-rank without --ep-size and the reverse, values
// that are not integers (or "all").
Result<EpChoice> ParseEpOptions(const Args& args);
// A usage error too, once --model-config is known (given or implied): what
// ep::CheckRank says about the size/rank for the config's expert count, when
// the config reads. A size the model's experts refuse is a bad value, not a
// bad input (it was exit 1 when the config was implied).
Status CheckEpChoiceForConfig(const EpChoice& choice, const std::string& model_config);

// "kimi-k3-expert-pack.manifest.json" -> "kimi-k3-expert-pack.ep2-of-4.manifest.json".
std::string RankManifestName(const std::string& manifest_name, const ep::Rank& rank);

}  // namespace k3pack::cli
