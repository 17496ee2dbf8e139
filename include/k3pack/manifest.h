// The adapter manifest (SGLang's SGLANG-KIMI-GGMLMOEPACK-ADAPTER-v1 JSON):
// creating it from GGUF shards + expert pack + tokenizer, writing it
// byte-compatibly with SGLang, and reading it back into typed records.
//
// A manifest ties together everything a server needs to trust at start-up:
// the shard inventory (sizes, metadata digests, every tensor's place), the
// validated pack geometry and index digest, the tokenizer files and the hard
// execution constraints. Readers (loader, store, verify, doctor) parse it
// through this header instead of poking at raw JSON.
//
// Under Profile::kKimiK3 the file has exactly SGLang's keys. Under
// Profile::kScaled one extra top-level key "k3pack" records the profile and
// per-layer role sizes (mixed quantization); its absence means kimi-k3.
// Every other key holds what SGLang's create_manifest would write for the
// same inputs (docs/FORMATS.md lists the fields field by field).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "k3pack/error.h"
#include "k3pack/kimi.h"
#include "k3pack/pack.h"

namespace k3pack::manifest {

inline constexpr std::string_view kManifestFormat = "SGLANG-KIMI-GGMLMOEPACK-ADAPTER-v1";
// Values of the "k3pack" extension's "profile" key.
inline constexpr std::string_view kScaledProfileName = "scaled";
inline constexpr std::string_view kKimiProfileName = "kimi-k3";

// ------------------------------------------------------------------ reading

// Reads and parses a JSON file. Errors name the file (missing file ->
// FileNotFoundError, bad JSON -> ValueError with the parser's position).
Result<nlohmann::json> ReadManifestJson(const std::string& path);

struct ShardRecord {
  uint32_t index = 0;
  std::string path;  // resolved absolute path at manifest time
  uint64_t size = 0;
  uint64_t metadata_nbytes = 0;  // aligned start of the tensor data section
  std::string metadata_sha256;   // of bytes [0, metadata_nbytes)
  uint64_t tensor_count = 0;
  std::optional<std::string> sha256;  // whole file; only with --full-source-hashes
};

struct TensorRecord {
  std::string name;
  std::vector<int64_t> shape;  // GGUF ne order (ne0 first)
  std::string dtype;           // gguf-py type name, e.g. "Q2_K"
  uint32_t dtype_id = 0;
  uint32_t shard_index = 0;
  uint64_t data_offset = 0;  // absolute file offset in the shard
  uint64_t nbytes = 0;
};

struct SourceSummary {
  std::string architecture;
  uint64_t shard_count = 0;
  uint64_t tensor_count = 0;
  uint64_t total_bytes = 0;
  bool full_source_hashes = false;
};

struct SourceRecord {
  SourceSummary summary;
  std::vector<ShardRecord> shards;
  std::vector<TensorRecord> tensors;  // sorted by name (code point order)
  std::string inventory_sha256;
};

struct RoleRecord {
  std::string dtype;
  uint32_t dtype_id = 0;
  std::vector<int64_t> logical_shape;  // [ne0, ne1] of the GGUF tensor
  uint64_t expert_bytes = 0;
  uint64_t entry_count = 0;
  uint64_t payload_bytes = 0;
};

struct ExpertPackRecord {
  std::string path;
  uint64_t size = 0;
  std::string magic;  // "GGMLMOEPACKv1"
  uint32_t version = 0;
  uint64_t header_bytes = 0;
  uint64_t entry_bytes = 0;
  uint64_t index_count = 0;
  uint64_t data_start = 0;
  uint64_t alignment = 0;
  std::string index_sha256;
  std::vector<std::string> physical_role_order;
  std::vector<uint32_t> active_moe_layer_ids;
  uint32_t num_experts = 0;
  uint32_t top_k = 0;
  uint64_t object_bytes = 0;
  std::array<RoleRecord, 3> roles;  // indexed by pack::Role: up, gate, down
  uint64_t payload_samples_verified = 0;
  bool full_pack_hash = false;
  std::optional<std::string> sha256;
};

struct ModelRecord {
  std::string config_path;
  std::string config_sha256;
  std::string architecture;  // always "KimiLinearForCausalLM" (SGLang hard-codes it)
  uint32_t num_hidden_layers = 0;
  std::vector<uint32_t> active_moe_layer_ids;
  uint32_t num_experts = 0;
  uint32_t num_experts_per_token = 0;
  uint32_t num_shared_experts = 0;
  uint64_t hidden_size = 0;
  uint64_t routed_expert_hidden_size = 0;
  uint64_t moe_intermediate_size = 0;
  std::string hidden_act;
};

struct TokenizerFile {
  std::string name;
  uint64_t size = 0;
  std::string sha256;
};

struct TokenizerRecord {
  // false: the manifest has no tokenizer section (absent or null). No SGLang
  // reader of the manifest reads it (store, non-expert iterator), so such a
  // manifest is served; verify says the tokenizer was not checked.
  bool recorded = true;
  std::string path;
  std::vector<TokenizerFile> files;
  std::string inventory_sha256;
};

struct VerificationRecord {
  std::string structure;  // "complete"
  int64_t payload_samples = 0;
  bool full_source_hashes = false;
  bool full_pack_hash = false;
};

// The k3pack extension: present under --profile scaled (with layer_roles)
// and on expert-parallel rank packs (with ep); absent on a plain kimi-k3
// manifest. SGLang ignores it.
struct LayerRoleInfo {
  std::string dtype;
  uint32_t dtype_id = 0;
  uint64_t expert_bytes = 0;
};
struct LayerRolesRecord {
  uint32_t layer = 0;
  uint64_t object_bytes = 0;
  std::array<LayerRoleInfo, 3> roles;  // up, gate, down
};
// The "ep" object of a rank pack's manifest: the pack holds only the bytes of
// experts [first_expert, end_expert) of every layer (include/k3pack/ep.h).
struct EpRecord {
  uint32_t size = 1;
  uint32_t rank = 0;
  uint32_t first_expert = 0;
  uint32_t end_expert = 0;  // exclusive
};
struct K3packExtension {
  std::string profile;  // "scaled" | "kimi-k3"
  std::vector<LayerRolesRecord> layer_roles;  // scaled: one per active layer, in order
  std::optional<EpRecord> ep;                 // rank packs only
  bool scaled() const { return profile == kScaledProfileName; }
};

struct Manifest {
  bool complete = false;
  std::string format;
  std::string created_at;
  std::string sglang_git_sha;
  nlohmann::json hard_constraints;  // compared as a whole by readers
  ModelRecord model;
  SourceRecord source;
  ExpertPackRecord expert_pack;
  TokenizerRecord tokenizer;
  VerificationRecord verification;
  std::optional<K3packExtension> k3pack;
  // A kimi-k3 rank pack's manifest has the extension too (profile "kimi-k3").
  kimi::Profile profile() const {
    return k3pack && k3pack->scaled() ? kimi::Profile::kScaled : kimi::Profile::kKimiK3;
  }
};

// Section parsers. A missing key is ErrorKind::kKey with the message `'key'`
// (Python's KeyError repr); a value of the wrong type is a ValueError naming
// the JSON path (e.g. "manifest source.shards[3].size: expected an unsigned integer").
Result<ShardRecord> ParseShardRecord(const nlohmann::json& j);
Result<TensorRecord> ParseTensorRecord(const nlohmann::json& j);
Result<RoleRecord> ParseRoleRecord(const nlohmann::json& j);
Result<SourceRecord> ParseSourceRecord(const nlohmann::json& j);
Result<ExpertPackRecord> ParseExpertPackRecord(const nlohmann::json& j);
Result<ModelRecord> ParseModelRecord(const nlohmann::json& j);
Result<TokenizerRecord> ParseTokenizerRecord(const nlohmann::json& j);
Result<std::optional<K3packExtension>> ParseK3packExtension(const nlohmann::json& manifest);
// The whole document. Does not judge values (format/complete/constraints):
// readers apply their own SGLang checks and texts.
Result<Manifest> ParseManifest(const nlohmann::json& j);
// ParseManifest of the JSON read from `path`, its errors naming that file.
Result<Manifest> ParseManifestOf(const nlohmann::json& j, const std::string& path);
Result<Manifest> ReadManifest(const std::string& path);

// SGLang's exact hard_constraints dict. Its top_k is the literal 16 that
// SGLang's create_manifest writes whatever the model's top-k, under every
// profile; readers take the runtime top-k from model.num_experts_per_token
// and expert_pack.top_k, never from this dict.
nlohmann::json HardConstraintsJson();
// SGLang's store check 3: `manifest["hard_constraints"] != {...}` with
// Python equality (key order irrelevant, extra or missing keys fail,
// True == 1 == 1.0).
bool HardConstraintsMatch(const nlohmann::json& hard_constraints);
// The key a rank pack's manifest adds to hard_constraints (value true). A
// rank pack holds only its own experts and SGLang runs its expert pack at
// EP 1 only, so the extra key makes SGLang's check 3 refuse the manifest
// instead of serving the other ranks' experts as zeros. k3pack's readers
// accept the key only beside k3pack.ep.
inline constexpr std::string_view kRankPackConstraint = "k3pack_expert_parallel_rank_pack";
// SGLang's dict plus kRankPackConstraint: what a rank pack's manifest records.
nlohmann::json RankPackHardConstraintsJson();

// ----------------------------------------------------------------- creating

struct CreateOptions {
  std::string gguf_dir;
  std::string expert_pack;
  std::string model_config;
  std::string tokenizer_dir;
  int64_t payload_samples = 6;  // < 0 -> "--payload-samples must be non-negative"
  bool full_source_hashes = false;  // the CLI's `manifest`/`build` turn it on by default
  // Whole-shard SHA-256s already computed (resolved path -> hex), e.g. by the
  // pack build beside its copy; those shards are not read again.
  std::map<std::string, std::string> known_shard_sha256;
  bool full_pack_hash = false;
  kimi::Profile profile = kimi::Profile::kKimiK3;
  // Empty -> "k3pack-<version>".
  std::string sglang_git_sha;
  // Empty -> now, Python isoformat (e.g. 2026-01-02T03:04:05.123456+00:00).
  std::string created_at;
  // Status lines for the steps (scan, hashing shards); may be empty.
  std::function<void(const std::string&)> progress;
  // Byte progress of the long steps: the whole-shard digests ("hash shards")
  // and the pack's validation ("hash pack" with full_pack_hash); may be empty.
  pack::ProgressFn pack_progress;
  // The pack is this expert-parallel rank's pack: recorded as k3pack.ep, and
  // payload samples are taken among its experts. Unset: taken from the
  // pack's digest sidecar when that is a rank pack's (version 3).
  std::optional<ep::Rank> ep;
  // Polled on the calling thread between chunks of the long steps (whole
  // shard and whole pack digests, payload samples); an error it returns
  // stops the call, which returns that error. Lets a caller answer Ctrl-C or
  // a cancel without waiting for terabytes to be hashed. May be empty.
  std::function<Status()> interrupt_check;
};

// SGLang's create_manifest: spec from config (+ GGUF cross-check), shard
// scan, pack validation, tokenizer inventory. Returns the manifest document.
Result<nlohmann::json> CreateManifest(const CreateOptions& options);

// Writes `manifest` as SGLang does (indent=2, sorted keys, raw UTF-8, "\n")
// through WriteFileAtomic.
Status WriteManifest(const std::string& path, const nlohmann::json& manifest);
// The exact bytes WriteManifest writes.
std::string SerializeManifest(const nlohmann::json& manifest);

// The JSON summary prepare_kimi_manifest.py prints after writing:
// {manifest, format, source_shards, source_tensors, pack_entries,
//  pack_index_sha256, top_k, payload_samples_verified}. Takes any JSON:
// a missing or misshapen field is null ("" for format); never throws.
nlohmann::json ManifestSummary(const std::string& output_path, const nlohmann::json& manifest);

// Python datetime.now(timezone.utc).isoformat().
std::string NowIsoformatUtc();

// ----------------------------------------------------------------- verify

// The model spec and expert tensors a manifest records (no GGUF parsing).
kimi::ModelSpec ModelSpecOf(const Manifest& m);
Result<pack::ExpertSet> ExpertsOf(const Manifest& m);
// The same from a source record and a spec read on their own (doctor reads
// them from a manifest that may not parse as a whole); `scaled` allows mixed
// expert types, as the scaled profile's builder does.
Result<pack::ExpertSet> ExpertsOfSource(const SourceRecord& source, const kimi::ModelSpec& spec, bool scaled);

struct VerifyPackOptions {
  bool full = false;            // every payload against the <pack>.digests sidecar
  bool against_source = false;  // with full: also every payload against the GGUF bytes
  int64_t samples = 6;          // without full: evenly spaced payloads compared with the GGUF source
  pack::ProgressFn progress;
  // As CreateOptions::interrupt_check: polled on the calling thread between
  // chunks of the shard digests, payloads and the whole-pack digest.
  std::function<Status()> interrupt_check;
};

// `k3pack verify`: shards unchanged (size + header digest), pack structure
// (SGLang's validator, damage located by header field / index entry) equal to
// the manifest's expert_pack section, then payloads. Returns the report
// (manifest, pack, index_sha256, payload_mode, entries_checked, ...).
Result<nlohmann::json> VerifyPack(const std::string& manifest_path, const VerifyPackOptions& options);

}  // namespace k3pack::manifest
