// Progress for pack operations: the command line's one reporter
// (src/util/progress.h) behind a plain ProgressFn.
#pragma once

#include <string>

#include "k3pack/pack.h"
#include "util/progress.h"

namespace k3pack::pack {

using ProgressMode = ::k3pack::ProgressMode;
using ::k3pack::ParseProgressMode;

// A ProgressFn writing to stderr in the given mode (empty for kNone). The
// bar line ends when done == total.
ProgressFn MakeProgressPrinter(ProgressMode mode);

}  // namespace k3pack::pack
