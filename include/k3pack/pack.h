// Building, validating and verifying the GGMLMOEPACKv1 expert pack.
//
// The pack is a byte-for-byte re-arrangement of the routed-expert tensors of
// a GGUF shard set into expert-major order (spec §1.1), so a server can load
// one (layer, expert) object with one aligned read. This header is what the
// CLI, the manifest builder and the tests use:
//   * CollectExperts: the §6.1 routed-expert checks (coverage, duplicates,
//     shape, dtype, sliceability) producing the inputs of the layout;
//   * BuildPack: the crash-safe, resumable, multi-threaded writer that also
//     records a SHA-256 per payload in the `<pack>.digests` sidecar;
//   * ValidatePack: SGLang's validate_ggml_moe_pack (§6.2 texts), returning
//     the manifest's `expert_pack` section;
//   * VerifyPayloads: full payload verification against the digest sidecar
//     and/or the GGUF source, without needing the other.
// The byte layout itself lives in src/pack/format.h.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "k3pack/ep.h"
#include "k3pack/error.h"
#include "k3pack/ggml_types.h"
#include "k3pack/kimi.h"
#include "k3pack/progress.h"

namespace k3pack::gguf {
class ShardSet;
}

namespace k3pack::pack {

// ------------------------------------------------------------ expert inputs

// A GGUF tensor as the scanner records it (also constructible from a
// manifest's source.tensors + source.shards records).
struct SourceTensor {
  std::string name;
  std::vector<int64_t> shape;  // GGUF ne order
  uint32_t dtype_id = 0;
  uint32_t shard_index = 0;
  uint64_t data_offset = 0;  // absolute offset in the shard file
  uint64_t nbytes = 0;
};

// One routed expert tensor (layer, role) after validation.
struct ExpertTensor {
  uint32_t layer = 0;
  uint32_t role = 0;  // pack::Role value: 0 up, 1 gate, 2 down
  SourceTensor tensor;
  std::string shard_path;
  uint64_t expert_bytes = 0;  // tensor.nbytes / num_experts
};

// The validated routed-expert tensors, by active layer, in physical role order.
struct ExpertSet {
  std::vector<uint32_t> layers;                      // active MoE layers in order
  uint32_t num_experts = 0;
  uint32_t top_k = 0;
  std::vector<std::array<ExpertTensor, 3>> by_layer;  // [active index][role]
  std::vector<std::string> shard_paths;              // by shard index
  bool mixed = false;  // sizes or types differ between layers

  uint64_t EstimatedPackBytes() const;  // final size of the pack
};

struct CollectOptions {
  // Allow expert dtypes to differ by role or by layer (kScaled only); entry
  // sizes then vary by layer. Without it, every layer must use the dtypes of
  // the first active layer.
  bool allow_mixed_types = false;
  // How errors name that option and the profile it needs (the Python
  // module passes its keywords).
  std::string mixed_types_option = "--allow-mixed-types";
  std::string scaled_profile_option = "--profile scaled";
};

// allow_mixed_types needs the scaled profile (SGLang's Kimi-K3 expert types
// are fixed): "--allow-mixed-types requires --profile scaled (...)" in the
// options' names otherwise. CollectExperts checks it; callers may check it
// first, with their other usage errors.
Status CheckMixedTypesAllowed(const CollectOptions& options, kimi::Profile profile);

// SGLang's routed-expert validation (§6.1), exact texts:
//   duplicate routed expert tensor (1, 'up')
//   routed expert tensor coverage mismatch: missing=[...], extra=[...]
//   unexpected expert shape for (1, 'up'): (3584, 3072, 896)
//   unexpected expert dtype for (1, 'up'): Q4_K
//   expert tensor is not evenly sliceable: blk.1.ffn_up_exps.weight
// Under kKimiK3 shapes/dtypes are K3's (Q2_K/Q2_K/Q3_K); under kScaled the
// shapes come from the spec and dtypes must agree across layers unless
// allow_mixed_types.
Result<ExpertSet> CollectExperts(const std::vector<SourceTensor>& tensors,
                                 const std::vector<std::string>& shard_paths, const kimi::ModelSpec& spec,
                                 const CollectOptions& options = {});
// The type each role is held to under kScaled without allow_mixed_types, as
// K3's are Q2_K/Q2_K/Q3_K: per role, the type most active layers use (up and
// gate counted together: they must agree), ties to the earliest layer's.
// Each tensor is then compared with its role's type in SGLang's order
// (layer, then up, gate, down), so the message names the odd tensor, not a
// healthy one. `layer_types` holds (up, gate, down) type ids per active layer.
std::array<uint32_t, 3> ExpectedScaledExpertTypes(const std::vector<std::array<uint32_t, 3>>& layer_types);
// Same, taking the tensors from an opened shard set.
Result<ExpertSet> CollectExperts(const gguf::ShardSet& shards, const kimi::ModelSpec& spec,
                                 const CollectOptions& options = {});
std::vector<SourceTensor> SourceTensorsOf(const gguf::ShardSet& shards);
// CollectExperts, then kimi::CrossCheckGguf (config vs GGUF metadata, k3pack's
// own check): SGLang's expert errors come first, the cross-check's finding as
// their hint; a checkpoint only the cross-check refuses gets its error.
Result<ExpertSet> CollectCheckedExperts(const gguf::ShardSet& shards, const kimi::ModelSpec& spec,
                                        const CollectOptions& options = {});
// What `k3pack pack` / `build` start from: open the shard set in `gguf_dir`,
// load the model config under `profile`, collect and cross-check
// (CollectCheckedExperts).
Result<ExpertSet> CollectExpertsFromGguf(const std::string& gguf_dir, const std::string& model_config,
                                         kimi::Profile profile, const CollectOptions& options = {});

// "<dir>/<prefix>.expert-major.pack" for a shard path (§3).
Result<std::string> DefaultPackPath(const std::string& any_shard_path);

// The default name of a rank pack beside the full pack's: "X.pack" ->
// "X.ep<R>-of-<N>.pack" (any other name gets ".ep<R>-of-<N>" appended), so
// rank packs and the full pack never collide.
std::string RankPackPath(const std::string& full_pack_path, const ep::Rank& rank);

// ------------------------------------------------------------------ build

// Progress of a long operation (include/k3pack/progress.h). Called from one
// thread, at most ~10 times/s and once at the end (done == total).
using Progress = ::k3pack::Progress;
using ProgressFn = ::k3pack::ProgressFn;

// The largest safety margin: it is converted to bytes and added to the
// pack's size, and beyond 1 PiB (no disk is short by that much) the sum no
// longer fits 64 bits.
inline constexpr double kMaxSafetyMarginGib = 1048576;

struct BuildOptions {
  std::string out_path;           // final pack path
  double safety_margin_gib = 2.0;  // free space required beyond the pack size, 0..kMaxSafetyMarginGib
  bool restart = false;           // discard an existing partial build
  // A finished pack at out_path is replaced (`--force`). It stays, with its
  // digest sidecar, until the new pack is complete and renamed over it, so a
  // refused, failed or interrupted rebuild loses nothing; only when the disk
  // cannot hold both is it removed first, after every other check passed.
  bool replace_existing = false;
  int threads = 0;                // copies in flight; 0 = auto
  uint64_t chunk_bytes = 8ull << 20;  // read size per role per batch of experts (see docs/FORMATS.md)
  // Also compute each whole source shard's SHA-256 (BuildResult::source_sha256),
  // on threads of their own beside the copy, so the manifest need not read
  // the shards again.
  bool hash_sources = false;
  ProgressFn progress;
  std::function<void(const std::string&)> log;  // human-readable status lines
  // Called once every check (the free-space one last) has passed and the
  // copy begins, as SGLang prints EXPERT_PACK_BUILD_START only then.
  std::function<void()> started;
  // Expert-parallel rank pack: same header, index, size and offsets as the
  // full pack, but only the payloads of the experts this rank owns are
  // written (read once from the source); every other object is a hole. The
  // digest sidecar is then version 3 (records of absent objects zero). The
  // rank is part of the checkpoint's input fingerprint.
  std::optional<ep::Rank> ep;
};

struct BuildResult {
  std::string pack_path;
  std::string digests_path;
  uint64_t pack_bytes = 0;
  uint64_t index_count = 0;
  std::string index_sha256;
  uint64_t copied_bytes = 0;   // data bytes read+written this run
  uint64_t hole_bytes = 0;     // payload bytes kept as holes (sparse source)
  uint64_t resumed_objects = 0;  // objects taken over from a checkpoint
  uint64_t rewritten_objects = 0;  // checkpointed objects whose bytes had changed, copied again
  // Whole-shard SHA-256 (hex) by resolved shard path, the form
  // manifest::CreateOptions::known_shard_sha256 takes; empty unless hash_sources.
  std::map<std::string, std::string> source_sha256;
  double seconds = 0;
  // Where the time went. read/write/hash are thread-seconds summed over the
  // copy workers (they overlap each other and the coordinator); checkpoint
  // and finalize are wall seconds the coordinator spent in fdatasync +
  // checkpoint writes, and in the closing fsyncs + renames.
  struct Phases {
    double copy_wall = 0, read = 0, write = 0, hash = 0, checkpoint = 0, finalize = 0;
  } phases;
};

// Writes the pack to `<out>.partial` (exclusive lock `<out>.lock` held
// throughout), checkpointing durably to `<out>.partial.checkpoint`; on
// success fsyncs, renames to `<out>`, writes `<out>.digests` and removes the
// checkpoint. A rerun after a crash continues from the checkpoint; a
// checkpoint that does not match the inputs is an error unless
// options.restart. Refuses to overwrite a finished pack (SGLang's text) and
// to start without room for the pack + margin (SGLang's text).
//
// SIGINT/SIGTERM during the copy stop it cleanly: the durable prefix is
// checkpointed and the error reads "interrupted; rerun the same command to
// resume from object N of T" (InterruptExitCode: 130 / 143). One that comes
// after the copy's last look at it is raised again for the handler the
// caller had in place, never dropped.
//
// Test seams (environment): K3PACK_FAKE_FREE_BYTES=N overrides the free
// space; K3PACK_CRASH_AFTER_OBJECTS=N calls _exit(86) right after the
// checkpoint that covers >= N objects.
Result<BuildResult> BuildPack(const ExpertSet& experts, const BuildOptions& options);

// The exit status for a BuildPack error: 128 + the signal for a build stopped
// by SIGINT/SIGTERM (130 / 143), else 1.
int InterruptExitCode(const Error& error);

// Sidecar paths.
std::string DigestsPathFor(const std::string& pack_path);     // <pack>.digests
std::string PartialPathFor(const std::string& pack_path);     // <pack>.partial
std::string CheckpointPathFor(const std::string& pack_path);  // <pack>.partial.checkpoint
std::string LockPathFor(const std::string& pack_path);        // <pack>.lock

// -------------------------------------------------------------- validate

struct ValidateOptions {
  int64_t payload_samples = 6;  // evenly spaced entries byte-compared with GGUF
  bool full_pack_hash = false;  // adds "sha256" of the whole pack
  ProgressFn progress;
  // Polled on the calling thread between payload samples and between chunks
  // of the whole-pack digest; an error it returns stops the validation and is
  // returned. May be empty.
  std::function<Status()> interrupt_check;
  // A rank pack: the samples are chosen (SGLang's spacing) among the entries
  // the rank owns, since the others are holes by design.
  std::optional<ep::Rank> ep;
};

// SGLang's validate_ggml_moe_pack (§6.2 texts, in SGLang's order). Returns
// the manifest's `expert_pack` object: path, size, magic, version,
// header_bytes, entry_bytes, index_count, data_start, alignment,
// index_sha256, physical_role_order, active_moe_layer_ids, num_experts,
// top_k, object_bytes, roles{up,gate,down}, payload_samples_verified,
// full_pack_hash [, sha256]. With mixed sizes (kScaled) the per-layer
// geometry is checked; roles.* then report the first active layer and
// payload_bytes the true totals.
Result<nlohmann::json> ValidatePack(const std::string& pack_path, const ExpertSet& experts,
                                    const ValidateOptions& options = {});

// SGLang's sample selection: none for k <= 0, {0} for k == 1, else
// round-half-even(i*(n-1)/(k-1)) for i in 0..k-1, duplicates removed.
std::vector<uint64_t> SampleIndices(uint64_t index_count, int64_t k);
// The entries to sample: SampleIndices over all entries, or, for a rank
// pack, over the entries of the rank's experts (in entry order).
std::vector<uint64_t> SampleEntries(uint64_t index_count, uint32_t num_experts, int64_t k,
                                    const std::optional<ep::Rank>& ep);

// The k3pack manifest extension's "layer_roles" list (one item per layer).
nlohmann::json LayerRolesJson(const ExpertSet& experts);

// ---------------------------------------------------------------- verify

// The digest sidecar: one SHA-256 and one CRC32C per pack entry (see
// docs/FORMATS.md). A sidecar written before k3pack recorded CRCs (version 1)
// reads with entry_crc32c empty.
struct PackDigests {
  uint64_t index_count = 0;
  uint64_t pack_size = 0;
  std::string index_sha256;  // hex
  std::vector<std::array<uint8_t, 32>> entry_sha256;
  std::vector<uint32_t> entry_crc32c;  // empty: no CRCs recorded (version 1)
  // Version 3 (rank packs): the EP rank whose objects the pack holds and the
  // experts per layer. The records of every other object are all zero (SHA
  // and CRC) and mean "absent", not "the digest of these bytes".
  std::optional<ep::Rank> ep;
  uint32_t num_experts = 0;  // version 3 only
  // Version 3: a tag of the GGUF source's expert bytes (pack::SourceTag), equal
  // for all rank packs of one checkpoint; 0 in sidecars written before it existed.
  uint32_t source_tag = 0;
  uint64_t data_start = 0;   // as recorded (0 in sidecars written by WritePackDigests before v3)
  // False for an entry a rank pack does not hold (its records are not digests).
  bool present(uint64_t entry_index) const {
    if (!ep || num_experts == 0) return true;
    const auto expert = static_cast<uint32_t>((entry_index / 3) % num_experts);
    return ep::OwnedExperts(*ep, num_experts).contains(expert);
  }
};
Result<PackDigests> ReadPackDigests(const std::string& digests_path);
Status WritePackDigests(const std::string& digests_path, const PackDigests& digests);

struct VerifyOptions {
  bool against_digests = true;   // compare with <pack>.digests
  bool against_source = false;   // compare with the GGUF bytes
  std::vector<uint64_t> entries;  // empty = all entries
  int threads = 0;
  ProgressFn progress;
  // Polled on the calling thread between the payloads it checks itself (it
  // is one of the `threads`) and while it waits for the others; an error it
  // returns stops every thread and is returned. May be empty.
  std::function<Status()> interrupt_check;
  // A rank pack (else taken from a version-3 digest sidecar): entries of
  // experts the rank does not own are skipped and counted, not verified.
  std::optional<ep::Rank> ep;
  // The caller knows the pack is a full one (its manifest names no rank): a
  // rank pack's sidecar beside it is refused, not taken as the pack's rank.
  bool full_pack = false;
};

struct VerifyResult {
  uint64_t entries_checked = 0;
  uint64_t bytes_checked = 0;
  // Of bytes_checked, those read: sparse holes are checked without a read,
  // so a sparse pack must not show its size over the time as read speed.
  uint64_t bytes_read = 0;
  std::optional<ep::Rank> ep;     // set when a rank pack was verified
  uint64_t unowned_entries = 0;   // skipped: another rank's (expected holes)
  uint64_t unowned_bytes = 0;
  double seconds = 0;
  double MBps() const { return seconds > 0 ? static_cast<double>(bytes_read) / 1e6 / seconds : 0; }  // read rate
};

// Reads every selected payload once, hashing it (digests) and/or comparing
// it with the GGUF slice (source). The first mismatch fails with
// `expert-pack payload does not match GGUF source for {name} expert {e}` or
// `expert-pack payload does not match digest sidecar for ...`.
Result<VerifyResult> VerifyPayloads(const std::string& pack_path, const ExpertSet& experts,
                                    const VerifyOptions& options);
// An owned payload of a rank pack that is damaged and entirely unallocated
// says so: "... (entry i, offset o): it is a hole where rank R's data should be".

// ------------------------------------------------------------ rank packs

struct MergeOptions {
  std::string out_path;  // the full pack to write (refused if it exists)
  // An existing pack at out_path is replaced (`--force`): it stays until the
  // merged pack is complete and renamed over it.
  bool replace_existing = false;
  ProgressFn progress;
  // Told (on the calling thread, SIGINT and SIGTERM blocked on it) once the
  // merged pack and its sidecar are in place and before those signals are
  // let through again: a Ctrl-C that came while the files were being
  // renamed is handled after this, so its message can say the merge was
  // done rather than that nothing was written.
  std::function<void()> on_published;
  // Notes for the operator ("finished an interrupted merge: P").
  std::function<void(const std::string&)> log;
};
struct MergeResult {
  std::string pack_path;
  std::string digests_path;
  uint32_t ep_size = 0;
  uint64_t pack_bytes = 0;
  uint64_t copied_bytes = 0;
  std::string index_sha256;
  double seconds = 0;
  // The pack was already the complete merge, only its sidecar was missing (a
  // merge interrupted between its two renames): the sidecar was written, no
  // payload copied.
  bool finished_interrupted = false;
};
// Rebuilds the full pack from the N rank packs of one EP group (any order):
// each must have a version-3 digest sidecar; their header + index bytes and
// sizes must be identical, and ranks 0..N-1 must each be present exactly
// once. Every owned payload is copied (data segments only) and checked
// against its rank's SHA-256 on the way; the result is written to
// `<out>.partial`, fsynced and renamed, then `<out>.digests` (version 2, as
// a direct build writes it). The pack is byte-identical to a direct build.
Result<MergeResult> MergeRankPacks(const std::vector<std::string>& rank_packs, const MergeOptions& options);

}  // namespace k3pack::pack
