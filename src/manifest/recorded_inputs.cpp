// Recorded inputs against the files (see recorded_inputs.h).
#include "manifest/recorded_inputs.h"

#include <filesystem>
#include <map>

#include "k3pack/gguf.h"
#include "manifest/pyjson.h"
#include "manifest/scan.h"
#include "util/file.h"
#include "util/sha256.h"

namespace k3pack::manifest {

using nlohmann::json;
using Kind = SourceDifference::Kind;

namespace {

// A value as it reads in a message: strings bare, anything else as JSON.
std::string Show(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  return v.dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<const json*> Member(const json& obj, const std::string& key, const std::string& where) {
  if (!obj.is_object()) return Error("manifest " + where + ": expected an object");
  auto it = obj.find(key);
  if (it == obj.end()) return Error("manifest " + where + " has no '" + key + "'", ErrorKind::kKey);
  return &*it;
}

// The first key of `then` (a record of the manifest; in `order`, then any
// other) whose value differs in `now` (the same record recomputed from the
// files); "" when none. Keys the manifest does not record are not compared
// (the writer records them all; hand-made manifests may not).
std::string FirstDifferentKey(const json& now, const json& then, std::initializer_list<const char*> order) {
  for (const char* k : order) {
    if (then.contains(k) && (!now.contains(k) || now.at(k) != then.at(k))) return k;
  }
  for (const auto& [k, v] : then.items()) {
    if (!now.contains(k) || now.at(k) != v) return k;
  }
  return "";
}

// "<key> <value from the files> != <value recorded>", the form every
// changed-input message uses.
std::string Detail(const json& now, const json& then, const std::string& key) {
  if (!now.contains(key)) return key + " (not derived from the files) = " + Show(then.at(key)) + " in the manifest";
  return key + " " + Show(now.at(key)) + " != " + Show(then.at(key)) + " (file != manifest)";
}

}  // namespace

namespace {

// Every difference in `out`, in report order; with `all` false it stops at
// the first one. A shard that is missing, has another size or header, or no
// longer parses ends the comparison after the shard loop: the records below
// need every shard scanned.
Status CompareSource(const json& source, const SourceCheckOptions& options, bool all,
                     std::vector<SourceDifference>* out) {
  K3_ASSIGN_OR_RETURN(const json* shards, Member(source, "shards", "source"));
  K3_ASSIGN_OR_RETURN(const json* tensors, Member(source, "tensors", "source"));
  if (!shards->is_array() || shards->empty()) return Error("manifest source.shards: expected a non-empty list");
  if (!tensors->is_array()) return Error("manifest source.tensors: expected a list");
  // Records a difference; true when the caller wants no more (only the first).
  auto found = [&](Kind kind, std::string shard, std::string tensor, std::string field, std::string detail) {
    SourceDifference d;
    d.kind = kind;
    d.shard_path = std::move(shard);
    d.tensor = std::move(tensor);
    d.field = std::move(field);
    d.detail = std::move(detail);
    out->push_back(std::move(d));
    return !all;
  };

  std::vector<std::shared_ptr<const gguf::GgufFile>> files;
  std::vector<std::string> paths;
  for (size_t i = 0; i < shards->size(); ++i) {
    const json& then = (*shards)[i];
    K3_ASSIGN_OR_RETURN(const json* p, Member(then, "path", "source.shards[" + std::to_string(i) + "]"));
    if (!p->is_string()) return Error("manifest source.shards[" + std::to_string(i) + "].path: expected a string");
    const std::string path = p->get<std::string>();
    paths.push_back(path);
    if (!PathExists(path)) {
      if (found(Kind::kShardMissing, path, "", "", "the file is missing")) return Status::OK();
      continue;
    }
    // Size and header digest from the raw bytes first: they name the change
    // even when the file no longer parses (truncated, header bytes flipped).
    K3_ASSIGN_OR_RETURN(uint64_t size, FileSize(path));
    const json now_size = {{"size", size}};
    if (then.contains("size") && now_size["size"] != then["size"]) {
      if (found(Kind::kShard, path, "", "size", Detail(now_size, then, "size"))) return Status::OK();
      continue;
    }
    if (then.contains("metadata_nbytes") && then["metadata_nbytes"].is_number_unsigned() &&
        then.contains("metadata_sha256") && then["metadata_nbytes"].get<uint64_t>() <= size) {
      K3_ASSIGN_OR_RETURN(std::string meta, Sha256FileRange(path, 0, then["metadata_nbytes"].get<uint64_t>()));
      const json now_meta = {{"metadata_sha256", meta}};
      if (now_meta["metadata_sha256"] != then["metadata_sha256"]) {
        if (found(Kind::kShard, path, "", "metadata_sha256", Detail(now_meta, then, "metadata_sha256"))) {
          return Status::OK();
        }
        continue;
      }
    }
    gguf::ReadOptions ro;
    ro.require_packed_offsets = false;  // what the loader accepts
    auto f = gguf::GgufFile::Open(path, ro);
    // An OS call that failed on a file whose size and header digest match
    // (mmap under `ulimit -v`, out of descriptors) says nothing about the
    // file: calling it "changed since the manifest was written" sent users to
    // rebuild an intact pack.
    if (!f.ok() && f.error().sys_errno() != 0) return f.error();
    if (!f.ok()) {
      if (found(Kind::kShardUnreadable, path, "", "", "it is no longer a readable GGUF file: " + f.error().message())) {
        return Status::OK();
      }
      continue;
    }
    files.push_back(*f);
  }
  if (!out->empty()) return Status::OK();
  // The writer's own scan; whole-file digests are added below, only where recorded.
  K3_ASSIGN_OR_RETURN(json fresh, ScanSourceJson(files));

  bool any_whole = false;
  std::vector<std::string> unhashed;  // shards whose recorded sha256 was taken as recorded
  for (size_t i = 0; i < shards->size(); ++i) {
    const json& then = (*shards)[i];
    json& now = fresh["shards"][i];
    any_whole = any_whole || then.contains("sha256");
    // Cheap fields first; size before the header digest, as SGLang's reader
    // checks only the size.
    json then_cheap = then;
    then_cheap.erase("sha256");  // compared below, only if asked to hash
    const std::string key = FirstDifferentKey(now, then_cheap, {"size", "metadata_sha256", "metadata_nbytes",
                                                                "tensor_count", "index", "path"});
    if (!key.empty()) {
      if (found(Kind::kShard, paths[i], "", key, Detail(now, then, key))) return Status::OK();
      continue;
    }
    if (then.contains("sha256")) {
      if (options.whole_files) {
        K3_ASSIGN_OR_RETURN(std::string whole, Sha256File(paths[i], options.between_chunks));
        now["sha256"] = whole;
        if (now["sha256"] != then["sha256"]) {
          if (found(Kind::kShard, paths[i], "", "sha256", Detail(now, then, "sha256"))) return Status::OK();
        }
      } else {
        now["sha256"] = then["sha256"];
        unhashed.push_back(paths[i]);
      }
    }
  }
  fresh["summary"]["full_source_hashes"] = any_whole;

  // Tensor records, by name (the writer sorts them by name).
  std::map<std::string, const json*> recorded, scanned;
  for (const json& t : *tensors) {
    if (!t.is_object() || !t.contains("name") || !t["name"].is_string()) {
      return Error("manifest source.tensors: every record needs a string 'name'");
    }
    recorded.emplace(t["name"].get<std::string>(), &t);
  }
  for (const json& t : fresh["tensors"]) scanned.emplace(t["name"].get<std::string>(), &t);
  auto shard_of = [&](const json& t) -> std::string {
    if (t.contains("shard_index") && t["shard_index"].is_number_unsigned() &&
        t["shard_index"].get<uint64_t>() < paths.size()) {
      return paths[t["shard_index"].get<uint64_t>()];
    }
    return "";
  };
  for (const auto& [name, t] : scanned) {
    if (recorded.count(name) == 0 &&
        found(Kind::kTensorSet, shard_of(*t), name, "name",
               "tensor " + name + " is in the shard but not in the manifest's source.tensors")) {
      return Status::OK();
    }
  }
  for (const auto& [name, t] : recorded) {
    if (scanned.count(name) == 0 &&
        found(Kind::kTensorSet, shard_of(*t), name, "name",
               "tensor " + name + " is recorded in the manifest but is in no shard")) {
      return Status::OK();
    }
  }
  for (const auto& [name, now] : scanned) {
    auto then = recorded.find(name);
    if (then == recorded.end()) continue;  // reported above
    const std::string key =
        FirstDifferentKey(*now, *then->second, {"shard_index", "dtype", "dtype_id", "shape", "data_offset", "nbytes"});
    if (!key.empty() && found(Kind::kTensor, shard_of(*now), name, key, Detail(*now, *then->second, key))) {
      return Status::OK();
    }
  }
  if (tensors->size() != recorded.size() &&
      found(Kind::kTensorSet, "", "", "name",
             "source.tensors has " + std::to_string(tensors->size()) + " records for " +
                 std::to_string(recorded.size()) + " tensors (a tensor is recorded twice)")) {
    return Status::OK();
  }

  if (const json* summary = source.contains("summary") ? &source["summary"] : nullptr) {
    const std::string skey = FirstDifferentKey(fresh["summary"], *summary,
                                               {"architecture", "shard_count", "tensor_count", "total_bytes",
                                                "full_source_hashes"});
    if (!skey.empty() && found(Kind::kSummary, "", "", skey, Detail(fresh["summary"], *summary, skey))) {
      return Status::OK();
    }
  }
  // The digest only means something once every record matches.
  if (!out->empty()) return Status::OK();
  fresh.erase("inventory_sha256");
  const json inventory = CanonicalSha256(fresh);  // as the writer: before the key exists
  const json recorded_inventory = source.value("inventory_sha256", json());
  if (source.contains("inventory_sha256") && inventory != recorded_inventory) {
    found(Kind::kInventory, "", "", "inventory_sha256",
          "inventory_sha256 recomputed from the shards is " + Show(inventory) + ", the manifest records " +
              Show(recorded_inventory));
    out->back().unhashed_sha256 = std::move(unhashed);
  }
  return Status::OK();
}

}  // namespace

Result<SourceDifference> CompareSourceWithShards(const json& source, const SourceCheckOptions& options) {
  std::vector<SourceDifference> d;
  K3_RETURN_IF_ERROR(CompareSource(source, options, /*all=*/false, &d));
  return d.empty() ? SourceDifference{} : d.front();
}

Result<std::vector<SourceDifference>> CompareSourceWithShardsAll(const json& source,
                                                                 const SourceCheckOptions& options) {
  std::vector<SourceDifference> d;
  K3_RETURN_IF_ERROR(CompareSource(source, options, /*all=*/true, &d));
  return d;
}

Status SourceDifferenceStatus(const SourceDifference& d) {
  const std::string rebuild = "rebuild the pack and manifest (`k3pack build`) from the current shards";
  switch (d.kind) {
    case Kind::kNone:
      return Status::OK();
    case Kind::kShardMissing:
      return Error("GGUF shard recorded in the manifest is missing: " + d.shard_path, ErrorKind::kFileNotFound);
    case Kind::kShardUnreadable:
    case Kind::kShard: {
      Error e("GGUF shard " + d.shard_path + " changed since the manifest was written: " + d.detail);
      if (d.field == "metadata_sha256") {
        return e.WithHint("the file has the same size but a different header (re-converted or edited); " + rebuild);
      }
      if (d.field == "sha256") return e.WithHint("same size and header, different tensor bytes; " + rebuild);
      return e.WithHint(rebuild);
    }
    case Kind::kTensorSet:
      return Error("GGUF shard " + (d.shard_path.empty() ? std::string("set") : d.shard_path) +
                   " changed since the manifest was written: " + d.detail)
          .WithHint("the manifest's source.tensors and the shards list different tensors; " + rebuild);
    case Kind::kTensor:
      return Error("GGUF tensor " + d.tensor + " in " + d.shard_path +
                   " does not match the manifest's source.tensors record: " + d.detail)
          .WithHint(rebuild);
    case Kind::kSummary:
      return Error("manifest source.summary does not match the GGUF shards: " + d.detail)
          .WithHint("the shards match their records, so the manifest's summary was edited; rewrite the manifest "
                    "(`k3pack manifest`)");
    case Kind::kInventory: {
      Error e("manifest source.inventory_sha256 does not match the GGUF shards: " + d.detail);
      if (!d.unhashed_sha256.empty()) {
        // The whole-file digests were not recomputed: one of them may be the edit.
        return e.WithHint("every record recomputed from the shards matches, so the recorded digest itself or the "
                          "whole-file sha256 recorded for one of " + std::to_string(d.unhashed_sha256.size()) +
                          " shard(s) was changed; `k3pack verify --full` hashes the shards and names one that "
                          "differs; else rewrite the manifest (`k3pack manifest`)");
      }
      return e.WithHint("every shard and tensor record matches the shards, so the recorded digest itself was changed; "
                        "rewrite the manifest (`k3pack manifest`)");
    }
  }
  return Status::OK();
}

Status CheckModelAgainstConfig(const json& model, kimi::Profile profile) {
  K3_ASSIGN_OR_RETURN(const json* path_v, Member(model, "config_path", "model"));
  K3_ASSIGN_OR_RETURN(const json* sha_v, Member(model, "config_sha256", "model"));
  if (!path_v->is_string()) return Error("manifest model.config_path: expected a string");
  const std::string path = path_v->get<std::string>();
  if (!PathExists(path)) {
    return Error("model config recorded in the manifest is missing: " + path, ErrorKind::kFileNotFound);
  }
  K3_ASSIGN_OR_RETURN(std::string sha, Sha256File(path));
  if (json(sha) != *sha_v) {
    return Error("model config " + path + " changed since the manifest was written: config_sha256 is " + sha +
                 ", the manifest records " + Show(*sha_v))
        .WithHint("rewrite the manifest (`k3pack manifest` or `k3pack build`) from the current config");
  }
  // Same file: every recorded dimension must be what the writer derives from it.
  K3_ASSIGN_OR_RETURN(kimi::ModelSpec spec, kimi::LoadModelSpec(path, profile));
  const json fresh = ModelSectionJson(spec, path, sha);
  const std::string key = FirstDifferentKey(
      fresh, model,
      {"hidden_size", "num_hidden_layers", "active_moe_layer_ids", "num_experts", "num_experts_per_token",
       "num_shared_experts", "routed_expert_hidden_size", "moe_intermediate_size", "hidden_act", "architecture"});
  if (!key.empty()) {
    return Error("manifest model." + key + " does not match the model config " + path + ": " +
                 Detail(fresh, model, key))
        .WithHint("the config file is the one recorded (same config_sha256), so the manifest was edited; rewrite it");
  }
  return Status::OK();
}

Status CheckTokenizerAgainstFiles(const json& tokenizer) {
  K3_ASSIGN_OR_RETURN(const json* path_v, Member(tokenizer, "path", "tokenizer"));
  K3_ASSIGN_OR_RETURN(const json* files_v, Member(tokenizer, "files", "tokenizer"));
  if (!path_v->is_string()) return Error("manifest tokenizer.path: expected a string");
  if (!files_v->is_array()) return Error("manifest tokenizer.files: expected a list");
  const std::string dir = path_v->get<std::string>();
  if (!PathExists(dir)) {
    return Error("tokenizer directory recorded in the manifest is missing: " + dir, ErrorKind::kFileNotFound);
  }
  const std::string hint = "rewrite the manifest (`k3pack manifest` or `k3pack build`) from the current tokenizer";
  K3_ASSIGN_OR_RETURN(json fresh, TokenizerSectionJson(dir));
  std::map<std::string, const json*> now, then;
  for (const json& f : fresh["files"]) now.emplace(f["name"].get<std::string>(), &f);
  for (const json& f : *files_v) {
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string()) {
      return Error("manifest tokenizer.files: every record needs a string 'name'");
    }
    then.emplace(f["name"].get<std::string>(), &f);
  }
  for (const auto& [name, f] : then) {
    if (now.count(name) == 0) {
      return Error("tokenizer file recorded in the manifest is missing: " + dir + "/" + name, ErrorKind::kFileNotFound)
          .WithHint(hint);
    }
    const std::string key = FirstDifferentKey(*now.at(name), *f, {"size", "sha256", "name"});
    if (!key.empty()) {
      return Error("tokenizer file " + dir + "/" + name + " changed since the manifest was written: " +
                   Detail(*now.at(name), *f, key))
          .WithHint(hint);
    }
  }
  for (const auto& [name, f] : now) {
    if (then.count(name) == 0) {
      return Error("tokenizer directory " + dir + " has a file the manifest does not record: " + name).WithHint(hint);
    }
  }
  if (fresh["path"] != *path_v) {
    return Error("manifest tokenizer.path does not match the directory: " + Detail(fresh, tokenizer, "path"))
        .WithHint(hint);
  }
  const json recorded_inventory = tokenizer.value("inventory_sha256", json());
  if (files_v->size() != fresh["files"].size() || fresh["inventory_sha256"] != recorded_inventory) {
    // Files equal one by one, yet the list's digest differs: the digest (or
    // the list's order / a duplicate record) was edited.
    return Error("manifest tokenizer.inventory_sha256 does not match the tokenizer files: inventory_sha256 "
                 "recomputed from " + dir + " is " + Show(fresh["inventory_sha256"]) + ", the manifest records " +
                 Show(recorded_inventory))
        .WithHint("every tokenizer file matches its record, so the recorded digest itself was changed; " + hint);
  }
  return Status::OK();
}

}  // namespace k3pack::manifest
