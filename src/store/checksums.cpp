// What both stores (ExpertStore, SlotCache) do alike once the pack passed
// SGLang's checks: plan the reads, describe the pack, and the read-path
// integrity check (per-payload CRC32Cs from the digest sidecar, checked on
// every object read before anyone sees its bytes).
#include <fcntl.h>

#include <cerrno>
#include <cstdio>

#include "k3pack/pack.h"
#include "pack/sidecars.h"
#include "store/store_impl.h"
#include "util/crc32c.h"
#include "util/process_limits.h"

namespace k3pack::store {

Result<ReadPlan> PlanObjectReads(const std::string& pack_path, const PackGeometry& geo, const StoreOptions& opt) {
  ReadPlan plan;
  const ObjectSpace& s = geo.space;
  plan.ranges.resize(s.num_active_layers());
  for (uint32_t li = 0; li < s.num_active_layers(); ++li)
    plan.ranges[li] = ObjectReadRanges(s.object_bytes[li], static_cast<uint32_t>(opt.read_splits));
  if (!opt.direct_io) return plan;
  for (uint64_t off : geo.object_offsets)
    if (off % 4096 != 0) return Error("expert-pack direct I/O requires aligned objects");
  for (const auto& rs : plan.ranges)
    for (const auto& r : rs)
      if (r.start % 4096 != 0 || r.length % 4096 != 0)
        return Error("expert-pack direct I/O requires aligned read ranges");
  auto direct = OpenReadOnly(pack_path, O_DIRECT);
  if (!direct.ok() && direct.error().sys_errno() == EINVAL) {
    // open() says only "Invalid argument": name the rule it broke.
    return Error::FromErrno("cannot open " + pack_path + " for direct I/O (O_DIRECT)", EINVAL)
        .WithHint("the filesystem holding it does not support O_DIRECT (ramfs, tmpfs before Linux 6.6, some FUSE "
                  "and network filesystems): read it without direct I/O (no --direct; direct_io=False), or move "
                  "the pack to a filesystem that supports it");
  }
  K3_ASSIGN_OR_RETURN(plan.direct_fd, std::move(direct));
  return plan;
}

StoreInfo DescribePack(const std::string& pack_path, const std::string& manifest_path, const PackGeometry& g) {
  const ObjectSpace& s = g.space;
  StoreInfo info;
  info.pack_path = pack_path;
  info.manifest_path = manifest_path;
  info.profile = g.profile;
  info.num_hidden_layers = s.num_layers_total;
  info.num_experts = s.num_experts;
  info.top_k = s.top_k;
  info.active_layer_ids = s.active_layer_ids;
  info.object_bytes = s.object_bytes;
  info.role_offsets = g.role_offsets;
  info.role_bytes = g.role_bytes;
  info.index_sha256 = g.index_sha256;
  info.index_count = g.index_count;
  info.data_start = g.data_start;
  info.pack_size = g.pack_size;
  info.ep = g.ep;
  info.owned_experts = g.owned;
  return info;
}

Result<ObjectChecksums> LoadObjectChecksums(const std::string& pack_path, const PackGeometry& geo) {
  ObjectChecksums out;
  const std::string path = pack::DigestsPathFor(pack_path);
  if (!PathExists(path)) {
    out.mode = "unavailable: no digest sidecar " + path;
    return out;
  }
  K3_ASSIGN_OR_RETURN(pack::PackDigests d, pack::ReadPackDigests(path));
  if (d.index_count != geo.index_count || d.index_sha256 != geo.index_sha256 || d.pack_size != geo.pack_size) {
    out.mode = "unavailable: digest sidecar " + path + " belongs to another pack (index differs)";
    return out;
  }
  // A rank pack's sidecar says which experts the file holds: a store that
  // would serve others would read holes and call them damage.
  if (d.ep && d.num_experts == geo.space.num_experts) {
    const ep::ExpertRange held = ep::OwnedExperts(*d.ep, d.num_experts);
    if (geo.owned.first < held.first || geo.owned.end > held.end) {
      const std::string serves =
          geo.ep.whole() ? "every expert" : "EP " + ep::Describe(geo.ep, geo.space.num_experts);
      return Error(geo.resolved_pack_path + " holds only the experts of EP " + ep::Describe(*d.ep, d.num_experts) +
                   " (its digest sidecar " + path + " says so), but this store would serve " + serves)
          .WithHint("open it with its rank manifest (the one whose k3pack.ep names the rank), or pass ep_rank=" +
                    std::to_string(d.ep->rank) + " and ep_size=" + std::to_string(d.ep->size) +
                    "; the full pack is rebuilt from all ranks with `k3pack ep-merge`");
    }
  }
  if (d.entry_crc32c.empty()) {
    out.mode = "unavailable: digest sidecar " + path +
               " predates per-object CRC32C (an older k3pack wrote it; rerun the `k3pack build` or `k3pack pack` "
               "that made the pack: it adds the CRC32C records)";
    return out;
  }
  out.entry_crc32c = std::move(d.entry_crc32c);
  out.mode = std::string("crc32c (") + Crc32cImplementation() + ")";
  return out;
}

Status CheckObjectBytes(const PackGeometry& geo, const std::vector<uint32_t>& entry_crc32c, ObjectId id,
                        const uint8_t* bytes) {
  const uint32_t li = geo.space.LayerIndexOf(id);
  for (uint32_t r = 0; r < 3; ++r) {
    const uint64_t i = uint64_t{id} * 3 + r;
    const uint32_t got = Crc32c(bytes + geo.role_offsets[li][r], geo.role_bytes[li][r]);
    if (got == entry_crc32c[i]) continue;
    static const char* kRole[3] = {"up", "gate", "down"};
    char hex[32];
    std::snprintf(hex, sizeof hex, "%08x != %08x", got, entry_crc32c[i]);
    return Error("expert-pack object (layer " + std::to_string(geo.space.LayerOf(id)) + ", expert " +
                     std::to_string(geo.space.ExpertOf(id)) + ") is damaged: " + kRole[r] + " payload at file offset " +
                     std::to_string(geo.object_offsets[id] + geo.role_offsets[li][r]) + " of " +
                     geo.resolved_pack_path + " has CRC32C " + hex + " (digest sidecar, entry " + std::to_string(i) +
                     ")",
                 ErrorKind::kOS, EIO)
        .WithHint("the pack's bytes changed after it was built (disk error?); `k3pack verify --full` lists every "
                  "damaged entry; rebuild the pack");
  }
  return Status::OK();
}

Error ExplainReadError(const PackGeometry& geo, ObjectId id, const Error& e) {
  if (!IsBareOutOfMemory(e)) return e;
  const uint32_t li = geo.space.LayerIndexOf(id);
  return Error("expert-pack object (layer " + std::to_string(geo.space.LayerOf(id)) + ", expert " +
                   std::to_string(geo.space.ExpertOf(id)) + ", " + std::to_string(geo.space.object_bytes[li]) +
                   " bytes) of " + geo.resolved_pack_path +
                   " could not be read or checked: out of memory (an allocation for its buffer, its read, its check "
                   "or its result failed)",
               ErrorKind::kMemory, ENOMEM)
      .WithHint(OutOfMemoryHint());
}

std::unique_ptr<ObjectRead> MakeObjectRead(const PackGeometry& geo, const std::vector<std::vector<ReadRange>>& ranges,
                                           ObjectId id, int fd, bool direct, uint8_t* dst) {
  const uint32_t li = geo.space.LayerIndexOf(id);
  auto read = std::make_unique<ObjectRead>();
  read->fd = fd;
  read->direct = direct;
  read->file_offset = geo.object_offsets[id];
  read->dst = dst;
  read->ranges = ranges[li];
  read->layer = geo.space.active_layer_ids[li];
  read->expert = geo.space.ExpertOf(id);
  return read;
}

Error AcquireOutOfMemory(const std::string& who, uint32_t layer) {
  return OutOfMemoryOn(who + "'s acquire of layer " + std::to_string(layer));
}

}  // namespace k3pack::store
