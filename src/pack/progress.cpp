#include "pack/progress.h"

#include <memory>

namespace k3pack::pack {

ProgressFn MakeProgressPrinter(ProgressMode mode) {
  if (mode == ProgressMode::kNone) return {};
  ProgressReporter::Options o;
  o.mode = mode;
  auto reporter = std::make_shared<ProgressReporter>(o);
  return [reporter](const Progress& p) { reporter->Update(p); };
}

}  // namespace k3pack::pack
