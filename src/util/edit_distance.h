// Edit distance between two names: doctor's near-miss tensor names and the
// argument parser's "did you mean" for an unknown option.
#pragma once

#include <cstddef>
#include <string_view>

namespace k3pack {

// Edit distance (insert/delete/substitute, unit costs).
size_t EditDistance(std::string_view a, std::string_view b);

}  // namespace k3pack
