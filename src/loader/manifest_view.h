// The part of the adapter manifest the non-expert stream reads, parsed the
// way kimi_k3_gguf.py reads it: `format` and `complete` first (SGLang's
// texts), then source.tensors grouped by shard_index and source.shards in
// order. Keys SGLang's iterator does not read are optional here and only
// used by verify_metadata.
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
  // Only for verify_metadata (absent keys skip the comparison).
  std::optional<std::vector<int64_t>> shape;
  std::optional<uint64_t> data_offset;
  std::optional<uint64_t> nbytes;
};

struct StreamShardRecord {
  uint32_t index = 0;
  std::string path;
  uint64_t size = 0;
  std::optional<uint64_t> metadata_nbytes;
  std::optional<std::string> metadata_sha256;
  std::optional<std::string> sha256;  // whole file; only with `manifest --full-source-hashes`
};

struct StreamManifest {
  std::vector<StreamShardRecord> shards;  // manifest order
  std::map<uint32_t, std::vector<StreamTensorRecord>> tensors_by_shard;
};

// Python truthiness of a JSON value (null, false, 0, "", [], {} are false).
bool PyTruthy(const nlohmann::json& v);

// Format/complete checks, then the records. A missing key is a KeyError
// whose message is the key's repr ("'shard_index'"), as Python's would be.
Result<StreamManifest> ParseStreamManifest(const nlohmann::json& doc);

// Reads and parses the manifest file (errors name the file).
Result<nlohmann::json> ReadJsonFile(const std::string& path);

}  // namespace k3pack::loader
