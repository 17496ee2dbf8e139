// Python repr() of the few value kinds SGLang interpolates into its error
// texts ({x!r}, tuples, sorted lists, sets), so our messages match verbatim.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "k3pack/error.h"

namespace k3pack {

// repr(str): single quotes unless the text has ' and no ", escapes \\, the
// chosen quote, \n \r \t and other control characters as \xNN.
std::string PyRepr(std::string_view s);

// "[1, 2, 3]" / "{1, 2}" for integer lists and sets (sets print ascending,
// which is what CPython does for small non-negative ints).
std::string PyList(const std::vector<int64_t>& v);
std::string PySet(const std::vector<int64_t>& v);

// What Python's open() of a directory raises: `[Errno 21] Is a directory:
// 'PATH'` (IsADirectoryError), SGLang's text where it opens a file the user
// gave as a directory.
Error PyIsADirectoryError(const std::string& path);

}  // namespace k3pack
