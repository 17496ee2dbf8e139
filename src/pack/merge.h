// Internals of the rank-pack merge shared with `k3pack ep-merge`.
#pragma once

#include <string>
#include <vector>

#include "k3pack/error.h"

namespace k3pack::pack {

// Whether `pack_path` is the finished merge of these rank packs (empty
// string) or why not: its digest sidecar is the full pack's with every
// owner's entry digests, its size and header/index equal theirs, and six
// evenly spaced payloads hash to their digests. An Error only for rank packs
// that cannot be merged (the checks of MergeRankPacks).
Result<std::string> WhyNotMergedPack(const std::vector<std::string>& rank_packs, const std::string& pack_path);

// The checks of MergeRankPacks on the rank packs alone (one --ep-size, each
// rank once, one checkpoint, one header and index), without touching the
// output: the CLI runs them before it takes the output's lock, so a refused
// merge leaves no FULL.pack.lock behind.
Status CheckRankPacksMerge(const std::vector<std::string>& rank_packs);

}  // namespace k3pack::pack
