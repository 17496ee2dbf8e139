// Internals shared by the store's translation units: the validated pack
// geometry produced by Open()'s checks.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "k3pack/ep.h"
#include "k3pack/error.h"
#include "k3pack/manifest.h"
#include "k3pack/store.h"
#include "store/io_engine.h"
#include "store/object_space.h"
#include "store/policy.h"
#include "store/runtime_options.h"
#include "util/file.h"

namespace k3pack::store {

struct PackGeometry {
  ObjectSpace space;
  std::string profile;                               // "kimi-k3" | "scaled"
  std::string format;
  std::string resolved_pack_path;
  std::vector<std::array<uint64_t, 3>> role_offsets;  // per active layer: up, gate, down
  std::vector<std::array<uint64_t, 3>> role_bytes;
  std::vector<uint64_t> object_offsets;               // per ObjectId
  std::string index_sha256;                          // manifest's (== computed)
  uint64_t index_count = 0, data_start = 0, pack_size = 0, alignment = 0;
  std::string inventory_sha256, config_sha256;
  // The EP rank served (size 1: all experts), its experts, and where the
  // rank came from: "none", "manifest", "option" or "manifest and option".
  ep::Rank ep;
  ep::ExpertRange owned;
  std::string ep_source = "none";
};

// Every start-up check of SGLang's KimiGGMLExpertPackStore (spec §2.7/§7.2),
// in its order, with its texts; `fd` is the opened pack.
// SGLang's check 1: both paths are regular files, else its FileNotFoundError
// text naming both paths resolved (Path.resolve()).
Status CheckStoreFiles(const std::string& pack_path, const std::string& manifest_path);

// stats_path may be written: not a directory, in a writable place, and
// holding nothing or a store's stats (SGLang's or k3pack's: a JSON object
// with cache_policy). Anything else is refused (kFileExists) rather than
// replaced: a slip of the path once wrote the counters over the served pack.
// Checked at open (so counters are not lost at close) and before each write.
// `option` names the path in messages (the CLI's --stats).
Status CheckStatsFile(const std::string& stats_path, const std::string& option = "stats_path");
// The stats object a store (SGLang's or k3pack's) wrote at `path`; nullopt
// for anything else (a far larger file than a snapshot is not read).
std::optional<nlohmann::json> ReadStoreStats(const std::string& path);

Result<PackGeometry> ValidatePack(const std::string& pack_path, const std::string& manifest_path,
                                  const StoreOptions& options, int fd);

// The manifest's JSON once step 2 holds (the adapter format, marked
// complete): SGLang's text, with a hint naming what the file lacks.
Result<nlohmann::json> ReadStoreManifest(const std::string& manifest_path);
// The object space a manifest describes (dimensions, per-layer object
// sizes) without validating the pack: for trace generation and simulation.
Result<ObjectSpace> SpaceFromManifest(const std::string& manifest_path);

// SGLang's read ranges (read_splits per object) for each active layer, after
// its direct-I/O checks (aligned objects and ranges, its texts) when
// `opt.direct_io`; `direct_fd` is then the pack opened with O_DIRECT.
struct ReadPlan {
  std::vector<std::vector<ReadRange>> ranges;  // per active layer
  UniqueFd direct_fd;
};
Result<ReadPlan> PlanObjectReads(const std::string& pack_path, const PackGeometry& geo, const StoreOptions& opt);

// The read of object `id` into `dst` over its layer's ranges (ReadPlan's
// per-layer `ranges`), from `fd` (the O_DIRECT one when `direct`); its
// `done` is the caller's.
std::unique_ptr<ObjectRead> MakeObjectRead(const PackGeometry& geo, const std::vector<std::vector<ReadRange>>& ranges,
                                           ObjectId id, int fd, bool direct, uint8_t* dst);

// What a caller of either store learns about the pack it opened.
StoreInfo DescribePack(const std::string& pack_path, const std::string& manifest_path, const PackGeometry& geo);

// The per-payload CRC32Cs of the pack's digest sidecar, when it has them and
// belongs to this pack (`mode` says "crc32c (...)"). A missing, older
// (version 1) or foreign sidecar leaves them empty and `mode` says why (the
// pack itself is valid for SGLang); a sidecar that is present but damaged is
// an error: it is k3pack's own file.
struct ObjectChecksums {
  std::vector<uint32_t> entry_crc32c;  // per index entry; empty = no check
  std::string mode;
};
Result<ObjectChecksums> LoadObjectChecksums(const std::string& pack_path, const PackGeometry& geo);
// Checks one object's bytes (up | gate | down as in the pack) against them:
// an error naming layer, expert, role and file offset.
Status CheckObjectBytes(const PackGeometry& geo, const std::vector<uint32_t>& entry_crc32c, ObjectId id,
                        const uint8_t* bytes);

// What a caller is told of a read of `id` that failed with `e`: `e`, or for
// BareOutOfMemory (all an I/O thread without memory could record) an error
// naming the object, the pack and the process's memory limit.
Error ExplainReadError(const PackGeometry& geo, ObjectId id, const Error& e);

// An acquire of `layer` by `who` ("the expert store", "the slot cache", ...)
// that ran out of memory on the caller's thread and gave back what it took.
Error AcquireOutOfMemory(const std::string& who, uint32_t layer);

// The EP rank a store serves: the manifest's k3pack.ep (a rank pack) and
// StoreOptions::ep must agree when both are given; the error names both.
// Checked after every SGLang check (k3pack's own rule). Sets geo->ep/owned.
// `names`: what an error about `option` calls its size and rank.
Status ResolveStoreRank(const std::optional<manifest::EpRecord>& recorded, const std::optional<ep::Rank>& option,
                        const std::string& manifest_path, PackGeometry* geo, const ep::RankNames& names = {});
// A rank store's refusal of routes to experts it does not own (after
// SGLang's route checks, before any I/O): names layer, expert, this rank and
// the owner. OK for a whole store.
Status CheckOwnedRoutes(const ep::Rank& rank, uint32_t num_experts, uint32_t layer, std::span<const int64_t> ids);
inline Status CheckOwnedRoutes(const PackGeometry& geo, uint32_t layer, std::span<const int64_t> ids) {
  return CheckOwnedRoutes(geo.ep, geo.space.num_experts, layer, ids);
}
// One acquire's route checks for a store over `geo`: SGLang's (PrepareRoute;
// a row is exactly top_k routes, or 1..top_k on a rank store, a token's share
// of its routes), then the rank's ownership (CheckOwnedRoutes).
Result<RouteCall> PrepareStoreRoute(const PackGeometry& geo, uint32_t layer, std::span<const int64_t> shape,
                                    std::span<const int64_t> ids, std::optional<bool> is_prefill);
// An acquire's request ids hold none, one for the call or one per row, and
// none is kNoRequestId; a Prefetch()/Keep() id is not kNoRequestId.
Status CheckRequestIds(std::span<const uint64_t> request_ids, uint64_t rows);
Status CheckRequestId(std::optional<uint64_t> request_id);

// A front tier's call of `layer` read through `host` in several acquires
// (ExpertStore::BeginChunkedCall), ended on every way out; nothing when the
// call fits one acquire (`chunked` false).
class ChunkedHostCall {
 public:
  ChunkedHostCall(ExpertStore& host, uint32_t layer, bool chunked, std::span<const uint64_t> requests = {})
      : host_(chunked ? &host : nullptr), layer_(layer), requests_(requests) {
    if (host_) host_->BeginChunkedCall(layer_);
  }
  ~ChunkedHostCall() {
    if (host_) host_->EndChunkedCall(layer_, requests_);
  }
  ChunkedHostCall(const ChunkedHostCall&) = delete;
  ChunkedHostCall& operator=(const ChunkedHostCall&) = delete;

 private:
  ExpertStore* host_;
  uint32_t layer_;
  std::span<const uint64_t> requests_;
};
// The policy's CallRows for an acquire's optional request ids (empty:
// unknown, null result; else one id for the call or one per row, a
// ValueError otherwise); `keys` backs the result's route keys.
Result<const CallRows*> StoreCallRows(const ObjectSpace& space, const RouteCall& call, std::span<const int64_t> ids,
                                      std::span<const uint64_t> request_ids, std::vector<ObjectId>* keys,
                                      CallRows* out);
// An acquire's checked route and its rows for the policy, shared by both
// stores' Acquire: PrepareStoreRoute, then StoreCallRows. `rows.keys` points
// into `row_keys`' buffer, which a move keeps.
struct PreparedAcquire {
  RouteCall call;
  std::vector<ObjectId> row_keys;
  CallRows rows;
  bool has_rows = false;  // false: no request ids given
  const CallRows* call_rows() const { return has_rows ? &rows : nullptr; }
};
Result<PreparedAcquire> PrepareAcquire(const PackGeometry& geo, uint32_t layer, std::span<const int64_t> shape,
                                       std::span<const int64_t> ids, std::optional<bool> is_prefill,
                                       std::span<const uint64_t> request_ids);
// The smallest working set one token may need resident: top_k objects, or
// for a rank store min(top_k, owned experts).
uint32_t WorkingSetObjects(const PackGeometry& geo);
// k3pack.ep in a snapshot: size, rank, owned range, owned objects and bytes.
nlohmann::json EpSnapshot(const PackGeometry& geo);

// SGLang's per-object generation: first 8 bytes (little-endian) of
// sha256("{index_sha256}:{layer}:{expert}"), 1 if that is 0.
uint64_t ObjectGeneration(const std::string& index_sha256, uint32_t layer, uint32_t expert);

}  // namespace k3pack::store
