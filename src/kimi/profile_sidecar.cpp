#include "kimi/profile_sidecar.h"

#include <filesystem>

#include "util/file.h"
#include "util/utf8.h"

namespace k3pack::kimi {

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

Result<Profile> ProfileRecordedNear(const std::vector<std::string>& near) {
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
      if (auto name = RecordedIn(c)) return ParseProfile(*name);
    }
  }
  return Profile::kKimiK3;
}

Result<Profile> WriteSynthSidecar(const std::string& out_dir, const std::string& config_path,
                                  const nlohmann::json& recipe) {
  // Record the profile the model passes, so later commands need no profile.
  const Profile profile = LoadModelSpec(config_path, Profile::kKimiK3).ok() ? Profile::kKimiK3 : Profile::kScaled;
  nlohmann::json side = {{"profile", ProfileName(profile)},
                         {"written_by", "k3pack synth"},
                         {"synth_args", recipe},
                         {"note", "read by k3pack commands when --profile is not given"}};
  K3_RETURN_IF_ERROR(WriteFileAtomic((fs::path(out_dir) / kProfileSidecar).string(), DumpJsonEscaped(side) + "\n"));
  return profile;
}

bool SynthSidecarRecords(const std::string& out_dir, const nlohmann::json& recipe) {
  auto text = ReadFileToString((fs::path(out_dir) / kProfileSidecar).string());
  if (!text.ok()) return false;
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  return !j.is_discarded() && j.is_object() && j.value("synth_args", nlohmann::json()) == recipe;
}

}  // namespace k3pack::kimi
