// Hints that name a limit of the process (not of a file or of the input) as
// the likely cause of a failure, with the limit's value now.
#pragma once

#include <string>

namespace k3pack {

// For an allocation that failed: under `ulimit -v` it names the limit and its
// value; without one it says to free memory or ask for smaller buffers.
std::string OutOfMemoryHint();

}  // namespace k3pack
