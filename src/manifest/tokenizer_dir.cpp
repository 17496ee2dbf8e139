#include "manifest/tokenizer_dir.h"

#include <algorithm>
#include <filesystem>
#include <vector>

namespace k3pack::manifest {

namespace fs = std::filesystem;

bool IsKimiTokenizerDir(const std::string& dir) {
  std::error_code ec;
  const fs::path d(dir);
  if (!fs::is_directory(d, ec) || !fs::is_regular_file(d / "config.json", ec)) return false;
  for (const char* name : {"tokenizer.json", "tiktoken.model", "tokenizer_config.json"}) {
    if (fs::is_regular_file(d / name, ec)) return true;
  }
  return false;
}

Result<std::string> DeriveTokenizerDir(const std::string& gguf_path) {
  std::error_code ec;
  fs::path shard_dir(gguf_path);
  if (!fs::is_directory(shard_dir, ec)) shard_dir = shard_dir.parent_path();
  if (shard_dir.empty()) shard_dir = ".";
  // The parent is taken from the path as given, as SGLang's Path.parent
  // does, except where the path has none to give ("m", ".", ".."): then it
  // is the real parent directory.
  fs::path parent = shard_dir.parent_path();
  const std::string last = shard_dir.filename().string();
  if (parent.empty() || last == "." || last == "..") parent = fs::weakly_canonical(shard_dir, ec).parent_path();

  std::vector<fs::path> candidates = {shard_dir / "tokenizer", parent / "kimi-k3-tokenizer"};
  std::vector<fs::path> globbed;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    if (e.path().filename().string().find("tokenizer") != std::string::npos) globbed.push_back(e.path());
  }
  std::sort(globbed.begin(), globbed.end());
  candidates.insert(candidates.end(), globbed.begin(), globbed.end());

  // One directory reached under two names (kimi-k3-tokenizer is also a
  // *tokenizer* match) is one candidate.
  std::vector<fs::path> valid, seen;
  for (const auto& c : candidates) {
    if (!IsKimiTokenizerDir(c.string())) continue;
    fs::path canonical = fs::weakly_canonical(c, ec);
    if (std::find(seen.begin(), seen.end(), canonical) != seen.end()) continue;
    seen.push_back(canonical);
    valid.push_back(c);
  }
  if (valid.size() == 1) return valid.front().string();
  std::string names;
  for (const auto& v : valid) names += (names.empty() ? "" : ", ") + v.filename().string();
  return Error("could not uniquely derive Kimi tokenizer beside " + shard_dir.string() +
               "; candidates: " + (names.empty() ? "none" : names));
}

}  // namespace k3pack::manifest
