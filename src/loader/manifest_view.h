// The part of the adapter manifest the non-expert stream reads, parsed the
// way kimi_k3_gguf.py reads it: `format` and `complete` first (SGLang's
// texts), then source.tensors grouped by shard_index and source.shards in
// order. verify_metadata compares the rest of the `source` section with the
// shards through manifest/recorded_inputs.h.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "k3pack/error.h"

namespace k3pack::loader {

struct StreamTensorRecord {
  std::string name;
  std::string dtype;
  uint32_t shard_index = 0;
};

struct StreamShardRecord {
  uint32_t index = 0;
  std::string path;
  uint64_t size = 0;
};

struct StreamManifest {
  std::vector<StreamShardRecord> shards;  // manifest order
  std::map<uint32_t, std::vector<StreamTensorRecord>> tensors_by_shard;
};

// Format/complete checks, then the records. A missing key is a KeyError
// whose message is the key's repr ("'shard_index'"), as Python's would be.
Result<StreamManifest> ParseStreamManifest(const nlohmann::json& doc);

// Reads and parses the manifest file (errors name the file).
Result<nlohmann::json> ReadJsonFile(const std::string& path);

}  // namespace k3pack::loader
