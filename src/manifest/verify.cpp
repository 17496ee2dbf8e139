// Verifying an expert pack against its manifest (k3pack verify, and
// k3pack.verify_pack in Python): every input is the one recorded (shards,
// tensor records and inventory digest, model config, tokenizer files; see
// recorded_inputs.h), the pack structure passes SGLang's validator and
// matches the manifest's expert_pack section, then payloads: sampled byte
// compares with the GGUF source, or every payload against the digest sidecar
// (full, then the whole-pack digest where recorded), optionally also the source.
#include <algorithm>

#include <nlohmann/json.hpp>

#include "k3pack/manifest.h"
#include "k3pack/pack.h"
#include "manifest/loader_rules.h"
#include "manifest/manifest_output.h"
#include "manifest/recorded_inputs.h"
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

Result<pack::ExpertSet> ExpertsOfSource(const SourceRecord& source, const kimi::ModelSpec& spec, bool scaled) {
  std::vector<pack::SourceTensor> tensors;
  for (const auto& t : source.tensors) {
    tensors.push_back({t.name, t.shape, t.dtype_id, t.shard_index, t.data_offset, t.nbytes});
  }
  std::vector<std::string> shard_paths;
  for (const auto& s : source.shards) shard_paths.push_back(s.path);
  pack::CollectOptions copts;
  copts.allow_mixed_types = scaled;
  return pack::CollectExperts(tensors, shard_paths, spec, copts);
}

Result<pack::ExpertSet> ExpertsOf(const Manifest& m) {
  return ExpertsOfSource(m.source, ModelSpecOf(m), m.profile() == kimi::Profile::kScaled);
}

namespace {

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

// The whole-pack digest a manifest written with --full-pack-hash records.
// It covers what no per-entry check reads: the padding between payloads and
// the zero fill between the index and data_start. Run after the payload
// checks, so damage inside a payload is named by entry first.
Status CheckWholePackDigest(const std::string& pack_path, const nlohmann::json& recorded,
                            const std::function<Status()>& interrupt_check) {
  auto it = recorded.find("sha256");
  if (it == recorded.end()) {
    if (recorded.value("full_pack_hash", false) == true) {
      return Error("full pack verification requested, but manifest has no full SHA-256")
          .WithHint("expert_pack.full_pack_hash is true but expert_pack.sha256 is missing; rewrite the manifest with "
                    "--full-pack-hash");
    }
    return Status::OK();
  }
  K3_ASSIGN_OR_RETURN(std::string whole, Sha256File(pack_path, interrupt_check));
  if (!it->is_string() || whole != it->get<std::string>()) {
    return Error("Kimi expert-pack SHA-256 does not match manifest\nmanifest expert_pack.sha256=" + it->dump() +
                 ", pack=" + whole + " (" + pack_path + ")")
        .WithHint("every payload matches its digest, so the changed bytes lie outside the payloads: the padding "
                  "between entries or the zero fill before data_start");
  }
  return Status::OK();
}

// The checks before any byte of the pack is read: the pack is there, the
// manifest passes SGLang's store rules, the pack has the recorded size, and
// every input the manifest records a digest of is unchanged.
Status CheckManifestAndInputs(const nlohmann::json& raw, const Manifest& m, const std::string& manifest_path,
                              const VerifyPackOptions& options) {
  const std::string& pack_path = m.expert_pack.path;
  if (!PathExists(pack_path)) {
    Error missing("Kimi expert-pack or manifest is missing: " + pack_path + ", " + manifest_path,
                  ErrorKind::kFileNotFound);
    // A --force rebuild short of space removes the old pack before its copy.
    const std::string building = pack::BuildInProgressHint(pack_path);
    return building.empty() ? missing : missing.WithHint(building);
  }
  // SGLang's store checks on the manifest alone: a manifest edited there
  // passes every comparison below, yet the server refuses it at start-up.
  if (auto rules = CheckLoaderManifestRules(raw); !rules.ok()) {
    return rules.error().WithHint(manifest_path + ": SGLang's store refuses this manifest when it starts (it checks "
                                  "complete/format, hard_constraints, the model dimensions and the active layers); "
                                  "regenerate it with `k3pack manifest` or `k3pack build`");
  }
  // SGLang's store check 7, before any byte of the pack is read: a truncated
  // or replaced pack is named as such, not by the first entry it cuts off.
  K3_ASSIGN_OR_RETURN(uint64_t pack_size, FileSize(pack_path));
  if (pack_size != m.expert_pack.size) {
    return PackSizeMismatch(pack_path, pack_size, manifest_path, static_cast<int64_t>(m.expert_pack.size), raw);
  }
  // With the writer's functions (recorded_inputs.h): the shards (size, header
  // digest, whole-file digest with --full when recorded), every
  // source.tensors record, the inventory digest; the model config; the
  // tokenizer files.
  SourceCheckOptions sopts;
  sopts.whole_files = options.full;
  sopts.between_chunks = options.interrupt_check;
  K3_ASSIGN_OR_RETURN(SourceDifference source_diff, CompareSourceWithShards(raw.at("source"), sopts));
  K3_RETURN_IF_ERROR(SourceDifferenceStatus(source_diff));
  K3_RETURN_IF_ERROR(CheckModelAgainstConfig(raw.at("model"), m.profile()));
  if (m.tokenizer.recorded) K3_RETURN_IF_ERROR(CheckTokenizerAgainstFiles(raw.at("tokenizer")));
  return Status::OK();
}

// A rank pack's manifest names its rank (k3pack.ep), which must own the
// experts it records.
Result<std::optional<ep::Rank>> RankOf(const Manifest& m, const pack::ExpertSet& experts) {
  if (!m.k3pack || !m.k3pack->ep) return std::optional<ep::Rank>();
  const ep::Rank rank{m.k3pack->ep->size, m.k3pack->ep->rank};
  K3_RETURN_IF_ERROR(ep::CheckRank(rank, experts.num_experts));
  const ep::ExpertRange owned = ep::OwnedExperts(rank, experts.num_experts);
  if (owned.first != m.k3pack->ep->first_expert || owned.end != m.k3pack->ep->end_expert) {
    return Error("manifest k3pack.ep: experts [" + std::to_string(m.k3pack->ep->first_expert) + ", " +
                 std::to_string(m.k3pack->ep->end_expert) + ") are not what " +
                 ep::Describe(rank, experts.num_experts) + " owns");
  }
  return std::optional<ep::Rank>(rank);
}

// SGLang's validation of the pack's structure, compared with the manifest's
// expert_pack section; an error keeps its first line (SGLang's text) and
// says where the damage lies.
Result<nlohmann::json> CheckStructure(const std::string& pack_path, const pack::ExpertSet& experts,
                                      const std::optional<ep::Rank>& rank, const nlohmann::json& recorded) {
  pack::ValidateOptions vopts;
  vopts.payload_samples = 0;
  vopts.ep = rank;
  auto validated = pack::ValidatePack(pack_path, experts, vopts);
  Status structure = validated.ok() ? CompareSection(*validated, recorded) : validated.status();
  if (structure.ok()) return validated;
  std::string where = LocatePrefixDamage(pack_path, experts);
  const Error& e = structure.error();
  // SGLang's validator texts name an entry, not the file.
  if (e.message().find(pack_path) == std::string::npos) where += (where.empty() ? "" : "\n") + ("pack: " + pack_path);
  const size_t nl = e.message().find('\n');
  const std::string msg = nl == std::string::npos ? e.message() + "\n" + where
                                                  : e.message().substr(0, nl) + "\n" + where + e.message().substr(nl);
  return Error(msg, e.kind(), e.sys_errno());
}

// How the payloads are checked, and the names the report gives it.
struct PayloadPlan {
  pack::VerifyOptions options;
  std::string mode;         // samples, full, full+source, full-source-only
  bool no_sidecar = false;  // --full --against-source of a pack without a digest sidecar
};

PayloadPlan PlanPayloads(const VerifyPackOptions& options, const std::string& pack_path, uint64_t index_count,
                         const pack::ExpertSet& experts, const std::optional<ep::Rank>& rank) {
  PayloadPlan plan;
  pack::VerifyOptions& o = plan.options;
  o.progress = options.progress;
  o.interrupt_check = options.interrupt_check;
  o.ep = rank;
  o.full_pack = !rank;  // the manifest names no rank
  if (options.full) {
    // A pack SGLang's prepare_kimi_pack wrote has no digest sidecar; asked to
    // compare with the source, every payload still is (the sidecar would only
    // add a second check). Without --against-source the missing sidecar is
    // the error, naming the way that works.
    plan.no_sidecar = options.against_source && !PathExists(pack::DigestsPathFor(pack_path));
    o.against_digests = !plan.no_sidecar;
    o.against_source = options.against_source;
    plan.mode = plan.no_sidecar ? "full-source-only" : o.against_source ? "full+source" : "full";
  } else {
    o.against_digests = false;
    o.against_source = true;
    o.entries = pack::SampleEntries(index_count, experts.num_experts, options.samples, rank);
    plan.mode = "samples";
  }
  return plan;
}

// The digest sidecar vouches for a pack's own bytes, not for where they came
// from: a pack merged (`ep-merge --force`) or built from another checkpoint
// of the same layout beside this manifest passed --full while a sampled
// verify found every payload different. So --full without --against-source
// also compares the default sample with the GGUF source; the count compared.
Result<uint64_t> CheckSourceSamplesOfFull(const VerifyPackOptions& options, const PayloadPlan& plan,
                                          const std::string& pack_path, uint64_t index_count,
                                          const pack::ExpertSet& experts, const std::optional<ep::Rank>& rank,
                                          const nlohmann::json& raw) {
  if (!options.full || plan.options.against_source) return uint64_t{0};
  pack::VerifyOptions o;
  o.against_digests = false;
  o.against_source = true;
  o.ep = rank;
  o.interrupt_check = options.interrupt_check;
  o.entries = pack::SampleEntries(index_count, experts.num_experts, VerifyPackOptions{}.samples, rank);
  if (o.entries.empty()) return uint64_t{0};
  auto r = pack::VerifyPayloads(pack_path, experts, o);
  if (!r.ok()) {
    if (r.error().kind() != ErrorKind::kValue) return r.error();
    // Whole, not damaged: the count line says what the hint explains.
    std::string text = r.error().message();
    if (const size_t at = text.rfind(" payloads are damaged"); at != std::string::npos)
      text.replace(at, std::string(" payloads are damaged").size(), " payloads differ from the GGUF source");
    return Error(text, r.error().kind())
        .WithHint("every payload matches the pack's digest sidecar, so the pack is whole, but these differ from the "
                  "GGUF shards this manifest records: the pack was built or merged from other shards of the same "
                  "layout. Rebuild it from these shards (`k3pack build " + RecordedShardDirOr(raw) +
                  RankFlagsOf(raw) + " --force`), or use the manifest of the shards it came from");
  }
  return r->entries_checked;
}

}  // namespace

Result<nlohmann::json> VerifyPack(const std::string& manifest_path, const VerifyPackOptions& options) {
  const bool full = options.full;
  if (options.samples < 0) return Error("samples must be non-negative");
  K3_ASSIGN_OR_RETURN(nlohmann::json raw, ReadManifestJson(manifest_path));
  // Step 2 of the store's checks first: a JSON file that is no finished
  // manifest is named as such, not by a key it lacks.
  if (Status st = CheckStoreFormatAndComplete(raw); !st.ok()) {
    return st.error().WithHint(WhyNotAFinishedManifest(raw, manifest_path));
  }
  K3_ASSIGN_OR_RETURN(Manifest m, ParseManifestOf(raw, manifest_path));
  const std::string pack_path = m.expert_pack.path;
  K3_RETURN_IF_ERROR(CheckManifestAndInputs(raw, m, manifest_path, options));
  K3_ASSIGN_OR_RETURN(pack::ExpertSet experts, ExpertsOf(m));
  // A rank pack: only its experts' payloads are checked; the others are
  // holes by design.
  K3_ASSIGN_OR_RETURN(std::optional<ep::Rank> rank, RankOf(m, experts));
  K3_ASSIGN_OR_RETURN(const nlohmann::json fresh, CheckStructure(pack_path, experts, rank, raw.at("expert_pack")));

  const PayloadPlan plan = PlanPayloads(options, pack_path, fresh["index_count"].get<uint64_t>(), experts, rank);
  pack::VerifyResult vr;
  if (full || !plan.options.entries.empty()) {
    K3_ASSIGN_OR_RETURN(vr, pack::VerifyPayloads(pack_path, experts, plan.options));
  }
  if (full) K3_RETURN_IF_ERROR(CheckWholePackDigest(pack_path, raw.at("expert_pack"), options.interrupt_check));
  K3_ASSIGN_OR_RETURN(const uint64_t source_samples,
                      CheckSourceSamplesOfFull(options, plan, pack_path, fresh["index_count"].get<uint64_t>(), experts,
                                               rank, raw));
  nlohmann::json out{{"manifest", manifest_path},
                     {"pack", pack_path},
                     {"structure", "ok"},
                     {"index_sha256", fresh["index_sha256"]},
                     {"shards_checked", m.source.shards.size()},
                     // What "unchanged" rests on: a sampled verify compares each shard's size
                     // and header digest; --full hashes whole shards where their SHA-256 is recorded.
                     {"shard_check", full && std::all_of(m.source.shards.begin(), m.source.shards.end(),
                                                         [](const ShardRecord& s) { return s.sha256.has_value(); })
                                         ? "whole-file SHA-256"
                                         : "size and header digest"},
                     {"tokenizer_checked", m.tokenizer.recorded},
                     {"pack_sha256_checked", full && raw.at("expert_pack").contains("sha256")},
                     {"payload_mode", plan.mode},
                     {"digest_sidecar", full ? (plan.no_sidecar ? "missing" : "checked") : "not used"},
                     {"entries_checked", vr.entries_checked},
                     {"source_samples_checked", source_samples},
                     {"bytes_checked", vr.bytes_checked},
                     {"bytes_read", vr.bytes_read},
                     {"seconds", vr.seconds},
                     {"mb_per_s", vr.MBps()}};
  if (rank) {
    // The other ranks' objects: expected holes, a count, not damage.
    out["ep"] = {{"size", rank->size},
                 {"rank", rank->rank},
                 {"first_expert", m.k3pack->ep->first_expert},
                 {"end_expert", m.k3pack->ep->end_expert},
                 {"unowned_entries", vr.unowned_entries},
                 {"unowned_bytes", vr.unowned_bytes},
                 {"sglang_store_refuses", SglangStoreRefuses(raw)}};
    // A rank manifest written before rank manifests carried the key SGLang's
    // store refuses: the command that writes this one anew, marked.
    if (!out["ep"]["sglang_store_refuses"].get<bool>())
      out["ep"]["regenerate_with"] = RewriteManifestCommand(raw, manifest_path);
  }
  return out;
}

}  // namespace k3pack::manifest
