// The store's stats: SGLang's snapshot() keys (§7.3, §7.7) plus k3pack's
// own under "k3pack", written like SGLang's _write_stats (indent=2,
// sort_keys, ASCII, trailing newline) but through an fsynced atomic rename.
#include <algorithm>
#include <filesystem>
#include <system_error>

#include "manifest/pyjson.h"
#include "store/fork_guard.h"
#include "store/store_impl.h"
#include "store/store_state.h"
#include "util/file.h"
#include "util/output_guard.h"
#include "util/json_text.h"

namespace k3pack::store {

using nlohmann::json;

namespace {

// A stats snapshot is kilobytes; anything far larger is not one.
constexpr uint64_t kLargestStatsFile = 64ull << 20;

}  // namespace

std::optional<json> ReadStoreStats(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec || size > kLargestStatsFile) return std::nullopt;
  auto text = ReadFileToString(path);
  if (!text.ok()) return std::nullopt;
  json j = ParseJsonOrDiscarded(*text);
  if (!j.is_object() || !j.contains("cache_policy")) return std::nullopt;
  return j;
}

Status CheckStatsFile(const std::string& stats_path, const std::string& option) {
  std::error_code ec;
  // "stats/" names a directory that is not there yet: the store opened, and
  // its first write made that directory and then refused it ("is a
  // directory"), losing the counters at close.
  K3_RETURN_IF_ERROR(RefuseFileOutputEndingInSlash(option, stats_path));
  if (std::filesystem::is_directory(stats_path, ec)) {
    return Error(option + " " + stats_path + " is a directory", ErrorKind::kFileExists)
        .WithHint("pass the path of the stats file to write, e.g. " +
                  (std::filesystem::path(stats_path) / "expert-store.stats.json").string());
  }
  K3_RETURN_IF_ERROR(CheckOutputWritable(option, stats_path));
  const FileStart kind = ClassifyFileStart(stats_path);
  if (kind == FileStart::kMissing || kind == FileStart::kEmpty) return Status::OK();
  if (kind == FileStart::kJson && ReadStoreStats(stats_path)) return Status::OK();
  return Error("refusing to write the expert store's stats over " + stats_path + " (" + option + "): it is " +
                   DescribeFileStart(stats_path) + ", not a stats file",
               ErrorKind::kFileExists)
      .WithHint("the store replaces only a stats file (its own or SGLang's), not even with --force; pass another " +
                option);
}

json ExpertStore::Impl::SnapshotLocked() const {
  const ObjectSpace& s = geo.space;
  json j = json::object();
  j["pack_path"] = geo.resolved_pack_path;  // SGLang's str(Path(pack_path).resolve())
  j["pack_entries"] = geo.index_count;
  j["pack_reads"] = pack_reads;
  j["pack_read_bytes"] = pack_read_bytes;
  j["pack_read_ns"] = pack_read_ns;
  j["read_splits"] = opt.read_splits;
  j["direct_io"] = opt.direct_io;
  j["cache_hits"] = cache_hits;
  j["cache_misses"] = cache_misses;
  j["cache_evictions"] = cache_evictions;
  j["cache_policy"] = policy->name();
  j["kernel_backend"] = "custom";
  j["resident_experts"] = policy->resident_count();
  j["resident_bytes"] = policy->used_bytes();
  j["h2d_bytes"] = 0;  // host tier: no device copies
  j["cache_vram_reserve_mib"] = 0;
  j["fallback_count"] = 0;
  j["io_errors"] = io_errors;
  j["pack_format"] = geo.format;
  j["active_moe_layers"] = s.num_active_layers();
  j["cache_capacity_experts"] = info.effective_capacity_objects;
  j["cache_capacity_bytes"] = info.effective_capacity_objects * s.max_object_bytes();
  j["staged_bytes"] = 0;
  j["mean_read_ms"] = pack_reads ? double(pack_read_ns) / double(pack_reads) / 1e6 : 0.0;
  j["route_calls_by_layer"] = route_calls;
  j["route_tokens_by_layer"] = route_tokens;

  json k = json::object();
  k["profile"] = geo.profile;
  k["io_backend"] = IoBackendName(engine->backend());
  k["queue_depth"] = opt.queue_depth;
  k["queue_depth_max"] = engine->max_device_reads();
  k["cache_budget_bytes"] = opt.cache_bytes;
  k["effective_capacity_experts"] = info.effective_capacity_objects;
  // The store's own count of what it caches (objects it keeps an entry and
  // buffer for), beside the policy's `resident_bytes`: the two agree unless
  // the store kept an object the policy evicted, or the reverse.
  // In the same pass, the cache mode's prefetch term (it stages nothing): what
  // it read ahead into the cache that no acquire has used yet (later useful,
  // or wasted when dropped).
  uint64_t entry_bytes = 0, read_ahead = 0, read_ahead_bytes = 0;
  for (ObjectId id = 0; id < entries.size(); ++id) {
    if (!entries[id]) continue;
    entry_bytes += s.Cost(id);
    if (entries[id]->prefetched && !entries[id]->used) {
      ++read_ahead;
      read_ahead_bytes += s.Cost(id);
    }
  }
  k["cache_entry_bytes"] = entry_bytes;
  uint64_t tokens = s.active_layer_ids.empty() ? 0 : route_tokens[s.active_layer_ids.front()];
  k["tokens"] = tokens;
  k["bytes_read_per_token"] = tokens ? double(pack_read_bytes) / double(tokens) : 0.0;
  uint64_t lookups = cache_hits + cache_misses;
  k["hit_rate"] = lookups ? double(cache_hits) / double(lookups) : 0.0;
  k["layer_hits"] = layer_hits;
  k["layer_misses"] = layer_misses;
  k["read_latency_ms"] = latency.PercentilesMs();  // the most recent reads
  k["prefetch_issued"] = prefetch_issued;
  k["prefetch_useful"] = prefetch_useful;
  k["prefetch_wasted"] = prefetch_wasted;
  // The prefetch policy's accounting: issued = useful + wasted + cancelled +
  // staged + failed; refused prefetches were never issued.
  json pf = json::object();
  pf["mode"] = staged_mode ? "staged" : "cache";
  pf["budget_bytes"] = staged_mode ? prefetch_budget : 0;
  pf["queue_depth"] = staged_mode ? prefetch_depth : 0;
  pf["issued"] = prefetch_issued;
  pf["issued_bytes"] = prefetch_issued_bytes;
  pf["useful"] = prefetch_useful;
  pf["useful_bytes"] = prefetch_useful_bytes;
  pf["wasted"] = prefetch_wasted;
  pf["wasted_bytes"] = prefetch_wasted_bytes;
  pf["refused"] = prefetch_refused;
  pf["refused_bytes"] = prefetch_refused_bytes;
  pf["cancelled"] = prefetch_cancelled;
  pf["cancelled_bytes"] = prefetch_cancelled_bytes;
  pf["keep_predicted"] = kept.has_value();
  pf["kept"] = prefetch_kept;  // keep hints given to residents (Prefetch of a resident object)
  pf["staged"] = staged_mode ? staged_objects : read_ahead;
  pf["failed"] = prefetch_failed;
  pf["staged_bytes"] = staged_mode ? staged_bytes : read_ahead_bytes;
  pf["staged_bytes_max"] = staged_bytes_max;
  pf["inflight"] = spec_inflight;
  k["prefetch"] = pf;
  k["checksums"] = checksum_mode;
  k["checksum_errors"] = checksum_errors;
  k["checksum_verified_objects"] = checksum_verified;
  k["ep"] = EpSnapshot(geo);
  j["k3pack"] = k;
  return j;
}

Status ExpertStore::Impl::WriteStatsJson() const {
  std::lock_guard<std::mutex> writing(stats_mu);
  json snapshot;
  {
    std::lock_guard<std::mutex> lock(mu);
    snapshot = SnapshotLocked();
  }
  // SGLang's _write_stats creates the parent directory: without it, hours
  // of counters were lost at close with "No such file or directory".
  const std::filesystem::path parent = std::filesystem::path(opt.stats_path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec)
    return Error("cannot write " + opt.stats_path + ": cannot create its directory " + parent.string() + ": " +
                     ec.message(),
                 ErrorKind::kOS, ec.value());
  // Looked at again: the path may have been given to another file since open.
  K3_RETURN_IF_ERROR(CheckStatsFile(opt.stats_path));
  return WriteFileAtomic(opt.stats_path, manifest::PyJsonDumps(snapshot, manifest::PyJsonStyle::kIndent2Ascii) + "\n");
}

json ExpertStore::Snapshot() const {
  ForkSafeLock lock(impl_->mu, impl_->opened_pid);
  return impl_->SnapshotLocked();
}

Status ExpertStore::WriteStats() const {
  if (impl_->opt.stats_path.empty()) return Error("no stats path was configured");
  K3_RETURN_IF_ERROR(CheckOpenedHere(impl_->opened_pid));  // the file is the parent's
  return impl_->WriteStatsJson();
}

}  // namespace k3pack::store
