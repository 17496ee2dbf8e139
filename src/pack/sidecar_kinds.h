// What k3pack may replace or delete beside a pack. The writers put several
// files next to `<pack>` (its digest sidecar, the build's partial pack,
// journal and checkpoint, the record of its inputs) and replace or remove
// them freely, also under --force and --restart. A path of that shape may
// hold a user's own file (`p.pack.digests` saved by hand, say): it is
// replaced or deleted only when it holds the kind of file k3pack writes there
// (by its first bytes; an empty or NUL-filled one is what a crash leaves),
// and otherwise refused up front, before any copying, naming the path and
// what it is, whatever the options.
#pragma once

#include <string>
#include <vector>

#include "k3pack/error.h"

namespace k3pack::pack {

enum class SidecarKind {
  kDigests,     // K3PACKDIGESTv1 sidecar, or the build's journal of one
  kPartialPack, // the pack being built: GGMLMOEPACKv1
  kCheckpoint,  // JSON with "format": "K3PACK-PACK-CHECKPOINT-v1" (or its reserved spare)
  kInputs,      // JSON with "format": "K3PACK-PACK-INPUTS-v1"
};

struct PackSidecar {
  std::string path;
  std::string label;  // for messages: "its .digests"
  SidecarKind kind;
};

// The files beside `pack` its writers replace or delete; `building`: also
// those of a build in progress (a merge writes only the digest sidecar).
std::vector<PackSidecar> PackSidecarsOf(const std::string& pack, bool building);

// "" when `path` is missing, empty or NUL-filled, or holds `kind`; else what
// it is instead ("it is a JSON document, not a k3pack build checkpoint").
std::string NotOurSidecar(const std::string& path, SidecarKind kind);

// Refuses (kFileExists) the first sidecar path of `pack` that holds a file
// of another kind, or something that is no regular file (a directory at
// `<pack>.digests` was found only after the whole copy). `option` names the
// pack ("--pack"), `force_option` the caller's force.
Status CheckSidecarsAreOurs(const std::string& option, const std::string& pack, const std::string& force_option,
                            bool building);

// Refuses a pack name that fits the 255-byte limit of a file name while the
// side files the writers add to it (".partial.checkpoint.spare", ".lock")
// do not: the build failed after it had started, with a lock file left.
Status CheckSideFileNamesFit(const std::string& option, const std::string& pack, bool building);

}  // namespace k3pack::pack
