#include "pack/inputs_record.h"

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "pack/sidecars.h"
#include "util/json_text.h"

namespace k3pack::pack {
namespace {

constexpr const char* kFormat = "K3PACK-PACK-INPUTS-v1";

std::string BaseName(const std::string& path) { return std::filesystem::path(path).filename().string(); }

// One shard's entry, every field of its type: a damaged record (a number
// where an entry belongs, "size": "big") made json's value() throw, and
// pack/build ended in std::terminate.
bool IsShardEntry(const nlohmann::json& rec) {
  return rec.is_object() && rec.contains("name") && rec["name"].is_string() && rec.contains("size") &&
         rec["size"].is_number_unsigned() && rec.contains("mtime_ns") && rec["mtime_ns"].is_number_integer();
}

}  // namespace

Status WriteInputsRecord(const std::string& pack, const ExpertSet& ex, const std::vector<FileStamp>& stamps) {
  nlohmann::json shards = nlohmann::json::array();
  for (size_t i = 0; i < ex.shard_paths.size() && i < stamps.size(); ++i) {
    shards.push_back({{"name", BaseName(ex.shard_paths[i])},
                      {"size", static_cast<uint64_t>(stamps[i].size)},
                      {"mtime_ns", stamps[i].mtime_ns}});
  }
  const nlohmann::json j = {{"format", kFormat}, {"shards", shards}};
  // Shard names are any bytes: never throw on one that is not UTF-8.
  return WriteFileAtomic(InputsRecordPathFor(pack), j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

Status RecordCurrentInputs(const std::string& pack, const ExpertSet& ex) {
  std::vector<FileStamp> now;
  for (const std::string& shard : ex.shard_paths) {
    K3_ASSIGN_OR_RETURN(FileStamp stamp, StampFile(shard));
    now.push_back(stamp);
  }
  return WriteInputsRecord(pack, ex, now);
}

std::string WhyInputsChanged(const std::string& pack, const ExpertSet& ex) {
  const std::string path = InputsRecordPathFor(pack);
  if (!PathExists(path)) return "";
  auto text = ReadFileToString(path);
  const nlohmann::json j = text.ok() ? ParseJsonOrDiscarded(*text) : nlohmann::json();
  const bool readable = j.is_object() && j.contains("format") && j["format"].is_string() &&
                        j["format"].get<std::string>() == kFormat && j.contains("shards") && j["shards"].is_array() &&
                        std::all_of(j["shards"].begin(), j["shards"].end(), IsShardEntry);
  if (!readable) return "the record of its inputs " + path + " is unreadable";
  const nlohmann::json& shards = j["shards"];
  if (shards.size() != ex.shard_paths.size()) {
    return "it was built from " + std::to_string(shards.size()) + " source shard(s) (" + path + "), not these " +
           std::to_string(ex.shard_paths.size());
  }
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string& shard = ex.shard_paths[i];
    const nlohmann::json& rec = shards[i];
    auto now = StampFile(shard);
    if (!now.ok()) return "source shard " + shard + " cannot be looked at: " + now.error().message();
    const auto recorded_size = rec["size"].get<uint64_t>();
    const auto recorded_mtime = rec["mtime_ns"].get<int64_t>();
    const std::string name = rec["name"].get<std::string>();
    std::string how;
    if (name != BaseName(shard)) {
      how = "it was built from " + name + " there";
    } else if (static_cast<uint64_t>(now->size) != recorded_size) {
      how = "its size went from " + std::to_string(recorded_size) + " to " + std::to_string(now->size) + " bytes";
    } else if (now->mtime_ns != recorded_mtime) {
      how = "it was written to (its modification time changed)";
    }
    if (!how.empty()) {
      return "source shard " + shard + " changed since the pack was built from it (" + path + "): " + how;
    }
  }
  return "";
}

}  // namespace k3pack::pack
