// Rank stores: which EP rank a store serves, and its refusal of routes to
// experts another rank owns. Ownership itself is k3pack/ep.h's (SGLang's
// contiguous blocks); this file only applies it to a store.
#include <algorithm>

#include "store/store_impl.h"

namespace k3pack::store {

Status ResolveStoreRank(const std::optional<manifest::EpRecord>& recorded, const std::optional<ep::Rank>& option,
                        const std::string& manifest_path, PackGeometry* g, const ep::RankNames& names) {
  const uint32_t experts = g->space.num_experts;
  std::optional<ep::Rank> from_manifest;
  if (recorded) {
    from_manifest = ep::Rank{recorded->size, recorded->rank};
    Status ok = ep::CheckRank(*from_manifest, experts);
    if (!ok.ok())
      return Error(manifest_path + ": k3pack.ep records rank " + std::to_string(recorded->rank) + " of " +
                   std::to_string(recorded->size) + ", which is not an EP rank of this pack: " + ok.error().message());
    const ep::ExpertRange want = ep::OwnedExperts(*from_manifest, experts);
    if (want.first != recorded->first_expert || want.end != recorded->end_expert)
      return Error(manifest_path + ": k3pack.ep records experts [" + std::to_string(recorded->first_expert) + ", " +
                   std::to_string(recorded->end_expert) + ") for rank " + std::to_string(recorded->rank) + " of " +
                   std::to_string(recorded->size) + ", but that rank owns [" + std::to_string(want.first) + ", " +
                   std::to_string(want.end) + ") of " + std::to_string(experts) + " experts: the manifest was edited");
  }
  if (option) {
    Status ok = ep::CheckRank(*option, experts, names);
    if (!ok.ok()) return ok;
    if (from_manifest && (from_manifest->size != option->size || from_manifest->rank != option->rank))
      return Error("EP rank mismatch: the store was opened as " + ep::Describe(*option, experts) + ", but " +
                   manifest_path + " describes a rank pack of " + ep::Describe(*from_manifest, experts))
          .WithHint("a rank pack holds only its own rank's experts: open it without an EP rank (or with its own), "
                    "or open the full pack with the rank you want");
  }
  g->ep = option ? *option : from_manifest.value_or(ep::Rank{});
  g->owned = ep::OwnedExperts(g->ep, experts);
  g->ep_source = from_manifest && option ? "manifest and option" : from_manifest ? "manifest"
                                                               : option          ? "option"
                                                                                 : "none";
  return Status::OK();
}

Status CheckOwnedRoutes(const ep::Rank& rank, uint32_t num_experts, uint32_t layer, std::span<const int64_t> ids) {
  if (rank.whole()) return Status::OK();
  const ep::ExpertRange owned = ep::OwnedExperts(rank, num_experts);
  for (int64_t e : ids) {
    const uint32_t expert = static_cast<uint32_t>(e);
    if (owned.contains(expert)) continue;
    const uint32_t owner = ep::OwnerOf(expert, num_experts, rank.size);
    return Error("layer " + std::to_string(layer) + " expert " + std::to_string(expert) +
                 " is not served by this EP rank store, " + ep::Describe(rank, num_experts) + ": rank " +
                 std::to_string(owner) + " owns it; SGLang's EP never routes it here: a routing bug");
  }
  return Status::OK();
}

Result<RouteCall> PrepareStoreRoute(const PackGeometry& geo, uint32_t layer, std::span<const int64_t> shape,
                                    std::span<const int64_t> ids, std::optional<bool> is_prefill) {
  K3_ASSIGN_OR_RETURN(RouteCall call,
                      PrepareRoute(geo.space, layer, shape, ids, is_prefill, /*rank_share=*/!geo.ep.whole()));
  K3_RETURN_IF_ERROR(CheckOwnedRoutes(geo, layer, ids));
  return call;
}

uint32_t WorkingSetObjects(const PackGeometry& g) { return std::min(g.space.top_k, g.owned.count()); }

nlohmann::json EpSnapshot(const PackGeometry& g) {
  uint64_t objects = 0, bytes = 0;
  for (uint64_t b : g.space.object_bytes) {
    objects += g.owned.count();
    bytes += b * g.owned.count();
  }
  return {{"size", g.ep.size},         {"rank", g.ep.rank},       {"first_expert", g.owned.first},
          {"end_expert", g.owned.end}, {"owned_objects", objects}, {"owned_bytes", bytes},
          {"source", g.ep_source}};
}

}  // namespace k3pack::store
