#include "cli/profile.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "util/file.h"

namespace k3pack::cli {

namespace fs = std::filesystem;

namespace {

// The profile a JSON file records: the sidecar's "profile", or a manifest's
// "k3pack" section (whose presence means scaled).
std::optional<std::string> RecordedIn(const std::string& path) {
  auto text = ReadFileToString(path);
  if (!text.ok()) return std::nullopt;
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  if (auto it = j.find("k3pack"); it != j.end() && it->is_object()) {
    if (auto p = it->find("profile"); p != it->end() && p->is_string()) return p->get<std::string>();
  }
  if (fs::path(path).filename() == kProfileSidecar) {
    if (auto p = j.find("profile"); p != j.end() && p->is_string()) return p->get<std::string>();
  }
  return std::nullopt;
}

}  // namespace

void AddProfileOption(Args& args) {
  args.Option("--profile",
              "kimi-k3 (SGLang's audited invariants) or scaled (any dimensions); default: the one recorded in the "
              "manifest or by `k3pack synth` (" + std::string(kProfileSidecar) + "), else kimi-k3");
}

Result<kimi::Profile> ResolveProfile(const Args& args, const std::vector<std::string>& near) {
  if (args.Has("--profile")) return kimi::ParseProfile(args.Get("--profile"));
  for (const std::string& p : near) {
    if (p.empty()) continue;
    std::error_code ec;
    std::vector<std::string> candidates;
    if (fs::is_directory(p, ec)) {
      candidates.push_back((fs::path(p) / kProfileSidecar).string());
    } else {
      if (fs::path(p).extension() == ".json") candidates.push_back(p);
      fs::path dir = fs::path(p).parent_path();
      candidates.push_back(((dir.empty() ? fs::path(".") : dir) / kProfileSidecar).string());
    }
    for (const std::string& c : candidates) {
      if (auto name = RecordedIn(c)) return kimi::ParseProfile(*name);
    }
  }
  return kimi::Profile::kKimiK3;
}

}  // namespace k3pack::cli
