#include "pack/format.h"

#include <cstring>
#include <limits>

#include "util/sha256.h"

#include "util/le.h"

namespace k3pack::pack {
namespace {


bool AddOverflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_add_overflow(a, b, out); }
bool MulOverflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

}  // namespace

const char* RoleName(Role r) {
  switch (r) {
    case Role::kUp: return "up";
    case Role::kGate: return "gate";
    case Role::kDown: return "down";
  }
  return "?";
}

std::optional<Role> RoleFromName(std::string_view s) {
  if (s == "up") return Role::kUp;
  if (s == "gate") return Role::kGate;
  if (s == "down") return Role::kDown;
  return std::nullopt;
}

std::array<uint8_t, kHeaderBytes> EncodeHeader(const PackHeader& h) {
  std::array<uint8_t, kHeaderBytes> out{};
  std::memcpy(out.data(), h.magic.data(), 16);
  PutU32(out.data() + 16, h.version);
  PutU32(out.data() + 20, h.header_size);
  PutU64(out.data() + 24, h.index_count);
  PutU64(out.data() + 32, h.data_start);
  return out;
}

Result<PackHeader> DecodeHeader(std::span<const uint8_t> bytes) {
  if (bytes.size() < kHeaderBytes) {
    return Error("unpack requires a buffer of 40 bytes", ErrorKind::kValue);
  }
  PackHeader h;
  std::memcpy(h.magic.data(), bytes.data(), 16);
  h.version = GetU32(bytes.data() + 16);
  h.header_size = GetU32(bytes.data() + 20);
  h.index_count = GetU64(bytes.data() + 24);
  h.data_start = GetU64(bytes.data() + 32);
  return h;
}

Status EncodeEntryInto(const PackEntry& e, std::span<uint8_t> out) {
  if (out.size() < kEntryBytes) return Error("entry buffer smaller than 152 bytes", ErrorKind::kValue);
  if (e.name.size() >= kEntryNameBytes) {
    return Error("pack tensor name is too long: " + e.name, ErrorKind::kValue);
  }
  uint8_t* p = out.data();
  std::memset(p, 0, kEntryBytes);
  std::memcpy(p, e.name.data(), e.name.size());
  PutU32(p + 128, static_cast<uint32_t>(e.expert));
  PutU32(p + 132, e.reserved);
  PutU64(p + 136, e.offset);
  PutU64(p + 144, e.nbytes);
  return Status::OK();
}

Result<std::array<uint8_t, kEntryBytes>> EncodeEntry(const PackEntry& e) {
  std::array<uint8_t, kEntryBytes> out{};
  K3_RETURN_IF_ERROR(EncodeEntryInto(e, out));
  return out;
}

Result<PackEntry> DecodeEntry(std::span<const uint8_t> bytes) {
  if (bytes.size() < kEntryBytes) {
    return Error("unpack requires a buffer of 152 bytes", ErrorKind::kValue);
  }
  const uint8_t* p = bytes.data();
  const void* nul = std::memchr(p, 0, kEntryNameBytes);
  size_t len = nul ? static_cast<size_t>(static_cast<const uint8_t*>(nul) - p) : kEntryNameBytes;
  PackEntry e;
  e.name.assign(reinterpret_cast<const char*>(p), len);
  e.name_utf8_ok = IsValidUtf8(e.name);
  e.expert = static_cast<int32_t>(GetU32(p + 128));
  e.reserved = GetU32(p + 132);
  e.offset = GetU64(p + 136);
  e.nbytes = GetU64(p + 144);
  return e;
}

std::optional<ParsedExpertName> ParseExpertTensorName(std::string_view name) {
  constexpr std::string_view kPre = "blk.";
  if (name.substr(0, kPre.size()) != kPre) return std::nullopt;
  const size_t dot = name.find('.', kPre.size());
  if (dot == std::string_view::npos) return std::nullopt;
  // Python's \d: any Unicode decimal digit, read as int() reads it.
  const std::string_view digits = name.substr(kPre.size(), dot - kPre.size());
  const std::optional<uint64_t> layer = PyDecimalValue(digits);
  if (!layer) return std::nullopt;
  std::string_view rest = name.substr(dot);
  for (Role r : kRoleOrder) {
    std::string expect = std::string(".ffn_") + RoleName(r) + "_exps.weight";
    if (rest == expect) return ParsedExpertName{*layer, *PyDecimalText(digits), r};
  }
  return std::nullopt;
}

bool PyIntTextLess(std::string_view a, std::string_view b) {
  return a.size() != b.size() ? a.size() < b.size() : a < b;
}

std::string ExpertTensorName(uint32_t layer, Role role) {
  return "blk." + std::to_string(layer) + ".ffn_" + RoleName(role) + "_exps.weight";
}

// ------------------------------------------------------------------ layout

Result<PackLayout> PackLayout::Make(std::vector<LayerRoleBytes> layers, uint32_t num_experts,
                                    std::vector<std::array<std::string, 3>> names) {
  if (layers.empty()) return Error("pack layout needs at least one active MoE layer", ErrorKind::kValue);
  if (num_experts == 0) return Error("pack layout needs num_experts > 0", ErrorKind::kValue);
  if (!names.empty() && names.size() != layers.size()) {
    return Error("pack layout: " + std::to_string(names.size()) + " rows of names for " +
                     std::to_string(layers.size()) + " layers",
                 ErrorKind::kValue);
  }
  // The index field holds 128 bytes and must keep a NUL; SGLang's writer
  // meets this only once its .partial exists, k3pack before any output.
  for (const auto& row : names) {
    for (const std::string& name : row) {
      if (name.size() < kEntryNameBytes) continue;
      return Error("expert tensor name is too long for the Pack index: " + name, ErrorKind::kValue)
          .WithHint("the name is " + std::to_string(name.size()) + " bytes; a pack index entry holds at most " +
                    std::to_string(kEntryNameBytes - 1) + " (rename the tensor in the GGUF)");
    }
  }
  PackLayout out;
  out.names_ = std::move(names);
  out.num_experts_ = num_experts;
  const uint64_t n_layers = layers.size();
  if (MulOverflows(n_layers * kRoleCount, num_experts, &out.index_count_)) {
    return Error("pack layout overflows", ErrorKind::kValue);
  }
  uint64_t index_end = 0;
  if (MulOverflows(out.index_count_, kEntryBytes, &index_end) || AddOverflows(index_end, kHeaderBytes, &index_end)) {
    return Error("pack layout overflows", ErrorKind::kValue);
  }
  out.data_start_ = AlignUp(index_end, kPackAlignment);
  uint64_t cursor = out.data_start_;
  out.geom_.reserve(layers.size());
  for (const auto& l : layers) {
    LayerGeom g;
    uint64_t c = 0;
    for (Role r : kRoleOrder) {
      uint64_t nb = l.expert_bytes[static_cast<uint32_t>(r)];
      if (nb == 0) {
        return Error("pack layout: layer " + std::to_string(l.layer) + " role " + RoleName(r) +
                         " has zero expert bytes",
                     ErrorKind::kValue);
      }
      c = AlignUp(c, kPackAlignment);
      g.role_off[static_cast<uint32_t>(r)] = c;
      if (AddOverflows(c, nb, &c)) return Error("pack layout overflows", ErrorKind::kValue);
    }
    g.object_bytes = c;
    g.stride = AlignUp(c, kPackAlignment);
    cursor = AlignUp(cursor, kPackAlignment);
    g.base = cursor;
    uint64_t span = 0;
    if (MulOverflows(g.stride, num_experts - 1, &span) || AddOverflows(span, g.object_bytes, &span) ||
        AddOverflows(cursor, span, &cursor)) {
      return Error("pack layout overflows", ErrorKind::kValue);
    }
    out.geom_.push_back(g);
  }
  out.final_size_ = cursor;
  out.layers_ = std::move(layers);
  return out;
}

Result<PackLayout> PackLayout::MakeUniform(const std::vector<uint32_t>& layers, uint32_t num_experts,
                                           std::array<uint64_t, 3> expert_bytes) {
  std::vector<LayerRoleBytes> v;
  v.reserve(layers.size());
  for (uint32_t l : layers) v.push_back({l, expert_bytes});
  return Make(std::move(v), num_experts);
}

std::vector<uint32_t> PackLayout::layer_ids() const {
  std::vector<uint32_t> ids;
  ids.reserve(layers_.size());
  for (const auto& l : layers_) ids.push_back(l.layer);
  return ids;
}

std::optional<uint32_t> PackLayout::ActiveIndex(uint32_t layer) const {
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (layers_[i].layer == layer) return static_cast<uint32_t>(i);
  }
  return std::nullopt;
}

PackHeader PackLayout::header() const {
  PackHeader h;
  h.index_count = index_count_;
  h.data_start = data_start_;
  return h;
}

EntrySlot PackLayout::Slot(uint32_t ali, uint32_t expert, Role role) const {
  const LayerGeom& g = geom_[ali];
  EntrySlot s;
  s.active_layer_index = ali;
  s.layer = layers_[ali].layer;
  s.expert = expert;
  s.role = role;
  s.object_index = static_cast<uint64_t>(ali) * num_experts_ + expert;
  s.entry_index = s.object_index * kRoleCount + static_cast<uint32_t>(role);
  s.offset = g.base + g.stride * expert + g.role_off[static_cast<uint32_t>(role)];
  s.nbytes = layers_[ali].expert_bytes[static_cast<uint32_t>(role)];
  return s;
}

EntrySlot PackLayout::Entry(uint64_t entry_index) const {
  uint64_t object = entry_index / kRoleCount;
  auto role = static_cast<Role>(entry_index % kRoleCount);
  return Slot(static_cast<uint32_t>(object / num_experts_), static_cast<uint32_t>(object % num_experts_), role);
}

uint64_t PackLayout::ObjectOffset(uint32_t ali, uint32_t expert) const {
  return geom_[ali].base + geom_[ali].stride * expert;
}
uint64_t PackLayout::ObjectBytes(uint32_t ali) const { return geom_[ali].object_bytes; }
uint64_t PackLayout::RoleOffsetInObject(uint32_t ali, Role role) const {
  return geom_[ali].role_off[static_cast<uint32_t>(role)];
}

bool PackLayout::RolesContiguous() const {
  for (size_t i = 0; i < layers_.size(); ++i) {
    const auto& b = layers_[i].expert_bytes;
    if (geom_[i].object_bytes != b[0] + b[1] + b[2]) return false;
  }
  return true;
}

bool PackLayout::Uniform() const {
  for (const auto& l : layers_) {
    if (l.expert_bytes != layers_.front().expert_bytes) return false;
  }
  return true;
}

PackEntry PackLayout::EntryRecord(uint64_t entry_index) const {
  EntrySlot s = Entry(entry_index);
  PackEntry e;
  e.name = names_.empty() ? ExpertTensorName(s.layer, s.role)
                          : names_[entry_index / kRoleCount / num_experts_][static_cast<uint32_t>(s.role)];
  e.expert = static_cast<int32_t>(s.expert);
  e.offset = s.offset;
  e.nbytes = s.nbytes;
  return e;
}

std::vector<uint8_t> PackLayout::EncodePrefix() const {
  std::vector<uint8_t> out(data_start_, 0);
  auto h = EncodeHeader(header());
  std::memcpy(out.data(), h.data(), h.size());
  for (uint64_t i = 0; i < index_count_; ++i) {
    // Names are short ("blk.N.ffn_gate_exps.weight"), so encoding cannot fail.
    (void)EncodeEntryInto(EntryRecord(i), std::span<uint8_t>(out.data() + kHeaderBytes + i * kEntryBytes, kEntryBytes));
  }
  return out;
}

std::string PackLayout::IndexSha256() const {
  auto prefix = EncodePrefix();
  return Sha256Hex(prefix.data(), index_end());
}

}  // namespace k3pack::pack
