// SGLang's validate_ggml_moe_pack (spec §6.2): header, every index entry,
// layout, index digest, sampled payload compare with the GGUF source.
#include <sys/stat.h>

#include <chrono>
#include <cstring>
#include <map>
#include <optional>

#include "k3pack/pack.h"
#include "pack/build_inputs.h"
#include "pack/copy.h"
#include "util/file.h"
#include "util/output_guard.h"
#include "util/pyrepr.h"
#include "util/sha256.h"

namespace k3pack::pack {
namespace {

// `layer` as str(int(...)): a name's layer may be past 64 bits.
std::string Triple(const std::string& layer, const std::string& role, int64_t expert) {
  return "(" + layer + ", " + PyRepr(role) + ", " + std::to_string(expert) + ")";
}

std::string DtypeName(uint32_t id) {
  const GgmlTypeInfo* info = GgmlTypeInfoFor(id);
  return info && info->name && info->name[0] ? info->name : std::to_string(id);
}

}  // namespace

std::vector<uint64_t> SampleIndices(uint64_t n, int64_t k) {
  std::vector<uint64_t> out;
  if (k <= 0 || n == 0) return out;
  if (k == 1) return {0};
  // k samples over n entries, spaced as SGLang spaces them; from k >= n on
  // that is every entry once. Without this, --samples / --payload-samples
  // of 10^14 looped 10^14 times before reading anything.
  if (static_cast<uint64_t>(k) >= n) {
    out.resize(n);
    for (uint64_t i = 0; i < n; ++i) out[i] = i;
    return out;
  }
  const uint64_t den = static_cast<uint64_t>(k - 1);
  for (uint64_t i = 0; i < static_cast<uint64_t>(k); ++i) {
    unsigned __int128 num = static_cast<unsigned __int128>(i) * (n - 1);
    uint64_t q = static_cast<uint64_t>(num / den), rem = static_cast<uint64_t>(num % den);
    if (2 * static_cast<unsigned __int128>(rem) > den || (2 * static_cast<unsigned __int128>(rem) == den && (q & 1))) ++q;
    if (out.empty() || out.back() != q) out.push_back(q);
  }
  return out;
}

std::vector<uint64_t> SampleEntries(uint64_t index_count, uint32_t num_experts, int64_t k,
                                    const std::optional<ep::Rank>& ep) {
  if (!ep || num_experts == 0) return SampleIndices(index_count, k);
  // A rank pack: SGLang's spacing over the entries the rank owns (the others
  // are holes by design), mapped back to entry indices.
  const ep::ExpertRange owned = ep::OwnedExperts(*ep, num_experts);
  const uint64_t per_layer = uint64_t{owned.count()} * kRoleCount;
  const uint64_t layers = index_count / (uint64_t{num_experts} * kRoleCount);
  std::vector<uint64_t> out;
  for (uint64_t j : SampleIndices(per_layer * layers, k)) {
    out.push_back((j / per_layer) * num_experts * kRoleCount + uint64_t{owned.first} * kRoleCount + j % per_layer);
  }
  return out;
}

namespace {

constexpr const char* kWhichPack =
    "pass the pack file `k3pack build` writes (<prefix>.expert-major.pack beside the shards, or its --pack)";

// The header's fields against SGLang's rules and the expected entry count.
Result<PackHeader> ReadCheckedHeader(int fd, uint64_t expected_count, std::array<uint8_t, kHeaderBytes>& hb) {
  K3_ASSIGN_OR_RETURN(size_t hgot, PreadFull(fd, hb.data(), hb.size(), 0));
  if (hgot < kHeaderBytes) return Error("GGML expert-pack header is truncated");
  K3_ASSIGN_OR_RETURN(PackHeader h, DecodeHeader(hb));
  if (h.magic != kPackMagic || h.version != kPackVersion) {
    return Error("GGML expert-pack magic or version does not match");
  }
  if (h.header_size != kHeaderBytes) return Error("GGML expert-pack header size does not match");
  if (h.index_count != expected_count) {
    return Error("GGML expert-pack has " + std::to_string(h.index_count) + " entries; expected " +
                 std::to_string(expected_count));
  }
  const uint64_t index_end = kHeaderBytes + h.index_count * kEntryBytes;
  if (h.data_start < index_end || h.data_start % kPackAlignment != 0) {
    return Error("GGML expert-pack data_start is invalid or unaligned");
  }
  return h;
}

// SGLang's per-entry checks, in its order, entry after entry: each payload
// follows the previous one, and an object (up..down) spans the same bytes
// throughout (per layer when the layers' types differ).
class IndexChecker {
 public:
  IndexChecker(const std::vector<uint8_t>& index, const PackLayout& layout, const ExpertSet& ex, uint64_t data_start,
               uint64_t file_size)
      : index_(index), layout_(layout), ex_(ex), file_size_(file_size), previous_end_(data_start) {}

  Status Check(uint64_t i) {
    K3_ASSIGN_OR_RETURN(PackEntry e, DecodeEntry({index_.data() + kHeaderBytes + i * kEntryBytes, kEntryBytes}));
    if (e.reserved != 0) return Error("GGML expert-pack reserved entry field must be zero");
    if (!e.name_utf8_ok) return Error("expert-pack tensor name is not valid UTF-8");
    auto parsed = ParseExpertTensorName(e.name);
    if (!parsed) return Error("invalid expert tensor name: " + PyRepr(e.name));
    const EntrySlot want = layout_.Entry(i);
    if (parsed->layer != want.layer || parsed->role != want.role || e.expert != static_cast<int64_t>(want.expert)) {
      return Error("GGML expert-pack is not complete expert-major up/gate/down layout at index " + std::to_string(i) +
                   ": expected=" + Triple(std::to_string(want.layer), RoleName(want.role), want.expert) +
                   ", actual=" + Triple(parsed->layer_text, RoleName(parsed->role), e.expert));
    }
    if (e.nbytes != want.nbytes) {
      return Error("expert-pack byte size mismatch for index " + std::to_string(i) + ": " + std::to_string(e.nbytes) +
                   " != " + std::to_string(want.nbytes));
    }
    if (e.offset % kPackAlignment != 0) return Error("expert-pack entry " + std::to_string(i) + " is not 4 KiB aligned");
    if (e.offset < previous_end_ || e.offset + e.nbytes > file_size_ || e.offset + e.nbytes < e.offset) {
      return Error("expert-pack entry " + std::to_string(i) + " overlaps or is out of range");
    }
    previous_end_ = e.offset + e.nbytes;
    if (want.role == Role::kUp) up_start_ = e.offset;
    if (want.role == Role::kDown) {
      const uint64_t span = previous_end_ - up_start_;
      if (ex_.mixed) {
        auto [it, fresh] = span_by_layer_.emplace(want.layer, span);
        if (!fresh && it->second != span) return Error("expert-pack object spans are not fixed size");
      } else {
        if (!global_span_) global_span_ = span;
        if (*global_span_ != span) return Error("expert-pack object spans are not fixed size");
      }
    }
    return Status::OK();
  }

  uint64_t previous_end() const { return previous_end_; }

  // The object span SGLang's report gives: the first active layer's.
  uint64_t object_bytes() const {
    if (ex_.mixed && !ex_.layers.empty()) {
      auto it = span_by_layer_.find(ex_.layers.front());
      return it == span_by_layer_.end() ? 0 : it->second;
    }
    return global_span_ ? *global_span_ : (span_by_layer_.empty() ? 0 : span_by_layer_.begin()->second);
  }

 private:
  const std::vector<uint8_t>& index_;
  const PackLayout& layout_;
  const ExpertSet& ex_;
  const uint64_t file_size_;
  uint64_t previous_end_;
  uint64_t up_start_ = 0;
  std::map<uint32_t, uint64_t> span_by_layer_;
  std::optional<uint64_t> global_span_;
};

// Sampled payloads against the GGUF source, with SGLang's text for a
// difference and for a short compare (the hint says which file ended where).
Status CompareSamples(int fd, const std::string& pack_path, const std::vector<uint8_t>& index, const PackLayout& layout,
                      const ExpertSet& ex, const std::vector<uint64_t>& samples, const ValidateOptions& o) {
  // A descriptor per sampled shard, held to the end, ran a model of many
  // shards out of descriptors under a `ulimit -n` the check needs two of.
  OneOpenFile shard;
  K3_ASSIGN_OR_RETURN(IoBuffer a, IoBuffer::Allocate(4 << 20));
  K3_ASSIGN_OR_RETURN(IoBuffer b, IoBuffer::Allocate(4 << 20));
  for (uint64_t idx : samples) {
    if (o.interrupt_check) K3_RETURN_IF_ERROR(o.interrupt_check());
    K3_ASSIGN_OR_RETURN(PackEntry e, DecodeEntry({index.data() + kHeaderBytes + idx * kEntryBytes, kEntryBytes}));
    const EntrySlot s = layout.Entry(idx);
    const ExpertTensor& t = ex.by_layer[s.active_layer_index][static_cast<uint32_t>(s.role)];
    K3_ASSIGN_OR_RETURN(const int shard_fd, shard.Get(t.tensor.shard_index, t.shard_path));
    auto same = RangesEqual({fd, e.offset, pack_path},
                            {shard_fd, t.tensor.data_offset + s.expert * t.expert_bytes, t.shard_path},
                            t.expert_bytes, a, b);
    if (!same.ok() && same.error().kind() != ErrorKind::kEOF) return same.error();
    if (!same.ok() || !*same) {
      Error mismatch("expert-pack payload does not match GGUF source for " + t.tensor.name + " expert " +
                     std::to_string(s.expert));
      return same.ok() ? mismatch : mismatch.WithHint(same.error().message());
    }
  }
  return Status::OK();
}

nlohmann::json RolesSection(const ExpertSet& ex) {
  nlohmann::json roles = nlohmann::json::object();
  for (Role r : kRoleOrder) {
    const auto ri = static_cast<uint32_t>(r);
    const ExpertTensor& t0 = ex.by_layer[0][ri];
    uint64_t payload = 0;
    for (const auto& row : ex.by_layer) payload += row[ri].expert_bytes * ex.num_experts;
    roles[RoleName(r)] = {{"dtype", DtypeName(t0.tensor.dtype_id)},
                          {"dtype_id", t0.tensor.dtype_id},
                          {"logical_shape", {t0.tensor.shape.at(0), t0.tensor.shape.at(1)}},
                          {"expert_bytes", t0.expert_bytes},
                          {"entry_count", static_cast<uint64_t>(ex.layers.size()) * ex.num_experts},
                          {"payload_bytes", payload}};
  }
  return roles;
}

Result<std::string> HashWholePack(const std::string& path, uint64_t file_size, const ValidateOptions& o) {
  std::function<void(uint64_t)> hashed;
  uint64_t done = 0;
  const auto started = std::chrono::steady_clock::now();
  if (o.progress) {
    hashed = [&](uint64_t n) {
      done += n;
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      o.progress(Progress("hash pack", done, file_size, 0, 0, elapsed));
    };
  }
  return Sha256File(path, o.interrupt_check, hashed);
}

}  // namespace

Result<nlohmann::json> ValidatePack(const std::string& pack_path, const ExpertSet& ex, const ValidateOptions& o) {
  if (!PathExists(pack_path)) {
    return Error("[Errno 2] No such file or directory: " + PyRepr(pack_path), ErrorKind::kFileNotFound, ENOENT);
  }
  // SGLang's open(path, "rb") of a directory; the header read below failed
  // with "read failed at offset 0: Is a directory", naming no file.
  struct stat dir_st;
  if (::stat(pack_path.c_str(), &dir_st) == 0 && S_ISDIR(dir_st.st_mode)) {
    return PyIsADirectoryError(pack_path).WithHint(kWhichPack);
  }
  K3_ASSIGN_OR_RETURN(std::string resolved, ResolvePath(pack_path));
  K3_ASSIGN_OR_RETURN(UniqueFd fd, OpenReadOnly(resolved));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Error::FromErrno("cannot stat " + resolved, errno);
  const auto file_size = static_cast<uint64_t>(st.st_size);
  K3_ASSIGN_OR_RETURN(PackLayout layout, LayoutOf(ex));

  std::array<uint8_t, kHeaderBytes> hb{};
  auto header = ReadCheckedHeader(fd.get(), layout.index_count(), hb);
  if (const FileStart kind = header.ok() ? FileStart::kExpertPack : ClassifyFileStart(pack_path);
      kind != FileStart::kExpertPack) {
    // SGLang's words name no file: which one it was, and what it is.
    const bool other_kind = kind == FileStart::kGguf || kind == FileStart::kTrace || kind == FileStart::kJson ||
                            kind == FileStart::kSvg;
    if (!other_kind && (pack_path.ends_with(".pack") || PathExists(DigestsPathFor(pack_path)))) {
      // A pack's name with a header that is not a pack's: most likely the
      // pack with its first bytes damaged, which the repair rewrites.
      return header.error().WithHint(pack_path + " does not start as an Expert Pack (it starts as " +
                                     DescribeFileStart(pack_path) + "): a damaged header is rewritten from the "
                                     "shards' layout by `k3pack build --restart` (or `k3pack pack "
                                     "--repair-damaged`); if it is no pack, " + kWhichPack);
    }
    return header.error().WithHint(pack_path + " is " + DescribeFileStart(pack_path) + ", not an Expert Pack; " +
                                   kWhichPack);
  }
  K3_ASSIGN_OR_RETURN(PackHeader h, std::move(header));
  const uint64_t index_end = kHeaderBytes + h.index_count * kEntryBytes;
  std::vector<uint8_t> index(index_end);
  std::memcpy(index.data(), hb.data(), kHeaderBytes);
  K3_ASSIGN_OR_RETURN(size_t igot, PreadFull(fd.get(), index.data() + kHeaderBytes, index_end - kHeaderBytes,
                                             kHeaderBytes));
  IndexChecker entries(index, layout, ex, h.data_start, file_size);
  if (igot < index_end - kHeaderBytes) {
    // Cut inside the index. SGLang's entry checks run before it notices the
    // short index, and an intact first entry fails its range check (its
    // payload would start at data_start, past the end of the file); only a
    // file cut inside entry 0 reaches the truncation text.
    const std::string hint = "the pack is truncated inside its index: the file is " + std::to_string(file_size) +
                             " bytes, the index of " + std::to_string(h.index_count) + " entries ends at byte " +
                             std::to_string(index_end) + " and the payloads at byte " +
                             std::to_string(layout.final_size());
    const uint64_t complete = igot / kEntryBytes;
    for (uint64_t i = 0; i < complete; ++i) {
      Status checked = entries.Check(i);
      if (!checked.ok()) return checked.error().WithHint(hint);
    }
    return Error("GGML expert-pack index is truncated").WithHint(hint);
  }
  const std::string index_sha = Sha256Hex(index.data(), index.size());
  for (uint64_t i = 0; i < h.index_count; ++i) K3_RETURN_IF_ERROR(entries.Check(i));
  if (file_size != entries.previous_end()) {
    return Error("expert-pack has unexplained trailing bytes: " + std::to_string(file_size - entries.previous_end()));
  }

  if (o.ep) K3_RETURN_IF_ERROR(ep::CheckRank(*o.ep, ex.num_experts));
  const auto samples = SampleEntries(h.index_count, ex.num_experts, o.payload_samples, o.ep);
  K3_RETURN_IF_ERROR(CompareSamples(fd.get(), pack_path, index, layout, ex, samples, o));

  nlohmann::json out = {
      {"path", resolved},
      {"size", file_size},
      {"magic", "GGMLMOEPACKv1"},
      {"version", h.version},
      {"header_bytes", kHeaderBytes},
      {"entry_bytes", kEntryBytes},
      {"index_count", h.index_count},
      {"data_start", h.data_start},
      {"alignment", kPackAlignment},
      {"index_sha256", index_sha},
      {"physical_role_order", {"up", "gate", "down"}},
      {"active_moe_layer_ids", ex.layers},
      {"num_experts", ex.num_experts},
      {"top_k", ex.top_k},
      {"object_bytes", entries.object_bytes()},
      {"roles", RolesSection(ex)},
      {"payload_samples_verified", samples.size()},
      {"full_pack_hash", o.full_pack_hash},
  };
  if (o.full_pack_hash) {
    K3_ASSIGN_OR_RETURN(std::string whole, HashWholePack(resolved, file_size, o));
    out["sha256"] = whole;
  }
  return out;
}

}  // namespace k3pack::pack
