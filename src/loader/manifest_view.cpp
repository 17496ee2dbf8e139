#include "loader/manifest_view.h"

#include "k3pack/manifest.h"
#include "manifest/loader_rules.h"
#include "util/file.h"
#include "util/pyint.h"
#include "util/pyrepr.h"

namespace k3pack::loader {

namespace {

using nlohmann::json;

Error MissingKey(const std::string& key) { return Error(PyRepr(key), ErrorKind::kKey); }

Result<const json*> Get(const json& obj, const std::string& key, const std::string& where) {
  if (!obj.is_object()) return Error("manifest " + where + ": expected an object");
  auto it = obj.find(key);
  if (it == obj.end()) return MissingKey(key);
  return &*it;
}

// int(obj[key]) as SGLang's iterator reads shard_index / index / size
// ("3", 3.0 and 3 are 3; int()'s own error otherwise). A negative value
// matches no shard and no file size: UINT64_MAX stands for it.
Result<uint64_t> GetUnsigned(const json& obj, const std::string& key, const std::string& where) {
  K3_ASSIGN_OR_RETURN(const json* v, Get(obj, key, where));
  K3_ASSIGN_OR_RETURN(int64_t i, k3pack::PyInt(*v));
  return i < 0 ? UINT64_MAX : static_cast<uint64_t>(i);
}

Result<std::string> GetString(const json& obj, const std::string& key, const std::string& where) {
  K3_ASSIGN_OR_RETURN(const json* v, Get(obj, key, where));
  if (!v->is_string()) return Error("manifest " + where + "." + key + ": expected a string, got " + v->dump());
  return v->get<std::string>();
}

Result<uint32_t> ToIndex(uint64_t v, const std::string& where) {
  if (v == UINT64_MAX) return UINT32_MAX;  // negative: a shard no record names
  if (v >= UINT32_MAX) return Error("manifest " + where + ": index " + std::to_string(v) + " is out of range");
  return static_cast<uint32_t>(v);
}

}  // namespace

Result<StreamManifest> ParseStreamManifest(const json& doc) {
  // manifest.get("format") / manifest.get("complete"): a missing key reads
  // as None, so both checks come before any KeyError.
  // The store's step 2 conditions (manifest/loader_rules.h), this loader's texts.
  if (!manifest::FormatSupported(doc)) return Error("Kimi-K3 manifest format is unsupported");
  if (!manifest::MarkedComplete(doc)) return Error("Kimi-K3 manifest is incomplete");

  K3_ASSIGN_OR_RETURN(const json* source, Get(doc, "source", "manifest"));
  K3_ASSIGN_OR_RETURN(const json* tensors, Get(*source, "tensors", "source"));
  if (!tensors->is_array()) return Error("manifest source.tensors: expected a list");
  StreamManifest m;
  for (size_t i = 0; i < tensors->size(); ++i) {
    const json& t = (*tensors)[i];
    const std::string where = "source.tensors[" + std::to_string(i) + "]";
    StreamTensorRecord r;
    K3_ASSIGN_OR_RETURN(uint64_t shard, GetUnsigned(t, "shard_index", where));
    K3_ASSIGN_OR_RETURN(r.shard_index, ToIndex(shard, where + ".shard_index"));
    K3_ASSIGN_OR_RETURN(r.name, GetString(t, "name", where));
    K3_ASSIGN_OR_RETURN(r.dtype, GetString(t, "dtype", where));
    m.tensors_by_shard[r.shard_index].push_back(std::move(r));
  }

  K3_ASSIGN_OR_RETURN(const json* shards, Get(*source, "shards", "source"));
  if (!shards->is_array()) return Error("manifest source.shards: expected a list");
  for (size_t i = 0; i < shards->size(); ++i) {
    const json& s = (*shards)[i];
    const std::string where = "source.shards[" + std::to_string(i) + "]";
    StreamShardRecord r;
    K3_ASSIGN_OR_RETURN(r.path, GetString(s, "path", where));
    K3_ASSIGN_OR_RETURN(r.size, GetUnsigned(s, "size", where));
    K3_ASSIGN_OR_RETURN(uint64_t index, GetUnsigned(s, "index", where));
    K3_ASSIGN_OR_RETURN(r.index, ToIndex(index, where + ".index"));
    m.shards.push_back(std::move(r));
  }
  return m;
}

Result<json> ReadJsonFile(const std::string& path) {
  // The manifest module's reader: a missing file is FileNotFoundError, bad
  // JSON a ValueError with the parser's position, both naming the file.
  return manifest::ReadManifestJson(path);
}

}  // namespace k3pack::loader
