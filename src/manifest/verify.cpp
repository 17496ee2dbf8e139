// Verifying an expert pack against its manifest (k3pack verify, and
// k3pack.verify_pack in Python): the GGUF shards are the ones recorded
// (size + metadata digest), the pack structure passes SGLang's validator and
// matches the manifest's expert_pack section, then payloads: sampled byte
// compares with the GGUF source, or every payload against the digest sidecar
// (full), optionally also the source.
#include <nlohmann/json.hpp>

#include "k3pack/manifest.h"
#include "k3pack/pack.h"
#include "pack/build_inputs.h"
#include "util/file.h"
#include "util/sha256.h"

namespace k3pack::manifest {

kimi::ModelSpec ModelSpecOf(const Manifest& m) {
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

Result<pack::ExpertSet> ExpertsOf(const Manifest& m) {
  std::vector<pack::SourceTensor> tensors;
  for (const auto& t : m.source.tensors) {
    tensors.push_back({t.name, t.shape, t.dtype_id, t.shard_index, t.data_offset, t.nbytes});
  }
  std::vector<std::string> shard_paths;
  for (const auto& s : m.source.shards) shard_paths.push_back(s.path);
  pack::CollectOptions copts;
  copts.allow_mixed_types = m.profile() == kimi::Profile::kScaled;
  return pack::CollectExperts(tensors, shard_paths, ModelSpecOf(m), copts);
}

namespace {

// Every shard recorded in the manifest is still the same file: present, same
// size, same header bytes (a same-size re-conversion changes the header) and,
// with `whole_files` where the manifest has whole-shard digests
// (--full-source-hashes), the same bytes (a same-size edit of tensor data).
Status CheckShards(const Manifest& m, bool whole_files) {
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
    if (whole_files && s.sha256) {
      K3_ASSIGN_OR_RETURN(std::string whole, Sha256File(s.path));
      if (whole != *s.sha256) {
        return Error("GGUF shard " + s.path + " changed since the manifest was written: sha256 " + whole + " != " +
                     *s.sha256)
            .WithHint("same size and header, different tensor bytes; rebuild the pack and manifest (`k3pack build`) "
                      "from the current shards");
      }
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

// Where the pack's header and index differ from the bytes the manifest's
// inventory implies (the builder's layout): the header field, or the index
// entry with its tensor, expert and field. SGLang's checks name only some of
// these (a flipped byte in a name's NUL padding is seen only by the index
// digest), so this line locates any damage. Empty when the bytes agree.
std::string LocatePrefixDamage(const std::string& pack_path, const pack::ExpertSet& experts) {
  auto layout = pack::LayoutOf(experts);
  if (!layout.ok()) return "";
  const std::vector<uint8_t> want = layout->EncodePrefix();
  auto fd = OpenReadOnly(pack_path);
  if (!fd.ok()) return "";
  std::vector<uint8_t> have(want.size());
  auto got = PreadFull(fd->get(), have.data(), have.size(), 0);
  if (!got.ok()) return "";
  have.resize(*got);
  std::vector<std::string> found;
  uint64_t more = 0;
  int64_t last_entry = -2;  // one report per damaged header / entry
  for (uint64_t at = 0; at < want.size(); ++at) {
    if (at < have.size() && have[at] == want[at]) continue;
    if (at >= have.size()) {
      found.push_back("the header/index is truncated at byte " + std::to_string(at));
      break;
    }
    const int64_t entry =
        at < pack::kHeaderBytes ? -1 : static_cast<int64_t>((at - pack::kHeaderBytes) / pack::kEntryBytes);
    if (entry == last_entry) continue;
    last_entry = entry;
    if (found.size() >= 16) {
      ++more;
      continue;
    }
    if (entry < 0) {
      const char* field = at < 16 ? "magic" : at < 20 ? "version" : at < 24 ? "header_bytes" : at < 32 ? "index_count"
                                                                                                 : "data_start";
      found.push_back("header field " + std::string(field) + " (byte " + std::to_string(at) + ")");
      continue;
    }
    const uint64_t k = (at - pack::kHeaderBytes) % pack::kEntryBytes;
    const char* field = k < 128 ? "name" : k < 132 ? "expert" : k < 136 ? "reserved" : k < 144 ? "offset" : "nbytes";
    const pack::EntrySlot slot = layout->Entry(static_cast<uint64_t>(entry));
    const auto& t = experts.by_layer[slot.active_layer_index][static_cast<uint32_t>(slot.role)];
    found.push_back("index entry " + std::to_string(entry) + " (" + t.tensor.name + " expert " +
                    std::to_string(slot.expert) + "), field " + field + " (byte " + std::to_string(at) + ")");
  }
  std::string text;
  for (const auto& f : found) text += (text.empty() ? "" : "; ") + f;
  if (more) text += "; and " + std::to_string(more) + " more";
  return text.empty() ? "" : "damaged: " + text;
}

}  // namespace

Result<nlohmann::json> VerifyPack(const std::string& manifest_path, const VerifyPackOptions& options) {
  const bool full = options.full;
  if (options.samples < 0) return Error("samples must be non-negative");
  K3_ASSIGN_OR_RETURN(Manifest m, ReadManifest(manifest_path));
  if (!m.complete || m.format != kManifestFormat) {
    return Error("Kimi expert-pack manifest is incomplete or unsupported");
  }
  const std::string pack_path = m.expert_pack.path;
  if (!PathExists(pack_path)) {
    return Error("Kimi expert-pack or manifest is missing: " + pack_path + ", " + manifest_path,
                 ErrorKind::kFileNotFound);
  }
  K3_RETURN_IF_ERROR(CheckShards(m, full));

  K3_ASSIGN_OR_RETURN(pack::ExpertSet experts, ExpertsOf(m));

  pack::ValidateOptions vopts;
  vopts.payload_samples = 0;
  K3_ASSIGN_OR_RETURN(nlohmann::json raw, ReadManifestJson(manifest_path));
  auto validated = pack::ValidatePack(pack_path, experts, vopts);
  Status structure = validated.ok() ? CompareSection(*validated, raw.at("expert_pack")) : validated.status();
  if (!structure.ok()) {
    const std::string where = LocatePrefixDamage(pack_path, experts);
    const Error& e = structure.error();
    if (where.empty()) return e;
    // First line unchanged (SGLang's text where it has one), then the location.
    const size_t nl = e.message().find('\n');
    const std::string msg = nl == std::string::npos ? e.message() + "\n" + where
                                                    : e.message().substr(0, nl) + "\n" + where + e.message().substr(nl);
    return Error(msg, e.kind(), e.sys_errno());
  }
  const nlohmann::json& fresh = *validated;

  pack::VerifyOptions o;
  o.progress = options.progress;
  std::string payload_mode;
  if (full) {
    o.against_digests = true;
    o.against_source = options.against_source;
    payload_mode = o.against_source ? "full+source" : "full";
  } else {
    o.against_digests = false;
    o.against_source = true;
    o.entries = pack::SampleIndices(fresh["index_count"].get<uint64_t>(), options.samples);
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

}  // namespace k3pack::manifest
