#include "cli/preflight.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <filesystem>
#include <optional>

#include <nlohmann/json.hpp>

#include "k3pack/gguf.h"
#include "k3pack/manifest.h"
#include "manifest/tokenizer_dir.h"
#include "pack/build_inputs.h"
#include "util/file.h"
#include "util/output_guard.h"
#include "util/json_text.h"

namespace k3pack::cli {

namespace fs = std::filesystem;

namespace {

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// True when `j` (a config object) names a Kimi model.
bool NamesKimi(const nlohmann::json& j) {
  if (!j.is_object()) return false;
  if (auto it = j.find("model_type"); it != j.end() && it->is_string() && Lower(*it).find("kimi") != std::string::npos)
    return true;
  if (auto it = j.find("architectures"); it != j.end() && it->is_array()) {
    for (const auto& a : *it) {
      if (a.is_string() && Lower(a).find("kimi") != std::string::npos) return true;
    }
  }
  return false;
}

std::string Describe(const nlohmann::json& j) {
  if (auto it = j.find("model_type"); it != j.end() && it->is_string()) return "model_type '" + it->get<std::string>() + "'";
  return "no model_type";
}

// A path to a file written with a trailing '/' (`--manifest m.json/`, a
// completion's slip): the kernel finds nothing there (ENOTDIR), and the
// error said the path does not exist, the hint that directory m.json "does
// not exist either", while m.json is right there. Set when that is the case;
// `fix` is the hint where a directory is what the option takes (passing the
// file without the '/' would be refused next).
std::optional<Error> SlashedFileError(const std::string& option, const std::string& path,
                                        const std::string& fix = "") {
  const std::string bare = k3pack::FileNamedWithSlash(path);
  if (bare.empty()) return std::nullopt;
  std::error_code ec;
  return Error(option + " " + path + " " + k3pack::EndsInSlashButNames(bare, KindOf(fs::status(bare, ec))),
               ErrorKind::kFileNotFound, ENOTDIR)
      .WithHint(fix.empty() ? "pass " + option + " " + bare + " (without the '/')" : fix);
}

}  // namespace

Status CheckModelConfig(const std::string& option, const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    if (auto slash = SlashedFileError(option, path)) return *slash;
    return Error(option + " " + path + " does not exist", ErrorKind::kFileNotFound)
        .WithHint("pass the HF config.json of the Kimi-K3 model as " + option);
  }
  if (fs::is_directory(path, ec)) {
    const std::string inside = (fs::path(path) / "config.json").string();
    return Error(option + " " + path + " is a directory, not a config file")
        .WithHint(PathExists(inside) ? "pass " + option + " " + inside
                                     : "pass the HF config.json of the Kimi-K3 model as " + option);
  }
  auto text = ReadFileToString(path);
  if (!text.ok()) return text.error().WithHint("pass a readable config.json as " + option);
  nlohmann::json j = ParseJsonOrDiscarded(*text);
  if (j.is_discarded() || !j.is_object()) {
    return Error(option + " " + path + " is not a JSON object").WithHint("pass the HF config.json of the Kimi-K3 model");
  }
  if (!NamesKimi(j) && !(j.contains("text_config") && NamesKimi(j["text_config"]))) {
    return Error(option + " " + path + " is not a Kimi HF config (" + Describe(j) + ")")
        .WithHint("pass the config.json of the Kimi-K3 model (model_type kimi_k3) as " + option);
  }
  return Status::OK();
}

Status CheckIsTokenizerDir(const std::string& option, const std::string& dir) {
  std::error_code ec;
  auto fix = "pass the Kimi tokenizer directory (config.json + tokenizer.json, tiktoken.model or "
             "tokenizer_config.json) as " + option;
  if (!fs::exists(dir, ec)) {
    if (auto slash = SlashedFileError(option, dir, fix)) return *slash;
    return Error(option + " " + dir + " does not exist", ErrorKind::kFileNotFound).WithHint(fix);
  }
  if (!fs::is_directory(dir, ec)) return Error(option + " " + dir + " is not a directory").WithHint(fix);
  // SGLang's test of a tokenizer directory, and the text it raises.
  if (!manifest::IsKimiTokenizerDir(dir)) {
    // SGLang names the directory resolved (Path(explicit).resolve()).
    return Error("Kimi tokenizer directory is invalid: " + ResolvedPathOrGiven(dir))
        .WithHint(option + " needs config.json and one of tokenizer.json, tiktoken.model, tokenizer_config.json; " +
                  fix);
  }
  return Status::OK();
}

Status CheckTokenizerDir(const std::string& option, const std::string& dir) {
  K3_RETURN_IF_ERROR(CheckIsTokenizerDir(option, dir));
  const fs::path d(dir);
  auto text = ReadFileToString((d / "config.json").string());
  if (!text.ok()) return text.error();
  nlohmann::json j = ParseJsonOrDiscarded(*text);
  if (j.is_discarded() || !j.is_object() || !j.contains("text_config")) {
    return Error("Kimi tokenizer config does not contain text_config")
        .WithHint((d / "config.json").string() + " (" + option + ") must be the model's HF config with text_config");
  }
  return manifest::CheckTokenizerFilesReadable(option, dir);
}

Status CheckGgufDir(const std::string& option, const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    if (auto slash = SlashedFileError(option, path)) return *slash;
    return Error(option + " " + path + " does not exist", ErrorKind::kFileNotFound)
        .WithHint("pass the directory holding the <prefix>-NNNNN-of-NNNNN.gguf shards as " + option);
  }
  if (!fs::is_directory(path, ec)) return Status::OK();  // a shard path: the reader judges it
  const std::string shown = ResolvedPathOrGiven(path);  // SGLang's text names the resolved directory
  // The *.gguf files of a directory; the errno of a listing that failed in
  // *list_errno when asked.
  auto count_gguf = [](const fs::path& d, int* list_errno = nullptr) {
    std::error_code e;
    size_t n = 0;
    for (fs::directory_iterator it(d, e), end; !e && it != end; it.increment(e)) {
      if (it->path().extension() == ".gguf") ++n;
    }
    if (list_errno != nullptr) *list_errno = e.value();
    return n;
  };
  int list_errno = 0;
  if (count_gguf(path, &list_errno) > 0) return Status::OK();
  if (list_errno != 0) return gguf::NoGgufFilesError(shown, list_errno);
  std::vector<std::pair<std::string, size_t>> subs;
  for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code e;
    if (!it->is_directory(e)) continue;
    if (size_t n = count_gguf(it->path()); n > 0) subs.emplace_back(it->path().filename().string(), n);
  }
  std::sort(subs.begin(), subs.end());
  if (subs.size() == 1) {
    const std::string sub = (fs::path(path) / subs[0].first).string();
    return gguf::NoGgufFilesError(shown).WithHint("found " + std::to_string(subs[0].second) + " shards in " + subs[0].first +
                                            "/: pass " + option + " " + sub);
  }
  if (subs.size() > 1) {
    std::string list;
    for (const auto& [name, n] : subs) list += "\n  " + name + "/ (" + std::to_string(n) + " shards)";
    return gguf::NoGgufFilesError(shown).WithHint("quant folders inside it:" + list + "\npass " + option + " " + path +
                                            "/<one of them>");
  }
  return gguf::NoGgufFilesError(shown).WithHint("pass the directory holding the <prefix>-NNNNN-of-NNNNN.gguf shards as " +
                                          option);
}

Status CheckInputExists(const std::string& option, const std::string& path, const std::string& suffix,
                        const std::string& make_it) {
  if (PathExists(path)) return Status::OK();
  if (auto slash = SlashedFileError(option, path)) return *slash;
  fs::path dir = fs::path(path).parent_path();
  const bool bare_name = dir.empty();  // "nosuch": looked for in the current directory
  if (bare_name) dir = ".";
  std::error_code ec;
  std::vector<std::string> found;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      found.push_back(it->path().string());
  }
  std::sort(found.begin(), found.end());
  Error e(option + " " + path + " does not exist", ErrorKind::kFileNotFound);
  // Not yet: a build holding a pack lock here writes it (or the pack it needs).
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().extension() != ".lock") continue;
    const std::string hint = pack::BuildInProgressHint((it->path().parent_path() / it->path().stem()).string());
    if (!hint.empty()) return e.WithHint(hint);
  }
  if (found.empty()) {
    const std::string where = bare_name ? "the current directory" : dir.string();
    return e.WithHint(fs::is_directory(dir, ec) ? "no *" + suffix + " in " + where + " either; " + make_it
                                                : "directory " + dir.string() + " does not exist either");
  }
  std::string list = "found beside it:";
  for (const auto& f : found) list += "\n  " + f;
  return e.WithHint(list);
}

Error WithMovedModelHint(const Error& e, const std::string& manifest_path) {
  if (e.message().find("\nhint:") != std::string::npos) return e;
  auto m = manifest::ReadManifest(manifest_path);
  if (!m.ok()) return e;
  std::vector<std::string> gone;
  if (!PathExists(m->expert_pack.path)) gone.push_back(m->expert_pack.path);
  for (const auto& s : m->source.shards) {
    if (!PathExists(s.path)) gone.push_back(s.path);
  }
  if (gone.empty()) return e;
  return e.WithHint(std::to_string(gone.size()) + " file(s) the manifest records are gone (first: " + gone.front() +
                    "); if the model directory was moved or renamed, rerun `k3pack build` in its new place to write "
                    "a new manifest (a valid pack there is reused)");
}

}  // namespace k3pack::cli
