// The pack's two sidecars (formats documented in docs/FORMATS.md):
//   <pack>.digests                 binary: 128-byte header + one raw SHA-256
//                                  per index entry, in entry order, then (v2)
//                                  one CRC32C per index entry (u32 LE);
//   <pack>.partial.checkpoint      JSON, written atomically: the input
//                                  fingerprint and how many leading objects
//                                  are durably in <pack>.partial.
// While building, the digests are journaled in place in
// <pack>.partial.digests (same layout, header not yet sealed), so finishing
// is "seal the header, fsync, rename".
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "k3pack/error.h"
#include "k3pack/pack.h"
#include "pack/format.h"

namespace k3pack::pack {

inline constexpr std::array<uint8_t, 16> kDigestsMagic = {'K', '3', 'P', 'A', 'C', 'K', 'D', 'I',
                                                          'G', 'E', 'S', 'T', 'v', '1', 0, 0};
inline constexpr uint64_t kDigestsHeaderBytes = 128;
inline constexpr uint64_t kDigestBytes = 32;
inline constexpr uint64_t kCrcBytes = 4;
// Version 1: SHA-256 records only; version 2 (written for full packs):
// SHA-256 records, then CRC32C records; version 3 (written for EP rank packs):
// version 2's records plus the rank in the header's last 16 bytes (u32
// ep_size, ep_rank, num_experts, 0); the records of objects the rank does not
// own are all zero. Readers accept all three.
inline constexpr uint32_t kDigestsVersion = 2;
inline constexpr uint32_t kDigestsRankVersion = 3;

// Size of a version-2 sidecar (and of the build's journal) for n entries.
inline uint64_t DigestsFileBytes(uint64_t n) { return kDigestsHeaderBytes + n * (kDigestBytes + kCrcBytes); }
// Offset of entry i's CRC32C record in a version-2 sidecar of n entries.
inline uint64_t CrcRecordOffset(uint64_t n, uint64_t i) {
  return kDigestsHeaderBytes + n * kDigestBytes + i * kCrcBytes;
}

struct DigestsHeader {
  uint32_t version = kDigestsVersion;
  uint64_t index_count = 0;
  uint64_t pack_size = 0;
  uint64_t data_start = 0;
  std::array<uint8_t, 32> index_sha256{};    // raw
  std::array<uint8_t, 32> records_sha256{};  // SHA-256 of all records (v2: SHA then CRC); all zero = not sealed
  // Version 3 only (ep_size >= 1): the rank pack's EP rank and experts per layer.
  uint32_t ep_size = 0;
  uint32_t ep_rank = 0;
  uint32_t num_experts = 0;
  uint32_t source_tag = 0;  // version 3: SourceTag of the GGUF source (0: not recorded)
};

std::array<uint8_t, kDigestsHeaderBytes> EncodeDigestsHeader(const DigestsHeader& h);

std::string ToHex(const uint8_t* p, size_t n);
bool FromHex(const std::string& hex, uint8_t* out, size_t n);
std::array<uint8_t, 32> Sha256Raw(const void* data, size_t n);

// Whether the sidecar `d` records the pack of `layout` that is `pack_size`
// bytes: its entry count, index digest and pack size (a sidecar copied from
// another pack, or left by a pack since replaced, does not).
bool DigestsMatchPack(const PackDigests& d, const PackLayout& layout, uint64_t pack_size);

// "" when the sidecar at `dpath`, of the pack of rank `recorded` (nullopt: a
// full pack's), is of the kind of pack wanted; else "digest sidecar P is the
// sidecar of a pack of expert-parallel rank R of N (...), not of a full pack"
// (or the other way round): a rank pack's sidecar copied beside a full pack
// checks only that rank's entries.
std::string SidecarOfAnotherPackKind(const std::string& dpath, const std::optional<ep::Rank>& recorded,
                                     const std::optional<ep::Rank>& wanted, uint32_t num_experts);

std::string JournalPathFor(const std::string& pack_path);  // <pack>.partial.digests
// <pack>.inputs: what the finished pack was built from (InputsRecord).
std::string InputsRecordPathFor(const std::string& pack_path);

struct Checkpoint {
  std::string fingerprint;       // hex SHA-256 over the build inputs
  uint64_t pack_size = 0;
  uint64_t index_count = 0;
  uint64_t objects_total = 0;
  uint64_t objects_done = 0;     // objects [0, objects_done) are durable
  std::string journal_sha256;    // of the journal's SHA-256 records for those objects
  std::string index_sha256;
  // Of the journal's CRC32C records for those objects. Empty in a checkpoint
  // written before the journal had CRCs (the resume then derives them).
  std::string journal_crc_sha256;
};

std::string EncodeCheckpoint(const Checkpoint& c);
// Fails with a ValueError naming the file when the content is not a checkpoint.
Result<Checkpoint> DecodeCheckpoint(const std::string& path, const std::string& text);

}  // namespace k3pack::pack
