// numpy .npy (format version 1.0) writing for `k3pack load --dump`, so any
// emitted tensor can be inspected with numpy.load().
#pragma once

#include <string>

#include "k3pack/error.h"
#include "k3pack/loader.h"

namespace k3pack::loader {

// The complete .npy header (magic, version 1.0, length, padded dict) for
// `t`: '<descr>', C order, shape as a Python tuple. bfloat16 has no numpy
// descr; it is written as '<u2' (raw bits; view as bfloat16 with ml_dtypes
// or torch).
std::string NpyHeader(const NamedTensor& t);

// Writes `<path>` through `<path>.tmp` + rename (no fsync: inspection
// output, not a product).
Status WriteNpy(const std::string& path, const NamedTensor& t);

// Whether `path` holds exactly the bytes WriteNpy(path, t) writes (false
// when it is missing or differs), compared in pieces: how a rerun of
// `load --dump` recognises the dump it would write.
Result<bool> NpyFileHolds(const std::string& path, const NamedTensor& t);

}  // namespace k3pack::loader
