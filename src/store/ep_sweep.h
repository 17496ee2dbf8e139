// `trace sweep --ep-size N`: a trace replayed as SGLang's expert-parallel
// ranks would see it. Each rank owns one contiguous block of every layer's
// experts (k3pack/ep.h), receives only the routes to those experts and runs
// its own cache of the given size; the sweep reports every rank's hit rate
// and bytes read per token, their total, and the same policy and cache size
// on one machine that holds every expert (what EP adds on top of caching).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "k3pack/error.h"
#include "k3pack/progress.h"
#include "store/simulate.h"

namespace k3pack::store {

// The calls of `seq` as rank `rank` of `ep_size` receives them, in the rank's
// own object space (`rank_space`: its experts renumbered from 0, the same
// layers, top_k and object sizes). A call without an owned expert is no call
// on that rank (SGLang's dispatch sends it no token for that layer). Tokens
// stay the model's tokens, so bytes per token add up across ranks.
// Precondition: ep::CheckRank({ep_size, rank}, space.num_experts).ok().
CallSeq RankCallSeq(const CallSeq& seq, const ObjectSpace& space, uint32_t ep_size, uint32_t rank);
ObjectSpace RankSpace(const ObjectSpace& space, uint32_t ep_size);

struct EpSweepTable {
  uint32_t ep_size = 1;
  std::vector<std::string> series;            // policies (+ "belady")
  std::vector<uint64_t> capacity_objects;     // per rank
  uint32_t experts_per_rank = 0;              // per layer
  uint64_t rank_objects = 0;                  // objects one rank owns
  uint64_t tokens = 0;
  // [series][size][rank]; hits and misses count distinct objects per call.
  std::vector<std::vector<std::vector<SimResult>>> ranks;
  // [series][size]: the whole model on one machine with the same cache size.
  std::vector<std::vector<SimResult>> single;
};

// Every policy (and Belady when `belady`) at every per-rank size, for every
// rank and for one machine; `threads` run the independent simulations.
// Fails with ep::CheckRank's error when ep_size does not divide the experts.
Result<EpSweepTable> EpSweep(const CallSeq& seq, const ObjectSpace& space, const std::vector<std::string>& policies,
                             const std::vector<uint64_t>& capacity_objects, uint32_t ep_size, bool belady,
                             unsigned threads, const ProgressFn& progress = {});

std::string EpSweepText(const EpSweepTable& t);
nlohmann::json EpSweepJson(const EpSweepTable& t);

}  // namespace k3pack::store
