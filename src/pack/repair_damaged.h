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
// the source's bytes; one none of whose payloads match is refused.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "k3pack/pack.h"

namespace k3pack::pack {

struct RepairDamagedResult {
  std::vector<std::string> repaired;  // "<tensor> expert <e> (entry <i>)", in entry order
  uint64_t entries_checked = 0;
  std::string sidecar_written;  // the digest sidecar's path when it was missing and is written now
  double seconds = 0;
};

Result<RepairDamagedResult> RepairDamagedPayloads(const std::string& pack_path, const ExpertSet& experts,
                                                  const ProgressFn& progress = {},
                                                  const std::optional<ep::Rank>& rank = std::nullopt);

}  // namespace k3pack::pack
