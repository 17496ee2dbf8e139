#include "manifest/tokenizer_dir.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "util/file.h"

namespace k3pack::manifest {

namespace fs = std::filesystem;

namespace {

fs::path ShardDir(const std::string& gguf_path) {
  std::error_code ec;
  fs::path p(gguf_path);
  if (!fs::is_directory(p, ec)) p = p.parent_path();
  return p.empty() ? fs::path(".") : p;
}

// The shard directory as SGLang's server sees it: it resolves the shard's
// path first, so a directory reached through a symlink is searched from
// where it really is (its parent's other tokenizers included). The shard
// file itself is not followed: a hub cache's shards link into a blobs
// directory, where no tokenizer is.
fs::path ResolvedShardDir(const std::string& gguf_path) {
  return fs::path(ResolvedPathOrGiven(ShardDir(gguf_path).string()));
}

}  // namespace

bool IsKimiTokenizerDir(const std::string& dir) {
  std::error_code ec;
  const fs::path d(dir);
  if (!fs::is_directory(d, ec) || !fs::is_regular_file(d / "config.json", ec)) return false;
  for (const char* name : {"tokenizer.json", "tiktoken.model", "tokenizer_config.json"}) {
    if (fs::is_regular_file(d / name, ec)) return true;
  }
  return false;
}

Status CheckTokenizerFilesReadable(const std::string& option, const std::string& dir) {
  const std::string why = "every file of the tokenizer directory is hashed into the manifest; make it readable for "
                          "this user or pass a readable copy as " + option;
  auto names = RegularFileNames(dir, "tokenizer directory");
  if (!names.ok()) return names.error().WithHint(why);
  for (const std::string& name : *names) {
    auto fd = OpenReadOnly((fs::path(dir) / name).string());
    if (!fd.ok()) return fd.error().WithHint(why);
  }
  return Status::OK();
}

namespace {

// SGLang's candidates, in its order, that hold a Kimi tokenizer; one
// directory reached under two names (kimi-k3-tokenizer is also a
// *tokenizer* match) counts once.
std::vector<fs::path> ValidTokenizerCandidates(const std::string& gguf_path) {
  std::error_code ec;
  const fs::path shard_dir = ResolvedShardDir(gguf_path);
  const fs::path parent = shard_dir.parent_path();

  std::vector<fs::path> candidates = {shard_dir / "tokenizer", parent / "kimi-k3-tokenizer"};
  std::vector<fs::path> globbed;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    if (e.path().filename().string().find("tokenizer") != std::string::npos) globbed.push_back(e.path());
  }
  std::sort(globbed.begin(), globbed.end());
  candidates.insert(candidates.end(), globbed.begin(), globbed.end());

  // Each by its resolved path, as SGLang lists them.
  std::vector<fs::path> valid;
  for (const auto& c : candidates) {
    if (!IsKimiTokenizerDir(c.string())) continue;
    const fs::path canonical(ResolvedPathOrGiven(c.string()));
    if (std::find(valid.begin(), valid.end(), canonical) == valid.end()) valid.push_back(canonical);
  }
  return valid;
}

}  // namespace

Result<std::string> DeriveTokenizerDir(const std::string& gguf_path) {
  const fs::path shard_dir = ResolvedShardDir(gguf_path);
  const std::vector<fs::path> valid = ValidTokenizerCandidates(gguf_path);
  if (valid.size() == 1) return valid.front().string();
  std::string names;
  for (const auto& v : valid) names += (names.empty() ? "" : ", ") + v.string();
  return Error("could not uniquely derive Kimi tokenizer beside " + shard_dir.string() +
               "; candidates: " + (names.empty() ? "none" : names));
}

Result<ImpliedPath> ImpliedTokenizerDir(const std::string& gguf_path, const InputNames& names) {
  auto tok = DeriveTokenizerDir(gguf_path);
  if (!tok.ok()) {
    return Error(tok.error().message(), ErrorKind::kRuntime)
        .WithHint("pass " + names.tokenizer_dir + " with the Kimi tokenizer directory (config.json + tokenizer.json, "
                  "tiktoken.model or tokenizer_config.json). Without it k3pack looks where SGLang's server does: "
                  "<shard dir>/tokenizer, <shard dir>/../kimi-k3-tokenizer and <shard dir>/../*tokenizer*");
  }
  return ImpliedPath{*tok, "the Kimi tokenizer directory beside the shards, found as SGLang's server finds it"};
}

Result<ImpliedPath> ImpliedModelConfig(const std::string& gguf_path, const std::string& tokenizer_dir,
                                       const InputNames& names) {
  std::error_code ec;
  const fs::path beside = ShardDir(gguf_path) / "config.json";
  if (fs::is_regular_file(beside, ec)) return ImpliedPath{beside.string(), "config.json beside the shards"};
  std::string tok = tokenizer_dir, why_not;
  if (tok.empty()) {
    auto derived = DeriveTokenizerDir(gguf_path);
    if (derived.ok()) tok = *derived;
    else why_not = derived.error().message();
  }
  const fs::path in_tok = fs::path(tok) / "config.json";
  if (tok.empty() || !fs::is_regular_file(in_tok, ec)) {
    if (why_not.empty()) why_not = "no " + in_tok.string();
    return Error(names.model_config + " not given, and no config.json found for it: no " + beside.string() +
                 ", and " + why_not)
        .WithHint("pass " + names.model_config + " with the Kimi-K3 model's HF config.json");
  }
  return ImpliedPath{in_tok.string(), "the tokenizer directory's config.json, as SGLang's server uses it"};
}

}  // namespace k3pack::manifest
