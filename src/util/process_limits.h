// Hints that name a limit of the process (not of a file or of the input) as
// the likely cause of a failure, with the limit's value now.
#pragma once

#include <string>

#include "k3pack/error.h"

namespace k3pack {

// For an allocation that failed: under `ulimit -v` it names the limit and its
// value; without one it says to free memory or ask for smaller buffers.
std::string OutOfMemoryHint();

// An allocation deep in the code (a container's growth) failed on `where`
// ("a copy thread of the pack build"): `out of memory on {where} (an
// allocation failed)`, ENOMEM, with OutOfMemoryHint().
Error OutOfMemoryOn(const std::string& where);

}  // namespace k3pack
