// Rewrites exactly the damaged payloads of a finished pack from the GGUF
// source (`k3pack pack --repair-damaged`, `k3pack build --restart`): every
// payload is hashed against the digest sidecar, each one that differs is
// zeroed and copied again from its source slice (holes kept), its new digest
// must equal the recorded one (else the source changed since the build), the
// pack is fsynced and the repaired entries are verified again against both
// the sidecar and the source. A header/index whose bytes differ from the
// layout of these shards (e.g. a name's NUL padding, which SGLang's validator
// skips but the index digest covers) is rewritten first. The builder's lock
// is held throughout.
#pragma once

#include <string>
#include <vector>

#include "k3pack/pack.h"

namespace k3pack::pack {

struct RepairDamagedResult {
  std::vector<std::string> repaired;  // "<tensor> expert <e> (entry <i>)", in entry order
  uint64_t entries_checked = 0;
  double seconds = 0;
};

Result<RepairDamagedResult> RepairDamagedPayloads(const std::string& pack_path, const ExpertSet& experts,
                                                  const ProgressFn& progress = {});

}  // namespace k3pack::pack
