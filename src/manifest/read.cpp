// Reading a manifest into typed records. Missing keys mirror Python's bare
// KeyError ('key'); wrong types name the JSON path of the offending value.
#include <filesystem>
#include <limits>

#include "k3pack/manifest.h"
#include "manifest/loader_rules.h"
#include "manifest/manifest_output.h"
#include "pack/format.h"
#include "util/file.h"
#include "util/output_guard.h"
#include "util/pyrepr.h"
#include "util/json_text.h"

namespace k3pack::manifest {

using nlohmann::json;

namespace {

// A cursor over one JSON object that remembers its path for messages.
class Obj {
 public:
  Obj(const json& j, std::string path) : j_(j), path_(std::move(path)) {}

  Status Check() const {
    if (!j_.is_object()) return Error("manifest " + Name() + ": expected an object");
    return Status::OK();
  }
  Result<const json*> Get(const std::string& key) const {
    K3_RETURN_IF_ERROR(Check());
    auto it = j_.find(key);
    if (it == j_.end()) return Error("'" + key + "'", ErrorKind::kKey);
    return &*it;
  }
  bool Has(const std::string& key) const { return j_.is_object() && j_.contains(key); }
  std::string Path(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  template <typename T>
  Result<T> Uint(const std::string& key) const {
    K3_ASSIGN_OR_RETURN(const json* v, Get(key));
    return AsUint<T>(*v, Path(key));
  }
  Result<int64_t> Int(const std::string& key) const {
    K3_ASSIGN_OR_RETURN(const json* v, Get(key));
    if (!v->is_number_integer() || (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))) {
      return TypeError(Path(key), "an integer");
    }
    return v->get<int64_t>();
  }
  Result<std::string> Str(const std::string& key) const {
    K3_ASSIGN_OR_RETURN(const json* v, Get(key));
    if (!v->is_string()) return TypeError(Path(key), "a string");
    return v->get<std::string>();
  }
  Result<bool> Bool(const std::string& key) const {
    K3_ASSIGN_OR_RETURN(const json* v, Get(key));
    if (!v->is_boolean()) return TypeError(Path(key), "a boolean");
    return v->get<bool>();
  }
  Result<std::optional<std::string>> OptStr(const std::string& key) const {
    if (!Has(key)) return std::optional<std::string>();
    K3_ASSIGN_OR_RETURN(std::string s, Str(key));
    return std::optional<std::string>(std::move(s));
  }
  template <typename T>
  Result<std::vector<T>> UintList(const std::string& key) const {
    K3_ASSIGN_OR_RETURN(const json* v, Get(key));
    if (!v->is_array()) return TypeError(Path(key), "a list");
    std::vector<T> out;
    out.reserve(v->size());
    for (size_t i = 0; i < v->size(); ++i) {
      K3_ASSIGN_OR_RETURN(T x, AsUint<T>((*v)[i], Path(key) + "[" + std::to_string(i) + "]"));
      out.push_back(x);
    }
    return out;
  }
  Result<std::vector<int64_t>> IntList(const std::string& key) const {
    K3_ASSIGN_OR_RETURN(const json* v, Get(key));
    if (!v->is_array()) return TypeError(Path(key), "a list");
    std::vector<int64_t> out;
    for (size_t i = 0; i < v->size(); ++i) {
      const json& e = (*v)[i];
      if (!e.is_number_integer() || (e.is_number_unsigned() && e.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))) {
        return TypeError(Path(key) + "[" + std::to_string(i) + "]", "an integer");
      }
      out.push_back(e.get<int64_t>());
    }
    return out;
  }
  Result<Obj> Child(const std::string& key) const {
    K3_ASSIGN_OR_RETURN(const json* v, Get(key));
    Obj c(*v, Path(key));
    K3_RETURN_IF_ERROR(c.Check());
    return c;
  }
  const json& raw() const { return j_; }
  std::string Name() const { return path_.empty() ? "document" : path_; }

  static Error TypeError(const std::string& path, const char* what) {
    return Error("manifest " + path + ": expected " + what);
  }
  template <typename T>
  static Result<T> AsUint(const json& v, const std::string& path) {
    if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0) ||
        v.get<uint64_t>() > std::numeric_limits<T>::max()) {
      return TypeError(path, std::numeric_limits<T>::max() == UINT32_MAX ? "an unsigned 32-bit integer"
                                                                         : "an unsigned integer");
    }
    return static_cast<T>(v.get<uint64_t>());
  }

 private:
  const json& j_;
  std::string path_;
};

template <typename Rec, typename Fn>
Result<std::vector<Rec>> ParseList(const Obj& parent, const std::string& key, Fn parse_one) {
  K3_ASSIGN_OR_RETURN(const json* v, parent.Get(key));
  if (!v->is_array()) return Obj::TypeError(parent.Path(key), "a list");
  std::vector<Rec> out;
  out.reserve(v->size());
  for (size_t i = 0; i < v->size(); ++i) {
    Obj item((*v)[i], parent.Path(key) + "[" + std::to_string(i) + "]");
    K3_RETURN_IF_ERROR(item.Check());
    K3_ASSIGN_OR_RETURN(Rec r, parse_one(item));
    out.push_back(std::move(r));
  }
  return out;
}

Result<ShardRecord> ShardOf(const Obj& o) {
  ShardRecord r;
  K3_ASSIGN_OR_RETURN(r.index, o.Uint<uint32_t>("index"));
  K3_ASSIGN_OR_RETURN(r.path, o.Str("path"));
  K3_ASSIGN_OR_RETURN(r.size, o.Uint<uint64_t>("size"));
  K3_ASSIGN_OR_RETURN(r.metadata_nbytes, o.Uint<uint64_t>("metadata_nbytes"));
  K3_ASSIGN_OR_RETURN(r.metadata_sha256, o.Str("metadata_sha256"));
  K3_ASSIGN_OR_RETURN(r.tensor_count, o.Uint<uint64_t>("tensor_count"));
  K3_ASSIGN_OR_RETURN(r.sha256, o.OptStr("sha256"));
  return r;
}

Result<TensorRecord> TensorOf(const Obj& o) {
  TensorRecord r;
  K3_ASSIGN_OR_RETURN(r.name, o.Str("name"));
  K3_ASSIGN_OR_RETURN(r.shape, o.IntList("shape"));
  K3_ASSIGN_OR_RETURN(r.dtype, o.Str("dtype"));
  K3_ASSIGN_OR_RETURN(r.dtype_id, o.Uint<uint32_t>("dtype_id"));
  K3_ASSIGN_OR_RETURN(r.shard_index, o.Uint<uint32_t>("shard_index"));
  K3_ASSIGN_OR_RETURN(r.data_offset, o.Uint<uint64_t>("data_offset"));
  K3_ASSIGN_OR_RETURN(r.nbytes, o.Uint<uint64_t>("nbytes"));
  return r;
}

Result<RoleRecord> RoleOf(const Obj& o) {
  RoleRecord r;
  K3_ASSIGN_OR_RETURN(r.dtype, o.Str("dtype"));
  K3_ASSIGN_OR_RETURN(r.dtype_id, o.Uint<uint32_t>("dtype_id"));
  K3_ASSIGN_OR_RETURN(r.logical_shape, o.IntList("logical_shape"));
  K3_ASSIGN_OR_RETURN(r.expert_bytes, o.Uint<uint64_t>("expert_bytes"));
  K3_ASSIGN_OR_RETURN(r.entry_count, o.Uint<uint64_t>("entry_count"));
  K3_ASSIGN_OR_RETURN(r.payload_bytes, o.Uint<uint64_t>("payload_bytes"));
  return r;
}

Result<SourceRecord> SourceOf(const Obj& o) {
  SourceRecord r;
  K3_ASSIGN_OR_RETURN(Obj s, o.Child("summary"));
  K3_ASSIGN_OR_RETURN(r.summary.architecture, s.Str("architecture"));
  K3_ASSIGN_OR_RETURN(r.summary.shard_count, s.Uint<uint64_t>("shard_count"));
  K3_ASSIGN_OR_RETURN(r.summary.tensor_count, s.Uint<uint64_t>("tensor_count"));
  K3_ASSIGN_OR_RETURN(r.summary.total_bytes, s.Uint<uint64_t>("total_bytes"));
  K3_ASSIGN_OR_RETURN(r.summary.full_source_hashes, s.Bool("full_source_hashes"));
  K3_ASSIGN_OR_RETURN(r.shards, ParseList<ShardRecord>(o, "shards", ShardOf));
  K3_ASSIGN_OR_RETURN(r.tensors, ParseList<TensorRecord>(o, "tensors", TensorOf));
  K3_ASSIGN_OR_RETURN(r.inventory_sha256, o.Str("inventory_sha256"));
  return r;
}

Result<ExpertPackRecord> ExpertPackOf(const Obj& o) {
  ExpertPackRecord r;
  K3_ASSIGN_OR_RETURN(r.path, o.Str("path"));
  K3_ASSIGN_OR_RETURN(r.size, o.Uint<uint64_t>("size"));
  K3_ASSIGN_OR_RETURN(r.magic, o.Str("magic"));
  K3_ASSIGN_OR_RETURN(r.version, o.Uint<uint32_t>("version"));
  K3_ASSIGN_OR_RETURN(r.header_bytes, o.Uint<uint64_t>("header_bytes"));
  K3_ASSIGN_OR_RETURN(r.entry_bytes, o.Uint<uint64_t>("entry_bytes"));
  K3_ASSIGN_OR_RETURN(r.index_count, o.Uint<uint64_t>("index_count"));
  K3_ASSIGN_OR_RETURN(r.data_start, o.Uint<uint64_t>("data_start"));
  K3_ASSIGN_OR_RETURN(r.alignment, o.Uint<uint64_t>("alignment"));
  K3_ASSIGN_OR_RETURN(r.index_sha256, o.Str("index_sha256"));
  K3_ASSIGN_OR_RETURN(const json* order, o.Get("physical_role_order"));
  if (!order->is_array()) return Obj::TypeError(o.Path("physical_role_order"), "a list");
  for (const json& e : *order) {
    if (!e.is_string()) return Obj::TypeError(o.Path("physical_role_order"), "a list of strings");
    r.physical_role_order.push_back(e.get<std::string>());
  }
  K3_ASSIGN_OR_RETURN(r.active_moe_layer_ids, o.UintList<uint32_t>("active_moe_layer_ids"));
  K3_ASSIGN_OR_RETURN(r.num_experts, o.Uint<uint32_t>("num_experts"));
  K3_ASSIGN_OR_RETURN(r.top_k, o.Uint<uint32_t>("top_k"));
  K3_ASSIGN_OR_RETURN(r.object_bytes, o.Uint<uint64_t>("object_bytes"));
  K3_ASSIGN_OR_RETURN(Obj roles, o.Child("roles"));
  for (pack::Role role : pack::kRoleOrder) {
    K3_ASSIGN_OR_RETURN(Obj ro, roles.Child(pack::RoleName(role)));
    K3_ASSIGN_OR_RETURN(r.roles[static_cast<size_t>(role)], RoleOf(ro));
  }
  K3_ASSIGN_OR_RETURN(r.payload_samples_verified, o.Uint<uint64_t>("payload_samples_verified"));
  K3_ASSIGN_OR_RETURN(r.full_pack_hash, o.Bool("full_pack_hash"));
  K3_ASSIGN_OR_RETURN(r.sha256, o.OptStr("sha256"));
  return r;
}

Result<ModelRecord> ModelOf(const Obj& o) {
  ModelRecord r;
  K3_ASSIGN_OR_RETURN(r.config_path, o.Str("config_path"));
  K3_ASSIGN_OR_RETURN(r.config_sha256, o.Str("config_sha256"));
  K3_ASSIGN_OR_RETURN(r.architecture, o.Str("architecture"));
  K3_ASSIGN_OR_RETURN(r.num_hidden_layers, o.Uint<uint32_t>("num_hidden_layers"));
  K3_ASSIGN_OR_RETURN(r.active_moe_layer_ids, o.UintList<uint32_t>("active_moe_layer_ids"));
  K3_ASSIGN_OR_RETURN(r.num_experts, o.Uint<uint32_t>("num_experts"));
  K3_ASSIGN_OR_RETURN(r.num_experts_per_token, o.Uint<uint32_t>("num_experts_per_token"));
  K3_ASSIGN_OR_RETURN(r.num_shared_experts, o.Uint<uint32_t>("num_shared_experts"));
  K3_ASSIGN_OR_RETURN(r.hidden_size, o.Uint<uint64_t>("hidden_size"));
  K3_ASSIGN_OR_RETURN(r.routed_expert_hidden_size, o.Uint<uint64_t>("routed_expert_hidden_size"));
  K3_ASSIGN_OR_RETURN(r.moe_intermediate_size, o.Uint<uint64_t>("moe_intermediate_size"));
  K3_ASSIGN_OR_RETURN(r.hidden_act, o.Str("hidden_act"));
  return r;
}

Result<TokenizerRecord> TokenizerOf(const Obj& o) {
  TokenizerRecord r;
  K3_ASSIGN_OR_RETURN(r.path, o.Str("path"));
  auto file_of = [](const Obj& f) -> Result<TokenizerFile> {
    TokenizerFile t;
    K3_ASSIGN_OR_RETURN(t.name, f.Str("name"));
    K3_ASSIGN_OR_RETURN(t.size, f.Uint<uint64_t>("size"));
    K3_ASSIGN_OR_RETURN(t.sha256, f.Str("sha256"));
    return t;
  };
  K3_ASSIGN_OR_RETURN(r.files, ParseList<TokenizerFile>(o, "files", file_of));
  K3_ASSIGN_OR_RETURN(r.inventory_sha256, o.Str("inventory_sha256"));
  return r;
}

Result<LayerRolesRecord> LayerRolesOf(const Obj& o) {
  LayerRolesRecord r;
  K3_ASSIGN_OR_RETURN(r.layer, o.Uint<uint32_t>("layer"));
  K3_ASSIGN_OR_RETURN(r.object_bytes, o.Uint<uint64_t>("object_bytes"));
  for (pack::Role role : pack::kRoleOrder) {
    K3_ASSIGN_OR_RETURN(Obj ro, o.Child(pack::RoleName(role)));
    LayerRoleInfo& info = r.roles[static_cast<size_t>(role)];
    K3_ASSIGN_OR_RETURN(info.dtype, ro.Str("dtype"));
    K3_ASSIGN_OR_RETURN(info.dtype_id, ro.Uint<uint32_t>("dtype_id"));
    K3_ASSIGN_OR_RETURN(info.expert_bytes, ro.Uint<uint64_t>("expert_bytes"));
  }
  return r;
}

}  // namespace

Result<json> ReadManifestJson(const std::string& path) {
  // SGLang's read_text() of a directory; ours said "cannot read M: read
  // failed at offset 0", though the CLI takes the directory holding the
  // manifest (the Python API takes the file, as SGLang does).
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    const std::string inside = (std::filesystem::path(path) / kDefaultManifestName).string();
    return PyIsADirectoryError(path).WithHint(PathExists(inside)
                                                  ? "pass the manifest in it: " + inside
                                                  : "pass the adapter manifest file `k3pack build` or `k3pack "
                                                    "manifest` wrote, not a directory");
  }
  // A shard or pack given where the manifest goes is named as such, and not
  // read whole (a shard is tens of GB) to find that it is no JSON.
  const FileStart kind = ClassifyFileStart(path);
  if (kind == FileStart::kGguf || kind == FileStart::kExpertPack || kind == FileStart::kTrace) {
    return Error(path + " is " + DescribeFileStart(path) + ", not a manifest")
        .WithHint("pass the adapter manifest `k3pack build` or `k3pack manifest` wrote (" +
                  std::string(kDefaultManifestName) + " beside the pack), or the directory holding it");
  }
  auto text = ReadFileToString(path);
  if (!text.ok()) return text.error();
  // Python's json.loads refuses what the server reads with read_text().
  if (text->starts_with("\xEF\xBB\xBF")) {
    return Error(path + ": manifest is not valid JSON: Unexpected UTF-8 BOM (decode using utf-8-sig): line 1 column 1 "
                        "(char 0)");
  }
  auto j = ParseJsonText(*text);  // the parser's position helps find the damage
  if (!j.ok()) return Error(path + ": manifest is not valid JSON: " + j.error().message());
  return j;
}

Result<ShardRecord> ParseShardRecord(const json& j) {
  Obj o(j, "shard");
  K3_RETURN_IF_ERROR(o.Check());
  return ShardOf(o);
}
Result<TensorRecord> ParseTensorRecord(const json& j) {
  Obj o(j, "tensor");
  K3_RETURN_IF_ERROR(o.Check());
  return TensorOf(o);
}
Result<RoleRecord> ParseRoleRecord(const json& j) {
  Obj o(j, "role");
  K3_RETURN_IF_ERROR(o.Check());
  return RoleOf(o);
}
Result<SourceRecord> ParseSourceRecord(const json& j) {
  Obj o(j, "source");
  K3_RETURN_IF_ERROR(o.Check());
  return SourceOf(o);
}
Result<ExpertPackRecord> ParseExpertPackRecord(const json& j) {
  Obj o(j, "expert_pack");
  K3_RETURN_IF_ERROR(o.Check());
  return ExpertPackOf(o);
}
Result<ModelRecord> ParseModelRecord(const json& j) {
  Obj o(j, "model");
  K3_RETURN_IF_ERROR(o.Check());
  return ModelOf(o);
}
Result<TokenizerRecord> ParseTokenizerRecord(const json& j) {
  Obj o(j, "tokenizer");
  K3_RETURN_IF_ERROR(o.Check());
  return TokenizerOf(o);
}

Result<std::optional<K3packExtension>> ParseK3packExtension(const json& manifest) {
  Obj root(manifest, "");
  K3_RETURN_IF_ERROR(root.Check());
  if (!root.Has("k3pack")) return std::optional<K3packExtension>();
  K3_ASSIGN_OR_RETURN(Obj ext, root.Child("k3pack"));
  K3packExtension e;
  K3_ASSIGN_OR_RETURN(e.profile, ext.Str("profile"));
  if (e.profile != kScaledProfileName && e.profile != kKimiProfileName) {
    return Error("manifest k3pack.profile: unknown profile '" + e.profile + "' (expected 'scaled' or 'kimi-k3')");
  }
  if (e.scaled()) {
    K3_ASSIGN_OR_RETURN(e.layer_roles, ParseList<LayerRolesRecord>(ext, "layer_roles", LayerRolesOf));
  }
  if (ext.Has("ep")) {
    K3_ASSIGN_OR_RETURN(Obj ep, ext.Child("ep"));
    EpRecord r;
    K3_ASSIGN_OR_RETURN(r.size, ep.Uint<uint32_t>("size"));
    K3_ASSIGN_OR_RETURN(r.rank, ep.Uint<uint32_t>("rank"));
    K3_ASSIGN_OR_RETURN(r.first_expert, ep.Uint<uint32_t>("first_expert"));
    K3_ASSIGN_OR_RETURN(r.end_expert, ep.Uint<uint32_t>("end_expert"));
    // The range must be the one ep.h assigns to (size, rank), whatever the
    // expert count: equal blocks, rank r's starting at r blocks in.
    const uint32_t count = r.end_expert - r.first_expert;
    if (r.size == 0 || r.rank >= r.size || r.end_expert <= r.first_expert || r.first_expert != r.rank * count)
      return Error("manifest k3pack.ep: experts [" + std::to_string(r.first_expert) + ", " +
                   std::to_string(r.end_expert) + ") are not the block EP rank " + std::to_string(r.rank) + " of " +
                   std::to_string(r.size) + " owns; the manifest was edited");
    e.ep = r;
  }
  return std::optional<K3packExtension>(std::move(e));
}

Result<Manifest> ParseManifest(const json& j) {
  Obj root(j, "");
  K3_RETURN_IF_ERROR(root.Check());
  Manifest m;
  K3_ASSIGN_OR_RETURN(m.complete, root.Bool("complete"));
  K3_ASSIGN_OR_RETURN(m.format, root.Str("format"));
  K3_ASSIGN_OR_RETURN(m.created_at, root.Str("created_at"));
  K3_ASSIGN_OR_RETURN(m.sglang_git_sha, root.Str("sglang_git_sha"));
  K3_ASSIGN_OR_RETURN(const json* hc, root.Get("hard_constraints"));
  m.hard_constraints = *hc;
  K3_ASSIGN_OR_RETURN(Obj model, root.Child("model"));
  K3_ASSIGN_OR_RETURN(m.model, ModelOf(model));
  K3_ASSIGN_OR_RETURN(Obj source, root.Child("source"));
  K3_ASSIGN_OR_RETURN(m.source, SourceOf(source));
  K3_ASSIGN_OR_RETURN(Obj pack, root.Child("expert_pack"));
  K3_ASSIGN_OR_RETURN(m.expert_pack, ExpertPackOf(pack));
  if (root.Has("tokenizer") && !j["tokenizer"].is_null()) {
    K3_ASSIGN_OR_RETURN(Obj tok, root.Child("tokenizer"));
    K3_ASSIGN_OR_RETURN(m.tokenizer, TokenizerOf(tok));
  } else {
    m.tokenizer.recorded = false;
  }
  K3_ASSIGN_OR_RETURN(Obj ver, root.Child("verification"));
  K3_ASSIGN_OR_RETURN(m.verification.structure, ver.Str("structure"));
  K3_ASSIGN_OR_RETURN(m.verification.payload_samples, ver.Int("payload_samples"));
  K3_ASSIGN_OR_RETURN(m.verification.full_source_hashes, ver.Bool("full_source_hashes"));
  K3_ASSIGN_OR_RETURN(m.verification.full_pack_hash, ver.Bool("full_pack_hash"));
  K3_ASSIGN_OR_RETURN(m.k3pack, ParseK3packExtension(j));
  return m;
}

Result<Manifest> ParseManifestOf(const json& j, const std::string& path) {
  auto m = ParseManifest(j);
  if (!m.ok() && m.error().kind() != ErrorKind::kKey) return m.error().WithContext(path);
  if (!m.ok() && m.error().message().find('\n') == std::string::npos) {
    // SGLang's loader raises a bare KeyError (the key's repr, the first line);
    // the hint says which file lacks it, or that it is no manifest at all.
    if (std::string why = WhyNotAFinishedManifest(j, path); !why.empty()) return m.error().WithHint(why);
    return WithMissingKeyHint(m.error(), path, "SGLang's loader");
  }
  return m;
}

Result<Manifest> ReadManifest(const std::string& path) {
  K3_ASSIGN_OR_RETURN(json j, ReadManifestJson(path));
  return ParseManifestOf(j, path);
}

}  // namespace k3pack::manifest
