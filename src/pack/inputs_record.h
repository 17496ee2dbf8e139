// `<pack>.inputs`: what a finished pack was built from. A build killed after
// its pack was published but before `build` wrote the manifest, then an
// edited source shard, then the same `build` again: the pack was reused
// (six sampled payloads agreed) and the manifest recorded the edited shards,
// so every check but `verify --against-source` passed a stale pack. The
// record holds each source shard's name, size and modification time (what
// the build checkpoint's fingerprint covers) as they were when the pack was
// built; a finished pack is taken as built from the shards given now only
// when they still show those. A pack without a record (an older k3pack's,
// SGLang's) is judged as before. The pack's bytes are not touched.
//
// JSON: {"format": "K3PACK-PACK-INPUTS-v1",
//        "shards": [{"name": "<file name>", "size": N, "mtime_ns": N}, ...]}
#pragma once

#include <string>
#include <vector>

#include "k3pack/error.h"
#include "k3pack/pack.h"
#include "util/file.h"

namespace k3pack::pack {

// Records `stamps` (those of ex.shard_paths the build read) beside `pack`,
// atomically.
Status WriteInputsRecord(const std::string& pack, const ExpertSet& ex, const std::vector<FileStamp>& stamps);

// The record of the shards as they are now (after a full comparison showed
// the pack holds their bytes).
Status RecordCurrentInputs(const std::string& pack, const ExpertSet& ex);

// "" when `pack` has no record or the shards of `ex` show what it records;
// else why the pack is not of these shards ("source shard P changed since
// the pack was built from it: its size went from A to B bytes").
std::string WhyInputsChanged(const std::string& pack, const ExpertSet& ex);

}  // namespace k3pack::pack
