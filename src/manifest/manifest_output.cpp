#include "manifest/manifest_output.h"

#include <filesystem>

#include "k3pack/gguf.h"
#include "k3pack/manifest.h"
#include "k3pack/pack.h"
#include "kimi/profile_sidecar.h"
#include "manifest/json_fields.h"
#include "manifest/loader_rules.h"
#include "pack/sidecar_kinds.h"
#include "util/file.h"
#include "util/format.h"

namespace k3pack::manifest {

namespace fs = std::filesystem;

Result<std::vector<NamedPath>> PreflightManifestOutput(const std::string& option, const std::string& output, bool force,
                               const std::string& force_option, const std::string& gguf_dir, const std::string& pack,
                               const std::string& model_config, const std::string& tokenizer_dir,
                               const InputNames& names) {
  K3_ASSIGN_OR_RETURN(std::vector<NamedPath> inputs, ManifestInputs(gguf_dir, pack, model_config, tokenizer_dir, names));
  K3_RETURN_IF_ERROR(CheckOutputsAreNotInputs({{option, output}}, inputs));
  K3_RETURN_IF_ERROR(CheckManifestPlace({option, output}, pack, tokenizer_dir, names));
  K3_RETURN_IF_ERROR(CheckManifestOutputFile(option, output, force, force_option));
  return inputs;
}

Status CheckManifestOutputFile(const std::string& option, const std::string& output, bool force,
                               const std::string& force_option) {
  K3_RETURN_IF_ERROR(CheckOutputWritableUnlessThere(option, output, force));
  OutputSpec spec;
  spec.option = option;
  spec.path = output;
  spec.force = force;
  spec.force_option = force_option;
  spec.not_own_kind = [&] { return NotAManifestFile(output); };
  return CheckOutputKind(spec);
}

Status CheckManifestPlace(const NamedPath& output, const std::string& pack, const std::string& tokenizer_dir,
                          const InputNames& names) {
  if (output.path.empty()) return Status::OK();
  std::vector<NamedPath> beside;
  for (const pack::PackSidecar& side : pack::PackSidecarsOf(pack, /*building=*/true)) {
    beside.push_back({names.pack + " (" + side.label + ")", side.path});
  }
  beside.push_back({names.pack + " (its .lock)", pack::LockPathFor(pack)});
  K3_RETURN_IF_ERROR(CheckOutputsAreNotInputs({output}, beside));
  K3_RETURN_IF_ERROR(CheckOutputNotIn(output, {names.tokenizer_dir, tokenizer_dir}, kManifestInTokenizerDir));
  return CheckOutputNotIn({names.pack, pack}, {names.tokenizer_dir, tokenizer_dir}, kPackInTokenizerDir);
}

Result<std::vector<NamedPath>> ManifestInputs(const std::string& gguf_dir, const std::string& pack_path,
                                              const std::string& model_config, const std::string& tokenizer_dir,
                                              const InputNames& names) {
  std::vector<NamedPath> inputs = {{names.model_config, model_config},
                                   {names.pack, pack_path},
                                   {names.pack + " (its .digests)", pack::DigestsPathFor(pack_path)}};
  K3_ASSIGN_OR_RETURN(std::vector<NamedPath> tokenizer_files,
                      FilesIn("a " + names.tokenizer_dir + " file", tokenizer_dir, "tokenizer directory"));
  for (auto& f : tokenizer_files) inputs.push_back(std::move(f));
  // The sidecar the profile search reads (profile=None / no --profile).
  for (auto& s : kimi::ProfileSidecarsNear({pack_path, model_config, gguf_dir})) inputs.push_back({"the profile record", s});
  std::error_code ec;
  if (fs::is_directory(gguf_dir, ec)) {
    auto shards = FilesIn("a shard in " + names.gguf_dir, gguf_dir, "GGUF directory");
    // What the shard discovery says of such a directory, SGLang's text.
    if (!shards.ok()) return gguf::NoGgufFilesError(ResolvedPathOrGiven(gguf_dir), shards.error().sys_errno());
    for (auto& f : *shards) {
      if (fs::path(f.path).extension() == ".gguf") inputs.push_back(std::move(f));
    }
  } else {
    inputs.push_back({names.gguf_dir, gguf_dir});
  }
  return inputs;
}

std::string NotAManifestFile(const std::string& path) {
  const FileStart kind = ClassifyFileStart(path);
  if (kind == FileStart::kMissing || kind == FileStart::kEmpty) return "";
  if (kind == FileStart::kJson) {
    // Every manifest names the pack's magic near its start and the format at
    // its end, so an old, edited or cut-short one (what doctor says to
    // regenerate) still shows it; a manifest is kilobytes to a few MB.
    constexpr uintmax_t kLargestManifest = uintmax_t{64} << 20;
    std::error_code ec;
    const uintmax_t size = fs::file_size(path, ec);
    if (ec) return "it is a JSON document whose size cannot be read (" + ec.message() + ")";
    if (size > kLargestManifest) {
      return "it is a JSON document of " + std::to_string(size) + " bytes, larger than any adapter manifest (64 MiB)";
    }
    auto text = ReadFileToString(path);
    if (!text.ok()) return "it is a JSON document that cannot be read (" + text.error().message() + ")";
    if (text->find("GGMLMOEPACK") != std::string::npos) return "";
    return "it is a JSON document that names no GGMLMOEPACK pack or format, not an adapter manifest";
  }
  return "it is " + DescribeFileStart(path) + ", not an adapter manifest";
}

bool SameManifest(const std::string& path, nlohmann::json fresh) {
  auto old = ReadManifestJson(path);
  if (!old.ok()) return false;
  nlohmann::json o = *old;
  o.erase("created_at");
  fresh.erase("created_at");
  return o == fresh;
}

bool ManifestRecordsPack(const std::string& path, const nlohmann::json& section) {
  auto m = ReadManifest(path);
  if (!m.ok() || !m->complete || section.is_null()) return false;
  return m->expert_pack.path == section.value("path", std::string()) &&
         m->expert_pack.size == section.value("size", uint64_t{0}) &&
         m->expert_pack.index_sha256 == section.value("index_sha256", std::string());
}

std::string RecordedPathOr(const nlohmann::json& m, std::initializer_list<const char*> keys, const char* placeholder) {
  const nlohmann::json* v = fields::Find(m, keys);
  return v != nullptr && v->is_string() ? ShellQuoted(v->get<std::string>()) : std::string(placeholder);
}

std::string RecordedShardDirOr(const nlohmann::json& m) {
  const nlohmann::json* shards = fields::Find(m, {"source", "shards"});
  const nlohmann::json* first = shards != nullptr && shards->is_array() && !shards->empty()
                                    ? fields::Find((*shards)[0], {"path"})
                                    : nullptr;
  return first != nullptr && first->is_string()
             ? ShellQuoted(fs::path(first->get<std::string>()).parent_path().string())
             : std::string("GGUF_DIR");
}

std::string RankFlagsOf(const nlohmann::json& m) {
  const nlohmann::json* size = fields::Find(m, {"k3pack", "ep", "size"});
  const nlohmann::json* rank = fields::Find(m, {"k3pack", "ep", "rank"});
  if (size == nullptr || rank == nullptr || !size->is_number_unsigned() || !rank->is_number_unsigned()) return "";
  return " --ep-size " + size->dump() + " --ep-rank " + rank->dump();
}

std::string ModelDirRecordedElsewhere(const nlohmann::json& m, const std::string& manifest_path) {
  std::error_code ec;
  const fs::path here = fs::weakly_canonical(fs::absolute(manifest_path, ec).parent_path(), ec);
  if (ec) return "";
  bool shards_here = false;
  for (fs::directory_iterator it(here, ec), end; !ec && it != end && !shards_here; it.increment(ec)) {
    shards_here = it->path().extension() == ".gguf";
  }
  const nlohmann::json* shards = fields::Find(m, {"source", "shards"});
  if (!shards_here || shards == nullptr || !shards->is_array() || shards->empty()) return "";
  std::string elsewhere;
  for (const nlohmann::json& s : *shards) {
    const nlohmann::json* path = fields::Find(s, {"path"});
    if (path == nullptr || !path->is_string()) return "";
    std::error_code e;
    const fs::path dir = fs::weakly_canonical(fs::path(path->get<std::string>()).parent_path(), e);
    if (e || dir == here) return "";
    if (elsewhere.empty()) elsewhere = dir.string();
  }
  return elsewhere;
}

std::string RewriteManifestCommand(const nlohmann::json& m, const std::string& manifest_path) {
  const nlohmann::json* profile = fields::Find(m, {"k3pack", "profile"});
  return "k3pack manifest --gguf-dir " + RecordedShardDirOr(m) + " --pack " +
         RecordedPathOr(m, {"expert_pack", "path"}, "PACK") + " --model-config " +
         RecordedPathOr(m, {"model", "config_path"}, "CONFIG") + " --tokenizer-dir " +
         RecordedPathOr(m, {"tokenizer", "path"}, "TOKENIZER_DIR") +
         (profile != nullptr && profile->is_string() ? " --profile " + ShellQuoted(profile->get<std::string>()) : "") +
         " --manifest " + ShellQuoted(manifest_path) + " --force";
}

bool RankManifestSglangWouldServe(const std::string& path, const nlohmann::json& section) {
  if (!ManifestRecordsPack(path, section)) return false;
  auto raw = ReadManifestJson(path);
  if (!raw.ok()) return false;
  const nlohmann::json* ep = fields::Find(*raw, {"k3pack", "ep"});
  return ep != nullptr && ep->is_object() && !SglangStoreRefuses(*raw);
}

}  // namespace k3pack::manifest
