// Strict UTF-8 validation, shared by the pack index (entry names) and the
// manifest writer (paths and names it must emit as Python would decode them).
#pragma once

#include <string_view>

namespace k3pack {

// True when `s` is UTF-8 that Python's strict decoder accepts: no overlong
// forms, no surrogates, nothing above U+10FFFF, no truncated sequences.
bool IsValidUtf8(std::string_view s);

}  // namespace k3pack
