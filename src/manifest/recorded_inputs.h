// Checking what a manifest records about its inputs against the files, with
// the manifest writer's own functions: the `source` section is recomputed from
// the shards by ScanSourceJson, the `model` section from the config by
// ModelSectionJson, the `tokenizer` section by TokenizerSectionJson; then
// record is compared with record, field by field, so the report names the
// shard, tensor or file and the field that changed, and a digest that no
// longer matches records that do (an edited inventory_sha256) is named too.
// Used by `k3pack verify` (VerifyPack) and the loader's verify_metadata.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "k3pack/error.h"
#include "k3pack/kimi.h"

namespace k3pack::manifest {

// The manifest's `model` section for a validated spec (create.cpp).
nlohmann::json ModelSectionJson(const kimi::ModelSpec& spec, const std::string& config_path,
                                const std::string& config_sha256);

// The first difference between a manifest's `source` section and the shards
// it records. kind kNone: none.
struct SourceDifference {
  enum class Kind {
    kNone,
    kShardMissing,     // a recorded shard path does not exist
    kShardUnreadable,  // it exists but is no longer a readable GGUF file (detail: the reader's error)
    kShard,            // a field of source.shards[i] differs (size, metadata_sha256, sha256, ...)
    kTensorSet,        // a tensor is in the shards but not recorded, or recorded but not in the shards
    kTensor,           // a field of a source.tensors record differs (shape, dtype, data_offset, ...)
    kSummary,          // a field of source.summary differs
    kInventory,        // every record matches, source.inventory_sha256 does not
  };
  Kind kind = Kind::kNone;
  std::string shard_path;  // the shard concerned ("" for kSummary / kInventory)
  std::string tensor;      // kTensorSet / kTensor: the tensor name
  std::string field;       // the field that differs
  std::string detail;      // "<field> is <now>, the manifest records <then>" (or what is missing)
  // kInventory without SourceCheckOptions::whole_files: the shards whose
  // recorded whole-file sha256 was taken as recorded (not hashed), so an
  // edit there is one explanation of the digest mismatch.
  std::vector<std::string> unhashed_sha256;
};

struct SourceCheckOptions {
  // Hash each whole shard the manifest has a sha256 for (--full-source-hashes);
  // otherwise the recorded whole-file digests are taken as they are.
  bool whole_files = false;
  // Runs between chunks of that hashing (Sha256FileRange); an error stops the
  // comparison and is returned as it is.
  std::function<Status()> between_chunks;
};

// Opens each recorded shard (as the loader does: any in-bounds tensor
// offsets), recomputes the section with ScanSourceJson and compares, in this
// order: shards (size, metadata_sha256, metadata_nbytes, tensor_count, ...,
// then sha256), the tensor name sets, each tensor record, the summary, and
// finally inventory_sha256. An Error only for a manifest it cannot read
// (missing keys, wrong types) or a scan failure.
Result<SourceDifference> CompareSourceWithShards(const nlohmann::json& source, const SourceCheckOptions& options = {});
// Every difference, in the same order (the first is CompareSourceWithShards'
// answer): each shard that is missing, changed size or header, or no longer
// parses (then nothing further: the records need every shard scanned); else
// each shard record, added or missing tensor, tensor record, the summary,
// and inventory_sha256 when every record matches. Empty when none. For
// reports that list every problem (doctor).
Result<std::vector<SourceDifference>> CompareSourceWithShardsAll(const nlohmann::json& source,
                                                                 const SourceCheckOptions& options = {});

// k3pack verify's wording of a SourceDifference (OK for kNone).
Status SourceDifferenceStatus(const SourceDifference& d);

// `model`: the config file's SHA-256 (model.config_sha256), then every field
// of the section recomputed from the config under `profile` (hidden_size,
// num_experts, ...). Names the config and the field.
Status CheckModelAgainstConfig(const nlohmann::json& model, kimi::Profile profile);

// `tokenizer`: the files now in tokenizer.path against tokenizer.files (a file
// missing, added, or with another size / sha256), then inventory_sha256.
Status CheckTokenizerAgainstFiles(const nlohmann::json& tokenizer);

}  // namespace k3pack::manifest
