// Rewrites exactly the damaged payloads of a finished pack from the GGUF
// source (`k3pack pack --repair-damaged`, `k3pack build --restart`): every
// payload is hashed against the digest sidecar, each one that differs is
// zeroed and copied again from its source slice (holes kept), its new digest
// must equal the recorded one (else the source changed since the build), the
// pack is fsynced and the repaired entries are verified again against both
// the sidecar and the source. A header/index whose bytes differ from the
// layout of these shards (e.g. a name's NUL padding, which SGLang's validator
// skips but the index digest covers) is rewritten too. The builder's lock
// is held throughout. A pack without a sidecar is compared with the source
// instead, payload by payload (`rank`: the rank pack the caller asked for;
// only its experts are compared), and its sidecar is written once it holds
// the source's bytes; one none of whose payloads match is refused. So is a
// pack whose shards changed since it was built (`<pack>.inputs`; its sidecar
// records the old shards' bytes) or whose sidecar is another rank's (a rank
// pack's beside a full pack): the sidecar is written anew, and the record of
// the inputs after it. A rank pack at a full pack's path is refused.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "k3pack/pack.h"

namespace k3pack::pack {

struct RepairDamagedResult {
  std::vector<std::string> repaired;  // "<tensor> expert <e> (entry <i>)", in entry order
  uint64_t entries_checked = 0;
  // The digest sidecar's path when it is written now: it was missing, or
  // it is written anew for `why_source` (the shards changed since the pack
  // was built, or the sidecar is another rank's), which made the shards the
  // record every payload was compared with.
  std::string sidecar_written;
  std::string why_source;
  double seconds = 0;
};

Result<RepairDamagedResult> RepairDamagedPayloads(const std::string& pack_path, const ExpertSet& experts,
                                                  const ProgressFn& progress = {},
                                                  const std::optional<ep::Rank>& rank = std::nullopt);

}  // namespace k3pack::pack
