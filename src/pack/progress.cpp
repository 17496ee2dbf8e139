#include "pack/progress.h"

#include <memory>

namespace k3pack::pack {

ProgressFn MakeProgressPrinter(ProgressMode mode, const std::optional<ep::Rank>& rank) {
  if (mode == ProgressMode::kNone) return {};
  ProgressReporter::Options o;
  o.mode = mode;
  if (rank) {
    o.scope = "rank " + std::to_string(rank->rank) + " of " + std::to_string(rank->size);
    o.scope_fields = {{"ep_rank", rank->rank}, {"ep_size", rank->size}};
  }
  auto reporter = std::make_shared<ProgressReporter>(o);
  return [reporter](const Progress& p) { reporter->Update(p); };
}

}  // namespace k3pack::pack
