// create_manifest: the adapter manifest from GGUF shards, the expert pack,
// the model config and the tokenizer directory (spec §2, §3, §8.2).
#include <sys/time.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <thread>

#include "k3pack/gguf.h"
#include "k3pack/manifest.h"
#include "k3pack/pack.h"
#include "k3pack_version.h"
#include "manifest/pyjson.h"
#include "manifest/recorded_inputs.h"
#include "manifest/scan.h"
#include "pack/build_inputs.h"
#include "util/file.h"
#include "util/sha256.h"

namespace k3pack::manifest {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Path.resolve(strict=True): the path must exist.
Result<std::string> ResolveExisting(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return Error::FromErrno(path, ENOENT);
  return ResolvePath(path);
}

}  // namespace

json HardConstraintsJson() {
  // The literal 16 of SGLang's create_manifest, also for models of another
  // top-k (scaled): SGLang's store compares this dict with its own.
  return {{"top_k", kimi::kK3TopK},
          {"top_k_is_immutable", true},
          {"all_selected_experts_must_execute", true},
          {"expert_pruning_allowed", false},
          {"requantization_allowed", false}};
}

bool HardConstraintsMatch(const json& hard_constraints) { return PyJsonEqual(hard_constraints, HardConstraintsJson()); }

json RankPackHardConstraintsJson() {
  json hc = HardConstraintsJson();
  hc[std::string(kRankPackConstraint)] = true;
  return hc;
}

std::string NowIsoformatUtc() {
  timeval tv{};
  gettimeofday(&tv, nullptr);
  std::tm tm{};
  time_t secs = tv.tv_sec;
  gmtime_r(&secs, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  std::string out = buf;
  if (tv.tv_usec != 0) {
    std::snprintf(buf, sizeof buf, ".%06ld", static_cast<long>(tv.tv_usec));
    out += buf;
  }
  return out + "+00:00";
}

json ModelSectionJson(const kimi::ModelSpec& spec, const std::string& config_path, const std::string& config_sha256) {
  return {{"config_path", config_path},
          {"config_sha256", config_sha256},
          {"architecture", "KimiLinearForCausalLM"},  // SGLang hard-codes this (quirk §11.7)
          {"num_hidden_layers", spec.num_hidden_layers},
          {"active_moe_layer_ids", spec.active_moe_layer_ids},
          {"num_experts", spec.num_experts},
          {"num_experts_per_token", spec.top_k},
          {"num_shared_experts", spec.num_shared_experts},
          {"hidden_size", spec.hidden_size},
          {"routed_expert_hidden_size", spec.routed_expert_hidden_size},
          {"moe_intermediate_size", spec.moe_intermediate_size},
          {"hidden_act", spec.hidden_act}};
}

Result<json> TokenizerSectionJson(const std::string& tokenizer_dir) {
  K3_ASSIGN_OR_RETURN(std::string dir, ResolveExisting(tokenizer_dir));
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return Error::FromErrno(dir, ENOTDIR);
  K3_ASSIGN_OR_RETURN(const std::vector<std::string> names, RegularFileNames(dir, "tokenizer directory"));
  json files = json::array();
  for (const std::string& name : names) {
    if (!IsValidUtf8(name)) return Error("tokenizer file name is not valid UTF-8: " + dir + "/" + name);
    const std::string path = dir + "/" + name;
    K3_ASSIGN_OR_RETURN(uint64_t size, FileSize(path));
    K3_ASSIGN_OR_RETURN(std::string digest, Sha256FileRange(path, 0, size));
    files.push_back({{"name", name}, {"size", size}, {"sha256", digest}});
  }
  const std::string inventory = CanonicalSha256(files);
  return json{{"path", dir}, {"files", std::move(files)}, {"inventory_sha256", inventory}};
}

Result<json> CreateManifest(const CreateOptions& o) {
  auto say = [&](const std::string& s) {
    if (o.progress) o.progress(s);
  };
  if (o.payload_samples < 0) return Error("--payload-samples must be non-negative");

  // Model spec (SGLang's texts) and the config's identity.
  K3_ASSIGN_OR_RETURN(std::string config_path, ResolveExisting(o.model_config));
  K3_ASSIGN_OR_RETURN(kimi::ModelSpec spec, kimi::LoadModelSpec(config_path, o.profile));
  K3_ASSIGN_OR_RETURN(std::string config_sha256, Sha256File(config_path));

  // Shards: discovery and cross-shard checks (ShardSet), then the inventory.
  K3_ASSIGN_OR_RETURN(std::string gguf_dir, ResolveExisting(o.gguf_dir));
  say("scanning GGUF shards in " + gguf_dir);
  K3_ASSIGN_OR_RETURN(gguf::ShardSet shards, gguf::ShardSet::Open(gguf_dir));
  ScanOptions scan_opts;
  scan_opts.full_source_hashes = o.full_source_hashes;
  scan_opts.known_sha256 = o.known_shard_sha256;
  scan_opts.progress = o.progress;
  scan_opts.hash_progress = o.pack_progress;
  scan_opts.interrupt_check = o.interrupt_check;
  K3_ASSIGN_OR_RETURN(json source, ScanSourceJson(shards, scan_opts));

  // Routed experts (§6.1 coverage/shape/dtype checks) and the pack.
  pack::CollectOptions collect;
  collect.allow_mixed_types = o.profile == kimi::Profile::kScaled;
  K3_ASSIGN_OR_RETURN(pack::ExpertSet experts, pack::CollectCheckedExperts(shards, spec, collect));
  // The pack the manifest describes must still be the one at its path once
  // the manifest is made: a `pack --force` beside this one replaces it, and
  // the manifest would record a pack that is no longer there. (A missing
  // pack is the validation's to report, in its words.)
  const Result<FileStamp> pack_stamp = StampFile(o.expert_pack);
  say("validating expert pack " + o.expert_pack);
  std::optional<ep::Rank> rank = o.ep;
  if (const std::string dpath = pack::DigestsPathFor(o.expert_pack); PathExists(dpath)) {
    // A rank pack says so in its digest sidecar (version 3).
    auto d = pack::ReadPackDigests(dpath);
    if (d.ok() && d->ep) {
      if (rank && (rank->size != d->ep->size || rank->rank != d->ep->rank)) {
        return Error(o.expert_pack + " is the pack of expert-parallel " + ep::Describe(*d->ep, d->num_experts) +
                     " (its digest sidecar says so), not of " + ep::Describe(*rank, experts.num_experts));
      }
      rank = d->ep;
    }
  }
  if (rank) K3_RETURN_IF_ERROR(ep::CheckRank(*rank, experts.num_experts));
  pack::ValidateOptions vopts;
  vopts.payload_samples = o.payload_samples;
  vopts.ep = rank;
  vopts.full_pack_hash = o.full_pack_hash;
  vopts.progress = o.pack_progress;
  vopts.interrupt_check = o.interrupt_check;
  K3_ASSIGN_OR_RETURN(json expert_pack, pack::ValidatePack(o.expert_pack, experts, vopts));

  K3_ASSIGN_OR_RETURN(json tokenizer, TokenizerSectionJson(o.tokenizer_dir));
  if (const std::string what = pack_stamp.ok() ? HowFileChanged(o.expert_pack, *pack_stamp) : ""; !what.empty()) {
    const std::string building = pack::BuildInProgressHint(o.expert_pack);
    return Error("the Expert Pack " + o.expert_pack + " changed while its manifest was made: " + what +
                 "; the manifest would record a pack that is no longer there, so none was made")
        .WithHint(building.empty() ? "rerun once nothing writes the pack any more" : building);
  }

  json m = json::object();
  m["format"] = std::string(kManifestFormat);
  m["complete"] = true;
  m["created_at"] = o.created_at.empty() ? NowIsoformatUtc() : o.created_at;
  m["sglang_git_sha"] = o.sglang_git_sha.empty() ? std::string("k3pack-") + K3PACK_VERSION : o.sglang_git_sha;
  m["hard_constraints"] = HardConstraintsJson();
  m["model"] = ModelSectionJson(spec, config_path, config_sha256);
  m["source"] = std::move(source);
  m["expert_pack"] = std::move(expert_pack);
  m["tokenizer"] = std::move(tokenizer);
  m["verification"] = {{"structure", "complete"},
                       {"payload_samples", o.payload_samples},
                       {"full_source_hashes", o.full_source_hashes},
                       {"full_pack_hash", o.full_pack_hash}};
  if (o.profile == kimi::Profile::kScaled) {
    m["k3pack"] = {{"profile", std::string(kScaledProfileName)}, {"layer_roles", pack::LayerRolesJson(experts)}};
  }
  if (rank) {
    // SGLang ignores the extra top-level key, so the constraint it does read
    // carries the refusal (RankPackHardConstraintsJson); the other sections
    // are the full pack's.
    if (!m.contains("k3pack")) m["k3pack"] = {{"profile", std::string(kKimiProfileName)}};
    const ep::ExpertRange owned = ep::OwnedExperts(*rank, experts.num_experts);
    m["k3pack"]["ep"] = {{"size", rank->size}, {"rank", rank->rank}, {"first_expert", owned.first},
                         {"end_expert", owned.end}};
    m["hard_constraints"] = RankPackHardConstraintsJson();
  }
  return m;
}

std::string SerializeManifest(const json& manifest) { return PyJsonDumps(manifest, PyJsonStyle::kIndent2) + "\n"; }

Status WriteManifest(const std::string& path, const json& manifest) {
  // WriteFileAtomic makes the missing directories of the path.
  return WriteFileAtomic(path, SerializeManifest(manifest));
}

json ManifestSummary(const std::string& output_path, const json& m) {
  auto get = [&](const char* a, const char* b) -> json {
    auto ia = m.find(a);
    if (ia == m.end() || !ia->is_object()) return nullptr;
    auto ib = ia->find(b);
    return ib == ia->end() ? json(nullptr) : *ib;
  };
  json source_summary = get("source", "summary");
  auto sub = [&](const char* k) -> json {
    if (!source_summary.is_object() || !source_summary.contains(k)) return nullptr;
    return source_summary[k];
  };
  // As found ("" when missing): json::value() would throw for a format that
  // is not a string, or for a document that is not an object.
  const auto format = m.is_object() ? m.find("format") : m.end();
  return {{"manifest", output_path},
          {"format", format == m.end() ? json("") : *format},
          {"source_shards", sub("shard_count")},
          {"source_tensors", sub("tensor_count")},
          {"pack_entries", get("expert_pack", "index_count")},
          {"pack_index_sha256", get("expert_pack", "index_sha256")},
          {"top_k", get("expert_pack", "top_k")},
          {"payload_samples_verified", get("expert_pack", "payload_samples_verified")}};
}

}  // namespace k3pack::manifest
