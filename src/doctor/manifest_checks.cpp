// Manifest checks: what SGLang's non-expert iterator and expert store verify
// at start-up (format, completeness, constraints, dimensions, shard sizes,
// tensor inventories and types, pack presence, size and index digest), each
// reported on its own. Works on the raw JSON so that one missing key does not
// hide the others.
#include <algorithm>
#include <filesystem>
#include <set>

#include "doctor/internal.h"
#include "k3pack/loader.h"
#include "k3pack/manifest.h"
#include "k3pack/pack.h"
#include "k3pack/store.h"
#include "manifest/json_fields.h"
#include "manifest/loader_rules.h"
#include "manifest/manifest_output.h"
#include "manifest/recorded_inputs.h"
#include "pack/pack_output.h"
#include "util/format.h"
#include "util/sha256.h"
#include "util/json_text.h"

namespace k3pack::doctor::internal {

namespace fs = std::filesystem;
using nlohmann::json;
using manifest::fields::Find;

namespace {

std::string Dotted(std::initializer_list<const char*> path) {
  std::string s;
  for (const char* k : path) s += (s.empty() ? "" : ".") + std::string(k);
  return s;
}

// A rule's error as a finding shows it: SGLang's text (the first line), and
// k3pack's hint, if any, after the finding's own message.
std::string HintOf(const Error& e) { return e.hint().empty() ? std::string() : "; " + e.hint(); }

// The commands that repair the manifest's pack, with its own paths: a pack
// whose structure or size changed is rebuilt with its manifest (`build
// --force`; `pack --restart` refuses a finished pack and `--repair-damaged`
// needs the layout intact), damaged payloads are rewritten in place.
std::string RebuildCommand(const json& j, const std::string& pack, const std::string& manifest_path) {
  return "`k3pack build " + manifest::RecordedShardDirOr(j) + manifest::RankFlagsOf(j) + " --model-config " +
         manifest::RecordedPathOr(j, {"model", "config_path"}, "CONFIG") + " --tokenizer-dir " +
         manifest::RecordedPathOr(j, {"tokenizer", "path"}, "TOKENIZER_DIR") + " --pack " + ShellQuoted(pack) +
         " --manifest " + ShellQuoted(manifest_path) + " --force`";
}

std::string RepairPayloadsCommand(const json& j, const std::string& pack) {
  return "`k3pack pack --repair-damaged --gguf-dir " + manifest::RecordedShardDirOr(j) + " --model-config " +
         manifest::RecordedPathOr(j, {"model", "config_path"}, "CONFIG") + " --pack " + ShellQuoted(pack) + "`";
}

// The command that rewrites the manifest from the files it records, keeping
// the pack: the fix for records edited by hand.
std::string RewriteManifestCommand(const json& j, const std::string& manifest_path) {
  return "`" + manifest::RewriteManifestCommand(j, manifest_path) + "`";
}

std::vector<std::string> RecordedShardPaths(const json& j) {
  std::vector<std::string> paths;
  const json* shards = Find(j, {"source", "shards"});
  if (shards == nullptr || !shards->is_array()) return paths;
  for (const json& s : *shards) {
    if (s.is_object() && s.contains("path") && s["path"].is_string()) paths.push_back(s["path"].get<std::string>());
  }
  return paths;
}

// The manifest's source records (every shard and tensor record, the summary
// and inventory_sha256) against the shards, with the comparison verify runs
// (manifest/recorded_inputs.h), cheap form: sizes and header digests, no
// whole-file hashing. What the shard loop of CheckManifest already reports
// (a missing, resized or re-headed shard, changed tensor names or types) is
// left to it.
void CheckSourceRecords(const json& j, const std::string& manifest_path, Collector& out) {
  using Kind = manifest::SourceDifference::Kind;
  auto diffs = manifest::CompareSourceWithShardsAll(j.at("source"));
  if (!diffs.ok()) {
    // A shard this process could not read (ulimit -n / -v, permissions) is
    // not a manifest that disagrees with its shards.
    if (!ReportProcessCannotRead(diffs.error(), FileNamedIn(diffs.error(), RecordedShardPaths(j), manifest_path),
                                 out)) {
      out.Add("manifest-invalid", "source", diffs.error().message(), {}, manifest_path);
    }
    return;
  }
  const std::string rewrite = RewriteManifestCommand(j, manifest_path);
  for (const manifest::SourceDifference& d : *diffs) {
    if (d.kind == Kind::kShardMissing || d.kind == Kind::kShardUnreadable ||
        (d.kind == Kind::kShard && (d.field == "size" || d.field == "metadata_sha256")) ||
        (d.kind == Kind::kTensorSet && !d.tensor.empty()) || (d.kind == Kind::kTensor && d.field == "dtype")) {
      continue;  // reported by the shard loop (or the GGUF examination)
    }
    std::string record = "source.inventory_sha256", object = record;
    if (d.kind == Kind::kShard) {
      record = "source.shards[" + d.shard_path + "]";
      object = d.shard_path;
    } else if (d.kind == Kind::kTensor) {
      record = "source.tensors[" + d.tensor + "]";
      object = d.tensor;
    } else if (d.kind == Kind::kTensorSet) {
      record = object = "source.tensors";
    } else if (d.kind == Kind::kSummary) {
      record = object = "source.summary";
    }
    const bool one_field = d.kind == Kind::kShard || d.kind == Kind::kTensor || d.kind == Kind::kSummary;
    std::string message = record + (one_field ? "." + d.field : std::string()) + ": " + d.detail;
    if (d.kind == Kind::kInventory && !d.unhashed_sha256.empty()) {
      message += "; every record doctor recomputed matches, so the digest itself or the whole-file sha256 recorded "
                 "for one of " + std::to_string(d.unhashed_sha256.size()) +
                 " shard(s) was edited (doctor does not hash whole shards)";
    }
    Finding& f = out.Add("manifest-source-record", object, message, {}, d.shard_path.empty() ? manifest_path : d.shard_path);
    f.details = {{"record", record}, {"field", d.field}};
    if (!d.shard_path.empty()) f.details["shard"] = d.shard_path;
    if (!d.tensor.empty()) f.details["tensor"] = d.tensor;
    f.fix = "Rewrite the manifest from the files it records (the pack is kept): " + rewrite + ".";
    if (!d.unhashed_sha256.empty()) {
      f.details["unhashed_sha256"] = d.unhashed_sha256;
      f.fix += " To see which shard's recorded sha256 differs first, `k3pack verify --manifest " + manifest_path +
               " --full` hashes every shard.";
    }
  }
}

// SGLang's pack validation, run on the manifest's own records. Without the
// recorded source shards (`shards_intact` false) the payload samples, which
// read them, are skipped: a missing shard is not a damaged pack.
void ValidatePackAgainstManifest(const json& j, const std::string& pack, const std::string& manifest_path,
                                 bool shards_intact, const DiagnoseOptions& options, Collector& out) {
  const json* model = Find(j, {"model"});
  auto source = manifest::ParseSourceRecord(j.contains("source") ? j["source"] : json());
  if (model == nullptr || !source.ok() || !model->contains("active_moe_layer_ids") ||
      !(*model)["active_moe_layer_ids"].is_array() || (*model)["active_moe_layer_ids"].empty()) {
    out.Add("check-skipped", "expert pack validation", "the manifest's model/source records are unusable");
    return;
  }
  json cfg = *model;
  cfg["first_k_dense_replace"] = (*model)["active_moe_layer_ids"][0];
  auto spec = kimi::ModelSpecFromConfig(cfg, options.profile);
  if (!spec.ok()) {
    out.Add("check-skipped", "expert pack validation", "model record: " + spec.error().message());
    return;
  }
  auto experts = manifest::ExpertsOfSource(*source, *spec, options.profile == kimi::Profile::kScaled);
  if (!experts.ok()) {
    out.Add("check-skipped", "expert pack validation", "routed experts of the manifest: " + experts.error().message());
    return;
  }
  pack::ValidateOptions vo;
  vo.payload_samples = options.pack_payload_samples;
  if (!shards_intact && vo.payload_samples > 0) {
    vo.payload_samples = 0;
    out.Add("check-skipped", "expert pack payload samples",
            "the manifest's source shards are missing or changed (reported above), so pack payloads were not "
            "compared with them");
  }
  // A rank pack's manifest: sample only the rank's payloads (the others are holes by design).
  if (auto ext = manifest::ParseK3packExtension(j); ext.ok() && *ext && (*ext)->ep) {
    vo.ep = ep::Rank{(*ext)->ep->size, (*ext)->ep->rank};
  }
  auto v = pack::ValidatePack(pack, *experts, vo);
  if (!v.ok() && !ReportProcessCannotRead(v.error(), FileNamedIn(v.error(), experts->shard_paths, pack), out)) {
    const std::string msg = v.error().message();
    Finding& f = out.Add("pack-invalid", pack, msg, v.error().headline(), pack);
    if (msg.rfind("expert-pack payload does not match GGUF source", 0) == 0) {
      f.fix = "Rewrite the damaged payloads from the source shards: " + RepairPayloadsCommand(j, pack) +
              " (or rerun `k3pack build` with --restart).";
    } else if (const std::string other = pack::NotAPackFile(pack); !other.empty()) {
      // `build --force` never replaces a file that is not a pack (a user's
      // file given as --pack by a slip): the rebuild it was told failed.
      f.fix = "Its first bytes are not an Expert Pack's (" + other + "), so `--force` will not replace it: " +
              "rewrite its header and any damaged payload in place from the source shards with " +
              RepairPayloadsCommand(j, pack) + ", or remove the file yourself and rebuild with " +
              RebuildCommand(j, pack, manifest_path) + ".";
    } else {
      f.fix = "Rebuild the pack and its manifest: " + RebuildCommand(j, pack, manifest_path) + ".";
    }
  }
}

// Finds a key of the manifest, reporting it once when missing with the name
// SGLang's KeyError gives.
class KeyFinder {
 public:
  KeyFinder(const json& j, const std::string& manifest_path, Collector& out)
      : j_(j), manifest_path_(manifest_path), out_(out) {}
  const json* operator()(std::initializer_list<const char*> path) const {
    const json* v = Find(j_, path);
    if (v == nullptr) {
      out_.Add("manifest-invalid", Dotted(path), "key is missing", "'" + std::string(*(path.end() - 1)) + "'",
               manifest_path_);
    }
    return v;
  }

 private:
  const json& j_;
  const std::string& manifest_path_;
  Collector& out_;
};

// The store's and the non-expert loader's checks on the manifest alone,
// every one a manifest breaks (the loaders stop at the first). The rules are
// the loaders' own functions; `options.profile` says which constants hold (a
// scaled manifest checked under kimi-k3 is held to SGLang's K3 rules). Keys
// that are missing were reported by `need`.
void CheckLoaderRules(const json& j, const DiagnoseOptions& options, const std::string& manifest_path,
                      const KeyFinder& need, Collector& out) {
  const bool kimi = options.profile == kimi::Profile::kKimiK3;
  const json* format = Find(j, {"format"});
  if (!manifest::FormatSupported(j)) {
    out.Add("manifest-format", "format", format == nullptr ? "no format key" : "format is " + format->dump(),
            "Kimi-K3 manifest format is unsupported", manifest_path);
  }
  const json* complete = Find(j, {"complete"});
  if (!manifest::MarkedComplete(j)) {
    out.Add("manifest-incomplete", "complete", complete == nullptr ? "no complete key" : "complete is " + complete->dump(),
            "Kimi-K3 manifest is incomplete", manifest_path);
  }
  if (Status hc = manifest::CheckHardConstraints(j, kimi); !hc.ok()) {
    const json* v = Find(j, {"hard_constraints"});
    out.Add("manifest-hard-constraints", "hard_constraints",
            (v == nullptr ? std::string("no hard_constraints key") : "hard_constraints is " + v->dump()) +
                HintOf(hc.error()),
            hc.error().headline(), manifest_path);
  }
  const json* layers = need({"model", "num_hidden_layers"});
  const json* experts = need({"model", "num_experts"});
  const json* topk = need({"model", "num_experts_per_token"});
  const json* active = need({"model", "active_moe_layer_ids"});
  const json* model = Find(j, {"model"});
  if (model == nullptr) return;
  if (auto dims = manifest::CheckDimensions(*model, kimi); !dims.ok() && layers && experts && topk) {
    out.Add("manifest-dimensions", "model",
            "layers/experts/top-k are " + layers->dump() + "/" + experts->dump() + "/" + topk->dump() +
                HintOf(dims.error()),
            dims.error().headline(), manifest_path);
  }
  if (active == nullptr) return;
  std::vector<manifest::LayerRolesRecord> roles;
  if (!kimi) {
    // The store holds a scaled manifest's list to the layers the pack was
    // built for, which its k3pack.layer_roles records: without them (or
    // without a layer count to bound the ids) there is nothing to hold it to.
    auto ext = manifest::ParseK3packExtension(j);
    if (!ext.ok() || !*ext || (*ext)->layer_roles.empty() || !layers || !layers->is_number_unsigned()) return;
    roles = (*ext)->layer_roles;
  }
  if (auto ids = manifest::CheckActiveLayers(*model, kimi, kimi ? 0 : layers->get<uint64_t>(), roles); !ids.ok()) {
    std::string detail = "active layers are not 1..92";
    if (!kimi) {
      json want = json::array();
      for (const auto& lr : roles) want.push_back(lr.layer);
      detail = "active layers are " + active->dump() + ", k3pack.layer_roles records " + want.dump();
    }
    out.Add("manifest-dimensions", "model.active_moe_layer_ids", detail, ids.error().headline(), manifest_path);
  }
}

// What the shard loop compares a shard record with, and the fixes it offers.
struct ShardRecordContext {
  const json& j;
  const std::string& manifest_path;
  std::map<uint64_t, std::map<std::string, std::string>> listed;  // shard index -> tensor name -> dtype (JSON)
  std::string rebuild;     // the pack and manifest rebuilt for the shards as they are
  std::string regenerate;  // the manifest rewritten for the shards as they are
};

ShardRecordContext ShardRecordContextOf(const json& j, const std::string& manifest_path, const json* tensors) {
  ShardRecordContext c{j, manifest_path, {}, {}, {}};
  if (tensors && tensors->is_array()) {
    for (const json& t : *tensors) {
      // (A shard_index of another type is the source-record comparison's to report.)
      if (t.contains("shard_index") && t["shard_index"].is_number_unsigned() && t.contains("name") &&
          t.contains("dtype") && t["name"].is_string()) {
        c.listed[t["shard_index"].get<uint64_t>()][t["name"].get<std::string>()] = t["dtype"].dump();
      }
    }
  }
  const json* p = Find(j, {"expert_pack", "path"});
  c.rebuild = RebuildCommand(j, p != nullptr && p->is_string() ? p->get<std::string>() : "PACK", manifest_path);
  // A shard whose names, types or header no longer match its record: the
  // manifest is rewritten for the shards as they are; should the pack no
  // longer match them, `manifest` says so and the rebuild is the fix.
  c.regenerate = "Regenerate the manifest for the shards as they are: " + RewriteManifestCommand(j, manifest_path) +
                 " (if it reports that the pack no longer matches them, rebuild both: " + c.rebuild + ").";
  return c;
}

// The tensor names and types of a shard against those its record lists.
void CheckShardInventory(const std::string& path, const gguf::GgufFile& file,
                         const std::map<std::string, std::string>& listed, const std::string& regenerate,
                         Collector& out) {
  std::map<std::string, std::string> here;
  for (const gguf::TensorInfo& t : file.tensors()) here[t.name] = json(std::string(GgmlTypeName(t.type))).dump();
  std::set<std::string> a, b;
  for (const auto& [n, _] : here) a.insert(n);
  for (const auto& [n, _] : listed) b.insert(n);
  if (a != b) {
    std::vector<std::string> added, removed;
    for (const auto& n : a) if (!b.count(n)) added.push_back(n);
    for (const auto& n : b) if (!a.count(n)) removed.push_back(n);
    Finding& fd = out.Add("manifest-shard-inventory", path,
                          std::to_string(added.size()) + " tensor(s) not in the manifest, " +
                              std::to_string(removed.size()) + " listed but absent",
                          "Kimi-K3 GGUF shard inventory changed: " + path, path);
    fd.details = {{"not_in_manifest", added}, {"absent", removed}};
    fd.fix = regenerate;
  }
  for (const auto& [n, dtype] : here) {
    auto it = listed.find(n);
    if (it != listed.end() && it->second != dtype) {
      out.Add("manifest-tensor-type", n, "type is " + dtype + ", the manifest says " + it->second,
              "Kimi-K3 GGUF tensor type changed: " + n, path)
          .fix = regenerate;
    }
  }
}

// One source.shards record against its file: presence and size, names and
// types, header digest. Returns false when the shard is not the one recorded
// (the pack's payload samples, which read it, are then skipped).
bool CheckShardRecord(const json& s, const ShardRecordContext& c, ManifestTargets& targets, Collector& out) {
  if (!s.contains("path") || !s["path"].is_string() || !s.contains("size") || !s.contains("index")) {
    out.Add("manifest-invalid", "source.shards[]", "shard record without path/size/index", "'path'", c.manifest_path);
    return false;
  }
  const std::string path = s["path"];
  // A record edited by hand can hold any JSON here: get<uint64_t>() of a
  // string threw out of Diagnose.
  if (!s["size"].is_number_unsigned() || !s["index"].is_number_unsigned()) {
    out.Add("manifest-invalid", "source.shards[" + path + "]",
            "size and index must be non-negative integers, the record has size " + s["size"].dump() + ", index " +
                s["index"].dump(),
            {}, c.manifest_path);
    return false;
  }
  const uint64_t index = s["index"].get<uint64_t>();
  targets.shard_paths.push_back(path);  // the loader opens the recorded path, wherever it is
  auto size = FileSize(path);
  if (!size.ok() || *size != s["size"].get<uint64_t>()) {
    Finding& f = out.Add("manifest-shard-changed", path,
                         !size.ok() ? "the file is missing"
                                    : "size is " + std::to_string(*size) + ", the manifest says " + s["size"].dump(),
                         "Kimi-K3 GGUF shard is missing or changed: " + path, path);
    f.details = {{"record", "source.shards[" + path + "]"}, {"field", size.ok() ? "size" : "path"}};
    if (size.ok()) {
      // Another size means other tensor bytes: the pack is rebuilt with its
      // manifest (a record edited by hand is rewritten by the same command).
      f.fix = "Restore the shard the manifest was written for, or rebuild the pack and its manifest for the "
              "shard as it is: " + c.rebuild + ".";
    }
    return false;
  }
  auto f = gguf::GgufFile::Open(path);
  if (!f.ok()) return true;  // the GGUF examination reports it
  static const std::map<std::string, std::string> kNone;
  auto listed = c.listed.find(index);
  CheckShardInventory(path, **f, listed == c.listed.end() ? kNone : listed->second, c.regenerate, out);
  if (s.contains("metadata_nbytes") && !s["metadata_nbytes"].is_number_unsigned()) {
    out.Add("manifest-invalid", "source.shards[" + path + "]",
            "metadata_nbytes must be a non-negative integer, the record has " + s["metadata_nbytes"].dump(), {},
            c.manifest_path);
  } else if (s.contains("metadata_nbytes") && s.contains("metadata_sha256")) {
    auto digest = Sha256FileRange(path, 0, s["metadata_nbytes"].get<uint64_t>());
    if (digest.ok() && *digest != s["metadata_sha256"]) {
      out.Add("manifest-metadata-changed", path, "header bytes hash to " + *digest, {}, path).fix = c.regenerate;
    }
  }
  return true;
}

// The pack the manifest records: presence, size and index digest, then
// SGLang's validation of its structure.
void CheckPackRecord(const json& j, const std::string& manifest_path, bool shards_intact,
                     const DiagnoseOptions& options, const KeyFinder& need, Collector& out) {
  const json* ppath = need({"expert_pack", "path"});
  if (!ppath || !ppath->is_string()) return;
  const std::string pack = *ppath;
  auto size = FileSize(pack);
  if (!size.ok()) {
    out.Add("pack-missing", pack, "the expert pack does not exist",
            "Kimi expert-pack or manifest is missing: " + pack + ", " + manifest_path, manifest_path);
    return;
  }
  const json* psize = need({"expert_pack", "size"});
  if (psize && *psize != *size) {
    Finding& f = out.Add("pack-size", pack, "size is " + std::to_string(*size) + ", the manifest says " + psize->dump(),
                         "Kimi expert-pack size does not match its manifest", pack);
    f.fix = "Rebuild the pack and its manifest: " + RebuildCommand(j, pack, manifest_path) +
            " (a pack whose size changed cannot be repaired in place).";
  }
  const json* count = need({"expert_pack", "index_count"});
  const json* digest = need({"expert_pack", "index_sha256"});
  if (count && digest && count->is_number_unsigned()) {
    // The header and index SGLang hashes; a count whose index would end
    // past 2^64 bytes wrapped to a short range and read as a digest
    // mismatch, where no file can hold it: truncated.
    const uint64_t n = count->get<uint64_t>();
    constexpr uint64_t kHeader = 40, kEntry = 152;
    auto d = n > (UINT64_MAX - kHeader) / kEntry
                 ? Result<std::string>(Error("index_count " + std::to_string(n) + " makes an index longer than any file"))
                 : Sha256FileRange(pack, 0, kHeader + kEntry * n);
    if (!d.ok()) {
      if (ReportProcessCannotRead(d.error(), pack, out)) return;  // nothing else of the pack can be read
      out.Add("pack-invalid", pack, d.error().message(), "Kimi expert-pack index is truncated", pack);
    } else if (*d != *digest) {
      out.Add("pack-index-digest", pack, "index hashes to " + *d, "Kimi expert-pack index SHA-256 does not match manifest",
              pack);
    }
  }
  ValidatePackAgainstManifest(j, pack, manifest_path, shards_intact, options, out);
}

size_t ErrorsIn(const Report& r) {
  return static_cast<size_t>(std::count_if(r.findings.begin(), r.findings.end(),
                                           [](const Finding& f) { return f.severity == Severity::kError; }));
}

// The readers' own opens, after doctor's copy of their rules: a manifest one
// of them refused for a reason those rules do not name (a UTF-8 BOM, a null
// expert_pack.path, a missing data_start or roles entry, a damaged digest
// sidecar) was called healthy. The stores are opened with the manifest's own
// pack path, as `k3pack run-experts` opens them.
void CheckReadersOpen(const json& j, const std::string& manifest_path, Collector& out) {
  const json* p = Find(j, {"expert_pack", "path"});
  const std::string pack = p && p->is_string() ? p->get<std::string>() : std::string();
  store::StoreOptions o;
  o.cache_bytes = uint64_t{1} << 40;  // allocated as objects are read (none are): any pack's working set fits
  o.queue_depth = 1;
  auto refused = [&](const std::string& reader, const Error& e) {
    if (ReportProcessCannotRead(e, manifest_path, out)) return;
    // k3pack's own words: SGLang's store has no such check (a digest sidecar) or would say it otherwise.
    Finding& f = out.Add("manifest-refused", manifest_path, reader + " refuses it: " + e.message(), {}, manifest_path);
    f.details["reader"] = reader;
    if (e.message().find("digest sidecar") == std::string::npos) return;
    const std::string rank = manifest::RankFlagsOf(j);
    f.fix = rank.empty() ? "Rerun `k3pack build " + manifest::RecordedShardDirOr(j) +
                               "`: it compares the pack with the shards and writes a damaged sidecar anew."
                         : "Rebuild that rank (a rank pack's sidecar records its rank, which a damaged one no longer "
                           "tells): `k3pack build " + manifest::RecordedShardDirOr(j) + rank + " --force`.";
  };
  if (auto s = store::ExpertStore::Open(pack, manifest_path, o); !s.ok()) {
    refused("the expert store", s.error());
  } else {
    (void)(*s)->Close();
  }
  if (auto l = loader::NonExpertStream::Open(manifest_path); !l.ok()) refused("the non-expert loader", l.error());
}

}  // namespace

ManifestTargets CheckManifest(const std::string& manifest_path, const DiagnoseOptions& options, Collector& out) {
  auto text = ReadFileToString(manifest_path);
  if (!text.ok()) {
    if (!ReportProcessCannotRead(text.error(), manifest_path, out)) {
      out.Add("input-unrecognized", manifest_path, text.error().message(), {}, manifest_path);
    }
    out.report().unusable = true;
    return {};
  }
  auto parsed = ParseJsonText(*text);
  if (!parsed.ok() || !parsed->is_object()) {
    // A cut-off or hand-broken manifest is the common case: say where it
    // stops parsing rather than only that it is no object.
    const std::string found = parsed.ok() ? "not a JSON object" : "not valid JSON: " + parsed.error().message();
    out.Add("input-unrecognized", manifest_path, found, {}, manifest_path);
    out.report().unusable = true;
    return {};
  }
  const json& j = *parsed;
  out.report().files.push_back(manifest_path);
  const size_t errors_before = ErrorsIn(out.report());
  const KeyFinder need(j, manifest_path, out);

  // SGLang's manifest-only rules, each through its one implementation
  // (manifest/loader_rules.h), each reported on its own.
  CheckLoaderRules(j, options, manifest_path, need, out);

  ManifestTargets targets;
  if (const json* cp = Find(j, {"model", "config_path"}); cp && cp->is_string()) {
    std::error_code ec;
    if (fs::is_regular_file(cp->get<std::string>(), ec)) targets.config_path = *cp;
  }
  if (const json* tp = Find(j, {"tokenizer", "path"}); tp && tp->is_string()) {
    std::error_code ec;
    if (fs::is_directory(tp->get<std::string>(), ec)) targets.tokenizer_dir = *tp;
  }
  const json* shards = need({"source", "shards"});
  const json* tensors = need({"source", "tensors"});
  bool shards_intact = shards != nullptr && shards->is_array();
  if (shards_intact) {
    const ShardRecordContext context = ShardRecordContextOf(j, manifest_path, tensors);
    for (const json& s : *shards) {
      if (!CheckShardRecord(s, context, targets, out)) shards_intact = false;
    }
  }
  // Every other recorded field (offsets, shapes, counts, the summary, the
  // inventory digest), as `k3pack verify` compares them.
  if (shards && shards->is_array() && tensors && tensors->is_array()) CheckSourceRecords(j, manifest_path, out);
  CheckPackRecord(j, manifest_path, shards_intact, options, need, out);
  if (ErrorsIn(out.report()) == errors_before) CheckReadersOpen(j, manifest_path, out);
  return targets;
}

}  // namespace k3pack::doctor::internal
