// GGMLMOEPACKv1: the on-disk layout of the Kimi expert pack (spec §1.1).
//
// This header is the single definition of the pack's bytes: constants, the
// 40-byte header, the 152-byte index entry, the expert-tensor name grammar and
// the payload layout (entry order + 4096-aligned offsets). The builder, the
// validator, the runtime store and the tests all use it, so the layout cannot
// drift between writer and readers.
#pragma once

#include "util/utf8.h"

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "k3pack/error.h"

namespace k3pack::pack {

inline constexpr std::array<uint8_t, 16> kPackMagic = {'G', 'G', 'M', 'L', 'M', 'O', 'E', 'P',
                                                       'A', 'C', 'K', 'v', '1', 0, 0, 0};
inline constexpr uint32_t kPackVersion = 1;
inline constexpr uint64_t kHeaderBytes = 40;   // struct "<16sIIQQ"
inline constexpr uint64_t kEntryBytes = 152;   // struct "<128siIQQ"
inline constexpr uint64_t kEntryNameBytes = 128;
inline constexpr uint64_t kPackAlignment = 4096;
inline constexpr uint64_t kCopyChunkBytes = 16ull << 20;  // SGLang's COPY_CHUNK_BYTES

// Physical role order inside one (layer, expert) object.
enum class Role : uint32_t { kUp = 0, kGate = 1, kDown = 2 };
inline constexpr uint32_t kRoleCount = 3;
inline constexpr std::array<Role, 3> kRoleOrder = {Role::kUp, Role::kGate, Role::kDown};
const char* RoleName(Role r);                           // "up", "gate", "down"
std::optional<Role> RoleFromName(std::string_view s);  // inverse of RoleName

inline constexpr uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// ------------------------------------------------------------------ header

struct PackHeader {
  std::array<uint8_t, 16> magic = kPackMagic;
  uint32_t version = kPackVersion;
  uint32_t header_size = static_cast<uint32_t>(kHeaderBytes);
  uint64_t index_count = 0;
  uint64_t data_start = 0;
};

// Little-endian "<16sIIQQ" into exactly kHeaderBytes bytes.
std::array<uint8_t, kHeaderBytes> EncodeHeader(const PackHeader& h);
// Decodes without judging the values (the validator does, with SGLang's texts).
// Fails only when fewer than kHeaderBytes bytes are given.
Result<PackHeader> DecodeHeader(std::span<const uint8_t> bytes);

// ------------------------------------------------------------------- entry

struct PackEntry {
  std::string name;          // bytes before the first NUL of the 128-byte field
  bool name_utf8_ok = true;  // decode result; false if those bytes are not valid UTF-8
  int32_t expert = 0;        // signed, as Python's "i"
  uint32_t reserved = 0;
  uint64_t offset = 0;
  uint64_t nbytes = 0;
};

// Encodes one entry. The name must be < 128 bytes (SGLang's writer rule, so
// at least one NUL terminates it); a longer name is a ValueError.
Result<std::array<uint8_t, kEntryBytes>> EncodeEntry(const PackEntry& e);
// Writes the entry into out[0..152) (out.size() >= kEntryBytes, name checked as above).
Status EncodeEntryInto(const PackEntry& e, std::span<uint8_t> out);
// Decodes: name cut at the first NUL (bytes after it ignored), UTF-8 checked.
Result<PackEntry> DecodeEntry(std::span<const uint8_t> bytes);

using k3pack::IsValidUtf8;  // util/utf8.h

// ---------------------------------------------------------- tensor names

struct ParsedExpertName {
  // int(layer), saturated: UINT64_MAX stands for 2^64 - 1 and every larger
  // layer, which no pack or spec can hold; layer_text tells them apart.
  uint64_t layer = 0;
  // str(int(layer)) at any size: Python's int has no bound, so SGLang keys
  // (and lists as extra) a stack of layer 2^64 like any other.
  std::string layer_text;
  Role role = Role::kUp;
};
// fullmatch of ^blk\.(?P<layer>\d+)\.ffn_(?P<role>up|gate|down)_exps\.weight$.
// Like Python's \d+ and int(), leading zeros are accepted ("blk.01" is layer
// 1) and so is any Unicode decimal digit ("blk.\u0663" is layer 3). nullopt
// when the name does not match.
std::optional<ParsedExpertName> ParseExpertTensorName(std::string_view name);
// Python's < on two ints written as str(int(x)) (no sign, no leading zeros).
bool PyIntTextLess(std::string_view a, std::string_view b);
std::string ExpertTensorName(uint32_t layer, Role role);  // "blk.{layer}.ffn_{role}_exps.weight"

// ------------------------------------------------------------------ layout

// Payload sizes of one active layer: expert_bytes per role (tensor.nbytes / E).
struct LayerRoleBytes {
  uint32_t layer = 0;
  std::array<uint64_t, 3> expert_bytes = {0, 0, 0};  // indexed by Role
};

// Where an entry lives and what it is.
struct EntrySlot {
  uint64_t entry_index = 0;
  uint64_t object_index = 0;  // over (active layer, expert) in order
  uint32_t layer = 0;
  uint32_t active_layer_index = 0;
  uint32_t expert = 0;
  Role role = Role::kUp;
  uint64_t offset = 0;  // absolute file offset of the payload
  uint64_t nbytes = 0;
};

// The writer's layout: entries expert-major (layer, expert, role up/gate/down),
// cursor aligned up to 4096 before every payload, no tail padding. Because
// every object starts 4096-aligned, the role offsets within an object and the
// object stride are constant per layer, so every lookup is O(1) and the K3
// pack (247,296 entries) needs no per-entry table.
class PackLayout {
 public:
  // `layers` in active order (strictly increasing layer ids expected, not required).
  // Fails on empty layers, zero experts, a zero expert_bytes, on overflow, or
  // on a name of 128 bytes or more (SGLang's writer text). `names` (by
  // active layer, then Role) are the GGUF tensors' own names, which SGLang's
  // writer puts in the index ("blk.07.ffn_up_exps.weight" stays so); without
  // them the index says ExpertTensorName's.
  static Result<PackLayout> Make(std::vector<LayerRoleBytes> layers, uint32_t num_experts,
                                 std::vector<std::array<std::string, 3>> names = {});
  // Convenience: the same three sizes for every layer.
  static Result<PackLayout> MakeUniform(const std::vector<uint32_t>& layers, uint32_t num_experts,
                                        std::array<uint64_t, 3> expert_bytes);

  uint32_t num_experts() const { return num_experts_; }
  uint32_t num_layers() const { return static_cast<uint32_t>(layers_.size()); }
  const std::vector<LayerRoleBytes>& layers() const { return layers_; }
  std::vector<uint32_t> layer_ids() const;
  // Index of `layer` in the active order, or nullopt.
  std::optional<uint32_t> ActiveIndex(uint32_t layer) const;

  uint64_t index_count() const { return index_count_; }
  uint64_t object_count() const { return index_count_ / kRoleCount; }
  uint64_t index_end() const { return kHeaderBytes + index_count_ * kEntryBytes; }  // index digest span
  uint64_t data_start() const { return data_start_; }
  uint64_t final_size() const { return final_size_; }
  PackHeader header() const;

  EntrySlot Entry(uint64_t entry_index) const;
  EntrySlot Slot(uint32_t active_layer_index, uint32_t expert, Role role) const;
  // Offset of the object's `up` payload and its span up to the end of `down`.
  uint64_t ObjectOffset(uint32_t active_layer_index, uint32_t expert) const;
  uint64_t ObjectBytes(uint32_t active_layer_index) const;  // up start .. down end
  // Role offset relative to the object start (constant per layer).
  uint64_t RoleOffsetInObject(uint32_t active_layer_index, Role role) const;
  // True when the three roles are byte-contiguous in every layer (runtime store requirement).
  bool RolesContiguous() const;
  // True when every layer has the same expert_bytes.
  bool Uniform() const;

  PackEntry EntryRecord(uint64_t entry_index) const;  // the index entry the writer emits
  // Header + all entries + zero fill up to data_start (data_start bytes).
  std::vector<uint8_t> EncodePrefix() const;
  // SHA-256 over header + entries (bytes [0, index_end())), lowercase hex.
  std::string IndexSha256() const;

 private:
  struct LayerGeom {
    uint64_t base = 0;                      // offset of expert 0's object
    std::array<uint64_t, 3> role_off = {};  // within the object
    uint64_t stride = 0;                    // object to object
    uint64_t object_bytes = 0;              // up start .. down end
  };
  std::vector<LayerRoleBytes> layers_;
  std::vector<std::array<std::string, 3>> names_;  // empty, or one row per layer
  std::vector<LayerGeom> geom_;
  uint32_t num_experts_ = 0;
  uint64_t index_count_ = 0;
  uint64_t data_start_ = 0;
  uint64_t final_size_ = 0;
};

}  // namespace k3pack::pack
