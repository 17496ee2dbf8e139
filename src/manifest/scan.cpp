// Shard inventory for the manifest's `source` section.
#include "manifest/scan.h"

#include <algorithm>
#include <optional>
#include <thread>

#include "k3pack/ggml_types.h"
#include "k3pack/gguf.h"
#include "manifest/pyjson.h"
#include "util/file.h"
#include "util/parallel_sha256.h"
#include "util/sha256.h"

namespace k3pack::manifest {

using nlohmann::json;

namespace {

// Whole-file digests of every shard, several shards at a time (each hash is
// sequential reads of one file; different files overlap well on NVMe).
Result<std::vector<std::string>> HashShards(const std::vector<std::string>& paths, const ScanOptions& o) {
  const int threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::min(4u, std::thread::hardware_concurrency())));
  // The calling thread is one of the hashing threads.
  ParallelSha256 hasher(paths, threads - 1);
  ParallelSha256::Wait wait;
  wait.progress = o.hash_progress;
  wait.interrupt_check = o.interrupt_check;
  if (o.progress) {
    wait.file_done = [&](size_t index, size_t done) {
      o.progress("hashed shard " + std::to_string(done) + "/" + std::to_string(paths.size()) + ": " + paths[index]);
    };
  }
  return hasher.Finish(wait);
}

}  // namespace

Result<json> ScanSourceJson(const gguf::ShardSet& set, const ScanOptions& o) {
  return ScanSourceJson(set.shards(), o);
}

Result<json> ScanSourceJson(const std::vector<std::shared_ptr<const gguf::GgufFile>>& files, const ScanOptions& o) {
  if (files.empty()) return Error("no GGUF shards to scan");
  std::vector<std::string> paths;
  json shards = json::array();
  uint64_t total_bytes = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    const gguf::GgufFile& f = *files[i];
    K3_ASSIGN_OR_RETURN(std::string path, ResolvePath(f.path()));
    if (!IsValidUtf8(path)) return Error("GGUF shard path is not valid UTF-8: " + path);
    const uint64_t meta = f.data_offset();
    if (meta > f.file_size()) {
      return Error("short read at offset " + std::to_string(f.file_size()) + "; " +
                       std::to_string(meta - f.file_size()) + " bytes remain",
                   ErrorKind::kEOF);
    }
    const std::string meta_sha = Sha256Hex(f.mapping()->data(), static_cast<size_t>(meta));
    shards.push_back({{"index", i},
                      {"path", path},
                      {"size", f.file_size()},
                      {"metadata_nbytes", meta},
                      {"metadata_sha256", meta_sha},
                      {"tensor_count", f.tensors().size()}});
    total_bytes += f.file_size();
    paths.push_back(std::move(path));
  }
  if (o.full_source_hashes) {
    std::vector<std::string> to_hash;
    for (const auto& path : paths) {
      if (!o.known_sha256.count(path)) to_hash.push_back(path);
    }
    K3_ASSIGN_OR_RETURN(std::vector<std::string> digests, HashShards(to_hash, o));
    std::map<std::string, std::string> all = o.known_sha256;
    for (size_t i = 0; i < to_hash.size(); ++i) all[to_hash[i]] = digests[i];
    for (size_t i = 0; i < paths.size(); ++i) shards[i]["sha256"] = all[paths[i]];
  }

  // All tensors, sorted by name: Python str order = code point order =
  // unsigned byte order of the UTF-8 names (std::string compares unsigned).
  std::vector<gguf::ShardSet::Located> all;  // shard order, then info order (ShardSet::AllTensors)
  for (size_t i = 0; i < files.size(); ++i) {
    for (const gguf::TensorInfo& t : files[i]->tensors()) all.push_back({&t, static_cast<uint32_t>(i)});
  }
  for (const auto& t : all) {
    if (!IsValidUtf8(t.info->name)) {
      return Error("GGUF tensor name is not valid UTF-8: " + PyJsonDumps(json(t.info->name), PyJsonStyle::kCanonicalAscii))
          .WithContext(files[t.shard_index]->path());
    }
  }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.info->name < b.info->name; });
  json tensors = json::array();
  for (const auto& t : all) {
    const gguf::TensorInfo& ti = *t.info;
    tensors.push_back({{"name", ti.name},
                       {"shape", ti.shape()},
                       {"dtype", std::string(GgmlTypeName(ti.type))},
                       {"dtype_id", static_cast<uint32_t>(ti.type)},
                       {"shard_index", t.shard_index},
                       {"data_offset", ti.data_offset},
                       {"nbytes", ti.nbytes}});
  }

  json source = json::object();
  source["summary"] = {{"architecture", files.front()->architecture()},
                       {"shard_count", files.size()},
                       {"tensor_count", all.size()},
                       {"total_bytes", total_bytes},
                       {"full_source_hashes", o.full_source_hashes}};
  source["shards"] = std::move(shards);
  source["tensors"] = std::move(tensors);
  source["inventory_sha256"] = CanonicalSha256(source);  // before the key itself exists
  return source;
}

}  // namespace k3pack::manifest
