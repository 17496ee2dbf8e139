// Expert parallelism: which EP rank owns which routed expert.
//
// SGLang's expert-parallel MoE layer (`--ep-size N`, no redundant experts)
// gives every rank the same number of routed experts, num_experts / N, as one
// contiguous block of global expert ids: rank r owns
// [r * num_experts / N, (r + 1) * num_experts / N). Its weight loader maps a
// global id g to the local id g - r * (num_experts / N) and drops every
// expert outside that block, so a rank never loads, caches or computes
// another rank's experts. SGLang requires num_experts to divide by N; Kimi-K3's
// 896 experts allow N in {1, 2, 4, 7, 8, 14, 16, ...}.
//
// This header is the one definition of that rule for every k3pack part that
// splits by rank (rank packs, rank stores, trace sweeps, run-experts).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "k3pack/error.h"

namespace k3pack::ep {

// One rank of an expert-parallel group. size == 1 is the whole model.
struct Rank {
  uint32_t size = 1;
  uint32_t rank = 0;
  bool whole() const { return size == 1; }
  // ".ep<rank>-of-<size>": what a rank's pack and manifest names carry
  // before their extension.
  std::string FileTag() const { return ".ep" + std::to_string(rank) + "-of-" + std::to_string(size); }
};

// `stem` without a trailing rank tag (".ep<R>-of-<N>"), so a path that
// already names a rank's file is tagged once: `--pack X.ep1-of-4.pack` gave
// X.ep1-of-4.ep1-of-4.pack.
std::string WithoutFileTag(const std::string& stem);

// The routed experts a rank owns: global ids [first, end).
struct ExpertRange {
  uint32_t first = 0;
  uint32_t end = 0;
  uint32_t count() const { return end - first; }
  bool contains(uint32_t expert) const { return expert >= first && expert < end; }
};

// What CheckRank's errors call the size and the rank, so each surface names
// its own argument: the CLI its flags (kCliNames), the Python module its
// keywords; the default names the values neutrally (a manifest's record, a
// library caller).
struct RankNames {
  std::string_view size = "EP size";
  std::string_view rank = "EP rank";
};
inline constexpr RankNames kCliNames{"--ep-size", "--ep-rank"};

// Checks size >= 1, rank < size and num_experts % size == 0; the error names
// the rule ("EP size 3 does not divide the 896 routed experts ...", with
// kCliNames "--ep-size 3 does not divide ...").
Status CheckRank(const Rank& rank, uint32_t num_experts, const RankNames& names = {});

// The experts `rank` owns. Precondition: CheckRank(rank, num_experts).ok().
ExpertRange OwnedExperts(const Rank& rank, uint32_t num_experts);

// The rank that owns global expert `expert`. Precondition: expert < num_experts
// and num_experts % ep_size == 0.
uint32_t OwnerOf(uint32_t expert, uint32_t num_experts, uint32_t ep_size);

// "rank 2 of 4 (experts 448..671)" for messages.
std::string Describe(const Rank& rank, uint32_t num_experts);

}  // namespace k3pack::ep
