// Progress reporting for long pack operations: a redrawn bar with rate and
// ETA on a terminal, or one JSON object per line for scripts.
#pragma once

#include <string>

#include "k3pack/pack.h"

namespace k3pack::pack {

enum class ProgressMode { kNone, kBar, kJson };

// "auto" -> bar when stderr is a TTY, else none; "bar"; "json"; "none".
Result<ProgressMode> ParseProgressMode(const std::string& name, bool stderr_is_tty);

// A ProgressFn writing to stderr in the given mode (empty for kNone). The
// bar ends with a newline when done == total.
ProgressFn MakeProgressPrinter(ProgressMode mode);

}  // namespace k3pack::pack
