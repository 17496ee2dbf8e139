#include "pack/sidecars.h"

#include <openssl/sha.h>

#include <cstring>

#include <nlohmann/json.hpp>

#include "k3pack/pack.h"
#include "util/file.h"
#include "util/sha256.h"

#include "util/le.h"
#include "util/json_text.h"

namespace k3pack::pack {
namespace {


}  // namespace

std::string DigestsPathFor(const std::string& p) { return p + ".digests"; }
bool DigestsMatchPack(const PackDigests& d, const PackLayout& layout, uint64_t pack_size) {
  return d.index_count == layout.index_count() && d.index_sha256 == layout.IndexSha256() && d.pack_size == pack_size;
}

std::string SidecarOfAnotherPackKind(const std::string& dpath, const std::optional<ep::Rank>& recorded,
                                     const std::optional<ep::Rank>& wanted, uint32_t num_experts) {
  const bool same = recorded.has_value() == wanted.has_value() &&
                    (!recorded || (recorded->size == wanted->size && recorded->rank == wanted->rank));
  if (same) return "";
  auto kind = [&](const std::optional<ep::Rank>& r) {
    return r ? "a pack of expert-parallel " + ep::Describe(*r, num_experts) : std::string("a full pack");
  };
  return "digest sidecar " + dpath + " is the sidecar of " + kind(recorded) + ", not of " + kind(wanted);
}

std::string PartialPathFor(const std::string& p) { return p + ".partial"; }
std::string CheckpointPathFor(const std::string& p) { return p + ".partial.checkpoint"; }
std::string LockPathFor(const std::string& p) { return p + ".lock"; }
std::string JournalPathFor(const std::string& p) { return p + ".partial.digests"; }
std::string InputsRecordPathFor(const std::string& p) { return p + ".inputs"; }

std::string ToHex(const uint8_t* p, size_t n) {
  static const char* kHex = "0123456789abcdef";
  std::string s(n * 2, '0');
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = kHex[p[i] >> 4];
    s[2 * i + 1] = kHex[p[i] & 15];
  }
  return s;
}

bool FromHex(const std::string& hex, uint8_t* out, size_t n) {
  if (hex.size() != 2 * n) return false;
  auto val = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (size_t i = 0; i < n; ++i) {
    int hi = val(hex[2 * i]), lo = val(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return true;
}

std::array<uint8_t, 32> Sha256Raw(const void* data, size_t n) {
  std::array<uint8_t, 32> out{};
  SHA256(static_cast<const unsigned char*>(data), n, out.data());
  return out;
}

std::array<uint8_t, kDigestsHeaderBytes> EncodeDigestsHeader(const DigestsHeader& h) {
  std::array<uint8_t, kDigestsHeaderBytes> out{};
  std::memcpy(out.data(), kDigestsMagic.data(), 16);
  PutU32(out.data() + 16, h.version);                                  // version
  PutU32(out.data() + 20, static_cast<uint32_t>(kDigestsHeaderBytes));  // header size
  PutU64(out.data() + 24, h.index_count);
  PutU64(out.data() + 32, h.pack_size);
  PutU64(out.data() + 40, h.data_start);
  std::memcpy(out.data() + 48, h.index_sha256.data(), 32);
  std::memcpy(out.data() + 80, h.records_sha256.data(), 32);
  if (h.version >= kDigestsRankVersion) {
    PutU32(out.data() + 112, h.ep_size);
    PutU32(out.data() + 116, h.ep_rank);
    PutU32(out.data() + 120, h.num_experts);
    PutU32(out.data() + 124, h.source_tag);
  }
  return out;
}

Result<PackDigests> ReadPackDigests(const std::string& path) {
  K3_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path));
  auto bad = [&](const std::string& why) {
    return Error("digest sidecar " + path + " is invalid: " + why, ErrorKind::kValue);
  };
  if (bytes.size() < kDigestsHeaderBytes) return bad("shorter than its 128-byte header");
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  if (std::memcmp(p, kDigestsMagic.data(), 16) != 0) return bad("bad magic");
  const uint32_t version = GetU32(p + 16);
  if (version < 1 || version > kDigestsRankVersion || GetU32(p + 20) != kDigestsHeaderBytes) {
    return bad("unsupported version");
  }
  const uint64_t record = version == 1 ? kDigestBytes : kDigestBytes + kCrcBytes;
  PackDigests d;
  d.index_count = GetU64(p + 24);
  d.pack_size = GetU64(p + 32);
  d.data_start = GetU64(p + 40);
  d.index_sha256 = ToHex(p + 48, 32);
  if (version >= kDigestsRankVersion) {
    const ep::Rank rank{GetU32(p + 112), GetU32(p + 116)};
    d.num_experts = GetU32(p + 120);
    d.source_tag = GetU32(p + 124);
    const Status st = ep::CheckRank(rank, d.num_experts);
    if (!st.ok()) return bad("its expert-parallel rank is invalid: " + st.error().message());
    d.ep = rank;
  }
  if (d.index_count > (bytes.size() - kDigestsHeaderBytes) / record ||
      bytes.size() != kDigestsHeaderBytes + d.index_count * record) {
    return bad("size " + std::to_string(bytes.size()) + " does not hold " + std::to_string(d.index_count) +
               " digests");
  }
  auto records = Sha256Raw(p + kDigestsHeaderBytes, d.index_count * record);
  if (std::memcmp(records.data(), p + 80, 32) != 0) return bad("records checksum mismatch (damaged or unsealed)");
  d.entry_sha256.resize(d.index_count);
  for (uint64_t i = 0; i < d.index_count; ++i) {
    std::memcpy(d.entry_sha256[i].data(), p + kDigestsHeaderBytes + i * kDigestBytes, 32);
  }
  if (version >= 2) {
    d.entry_crc32c.resize(d.index_count);
    for (uint64_t i = 0; i < d.index_count; ++i) d.entry_crc32c[i] = GetU32(p + CrcRecordOffset(d.index_count, i));
  }
  return d;
}

Status WritePackDigests(const std::string& path, const PackDigests& d) {
  const uint64_t n = d.entry_sha256.size();
  const bool crcs = !d.entry_crc32c.empty();
  if (crcs && d.entry_crc32c.size() != n) return Error("WritePackDigests: CRC and SHA-256 counts differ");
  std::string out(crcs ? DigestsFileBytes(n) : kDigestsHeaderBytes + n * kDigestBytes, '\0');
  auto* p = reinterpret_cast<uint8_t*>(out.data());
  for (size_t i = 0; i < n; ++i) {
    std::memcpy(p + kDigestsHeaderBytes + i * kDigestBytes, d.entry_sha256[i].data(), 32);
    if (crcs) PutU32(p + CrcRecordOffset(n, i), d.entry_crc32c[i]);
  }
  DigestsHeader h;
  h.version = crcs ? 2 : 1;
  if (d.ep) {
    if (!crcs) return Error("WritePackDigests: a rank pack's sidecar (version 3) needs CRCs");
    h.version = kDigestsRankVersion;
    h.ep_size = d.ep->size;
    h.ep_rank = d.ep->rank;
    h.num_experts = d.num_experts;
    h.source_tag = d.source_tag;
  }
  h.index_count = n;
  h.pack_size = d.pack_size;
  h.data_start = d.data_start;
  if (!FromHex(d.index_sha256, h.index_sha256.data(), 32)) return Error("bad index_sha256 hex");
  h.records_sha256 = Sha256Raw(p + kDigestsHeaderBytes, out.size() - kDigestsHeaderBytes);
  auto head = EncodeDigestsHeader(h);
  std::memcpy(p, head.data(), head.size());
  return WriteFileAtomic(path, out);
}

std::string EncodeCheckpoint(const Checkpoint& c) {
  nlohmann::json j = {{"format", "K3PACK-PACK-CHECKPOINT-v1"},
                      {"fingerprint", c.fingerprint},
                      {"pack_size", c.pack_size},
                      {"index_count", c.index_count},
                      {"index_sha256", c.index_sha256},
                      {"objects_total", c.objects_total},
                      {"objects_done", c.objects_done},
                      {"journal_sha256", c.journal_sha256}};
  if (!c.journal_crc_sha256.empty()) j["journal_crc_sha256"] = c.journal_crc_sha256;
  return j.dump(2) + "\n";
}

Result<Checkpoint> DecodeCheckpoint(const std::string& path, const std::string& text) {
  auto j = ParseJsonOrDiscarded(text);
  auto bad = [&](const std::string& why) {
    return Error("checkpoint " + path + " is unreadable: " + why, ErrorKind::kValue)
        .WithHint("pass --restart to discard the partial build and start over");
  };
  if (j.is_discarded() || !j.is_object()) return bad("not JSON");
  // Not value(): it throws when the key holds another type than the default's.
  const auto format = j.find("format");
  if (format == j.end() || !format->is_string() || *format != "K3PACK-PACK-CHECKPOINT-v1") {
    return bad("unknown format");
  }
  try {
    Checkpoint c;
    c.fingerprint = j.at("fingerprint").get<std::string>();
    c.pack_size = j.at("pack_size").get<uint64_t>();
    c.index_count = j.at("index_count").get<uint64_t>();
    c.index_sha256 = j.at("index_sha256").get<std::string>();
    c.objects_total = j.at("objects_total").get<uint64_t>();
    c.objects_done = j.at("objects_done").get<uint64_t>();
    c.journal_sha256 = j.at("journal_sha256").get<std::string>();
    c.journal_crc_sha256 = j.value("journal_crc_sha256", "");
    if (c.objects_done > c.objects_total) return bad("objects_done > objects_total");
    return c;
  } catch (const std::exception& e) {
    return bad(e.what());
  }
}

}  // namespace k3pack::pack
