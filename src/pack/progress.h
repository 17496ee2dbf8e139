// Progress for pack operations: the command line's one reporter
// (src/util/progress.h) behind a plain ProgressFn.
#pragma once

#include <optional>
#include <string>

#include "k3pack/ep.h"
#include "k3pack/pack.h"
#include "util/progress.h"

namespace k3pack::pack {

using ProgressMode = ::k3pack::ProgressMode;
using ::k3pack::ParseProgressMode;

// A ProgressFn writing to stderr in the given mode (empty for kNone). The
// bar line ends when done == total. A rank's work (`--ep-rank all` runs them
// one after another) is told as that rank's: "(rank R of N)" after the phase,
// `ep_rank` and `ep_size` in JSON.
ProgressFn MakeProgressPrinter(ProgressMode mode, const std::optional<ep::Rank>& rank = std::nullopt);

}  // namespace k3pack::pack
