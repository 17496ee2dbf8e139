// The overwrite rule (util/output_guard.h) applied to a manifest path, shared
// by `k3pack manifest`, `k3pack build` and the Python binding: what counts as
// an input the manifest must not replace, and when an existing manifest is
// the finished output ("already built").
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "util/output_guard.h"

namespace k3pack::manifest {

// SGLang's artifact name for the manifest, the default of every writer.
inline constexpr const char* kDefaultManifestName = "kimi-k3-expert-pack.manifest.json";

// How the caller names the inputs in its messages.
struct InputNames {
  std::string gguf_dir = "--gguf-dir";
  std::string pack = "--pack";
  std::string model_config = "--model-config";
  std::string tokenizer_dir = "--tokenizer-dir";
};

// Why a manifest is not written into its tokenizer directory. It records
// every file there: `verify` then found the manifest itself unrecorded, and
// a rerun of the same command took it for a tokenizer file (an input).
inline constexpr const char* kManifestInTokenizerDir =
    "the manifest records every file of that directory, so it would find itself there unrecorded "
    "(`k3pack verify` refuses that) and a rerun would take it for a tokenizer file";

// Why a pack whose manifest is written is not put in its tokenizer
// directory: the manifest hashes every file there in full (a terabyte pack
// and its side files recorded as tokenizer files), and SGLang's model-meta
// step copies each of them.
inline constexpr const char* kPackInTokenizerDir =
    "the manifest records every file of that directory, so the pack and its side files would be hashed in full "
    "and recorded as tokenizer files (and SGLang's model-meta step copies every tokenizer file)";

// Where no manifest of `pack` is written, whichever writer (`k3pack build`,
// `k3pack manifest`, create_manifest): at a file the pack's writers put
// beside it (its .digests, .inputs, .lock, a build's .partial files; `k3pack
// manifest --manifest P.inputs --force` replaced the pack's inputs record and
// every later build of P refused it), or directly in the tokenizer directory
// (kManifestInTokenizerDir); nor for a pack in the tokenizer directory
// (kPackInTokenizerDir). The refusal names `output`'s option, or the pack's.
Status CheckManifestPlace(const NamedPath& output, const std::string& pack, const std::string& tokenizer_dir,
                          const InputNames& names = {});

// `k3pack manifest`'s and create_manifest's look at the manifest's path before
// the shards are hashed (18 minutes at full scale; a refusal used to come
// after them): none of the inputs, a place where no manifest goes
// (CheckManifestPlace), writable where it must be written, and no file of
// another kind. `option` and `force_option` name them as the caller does.
// Returns the inputs (ManifestInputs).
Result<std::vector<NamedPath>> PreflightManifestOutput(const std::string& option, const std::string& output, bool force,
                               const std::string& force_option, const std::string& gguf_dir, const std::string& pack,
                               const std::string& model_config, const std::string& tokenizer_dir,
                               const InputNames& names = {});

// Its last part, which needs no inputs (`build` checks its manifest path so,
// before it judges the pack): writable where it must be written
// (CheckOutputWritableUnlessThere), and no file of another kind there.
Status CheckManifestOutputFile(const std::string& option, const std::string& output, bool force,
                               const std::string& force_option = "--force");

// Every file a manifest of these inputs reads: the config, the pack and its
// .digests, each tokenizer file, and the shards (each .gguf in `gguf_dir`, or
// `gguf_dir` itself when it names a shard). A directory of them that cannot
// be listed is an error (the tokenizer's `cannot list tokenizer directory`,
// the shards' SGLang `no GGUF files found`), never an input left unseen.
Result<std::vector<NamedPath>> ManifestInputs(const std::string& gguf_dir, const std::string& pack,
                                              const std::string& model_config, const std::string& tokenizer_dir,
                                              const InputNames& names = {});

// For OutputSpec::not_own_kind: "" when --force may replace the file at
// `path`: an adapter manifest of any version, edited or cut short (JSON that
// names GGMLMOEPACK, the pack's magic or the format), or an empty or
// zero-filled file a crash left. Anything else is said for what it is ("it
// is a GGUF file, not an adapter manifest"): a model's config.json or a note
// given as --manifest by a slip is the user's, not --force's to replace.
std::string NotAManifestFile(const std::string& path);

// The manifest at `path` is `fresh`, ignoring when it was written.
bool SameManifest(const std::string& path, nlohmann::json fresh);

// The manifest at `path` is complete and records this very pack (`section`:
// ValidatePack's expert_pack section: path, size, index digest).
bool ManifestRecordsPack(const std::string& path, const nlohmann::json& section);

// Commands the user is told to run, with the paths the manifest `m` records,
// each shell-quoted; a placeholder (CONFIG, PACK, ...) where a record is missing.
std::string RecordedPathOr(const nlohmann::json& m, std::initializer_list<const char*> keys, const char* placeholder);
// The directory of the first recorded shard (a command's --gguf-dir), else GGUF_DIR.
std::string RecordedShardDirOr(const nlohmann::json& m);
// " --ep-size N --ep-rank R" for the manifest of a rank pack (its k3pack.ep),
// "" otherwise: a hint's rebuild command must rebuild that rank, not the
// full pack.
std::string RankFlagsOf(const nlohmann::json& m);
// The directory of the shards the manifest `m` at `manifest_path` records,
// when the directory beside it holds GGUF shards and none of the recorded
// ones: a model directory copied with its manifest, whose checks then read
// the original's files. Empty otherwise.
std::string ModelDirRecordedElsewhere(const nlohmann::json& m, const std::string& manifest_path);
// `k3pack manifest ... --force`: writes the manifest at `manifest_path` anew
// from the files it records (shards, pack, config, tokenizer, profile),
// keeping the pack; the fix for records edited by hand or written by an
// older k3pack.
std::string RewriteManifestCommand(const nlohmann::json& m, const std::string& manifest_path);

// ManifestRecordsPack, and the manifest is an expert-parallel rank pack's
// (k3pack.ep) that SGLang's store would take: written before rank manifests
// carried the key it refuses (RankPackHardConstraintsJson). `build` replaces
// such a manifest of its pack, which loses nothing.
bool RankManifestSglangWouldServe(const std::string& path, const nlohmann::json& section);

}  // namespace k3pack::manifest
