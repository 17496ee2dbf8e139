#include "k3pack/ep.h"

#include <algorithm>
#include <string_view>

namespace k3pack::ep {

Status CheckRank(const Rank& rank, uint32_t num_experts, const RankNames& names) {
  const std::string size(names.size), rank_name(names.rank);
  if (rank.size == 0) return Error(size + " must be at least 1, got 0");
  if (rank.rank >= rank.size)
    return Error(rank_name + " " + std::to_string(rank.rank) + " is out of range for " + size + " " +
                 std::to_string(rank.size) + " (ranks are 0.." + std::to_string(rank.size - 1) + ")");
  if (num_experts == 0 || num_experts % rank.size != 0)
    return Error(size + " " + std::to_string(rank.size) + " does not divide the " + std::to_string(num_experts) +
                 " routed experts per layer; SGLang's expert parallelism gives every rank the same number of "
                 "experts, so the size must be a divisor of " +
                 std::to_string(num_experts));
  return Status::OK();
}

std::string WithoutFileTag(const std::string& stem) {
  const size_t at = stem.rfind(".ep");
  if (at == std::string::npos) return stem;
  const std::string_view tag = std::string_view(stem).substr(at + 3);
  const size_t of = tag.find("-of-");
  const auto digits = [](std::string_view s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (of == std::string_view::npos || !digits(tag.substr(0, of)) || !digits(tag.substr(of + 4))) return stem;
  return stem.substr(0, at);
}

ExpertRange OwnedExperts(const Rank& rank, uint32_t num_experts) {
  const uint32_t per_rank = num_experts / rank.size;
  return ExpertRange{rank.rank * per_rank, (rank.rank + 1) * per_rank};
}

uint32_t OwnerOf(uint32_t expert, uint32_t num_experts, uint32_t ep_size) {
  return expert / (num_experts / ep_size);
}

std::string Describe(const Rank& rank, uint32_t num_experts) {
  const ExpertRange owned = OwnedExperts(rank, num_experts);
  return "rank " + std::to_string(rank.rank) + " of " + std::to_string(rank.size) + " (experts " +
         std::to_string(owned.first) + ".." + std::to_string(owned.end - 1) + ")";
}

}  // namespace k3pack::ep
