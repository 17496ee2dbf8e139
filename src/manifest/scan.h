// The manifest's `source` section: SGLang's scan_gguf_shards inventory of an
// opened shard set (spec §2.4, §3). Also used by readers that re-scan and
// compare against a manifest (verify, doctor).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "k3pack/error.h"
#include "k3pack/progress.h"

namespace k3pack::gguf {
class ShardSet;
class GgufFile;
}

namespace k3pack::manifest {

struct ScanOptions {
  bool full_source_hashes = false;  // adds "sha256" of every whole shard
  int threads = 0;                  // shards hashed concurrently; 0 = auto
  // Whole-shard digests already computed (by resolved path), e.g. by the
  // pack build that just read the shards: those shards are not read again.
  std::map<std::string, std::string> known_sha256;
  std::function<void(const std::string&)> progress;
  // Byte progress of the shard digests (phase "hash shards"); may be empty.
  ProgressFn hash_progress;
  // Polled on the calling thread between 8 MiB chunks of its shard digests;
  // an error stops every hashing thread and is returned.
  std::function<Status()> interrupt_check;
};

// {summary, shards, tensors (sorted by name), inventory_sha256}.
// Tensor names must be valid UTF-8 (gguf-py decodes them strictly).
Result<nlohmann::json> ScanSourceJson(const gguf::ShardSet& shards, const ScanOptions& options = {});
// Same over shards opened one by one (in shard order), as readers that
// re-scan the files a manifest records do.
Result<nlohmann::json> ScanSourceJson(const std::vector<std::shared_ptr<const gguf::GgufFile>>& shards,
                                      const ScanOptions& options = {});
// The `tokenizer` section: every regular file (symlinks followed, not
// recursive) of the resolved directory, sorted by name, with size and SHA-256.
Result<nlohmann::json> TokenizerSectionJson(const std::string& tokenizer_dir);

}  // namespace k3pack::manifest
