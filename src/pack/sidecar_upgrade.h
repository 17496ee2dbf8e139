// A finished pack whose digest sidecar an older k3pack wrote (version 1,
// before CRC32C records existed), or whose sidecar was damaged, is given the
// sidecar this k3pack writes.
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
// the pack's lock held. `note` (may be empty) says what is done and why;
// `progress` (may be empty) is called on the calling thread, phase "sidecar".
Status AddCrcRecordsToOldSidecar(const std::string& pack_path, const ExpertSet& experts, int threads,
                                 const std::function<void(const std::string&)>& note,
                                 const ProgressFn& progress = {});

// Why the digest sidecar of the finished full pack `pack_path` is one every
// store refuses ("" when it is usable, absent, or cannot be read by this
// process): damaged, cut short, emptied, of another pack, or a rank pack's.
std::string WhySidecarIsUnusable(const std::string& pack_path, const ExpertSet& experts);

// Writes <pack>.digests anew (atomically) from the pack's own bytes: every
// payload read once for its SHA-256 and CRC32C. The caller has checked the
// payloads (against the source) and holds the pack's lock. `progress` as
// AddCrcRecordsToOldSidecar's.
Status RewriteSidecarFromPack(const std::string& pack_path, const ExpertSet& experts, int threads,
                              const ProgressFn& progress = {});

}  // namespace k3pack::pack
