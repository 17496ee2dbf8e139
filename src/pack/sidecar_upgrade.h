// A finished pack whose digest sidecar an older k3pack wrote (version 1,
// before CRC32C records existed) is given the sidecar this k3pack writes.
#pragma once

#include <functional>
#include <string>

#include "k3pack/error.h"
#include "k3pack/pack.h"

namespace k3pack::pack {

// When <pack>.digests of the finished pack `pack_path` (of `experts`) is a
// version-1 sidecar: reads every payload once, checks its SHA-256 against
// the old record and replaces the sidecar (atomically) by a version-2 one
// with the CRC32C of each payload, the records the store checks every read
// against. A payload that differs from its record fails naming it, and the
// old sidecar is kept. Any other sidecar (or none) is left alone. Call with
// the pack's lock held. `note` (may be empty) says what is done and why.
Status AddCrcRecordsToOldSidecar(const std::string& pack_path, const ExpertSet& experts, int threads,
                                 const std::function<void(const std::string&)>& note);

}  // namespace k3pack::pack
