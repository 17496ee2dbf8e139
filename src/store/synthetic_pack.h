// Synthetic expert packs + manifests written directly with pack/format.h
// (payload bytes follow PatternByte, or holes for full-scale geometry), so
// the store's tests and benchmark need neither GGUF files nor the manifest
// builder. Not used by the product code paths.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "k3pack/manifest.h"
#include "k3pack/pack.h"
#include "pack/format.h"
#include "pack/sidecars.h"
#include "util/crc32c.h"
#include "util/file.h"
#include "util/sha256.h"

namespace k3pack::store::testing {

// Byte i of (layer, expert, role): a pattern that differs per object and role.
inline uint8_t PatternByte(uint32_t layer, uint32_t expert, uint32_t role, uint64_t i) {
  return static_cast<uint8_t>((layer * 131 + expert * 31 + role * 7 + i * 13 + (i >> 8)) & 0xff);
}

struct TinySpec {
  std::vector<uint32_t> layers = {1, 2};
  uint32_t num_hidden_layers = 3;
  uint32_t experts = 8;
  uint32_t top_k = 2;
  std::vector<std::array<uint64_t, 3>> role_bytes;  // per layer; default 4096 each
  bool kimi_profile = false;   // no "k3pack" extension (SGLang's strict invariants apply)
  bool sparse = false;         // payloads left as holes (full-scale K3 geometry)
};

class TinyPack {
 public:
  // The directory goes when the process that made it exits (a forked child
  // leaves its parent's alone), so a test that fails half-way, or never
  // removes what it made, leaves nothing in the temp directory.
  static std::string TempDir(const std::string& tag) {
    auto dir = std::filesystem::temp_directory_path() /
               ("k3-store-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    made().dirs.push_back(dir);
    return dir.string();
  }

  explicit TinyPack(TinySpec spec, const std::string& tag = "pack") : spec_(std::move(spec)) {
    if (spec_.role_bytes.empty()) spec_.role_bytes.assign(spec_.layers.size(), {4096, 4096, 4096});
    dir = TempDir(tag);
    pack = dir + "/experts.expert-major.pack";
    manifest = dir + "/manifest.json";
    std::vector<pack::LayerRoleBytes> lrb;
    for (size_t i = 0; i < spec_.layers.size(); ++i) lrb.push_back({spec_.layers[i], spec_.role_bytes[i]});
    layout = std::move(pack::PackLayout::Make(lrb, spec_.experts)).value();
    WritePack();
    json = MakeManifest();
    Save();
  }

  ~TinyPack() { std::filesystem::remove_all(dir); }

  void WritePack() {
    UniqueFd fd(::open(pack.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644));
    std::vector<uint8_t> prefix = layout.EncodePrefix();
    (void)PwriteFull(fd.get(), prefix.data(), prefix.size(), 0);
    if (!spec_.sparse) {
      for (uint64_t i = 0; i < layout.index_count(); ++i) {
        pack::EntrySlot s = layout.Entry(i);
        std::vector<uint8_t> buf(s.nbytes);
        for (uint64_t b = 0; b < s.nbytes; ++b) buf[b] = PatternByte(s.layer, s.expert, uint32_t(s.role), b);
        (void)PwriteFull(fd.get(), buf.data(), buf.size(), s.offset);
      }
    }
    (void)::ftruncate(fd.get(), static_cast<off_t>(layout.final_size()));
  }

  nlohmann::json MakeManifest() const {
    using nlohmann::json;
    json m;
    m["complete"] = true;
    m["format"] = std::string(manifest::kManifestFormat);
    m["created_at"] = "2026-01-01T00:00:00+00:00";
    m["sglang_git_sha"] = "test";
    m["hard_constraints"] = manifest::HardConstraintsJson();  // top_k 16 under every profile, as SGLang writes
    json model;
    model["config_path"] = dir + "/config.json";
    model["config_sha256"] = std::string(64, 'c');
    model["architecture"] = "KimiLinearForCausalLM";
    model["num_hidden_layers"] = spec_.num_hidden_layers;
    model["active_moe_layer_ids"] = spec_.layers;
    model["num_experts"] = spec_.experts;
    model["num_experts_per_token"] = spec_.top_k;
    m["model"] = model;
    m["source"] = {{"inventory_sha256", std::string(64, 'a')}};
    json ep;
    ep["path"] = pack;
    ep["size"] = layout.final_size();
    ep["magic"] = "GGMLMOEPACKv1";
    ep["version"] = 1;
    ep["header_bytes"] = 40;
    ep["entry_bytes"] = 152;
    ep["index_count"] = layout.index_count();
    ep["data_start"] = layout.data_start();
    ep["alignment"] = 4096;
    ep["index_sha256"] = layout.IndexSha256();
    ep["physical_role_order"] = {"up", "gate", "down"};
    ep["active_moe_layer_ids"] = spec_.layers;
    ep["num_experts"] = spec_.experts;
    ep["top_k"] = spec_.top_k;
    const auto& rb0 = spec_.role_bytes[0];
    ep["object_bytes"] = rb0[0] + rb0[1] + rb0[2];
    const char* names[3] = {"up", "gate", "down"};
    const char* dtypes[3] = {"Q2_K", "Q2_K", "Q3_K"};
    const int ids[3] = {10, 10, 11};
    for (int r = 0; r < 3; ++r) {
      ep["roles"][names[r]] = {{"dtype", dtypes[r]},
                               {"dtype_id", ids[r]},
                               {"logical_shape", {256, 16}},
                               {"expert_bytes", rb0[r]},
                               {"entry_count", spec_.layers.size() * spec_.experts},
                               {"payload_bytes", rb0[r] * spec_.layers.size() * spec_.experts}};
    }
    ep["payload_samples_verified"] = 0;
    ep["full_pack_hash"] = false;
    m["expert_pack"] = ep;
    if (!spec_.kimi_profile) {
      json lr = json::array();
      for (size_t i = 0; i < spec_.layers.size(); ++i) {
        const auto& rb = spec_.role_bytes[i];
        json item = {{"layer", spec_.layers[i]}, {"object_bytes", rb[0] + rb[1] + rb[2]}};
        for (int r = 0; r < 3; ++r)
          item[names[r]] = {{"dtype", dtypes[r]}, {"dtype_id", ids[r]}, {"expert_bytes", rb[r]}};
        lr.push_back(item);
      }
      m["k3pack"] = {{"profile", "scaled"}, {"layer_roles", lr}};
    }
    return m;
  }

  void Save() const { (void)WriteFileAtomic(manifest, json.dump(2)); }

  // Overwrites `n` bytes at `offset` of the pack.
  void Patch(uint64_t offset, const void* data, size_t n) const {
    UniqueFd fd(::open(pack.c_str(), O_WRONLY));
    (void)PwriteFull(fd.get(), data, n, offset);
  }
  uint64_t EntryOffset(uint64_t i) const { return pack::kHeaderBytes + i * pack::kEntryBytes; }
  // Re-hashes the index into the manifest after a patch (so later checks are reached).
  void RehashIndex() {
    json["expert_pack"]["index_sha256"] = *Sha256FileRange(pack, 0, layout.index_end());
    Save();
  }
  void SetSizeFromFile() {
    json["expert_pack"]["size"] = *FileSize(pack);
    Save();
  }

  // Writes `<pack>.digests` as the builder does (SHA-256 + CRC32C of every
  // entry), or a version-1 sidecar without CRCs (`with_crcs` false), from
  // the pack's current bytes.
  Status WriteDigestSidecar(bool with_crcs = true) const {
    K3_ASSIGN_OR_RETURN(UniqueFd fd, OpenReadOnly(pack));
    pack::PackDigests d;
    d.index_count = layout.index_count();
    d.pack_size = layout.final_size();
    d.index_sha256 = layout.IndexSha256();
    std::vector<uint8_t> buf;
    for (uint64_t i = 0; i < d.index_count; ++i) {
      const pack::EntrySlot s = layout.Entry(i);
      buf.resize(s.nbytes);
      K3_ASSIGN_OR_RETURN(size_t got, PreadFull(fd.get(), buf.data(), buf.size(), s.offset));
      if (got != buf.size()) return Error("short read of " + pack);
      d.entry_sha256.push_back(pack::Sha256Raw(buf.data(), buf.size()));
      if (with_crcs) d.entry_crc32c.push_back(Crc32c(buf.data(), buf.size()));
    }
    return pack::WritePackDigests(pack::DigestsPathFor(pack), d);
  }

  const TinySpec& spec() const { return spec_; }
  std::string dir, pack, manifest;
  pack::PackLayout layout = std::move(pack::PackLayout::MakeUniform({1}, 1, {4096, 4096, 4096})).value();
  nlohmann::json json;

 private:
  static int& counter() {
    static int c = 0;
    return c;
  }
  struct MadeDirs {
    pid_t owner = ::getpid();
    std::vector<std::filesystem::path> dirs;
    ~MadeDirs() {
      if (::getpid() != owner) return;
      std::error_code ec;
      for (const auto& d : dirs) std::filesystem::remove_all(d, ec);
    }
  };
  static MadeDirs& made() {
    static MadeDirs m;
    return m;
  }
  TinySpec spec_;
};

}  // namespace k3pack::store::testing
