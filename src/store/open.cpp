// ExpertStore::Open's validation: SGLang's KimiGGMLExpertPackStore checks
// (spec §2.7 steps 1-14, §7.2), in order, with its error texts. Under the
// "scaled" profile the Kimi-K3 constants give way to the manifest's own
// dimensions and per-layer role sizes (the "k3pack" extension).
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <system_error>
#include <thread>

#include "k3pack/ggml_types.h"
#include "k3pack/manifest.h"
#include "manifest/json_fields.h"
#include "manifest/loader_rules.h"
#include "manifest/pyjson.h"
#include "pack/build_inputs.h"
#include "pack/format.h"
#include "store/store_impl.h"
#include "util/pyrepr.h"
#include "util/sha256.h"
#include "util/threads.h"
#include "util/utf8.h"

namespace k3pack::store {
namespace {

using nlohmann::json;

using manifest::fields::At;
using manifest::fields::KeyErr;
using manifest::fields::Str;
using manifest::fields::U64;

constexpr const char* kRoleNames[3] = {"up", "gate", "down"};

// SGLang's checks 9 and 10 on expert_pack.roles / object_bytes (both
// profiles), then the per-layer role sizes the entry walk checks: the same
// for every layer (kimi-k3) or the k3pack extension's (scaled). `roles_bytes`
// receives expert_pack.roles' sizes, which SGLang holds every entry to; the
// walk holds the first active layer's entries to them under both profiles.
Status LoadRoles(const std::string& manifest_path, const json& ep,
                 const std::optional<manifest::K3packExtension>& ext, const std::vector<uint32_t>& layers, bool kimi,
                 PackGeometry* g, std::array<uint64_t, 3>* roles_bytes) {
  K3_ASSIGN_OR_RETURN(const json* roles, At(ep, "roles"));
  // 9. Each role's dtype name and id: K3's Q2_K/Q2_K/Q3_K, or under scaled
  // the first active layer's types as the k3pack extension records them
  // (expert_pack.roles describes that layer, like SGLang's writer).
  static const std::pair<const char*, uint64_t> kK3Types[3] = {{"Q2_K", 10}, {"Q2_K", 10}, {"Q3_K", 11}};
  for (int r = 0; r < 3; ++r) {
    K3_ASSIGN_OR_RETURN(const json* role, At(*roles, kRoleNames[r]));
    Error unsupported(std::string("Kimi expert-pack ") + kRoleNames[r] + " quant type is unsupported");
    if (kimi) {
      // SGLang: dtype != name or int(dtype_id) != id, short-circuit (a wrong
      // dtype is reported without reading dtype_id; "10" and 10.0 are 10).
      K3_ASSIGN_OR_RETURN(const json* dtype_j, At(*role, "dtype"));
      if (!dtype_j->is_string() || dtype_j->get_ref<const std::string&>() != kK3Types[r].first) return unsupported;
      K3_ASSIGN_OR_RETURN(int64_t dtype_id, manifest::fields::IntAt(*role, "dtype_id"));
      if (dtype_id != int64_t(kK3Types[r].second)) return unsupported;
      continue;
    }
    K3_ASSIGN_OR_RETURN(std::string dtype, Str(*role, "dtype"));
    K3_ASSIGN_OR_RETURN(uint64_t dtype_id, U64(*role, "dtype_id"));
    auto type = GgmlTypeFromName(dtype);
    if (!type || static_cast<uint64_t>(*type) != dtype_id)
      return unsupported.WithHint("expert_pack.roles." + std::string(kRoleNames[r]) + " says dtype " + PyRepr(dtype) +
                                  " with dtype_id " + std::to_string(dtype_id) + ", which is not a ggml type pair");
    if (!ext->layer_roles.empty()) {
      const manifest::LayerRoleInfo& first = ext->layer_roles.front().roles[r];
      if (first.dtype != dtype || first.dtype_id != dtype_id)
        return unsupported.WithHint("expert_pack.roles." + std::string(kRoleNames[r]) + " says " + dtype + " (" +
                                    std::to_string(dtype_id) + "), k3pack.layer_roles says " + first.dtype + " (" +
                                    std::to_string(first.dtype_id) + ") for layer " +
                                    std::to_string(ext->layer_roles.front().layer) + ": the manifest was edited");
    }
  }
  // 10. The roles' sizes add up to object_bytes (no padding between roles).
  // SGLang reads int(object_bytes), int(data_start), then each role's
  // int(expert_bytes) in physical order: a missing key is named in that order.
  K3_ASSIGN_OR_RETURN(int64_t object_bytes, manifest::fields::IntAt(ep, "object_bytes"));
  K3_RETURN_IF_ERROR(manifest::fields::IntAt(ep, "data_start").status());
  // Python's sum is exact, so sizes whose sum leaves 64 bits never match;
  // here a wrapped sum could have matched.
  const Error mismatch("Kimi expert-pack role sizes do not match object bytes");
  auto overflow = [&](const std::string& where, const std::array<uint64_t, 3>& bytes, uint64_t object) {
    return mismatch.WithHint(manifest_path + ": " + where + ": the roles' expert_bytes (up " +
                             std::to_string(bytes[0]) + ", gate " + std::to_string(bytes[1]) + ", down " +
                             std::to_string(bytes[2]) + ") overflow a 64-bit sum, so they cannot add up to "
                             "object_bytes " + std::to_string(object) +
                             " (an object is its three roles with no padding between them)");
  };
  int64_t sum = 0;
  bool overflowed = false;
  for (int r = 0; r < 3; ++r) {
    K3_ASSIGN_OR_RETURN(int64_t b, manifest::fields::IntAt((*roles)[kRoleNames[r]], "expert_bytes"));
    if (b < 0) return mismatch;  // no payload of that size
    (*roles_bytes)[r] = static_cast<uint64_t>(b);
    overflowed = overflowed || __builtin_add_overflow(sum, b, &sum);
  }
  if (overflowed)
    return overflow("expert_pack.roles (" +
                        (kimi || layers.empty() ? std::string("every active layer")
                                                : "layer " + std::to_string(layers.front())) +
                        ")",
                    *roles_bytes, static_cast<uint64_t>(std::max<int64_t>(object_bytes, 0)));
  if (sum != object_bytes) return mismatch;
  if (kimi) {
    g->role_bytes.assign(layers.size(), *roles_bytes);
  } else {
    // Step 5 made the extension cover exactly the active layers.
    for (size_t i = 0; i < layers.size(); ++i) {
      const auto& lr = ext->layer_roles[i];
      std::array<uint64_t, 3> bytes{};
      uint64_t layer_sum = 0;
      bool layer_overflowed = false;
      for (int r = 0; r < 3; ++r) {
        auto type = GgmlTypeFromName(lr.roles[r].dtype);
        if (!type || static_cast<uint32_t>(*type) != lr.roles[r].dtype_id)
          return Error(std::string("Kimi expert-pack ") + kRoleNames[r] + " quant type is unsupported")
              .WithHint("k3pack.layer_roles entry for layer " + std::to_string(lr.layer) + " says dtype " +
                        PyRepr(lr.roles[r].dtype) + " with dtype_id " + std::to_string(lr.roles[r].dtype_id));
        bytes[r] = lr.roles[r].expert_bytes;
        layer_overflowed = layer_overflowed || __builtin_add_overflow(layer_sum, bytes[r], &layer_sum);
      }
      if (layer_overflowed)
        return overflow("k3pack.layer_roles entry for layer " + std::to_string(lr.layer), bytes, lr.object_bytes);
      if (layer_sum != lr.object_bytes || layer_sum == 0)
        return mismatch.WithHint("k3pack.layer_roles entry for layer " + std::to_string(lr.layer) +
                                 ": roles add up to " + std::to_string(layer_sum) + " bytes, object_bytes is " +
                                 std::to_string(lr.object_bytes));
      g->role_bytes.push_back(bytes);
    }
  }
  for (const auto& b : g->role_bytes) g->role_offsets.push_back({0, b[0], b[0] + b[1]});
  return Status::OK();
}

std::string HexByte(uint8_t b) {
  const char* digits = "0123456789abcdef";
  return {digits[b >> 4], digits[b & 15]};
}

uint32_t LE32(const uint8_t* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }
uint64_t LE64(const uint8_t* p) { uint64_t v; std::memcpy(&v, p, 8); return v; }

// Step 12: every entry's identity, range and contiguity (§7.2 step 4).
// `count` complete entries are walked; `truncated`: the file ends inside the
// index after them (SGLang reads entry by entry, so their checks come first).
// `first_object_reads(i)` runs after entry i's checks for the first three
// entries: the manifest keys SGLang reads while building an entry record
// (index_sha256 for the generation, the role's logical_shape), so a missing
// one is its KeyError at that point.
Status WalkEntries(const uint8_t* index, uint64_t count, uint64_t file_size, const std::array<uint64_t, 3>& roles_bytes,
                   PackGeometry* g, const std::function<Status(uint64_t)>& first_object_reads,
                   bool truncated = false) {
  const ObjectSpace& s = g->space;
  const uint32_t E = s.num_experts;
  g->object_offsets.assign(s.num_objects(), 0);
  uint64_t previous_end = g->data_start;
  std::vector<std::array<std::string, 3>> names(s.num_active_layers());
  for (uint32_t li = 0; li < s.num_active_layers(); ++li)
    for (uint32_t r = 0; r < 3; ++r) names[li][r] = pack::ExpertTensorName(s.active_layer_ids[li], pack::Role(r));
  for (uint64_t i = 0; i < count; ++i) {
    const uint8_t* e = index + i * pack::kEntryBytes;
    const uint64_t object = i / 3;
    const uint32_t role = static_cast<uint32_t>(i % 3);
    const uint32_t li = static_cast<uint32_t>(object / E), expert = static_cast<uint32_t>(object % E);
    const uint32_t layer = s.active_layer_ids[li];
    auto identity = [&] {
      return Error("Kimi expert-pack identity mismatch at index " + std::to_string(i))
          .WithHint("index entry " + std::to_string(i) + " of " + g->resolved_pack_path + " (file offset " +
                    std::to_string(pack::kHeaderBytes + i * pack::kEntryBytes) + ") should name " +
                    names[li][role] + " expert " + std::to_string(expert));
    };
    // Fast path: the canonical name NUL-terminated; otherwise parse like SGLang
    // (cut at the first NUL, UTF-8, fullmatch of the regex; "blk.01" is layer 1).
    const std::string& expected = names[li][role];
    bool canonical = std::memcmp(e, expected.data(), expected.size()) == 0 && e[expected.size()] == 0;
    if (!canonical) {
      // SGLang decodes the name (up to its first NUL) strictly first: a
      // damaged name that is not UTF-8 is Python's UnicodeDecodeError.
      const char* raw = reinterpret_cast<const char*>(e);
      const std::string decode_error = PythonUtf8DecodeError(std::string_view(raw, strnlen(raw, 128)));
      if (!decode_error.empty())
        return Error(decode_error)
            .WithHint("index entry " + std::to_string(i) + " (" + expected + " expert " + std::to_string(expert) +
                      "): its name field (file offset " +
                      std::to_string(pack::kHeaderBytes + i * pack::kEntryBytes) + ") is not UTF-8");
      auto entry = pack::DecodeEntry({e, pack::kEntryBytes});
      if (!entry.ok() || !entry->name_utf8_ok) return identity();
      auto parsed = pack::ParseExpertTensorName(entry->name);
      if (!parsed || parsed->layer != layer || static_cast<uint32_t>(parsed->role) != role) return identity();
    }
    int32_t entry_expert;
    std::memcpy(&entry_expert, e + 128, 4);
    if (entry_expert != static_cast<int32_t>(expert) || LE32(e + 132) != 0) return identity();
    const uint64_t offset = LE64(e + 136), nbytes = LE64(e + 144);
    // SGLang holds every entry to expert_pack.roles; scaled packs may vary by
    // layer (the extension), but their first layer is what roles describes.
    if (nbytes != g->role_bytes[li][role] || (li == 0 && nbytes != roles_bytes[role]) ||
        offset % g->alignment != 0 || offset < previous_end ||
        offset > file_size || nbytes > file_size - offset) {
      Error e("Kimi expert-pack range mismatch at index " + std::to_string(i));
      const bool by_roles = li == 0 && nbytes != roles_bytes[role];
      const uint64_t want = by_roles ? roles_bytes[role] : g->role_bytes[li][role];
      if (nbytes != want)
        return e.WithHint("entry " + std::to_string(i) + " (" + names[li][role] + " expert " + std::to_string(expert) +
                          ") holds " + std::to_string(nbytes) + " bytes; the manifest's " +
                          (by_roles ? "expert_pack.roles" : "k3pack.layer_roles") + " records " +
                          std::to_string(want) + " per " + kRoleNames[role] + " expert");
      // Checked in order, damage to one entry's range surfaces at the next.
      if (i > 0 && offset < previous_end)
        return e.WithHint("entry " + std::to_string(i) + " starts at byte " + std::to_string(offset) +
                          ", before the end of index entry " + std::to_string(i - 1) + " (byte " +
                          std::to_string(previous_end) + "): the offset or size of either entry may be the damaged field");
      return e.WithHint("entry " + std::to_string(i) + " (" + names[li][role] + " expert " + std::to_string(expert) +
                        ") of " + g->resolved_pack_path + " spans bytes " + std::to_string(offset) + " + " +
                        std::to_string(nbytes) + ", which is not " + std::to_string(g->alignment) +
                        "-aligned or runs past the file's " + std::to_string(file_size) + " bytes");
    }
    if (role == 0) {
      g->object_offsets[object] = offset;
    } else if (offset != g->object_offsets[object] + g->role_offsets[li][role]) {
      const uint64_t first = i - role;
      return Error("Kimi expert object is not contiguous at index " + std::to_string(i))
          .WithHint("entry " + std::to_string(i) + " starts at byte " + std::to_string(offset) +
                    "; its object's first role, index entry " + std::to_string(first) + ", starts at byte " +
                    std::to_string(g->object_offsets[object]) + ", which puts this role at byte " +
                    std::to_string(g->object_offsets[object] + g->role_offsets[li][role]) +
                    ": the offset of either entry may be the damaged field");
    }
    previous_end = offset + nbytes;
    if (i < 3) K3_RETURN_IF_ERROR(first_object_reads(i));
  }
  if (truncated) {
    return Error("Kimi expert-pack index is truncated")
        .WithHint("the file is " + std::to_string(file_size) + " bytes and ends inside index entry " +
                  std::to_string(count) + " of " + std::to_string(g->index_count));
  }
  if (previous_end != file_size) return Error("Kimi expert-pack file has trailing or missing bytes");
  return Status::OK();
}

// When the index digest disagrees although every check passed, the damage
// sits in bytes SGLang's checks do not read (a name's NUL padding) or in the
// manifest. Names the first entry whose bytes differ from the writer's
// canonical form (name, zero padding) so the message points at it.
std::string LocateNonCanonicalEntry(const uint8_t* index, uint64_t count, const ObjectSpace& s) {
  for (uint64_t i = 0; i < count; ++i) {
    const uint8_t* e = index + i * pack::kEntryBytes;
    const uint64_t object = i / 3;
    const uint32_t layer = s.active_layer_ids[object / s.num_experts];
    std::string name = pack::ExpertTensorName(layer, pack::Role(i % 3));
    // SGLang's writer keeps a GGUF's own spelling of the layer ("blk.07"):
    // a name that identifies the same stack is the writer's name.
    const std::string own(reinterpret_cast<const char*>(e), strnlen(reinterpret_cast<const char*>(e), 128));
    const auto parsed = pack::ParseExpertTensorName(own);
    if (parsed && parsed->layer == layer && static_cast<uint32_t>(parsed->role) == i % 3) name = own;
    for (size_t k = 0; k < 128; ++k) {
      const uint8_t want = k < name.size() ? static_cast<uint8_t>(name[k]) : 0;
      if (e[k] == want) continue;
      return "index entry " + std::to_string(i) + " (" + name + " expert " + std::to_string(object % s.num_experts) +
             "): name field byte " + std::to_string(k) + " is 0x" + HexByte(e[k]) + ", the writer's is 0x" +
             HexByte(want) + " (file offset " + std::to_string(pack::kHeaderBytes + i * pack::kEntryBytes + k) + ")";
    }
  }
  return "the header and every index entry are in canonical form: the manifest's index_sha256 belongs to other bytes";
}

}  // namespace

Status CheckStoreFiles(const std::string& pack_path, const std::string& manifest_path) {
  // Path(p).resolve() of both, then is_file(): the message names the
  // resolved paths (absolute, symlinks resolved), a directory is missing.
  // SGLang's text names both; the hint says which of them is wrong, and how.
  std::string hint;
  for (const auto& [what, path] : {std::pair<std::string, std::string>{"the pack", pack_path}, {"the manifest", manifest_path}}) {
    std::error_code ec;
    const auto status = std::filesystem::status(path, ec);
    if (std::filesystem::is_regular_file(status)) continue;
    hint += (hint.empty() ? "" : "; ") + what + " " + path +
            (!std::filesystem::exists(status) ? " does not exist"
             : std::filesystem::is_directory(status) ? " is a directory, not a file"
                                                     : " is not a regular file");
    // A --force rebuild short of space removes the old pack before its copy.
    if (what == "the pack" && !std::filesystem::exists(status)) {
      const std::string building = pack::BuildInProgressHint(path);
      if (!building.empty()) hint += " (" + building + ")";
    }
  }
  if (hint.empty()) return Status::OK();
  return Error("Kimi expert-pack or manifest is missing: " + ResolvedPathOrGiven(pack_path) + ", " +
                   ResolvedPathOrGiven(manifest_path),
               ErrorKind::kFileNotFound)
      .WithHint(hint);
}

uint64_t ObjectGeneration(const std::string& index_sha256, uint32_t layer, uint32_t expert) {
  std::string hex = Sha256Hex(index_sha256 + ":" + std::to_string(layer) + ":" + std::to_string(expert));
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) {
    uint64_t byte = std::stoul(hex.substr(size_t(i) * 2, 2), nullptr, 16);
    v |= byte << (8 * i);
  }
  return v == 0 ? 1 : v;
}

Result<json> ReadStoreManifest(const std::string& manifest_path) {
  K3_ASSIGN_OR_RETURN(json m, manifest::ReadManifestJson(manifest_path));
  if (Status st = manifest::CheckStoreFormatAndComplete(m); !st.ok()) {
    return st.error().WithHint(manifest::WhyNotAFinishedManifest(m, manifest_path));
  }
  return m;
}

namespace {

Result<ObjectSpace> SpaceFromManifestJson(const json& m, const std::string& manifest_path) {
  K3_ASSIGN_OR_RETURN(auto ext, manifest::ParseK3packExtension(m));
  K3_ASSIGN_OR_RETURN(const json* model, At(m, "model"));
  K3_ASSIGN_OR_RETURN(const json* ep, At(m, "expert_pack"));
  ObjectSpace s;
  // The store's own rules for the sizes and the layer list (steps 4 and 5),
  // so a manifest the store opens gives a trace the same space.
  const bool kimi = !ext || !ext->scaled();
  auto dims = manifest::CheckDimensions(*model, kimi);
  if (!dims.ok()) return dims.error().WithContext(manifest_path);
  auto active = manifest::CheckActiveLayers(*model, kimi, dims->layers,
                                            kimi ? std::vector<manifest::LayerRolesRecord>{} : ext->layer_roles);
  if (!active.ok()) return active.error().WithContext(manifest_path);
  s.active_layer_ids = std::move(*active);
  s.num_experts = static_cast<uint32_t>(dims->experts);
  s.top_k = static_cast<uint32_t>(dims->top_k);
  s.num_layers_total = static_cast<uint32_t>(dims->layers);
  if (ext && ext->scaled()) {
    for (const auto& lr : ext->layer_roles) s.object_bytes.push_back(lr.object_bytes);
  } else {
    K3_ASSIGN_OR_RETURN(uint64_t ob, U64(*ep, "object_bytes"));
    s.object_bytes.assign(s.active_layer_ids.size(), ob);
  }
  if (s.object_bytes.size() != s.active_layer_ids.size())
    return Error(manifest_path + ": k3pack.layer_roles does not cover every active layer");
  return s;
}

}  // namespace

Result<ObjectSpace> SpaceFromManifest(const std::string& manifest_path) {
  // Step 2 first: a JSON file that is no manifest (a model's config.json)
  // failed as the KeyError 'model'.
  K3_ASSIGN_OR_RETURN(json m, ReadStoreManifest(manifest_path));
  auto s = SpaceFromManifestJson(m, manifest_path);
  // SGLang's bare KeyError, with the file named: trace gen and sweep said
  // only 'model'.
  if (!s.ok()) return manifest::WithMissingKeyHint(s.error(), manifest_path, "SGLang's expert store");
  return s;
}

Result<PackGeometry> ValidatePack(const std::string& pack_path, const std::string& manifest_path,
                                  const StoreOptions& opt, int fd) {
  PackGeometry g;
  // 1. Files exist (checked by the caller before opening; repeated for direct use).
  K3_RETURN_IF_ERROR(CheckStoreFiles(pack_path, manifest_path));
  K3_ASSIGN_OR_RETURN(json m, ReadStoreManifest(manifest_path));
  // 2-5. the checks on the manifest alone.
  manifest::ExpectedDims expected;
  expected.layers = opt.expected_layers;
  expected.experts = opt.expected_experts;
  expected.top_k = opt.expected_top_k;
  K3_ASSIGN_OR_RETURN(manifest::LoaderLayout layout, manifest::CheckLoaderManifestRules(m, expected));
  g.format = std::string(manifest::kManifestFormat);
  const bool kimi = layout.kimi;
  g.profile = kimi ? "kimi-k3" : "scaled";
  const auto& ext = layout.ext;
  const uint64_t layers_n = layout.num_layers, experts_n = layout.num_experts, top_k = layout.top_k;
  const std::vector<uint32_t>& active = layout.active;
  const json* model = &m.at("model");  // present: the checks read it
  // 6-8. pack path, size, physical role order.
  K3_ASSIGN_OR_RETURN(const json* ep, At(m, "expert_pack"));
  K3_ASSIGN_OR_RETURN(std::string ep_path, Str(*ep, "path"));
  auto resolved_pack = ResolvePath(pack_path);
  auto resolved_manifest_pack = ResolvePath(ep_path);
  if (!resolved_pack.ok() || !resolved_manifest_pack.ok() || *resolved_pack != *resolved_manifest_pack)
    return Error("Kimi manifest expert-pack path does not match pack_path")
        .WithHint("the manifest records the pack at " + ep_path + ", the pack given is " + pack_path +
                  " (a copied or moved pack needs a manifest written for it: `k3pack manifest` or `k3pack build`)");
  g.resolved_pack_path = *resolved_pack;
  K3_ASSIGN_OR_RETURN(int64_t ep_size, manifest::fields::IntAt(*ep, "size"));  // int(size), as SGLang
  K3_ASSIGN_OR_RETURN(uint64_t file_size, FileSize(pack_path));
  if (ep_size < 0 || uint64_t(ep_size) != file_size)
    return manifest::PackSizeMismatch(pack_path, file_size, manifest_path, ep_size, m);
  g.pack_size = file_size;
  // expert_pack.get("physical_role_order"): a missing key is the mismatch.
  if (!ep->is_object() || !ep->contains("physical_role_order") ||
      (*ep)["physical_role_order"] != json::array({"up", "gate", "down"}))
    return Error("Kimi expert-pack physical role order is unsupported");
  if (!kimi) {
    // The runtime top-k (step 4) is also what the validated pack record says
    // (SGLang's store does not read expert_pack.top_k; K3's is always 16).
    K3_ASSIGN_OR_RETURN(uint64_t pack_top_k, U64(*ep, "top_k"));
    if (pack_top_k != top_k)
      return Error("scaled manifest expert_pack.top_k is " + std::to_string(pack_top_k) +
                   ", model.num_experts_per_token is " + std::to_string(top_k) + ": the manifest was edited")
          .WithHint("regenerate it with `k3pack manifest`");
  }
  // 9-10. role types and sizes.
  std::array<uint64_t, 3> roles_bytes{};
  K3_RETURN_IF_ERROR(LoadRoles(manifest_path, *ep, ext, active, kimi, &g, &roles_bytes));
  g.space.active_layer_ids = active;
  g.space.num_experts = static_cast<uint32_t>(experts_n);
  g.space.top_k = static_cast<uint32_t>(top_k);
  g.space.num_layers_total = static_cast<uint32_t>(layers_n);
  for (const auto& b : g.role_bytes) g.space.object_bytes.push_back(b[0] + b[1] + b[2]);
  // 11. header.
  K3_ASSIGN_OR_RETURN(int64_t data_start, manifest::fields::IntAt(*ep, "data_start"));
  K3_ASSIGN_OR_RETURN(int64_t alignment, manifest::fields::IntAt(*ep, "alignment"));
  // A negative value matches no header; alignment 0 is refused at entry 0.
  g.data_start = data_start < 0 ? UINT64_MAX : uint64_t(data_start);
  g.alignment = alignment < 0 ? 0 : uint64_t(alignment);
  if (file_size < pack::kHeaderBytes) return Error("Kimi expert-pack header is truncated");
  g.index_count = uint64_t{active.size()} * experts_n * 3;
  const uint64_t index_end = pack::kHeaderBytes + g.index_count * pack::kEntryBytes;
  // Map the header + index (37.6 MB for K3) instead of copying it: the digest
  // and the entry walk read page-cache pages in place.
  const uint64_t mapped = std::min(file_size, index_end);
  void* map = ::mmap(nullptr, mapped, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
  if (map == MAP_FAILED) return Error::FromErrno("cannot map the expert-pack index of " + pack_path, errno);
  struct Unmap {
    void* p;
    size_t n;
    ~Unmap() { ::munmap(p, n); }
  } unmap{map, mapped};
  const uint8_t* prefix = static_cast<const uint8_t*>(map);
  K3_ASSIGN_OR_RETURN(pack::PackHeader h, pack::DecodeHeader({prefix, pack::kHeaderBytes}));
  if (h.magic != pack::kPackMagic || h.version != 1 || h.header_size != pack::kHeaderBytes ||
      h.index_count != g.index_count || h.data_start != g.data_start) {
    // SGLang's line names no field and no file: the hint says which differs.
    std::string field = h.magic != pack::kPackMagic   ? "its magic is not GGMLMOEPACKv1"
                        : h.version != 1               ? "its version is " + std::to_string(h.version) + ", not 1"
                        : h.header_size != pack::kHeaderBytes
                            ? "its header size is " + std::to_string(h.header_size) + ", not " +
                                  std::to_string(pack::kHeaderBytes)
                        : h.index_count != g.index_count
                            ? "its index count is " + std::to_string(h.index_count) + ", the manifest's layers x "
                                  "experts x 3 is " + std::to_string(g.index_count)
                            : "its data_start is " + std::to_string(h.data_start) + ", the manifest records " +
                                  std::to_string(g.data_start);
    return Error("Kimi expert-pack header does not match its manifest")
        .WithHint("the header of " + pack_path + ": " + field + " (manifest " + manifest_path +
                  "); `k3pack verify --full` names every damaged byte, `k3pack build --restart` rewrites the header");
  }
  // 12. index entries (hashed on a second thread meanwhile: step 13's digest).
  if (g.alignment == 0) return Error("Kimi expert-pack range mismatch at index 0");
  const json* roles_j = &(*ep)["roles"];  // present: LoadRoles read it
  auto first_object_reads = [&](uint64_t i) -> Status {
    if (i == 0) K3_RETURN_IF_ERROR(Str(*ep, "index_sha256").status());
    K3_ASSIGN_OR_RETURN(const json* shape, At((*roles_j)[kRoleNames[i]], "logical_shape"));
    if (!shape->is_array()) return Error("'" + std::string(shape->type_name()) + "' object is not iterable");
    for (const json& v : *shape) K3_RETURN_IF_ERROR(manifest::fields::PyInt(v).status());
    return Status::OK();
  };
  if (mapped < index_end) {
    // Cut inside the index: the complete entries are checked first, as
    // SGLang's entry-by-entry read does (an intact entry 0 then fails its
    // range check: its payload lies past the end of the file).
    const uint64_t complete = (mapped - pack::kHeaderBytes) / pack::kEntryBytes;
    return WalkEntries(prefix + pack::kHeaderBytes, complete, file_size, roles_bytes, &g, first_object_reads,
                       /*truncated=*/true);
  }
  std::string digest;
  bool hashed = false;
  Status walked;
  {
    // With no thread to spare, or no memory on it (a pids or address-space
    // limit), it is hashed here after the walk.
    std::vector<std::thread> hasher;
    const JoinedOnExit joined(hasher, [] {});
    (void)TryStartThread([&] {
      hasher.emplace_back([&] { hashed = !RanOutOfMemory([&] { digest = Sha256Hex(prefix, index_end); }); });
    });
    walked = WalkEntries(prefix + pack::kHeaderBytes, g.index_count, file_size, roles_bytes, &g, first_object_reads);
  }
  if (!hashed) digest = Sha256Hex(prefix, index_end);
  K3_RETURN_IF_ERROR(walked);
  // 13. index digest.
  K3_ASSIGN_OR_RETURN(g.index_sha256, Str(*ep, "index_sha256"));
  if (digest != g.index_sha256) {
    // Which files (SGLang's line names neither), then where the damage is.
    return Error("Kimi expert-pack index SHA-256 does not match manifest")
        .WithHint("the index of " + pack_path + " hashes to " + digest + ", " + manifest_path + " records " +
                  g.index_sha256 + "; " + LocateNonCanonicalEntry(prefix + pack::kHeaderBytes, g.index_count, g.space));
  }
  // 14. optional whole-pack digest.
  if (opt.verify_pack_sha256) {
    // `if not expert_pack.get("sha256")`: absent, null or "" is no digest.
    if (!manifest::fields::Truthy(*ep, "sha256"))
      return Error("full pack verification requested, but manifest has no full SHA-256");
    K3_ASSIGN_OR_RETURN(std::string full, Sha256File(pack_path));
    if (json(full) != (*ep)["sha256"]) return Error("Kimi expert-pack SHA-256 does not match manifest");
  }
  // Read for the synthesized header (a bare KeyError when missing).
  K3_ASSIGN_OR_RETURN(const json* source, At(m, "source"));
  K3_ASSIGN_OR_RETURN(g.inventory_sha256, Str(*source, "inventory_sha256"));
  K3_ASSIGN_OR_RETURN(g.config_sha256, Str(*model, "config_sha256"));
  // k3pack's own: the EP rank this store serves (a rank pack's, or the caller's).
  K3_RETURN_IF_ERROR(ResolveStoreRank(ext ? ext->ep : std::optional<manifest::EpRecord>(), opt.ep, manifest_path, &g,
                                      opt.ep_names));
  return g;
}

}  // namespace k3pack::store
