// Internals shared by the doctor's check groups: the finding collector and
// the leniently opened shard set every group works on.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "k3pack/doctor.h"
#include "k3pack/gguf.h"
#include "kimi/tensors.h"
#include "util/edit_distance.h"
#include "util/file.h"

namespace k3pack::doctor::internal {

// Adds findings with the catalog's severity, meaning and fix.
class Collector {
 public:
  explicit Collector(Report* report) : report_(report) {}
  // `code` must be in the catalog. `sglang_error` is SGLang's verbatim text
  // (empty when SGLang has none for this case).
  Finding& Add(std::string_view code, std::string object, std::string message, std::string sglang_error = {},
               std::string file = {});
  Report& report() { return *report_; }

 private:
  Report* report_;
};

// When `e` is the OS refusing this user `path` (EACCES, EPERM), reports
// file-permission-denied, with the PermissionError Python's open() raises
// for it, and returns true: a file this user may not read is not a damaged
// one (to re-download or rebuild), whatever check tried to read it. The same
// for a process out of file descriptors (EMFILE, ENFILE: open-file-limit),
// which can open no file at all, and one that could not map or allocate
// memory (ENOMEM, mostly under `ulimit -v`: out-of-memory).
bool ReportProcessCannotRead(const Error& e, const std::string& path, Collector& out);
// Which of `files` the first line of `e` names as the file an OS call failed
// on ("cannot open FILE: ..."); `otherwise` when none: a check that reads
// several files (the pack and its source shards) files the finding under
// the one that failed.
std::string FileNamedIn(const Error& e, const std::vector<std::string>& files, const std::string& otherwise);
// Whether `err` is the process or system out of file descriptors.
bool IsOpenFileLimit(int err);

// One shard file as doctor could read it.
struct Shard {
  std::string path;
  uint64_t size = 0;
  std::optional<gguf::ShardName> name;  // parsed file name (numbered sets)
  std::shared_ptr<const gguf::GgufFile> file;  // null when unreadable
  bool strict_ok = false;   // passed the reader with every rule on
  bool truncated = false;   // some tensor data ends past the end of the file
  std::shared_ptr<const MappedFile> real;  // the file's own bytes
  // Tensor data fully inside the file (false for cut-off tensors).
  bool DataReadable(const gguf::TensorInfo& t) const { return real && t.data_offset + t.nbytes <= size; }
  // The tensor's bytes from the real file; empty when cut off.
  std::span<const uint8_t> Bytes(const gguf::TensorInfo& t) const {
    if (!DataReadable(t)) return {};
    return {real->data() + t.data_offset, static_cast<size_t>(t.nbytes)};
  }
};

struct Located {
  const gguf::TensorInfo* info = nullptr;
  uint32_t shard = 0;
};

// The shard set under examination, readable parts only.
struct ShardView {
  std::string dir;
  std::string prefix;
  std::vector<Shard> shards;  // in shard order (numbered) or the single file
  bool all_readable = true;   // every shard's header could be parsed
  std::map<std::string, Located> tensors;  // first occurrence of each name
  std::vector<std::string> order;          // tensor names in shard + info order

  const gguf::GgufFile* first() const {
    return shards.empty() || !shards.front().file ? nullptr : shards.front().file.get();
  }
  const Located* Find(const std::string& name) const {
    auto it = tensors.find(name);
    return it == tensors.end() ? nullptr : &it->second;
  }
};

// Discovers the shards for `path` (file or directory), reporting discovery
// problems (stray files, incomplete sets, several sets). Returns nullopt and
// marks the report unusable when there is nothing to examine.
std::optional<ShardView> DiscoverAndOpen(const std::string& path, Collector& out);
// The shards a manifest lists, in its order, opened as the loader opens
// them (each path as recorded; no directory discovery). Missing files are
// skipped (the manifest check reports them). nullopt when none exists.
std::optional<ShardView> OpenListed(const std::vector<std::string>& paths, Collector& out);
// Unfinished downloads (downloads.cpp). Files a download tool writes
// beside `shard_path` while it works (`.part`, `.aria2`, ...) that exist.
std::vector<std::string> DownloadLeftovers(const std::string& shard_path);
// A shard that is a symbolic link to nothing (a Hugging Face snapshot whose
// blob is missing): reports shard-link-broken and returns true.
bool ReportBrokenLink(const Shard& s, Collector& out);
// aria2's control file beside a present shard: download-in-progress.
void CheckDownloadLeftovers(const Shard& s, Collector& out);

// Split keys, counts, duplicates, architecture (SGLang's scanner, every rule).
void CheckSplit(const ShardView& view, Collector& out);
// Metadata keys and tensor names that are not UTF-8: k3pack keeps them as
// bytes, gguf-py (SGLang's scanner) decodes each strictly and fails.
void CheckStringsAreUtf8(const ShardView& view, Collector& out);
// Renamed shards (renames.cpp): when the headers alone form a complete split
// that the names contradict, reports shards-renamed with the renames and
// turns the name findings' advice from "download" into "rename".
void CheckRenamedShards(const ShardView& view, Collector& out);

// Layout checks against the kimi-k3.* metadata and (when found) config.json:
// names, shapes, dtypes, routed experts. Fills `dims` when the metadata is
// usable.
struct ModelContext {
  std::optional<kimi::SynthDims> dims;
  std::map<std::string, kimi::ExpectedTensor> expected;  // by name
  std::optional<kimi::ModelSpec> spec;
};
ModelContext CheckModel(const ShardView& view, const DiagnoseOptions& options, Collector& out);
// The config.json at `config` (whose KimiK3Spec is `spec`) against the
// GGUF's kimi-k3.* metadata (config_shapes.cpp): KimiK3Spec's MoE keys and
// the attention, dense, embedding and layer-kind keys SGLang builds its
// modules from; config-gguf-mismatch per key, config-invalid for a value
// SGLang cannot size a module with.
void CrossCheckConfig(const kimi::ModelSpec& spec, const std::string& config, const kimi::SynthDims& dims,
                      Collector& out);
// The object a config's model keys are read from: its text_config when that
// is an object, else the top level; nullopt when the file is no JSON object.
std::optional<nlohmann::json> ModelKeysOf(const std::string& config);
// Whether the config has a text_config object (what SGLang's server asks of
// the tokenizer directory's); true when it cannot be read or parsed (the
// spec's own finding says so).
bool HasTextConfig(const std::string& config);
void CheckExperts(const ShardView& view, const ModelContext& model, const DiagnoseOptions& options, Collector& out);
// `progress` (may be empty) gets the bytes and tensors decoded so far: on a
// big set the value checks are what takes time (every ssm_a and small
// vector is read from the shards).
// `ssm_a_only`: only the ssm_a tensors (what SGLang's loader transforms and
// rejects), not the residual scores or the non-finite scan of small vectors.
void CheckValues(const ShardView& view, const ModelContext& model, Collector& out, const ProgressFn& progress = {},
                 bool ssm_a_only = false);

// Per-ssm_a verdict used by both doctor and repair.
struct SsmAVerdict {
  std::string name;
  uint32_t shard = 0;
  const gguf::TensorInfo* info = nullptr;
  std::optional<SsmAStats> stats;  // when the values could be decoded
  std::vector<float> values;
};
// `decoded` (may be empty) is called with each tensor's byte count once it is read.
std::vector<SsmAVerdict> ExamineSsmA(const ShardView& view, const std::function<void(uint64_t)>& decoded = {});

// A manifest path: checks the manifest. Returns what the GGUF examination
// should look at, resolved as SGLang's loader resolves it: the listed shard
// paths in source.shards order, and the manifest's model config.
struct ManifestTargets {
  std::vector<std::string> shard_paths;
  std::string config_path;  // model.config_path when that file exists
  std::string tokenizer_dir;  // tokenizer.path when that directory exists
};
ManifestTargets CheckManifest(const std::string& manifest_path, const DiagnoseOptions& options, Collector& out);

// EditDistance: util/edit_distance.h, shared with the argument parser.
using k3pack::EditDistance;

// Python tuple repr of a numpy shape (reversed ne): "(512,)", "(1, 512)".
std::string NumpyShapeRepr(const std::vector<int64_t>& ne);
// "[3584, 3072, 896]"-style ne list for messages.
std::string NeList(const std::vector<int64_t>& ne);

}  // namespace k3pack::doctor::internal
