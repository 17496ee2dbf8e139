// k3pack verify: checks an expert pack against its manifest: the GGUF shards
// are the ones recorded (size + metadata digest), the pack structure passes
// SGLang's validator and matches the manifest's expert_pack section, then
// payloads: sampled byte compares with the GGUF source (default), or every
// payload against the digest sidecar (--full), optionally also the source.
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "k3pack/manifest.h"
#include "k3pack/pack.h"
#include "pack/progress.h"
#include "util/file.h"
#include "util/format.h"
#include "util/sha256.h"

namespace k3pack::cli {
namespace {

constexpr const char* kCmd = "verify";

kimi::ModelSpec SpecOf(const manifest::Manifest& m) {
  kimi::ModelSpec s;
  s.num_hidden_layers = m.model.num_hidden_layers;
  s.num_experts = m.model.num_experts;
  s.top_k = m.model.num_experts_per_token;
  s.num_shared_experts = m.model.num_shared_experts;
  s.hidden_size = m.model.hidden_size;
  s.routed_expert_hidden_size = m.model.routed_expert_hidden_size;
  s.moe_intermediate_size = m.model.moe_intermediate_size;
  s.hidden_act = m.model.hidden_act;
  s.active_moe_layer_ids = m.model.active_moe_layer_ids;
  s.first_k_dense_replace = s.active_moe_layer_ids.empty() ? 0 : s.active_moe_layer_ids.front();
  s.profile = m.profile();
  return s;
}

// Every shard recorded in the manifest is still the same file: present, same
// size, same header bytes (a same-size re-conversion changes the header).
Status CheckShards(const manifest::Manifest& m) {
  for (const auto& s : m.source.shards) {
    if (!PathExists(s.path)) {
      return Error("GGUF shard recorded in the manifest is missing: " + s.path, ErrorKind::kFileNotFound);
    }
    K3_ASSIGN_OR_RETURN(uint64_t size, FileSize(s.path));
    if (size != s.size) {
      return Error("GGUF shard " + s.path + " changed since the manifest was written: size " + std::to_string(size) +
                   " != " + std::to_string(s.size))
          .WithHint("rebuild the pack and manifest (`k3pack build`) from the current shards");
    }
    K3_ASSIGN_OR_RETURN(std::string meta, Sha256FileRange(s.path, 0, s.metadata_nbytes));
    if (meta != s.metadata_sha256) {
      return Error("GGUF shard " + s.path + " changed since the manifest was written: metadata_sha256 " + meta +
                   " != " + s.metadata_sha256)
          .WithHint("the file has the same size but a different header (re-converted or edited); rebuild the pack "
                    "and manifest (`k3pack build`) from the current shards");
    }
  }
  return Status::OK();
}

// The validator's fresh view of the pack must equal what the manifest recorded.
Status CompareSection(const nlohmann::json& fresh, const nlohmann::json& recorded) {
  for (const char* key : {"size", "index_count", "data_start", "index_sha256", "object_bytes", "roles", "magic",
                          "version", "header_bytes", "entry_bytes", "alignment", "active_moe_layer_ids",
                          "num_experts", "top_k", "physical_role_order"}) {
    if (!recorded.contains(key)) return Error("'" + std::string(key) + "'", ErrorKind::kKey);
    if (fresh.at(key) != recorded.at(key)) {
      std::string text = std::string("manifest expert_pack.") + key + " does not match the pack: manifest=" +
                         recorded.at(key).dump() + ", pack=" + fresh.at(key).dump();
      if (std::string(key) == "index_sha256") text = "Kimi expert-pack index SHA-256 does not match manifest\n" + text;
      if (std::string(key) == "size") text = "Kimi expert-pack size does not match its manifest\n" + text;
      return Error(text);
    }
  }
  return Status::OK();
}

Result<nlohmann::json> Run(const Args& args) {
  const std::string manifest_path = args.Get("--manifest");
  const bool full = args.Has("--full");
  int64_t samples = 6;
  if (args.Has("--samples")) {
    if (full) return Error("--samples and --full are mutually exclusive");
    K3_ASSIGN_OR_RETURN(samples, args.GetInt("--samples"));
    if (samples < 0) return Error("--samples must be non-negative");
  }
  K3_ASSIGN_OR_RETURN(pack::ProgressMode mode, pack::ParseProgressMode(args.Get("--progress"), StderrIsTty()));
  K3_ASSIGN_OR_RETURN(manifest::Manifest m, manifest::ReadManifest(manifest_path));
  if (!m.complete || m.format != manifest::kManifestFormat) {
    return Error("Kimi expert-pack manifest is incomplete or unsupported");
  }
  const std::string pack_path = m.expert_pack.path;
  if (!PathExists(pack_path)) {
    return Error("Kimi expert-pack or manifest is missing: " + pack_path + ", " + manifest_path,
                 ErrorKind::kFileNotFound);
  }
  K3_RETURN_IF_ERROR(CheckShards(m));

  std::vector<pack::SourceTensor> tensors;
  for (const auto& t : m.source.tensors) {
    tensors.push_back({t.name, t.shape, t.dtype_id, t.shard_index, t.data_offset, t.nbytes});
  }
  std::vector<std::string> shard_paths;
  for (const auto& s : m.source.shards) shard_paths.push_back(s.path);
  pack::CollectOptions copts;
  copts.allow_mixed_types = m.profile() == kimi::Profile::kScaled;
  K3_ASSIGN_OR_RETURN(pack::ExpertSet experts, pack::CollectExperts(tensors, shard_paths, SpecOf(m), copts));

  pack::ValidateOptions vopts;
  vopts.payload_samples = 0;
  K3_ASSIGN_OR_RETURN(nlohmann::json fresh, pack::ValidatePack(pack_path, experts, vopts));
  K3_ASSIGN_OR_RETURN(nlohmann::json raw, manifest::ReadManifestJson(manifest_path));
  K3_RETURN_IF_ERROR(CompareSection(fresh, raw.at("expert_pack")));

  pack::VerifyOptions o;
  o.progress = pack::MakeProgressPrinter(mode);
  std::string payload_mode;
  if (full) {
    o.against_digests = true;
    o.against_source = args.Has("--against-source");
    payload_mode = o.against_source ? "full+source" : "full";
  } else {
    o.against_digests = false;
    o.against_source = true;
    o.entries = pack::SampleIndices(fresh["index_count"].get<uint64_t>(), samples);
    payload_mode = "samples";
  }
  pack::VerifyResult vr;
  if (full || !o.entries.empty()) {
    K3_ASSIGN_OR_RETURN(vr, pack::VerifyPayloads(pack_path, experts, o));
  }
  return nlohmann::json{{"manifest", manifest_path},
                        {"pack", pack_path},
                        {"structure", "ok"},
                        {"index_sha256", fresh["index_sha256"]},
                        {"shards_checked", m.source.shards.size()},
                        {"payload_mode", payload_mode},
                        {"entries_checked", vr.entries_checked},
                        {"bytes_checked", vr.bytes_checked},
                        {"seconds", vr.seconds},
                        {"mb_per_s", vr.MBps()}};
}

int RunVerify(const std::vector<std::string>& argv) {
  Args args(kCmd, "k3pack verify --manifest M.json [--samples N | --full [--against-source]] [--json]",
            "Verify an expert pack against its manifest: source shards unchanged (size + header digest), pack\n"
            "structure (SGLang's validator) and index digest, then payloads: N evenly spaced entries byte-compared\n"
            "with the GGUF source (default 6), or every payload against the <pack>.digests sidecar (--full).");
  args.Option("--manifest", "manifest JSON written by `k3pack manifest` / `k3pack build`", std::nullopt, true)
      .Option("--samples", "evenly spaced payloads compared with the GGUF source (default 6)")
      .Flag("--full", "hash every payload and compare with the digest sidecar")
      .Flag("--against-source", "with --full: also compare every payload with the GGUF source")
      .Option("--progress", "auto | bar | json | none", "auto")
      .Flag("--json", "print the result as JSON");
  int code = 0;
  if (!args.Parse(argv, &code)) return code;
  if (args.Has("--against-source") && !args.Has("--full")) {
    std::fprintf(stderr, "k3pack verify: error: --against-source needs --full\n");
    return 2;
  }
  auto r = Run(args);
  if (!r.ok()) return ReportError(kCmd, r.error());
  const auto& j = *r;
  if (args.Has("--json")) {
    std::cout << j.dump(2) << "\n";
  } else {
    std::printf("EXPERT_PACK_VERIFIED path=%s index_sha256=%s\n", j["pack"].get<std::string>().c_str(),
                j["index_sha256"].get<std::string>().c_str());
    std::printf("  shards: %zu unchanged; structure ok; payloads (%s): %llu entries, %s in %s (%.1f MB/s)\n",
                j["shards_checked"].get<size_t>(), j["payload_mode"].get<std::string>().c_str(),
                j["entries_checked"].get<unsigned long long>(), HumanBytes(j["bytes_checked"].get<uint64_t>()).c_str(),
                HumanDuration(j["seconds"].get<double>()).c_str(), j["mb_per_s"].get<double>());
  }
  return 0;
}

}  // namespace

K3_COMMAND("verify", "verify a pack against its manifest (sampled or full payload checks)", RunVerify);

}  // namespace k3pack::cli
