// Loader throughput for the non-routed weights, next to memcpy of the same
// bytes measured in the same run.
//
//   bench_loader [--manifest M | --gguf DIR] [--mib N] [--repeat R] [--dir D] [--holes]
//
// --gguf DIR streams an existing shard set through a minimal manifest
// written for it (e.g. `k3pack synth --preset k3-structure`). Without
// either, the bench writes a synthetic 3-shard model with N MiB of
// non-routed tensors (real bytes, or holes with --holes) plus routed
// aggregates (holes, never read) and a manifest beside it.
//
// R rounds (each round runs every mode once), once with a cold page cache
// (POSIX_FADV_DONTNEED on every shard before each run) and once warm; per
// mode the median time, the median and range of its ratio to the baseline
// run of the same round, and the growth of peak RSS:
//   raw pread    the baseline: exactly the emitted byte ranges read with
//                pread into one reused buffer, POSIX_FADV_SEQUENTIAL;
//   memcpy-map   the same ranges memcpy-ed out of fresh read-only mappings;
//   loader       NonExpertStream (all checks, zero-copy views, MADV_WILLNEED)
//                with the consumer memcpy-ing every tensor to one buffer;
//   populate     the same with LoadOptions::populate (MADV_POPULATE_READ);
//   copy         LoadOptions::copy: the stream preads every tensor into a
//                fresh buffer of its own (what a copying consumer gets).
// Ratios are to the raw pread of the same run (target >= 0.8). Timings are
// never asserted. With --gguf on `k3pack synth --preset k3-structure` output
// this is the full-scale structural (sparse) model.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_args.h"
#include "bench_measure.h"
#include "k3pack/gguf.h"
#include "k3pack/loader.h"
#include "util/file.h"
#include "util/sha256.h"

namespace {

using namespace k3pack;  // NOLINT
using nlohmann::json;
namespace fs = std::filesystem;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

uint64_t PeakRss() {
  struct rusage ru {};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;
}

// VmHWM / VmRSS of /proc/self/status in bytes (0 where unavailable).
uint64_t StatusBytes(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const size_t klen = std::strlen(key);
  while (std::getline(in, line)) {
    if (line.compare(0, klen, key) == 0) return std::strtoull(line.c_str() + klen, nullptr, 10) * 1024;
  }
  return 0;
}
uint64_t CurrentRss() { return StatusBytes("VmRSS:"); }
uint64_t PeakRssNow() { return StatusBytes("VmHWM:"); }
// Sets VmHWM back to the current RSS, so each mode's peak is its own.
void ResetPeakRss() { std::ofstream("/proc/self/clear_refs") << "5"; }

// The manifest fields the stream reads (and verify_metadata compares),
// computed from the shard files.
std::string WriteMinimalManifest(const std::vector<std::string>& paths, const std::string& path) {
  json shards = json::array(), tensors = json::array();
  for (size_t i = 0; i < paths.size(); ++i) {
    auto f = gguf::GgufFile::Open(paths[i]).value();
    shards.push_back({{"index", i}, {"path", paths[i]}, {"size", f->file_size()},
                      {"metadata_nbytes", f->data_offset()},
                      {"metadata_sha256", Sha256Hex(f->mapping()->data(), f->data_offset())},
                      {"tensor_count", f->tensors().size()}});
    for (const auto& ti : f->tensors()) {
      tensors.push_back({{"name", ti.name}, {"shape", ti.shape()}, {"dtype", std::string(GgmlTypeName(ti.type))},
                         {"dtype_id", static_cast<uint32_t>(ti.type)}, {"shard_index", i},
                         {"data_offset", ti.data_offset}, {"nbytes", ti.nbytes}});
    }
  }
  json m = {{"format", "SGLANG-KIMI-GGMLMOEPACK-ADAPTER-v1"}, {"complete", true},
            {"source", {{"shards", shards}, {"tensors", tensors}}}};
  std::ofstream(path) << m.dump(2) << "\n";
  return path;
}

// A model with `mib` MiB of non-routed data: per layer a Q8_0 matrix, an F32
// norm, an F16 matrix, and a routed Q2_K stack (hole).
std::string WriteSyntheticModel(const std::string& dir, uint64_t mib, bool holes) {
  const int64_t cols = 4096;                        // ne0
  const uint64_t q8_row = cols / 32 * 34;           // 4352 bytes
  const uint64_t per_layer_target = 64ull << 20;    // ~64 MiB of non-routed bytes per layer
  const int64_t rows = static_cast<int64_t>(per_layer_target / 2 / q8_row);
  const uint64_t layers = std::max<uint64_t>(1, (mib << 20) / per_layer_target);
  std::vector<gguf::TensorSpec> t;
  std::vector<uint32_t> shard_of;
  auto fill = [holes](uint8_t seed) -> std::function<void(uint64_t, std::span<uint8_t>)> {
    if (holes) return nullptr;
    return [seed](uint64_t off, std::span<uint8_t> out) {
      for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>((off + i) * 2654435761u >> 13) ^ seed;
    };
  };
  for (uint64_t l = 0; l < layers; ++l) {
    const std::string p = "blk." + std::to_string(l + 1) + ".";
    const uint32_t shard = static_cast<uint32_t>(l * 3 / layers);
    t.push_back({p + "attn_norm.weight", GgmlType::F32, {cols}, [](uint64_t, std::span<uint8_t> o) {
                   for (size_t i = 0; i + 4 <= o.size(); i += 4) {
                     float one = 1.0f;
                     std::memcpy(o.data() + i, &one, 4);
                   }
                 }});
    t.push_back({p + "attn_q_b.weight", GgmlType::Q8_0, {cols, rows}, fill(1)});
    t.push_back({p + "attn_output.weight", GgmlType::F16, {cols, static_cast<int64_t>(per_layer_target / 2 / (cols * 2))},
                 fill(2)});
    t.push_back({p + "ffn_up_exps.weight", GgmlType::Q2_K, {4096, 1024, 16}, nullptr});
    for (int i = 0; i < 4; ++i) shard_of.push_back(shard);
  }
  gguf::MetadataBuilder meta;
  meta.Str("general.architecture", "kimi-k3");
  auto paths = gguf::WriteGgufSplit(dir, "BENCH", meta, gguf::MetadataBuilder(), t, shard_of);
  if (!paths.ok()) {
    std::fprintf(stderr, "bench_loader: %s\n", paths.error().message().c_str());
    std::exit(1);
  }
  return WriteMinimalManifest(*paths, dir + "/bench.manifest.json");
}

struct Range {
  std::string path;
  std::vector<std::pair<uint64_t, uint64_t>> spans;  // (offset, nbytes) of emitted views
};

// Whether any shard has holes (fewer blocks than its size): copy mode then
// reads nothing for them while the raw pread reads the kernel's zero pages.
bool AnySparse(const std::vector<Range>& ranges) {
  for (const Range& r : ranges) {
    struct stat st {};
    if (::stat(r.path.c_str(), &st) == 0 && uint64_t(st.st_blocks) * 512 < uint64_t(st.st_size)) return true;
  }
  return false;
}

// The byte ranges the loader hands out as views, per shard (for memcpy-map).
std::vector<Range> EmittedRanges(const std::string& manifest, uint64_t* total, uint64_t* max_tensor) {
  std::vector<Range> out;
  auto s = loader::NonExpertStream::Open(manifest).value();
  *total = 0;
  *max_tensor = 0;
  std::string last_path;
  const uint8_t* last = nullptr;
  (void)s.ForEach([&](loader::NamedTensor&& t) -> Status {
    *max_tensor = std::max<uint64_t>(*max_tensor, t.data.size());
    *total += t.data.size();
    if (!t.zero_copy || t.data.data() == last) return Status::OK();
    last = t.data.data();
    const auto* map = static_cast<const MappedFile*>(t.owner.get());
    if (out.empty() || out.back().path != map->path()) out.push_back({map->path(), {}});
    out.back().spans.emplace_back(static_cast<uint64_t>(t.data.data() - map->data()), t.data.size());
    return Status::OK();
  });
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string manifest, dir, gguf_dir;
  uint64_t mib = 1024;
  int repeat = 3;
  bool holes = false;
  const char* usage = "bench_loader [--manifest M | --gguf DIR] [--mib N] [--repeat R] [--dir D] [--holes]";
  bench::ExitOnHelp(argc, argv, usage);
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--manifest") manifest = next();
    else if (a == "--gguf") gguf_dir = next();
    else if (a == "--mib") mib = bench::PositiveArg(next().c_str(), usage);
    else if (a == "--repeat") repeat = static_cast<int>(bench::PositiveArg(next().c_str(), usage));
    else if (a == "--dir") dir = next();
    else if (a == "--holes") holes = true;
    else bench::ExitUsage(usage);
  }
  bool cleanup = false;
  if (!gguf_dir.empty()) {
    auto paths = gguf::ShardSet::Discover(gguf_dir);
    if (!paths.ok()) {
      std::fprintf(stderr, "bench_loader: %s\n", paths.error().message().c_str());
      return 1;
    }
    manifest = WriteMinimalManifest(*paths, (fs::temp_directory_path() / "bench_loader.manifest.json").string());
  }
  if (manifest.empty()) {
    if (dir.empty()) {
      dir = (fs::temp_directory_path() / ("bench_loader." + std::to_string(::getpid()))).string();
      cleanup = true;
    }
    fs::create_directories(dir);
    std::printf("writing a synthetic model (%llu MiB non-routed%s) in %s\n", static_cast<unsigned long long>(mib),
                holes ? ", holes" : "", dir.c_str());
    manifest = WriteSyntheticModel(dir, mib, holes);
  }

  uint64_t total = 0, max_tensor = 0;
  const std::vector<Range> ranges = EmittedRanges(manifest, &total, &max_tensor);  // also warms the page cache
  if (AnySparse(ranges))
    std::printf("note: the input has holes: copy mode skips them while the raw pread reads zero pages, so the two "
                "sides do different work and copy mode's ratios are not like for like\n");
  // One reused buffer for the consumers' copies and for the raw pread.
  std::vector<uint8_t> dst(std::min<uint64_t>(max_tensor, 64ull << 20) + 64);
  std::memset(dst.data(), 0, dst.size());
  auto copy_view = [&](const uint8_t* p, uint64_t n) {
    for (uint64_t off = 0; off < n; off += dst.size()) {
      const uint64_t k = std::min<uint64_t>(dst.size(), n - off);
      std::memcpy(dst.data(), p + off, k);
    }
  };
  auto drop_cache = [&] {
    for (const Range& rg : ranges) bench::EvictFromPageCache(rg.path);
  };

  // The modes, each consuming exactly the emitted bytes.
  struct Mode {
    const char* name;
    std::function<uint64_t()> run;  // returns the bytes consumed
    bool raw = false;               // reads each stored range once (view_total), not the emitted total
  };
  // O_DIRECT reads need block-aligned offsets, lengths and memory: an
  // aligned buffer, each range widened to 4 KiB blocks (the extra bytes are
  // not counted). Null where the filesystem refuses O_DIRECT (tmpfs).
  constexpr uint64_t kBlock = 4096;
  const bool direct_ok = [&] {
    if (ranges.empty()) return false;
    auto fd = OpenReadOnly(ranges.front().path, O_DIRECT);
    return fd.ok();
  }();
  std::unique_ptr<uint8_t, decltype(&std::free)> direct_buf(
      static_cast<uint8_t*>(std::aligned_alloc(kBlock, (dst.size() + 2 * kBlock) / kBlock * kBlock)), &std::free);
  const uint64_t direct_chunk = dst.size() / kBlock * kBlock;
  // The raw modes read each distinct stored range once; the stream also
  // hands out computed tensors and second views of one range.
  uint64_t view_total = 0;
  for (const Range& rg : ranges) {
    for (auto [off, n] : rg.spans) view_total += n;
  }
  auto stream = [&](loader::LoadOptions o, bool consumer_copies) {
    return [&, o, consumer_copies]() -> uint64_t {
      auto s = loader::NonExpertStream::Open(manifest, o).value();
      uint64_t n = 0;
      Status st = s.ForEach([&](loader::NamedTensor&& t) -> Status {
        if (consumer_copies) copy_view(t.data.data(), t.data.size());
        n += t.data.size();
        return Status::OK();
      });
      if (!st.ok()) {
        std::fprintf(stderr, "bench_loader: %s\n", st.message().c_str());
        std::exit(1);
      }
      return n;
    };
  };
  loader::LoadOptions populate, copy;
  populate.populate = true;
  copy.copy = true;
  std::vector<Mode> modes = {
      // Baseline: the same byte ranges read with pread into one reused
      // buffer, POSIX_FADV_SEQUENTIAL on each shard (no checks, no names).
      {"raw pread (baseline)",
       [&]() -> uint64_t {
         uint64_t n = 0;
         for (const Range& rg : ranges) {
           auto fd = OpenReadOnly(rg.path).value();
           ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
           for (auto [off, len] : rg.spans) {
             for (uint64_t done = 0; done < len;) {
               const size_t k = static_cast<size_t>(std::min<uint64_t>(dst.size(), len - done));
               auto got = PreadFull(fd.get(), dst.data(), k, off + done);
               if (!got.ok() || *got == 0) break;
               done += *got;
               n += *got;
             }
           }
         }
         return n;
       },
       true},
      {"memcpy from fresh maps",
       [&]() -> uint64_t {
         for (const Range& rg : ranges) {
           auto map = MappedFile::Open(rg.path).value();
           for (auto [off, n] : rg.spans) copy_view(map->data() + off, n);
         }
         return view_total;
       },
       true},
      {"loader zero-copy + memcpy", stream({}, true)},
      {"loader populate + memcpy", stream(populate, true)},
      {"loader copy=true (pread)", stream(copy, false)},
  };
  if (direct_ok) {
    // Second baseline: the same ranges with O_DIRECT (no page cache at all),
    // in aligned chunks of the reused buffer's size.
    modes.insert(modes.begin() + 1, Mode{"raw O_DIRECT pread", [&]() -> uint64_t {
      uint64_t n = 0;
      for (const Range& rg : ranges) {
        auto fd = OpenReadOnly(rg.path, O_DIRECT).value();
        for (auto [off, len] : rg.spans) {
          const uint64_t a = off / kBlock * kBlock, z = (off + len + kBlock - 1) / kBlock * kBlock;
          for (uint64_t pos = a; pos < z;) {
            const size_t k = static_cast<size_t>(std::min<uint64_t>(direct_chunk, z - pos));
            const ssize_t got = ::pread(fd.get(), direct_buf.get(), k, static_cast<off_t>(pos));
            if (got <= 0) break;
            const uint64_t lo = std::max(pos, off), hi = std::min(pos + static_cast<uint64_t>(got), off + len);
            if (hi > lo) n += hi - lo;
            pos += static_cast<uint64_t>(got);
          }
        }
      }
      return n;
    }, true});
  }

  std::printf("non-routed bytes   %.3f GB in %zu shard(s), largest tensor %.1f MiB, median of %d rounds\n",
              static_cast<double>(total) / 1e9, ranges.size(), static_cast<double>(max_tensor) / (1 << 20), repeat);
  std::printf("%-28s %6s %10s %9s %20s %14s\n", "mode", "cache", "GB/s", "seconds", "x pread (range)",
              "peak RSS +MiB");
  using bench::Median;
  for (const bool cold : {true, false}) {
    // Rounds of every mode in turn, so each mode's ratio is paired with the
    // baseline run just before it (load changes between rounds cancel out).
    std::vector<std::vector<double>> secs(modes.size());
    std::vector<uint64_t> peak_growth(modes.size(), 0), bytes(modes.size(), 0);
    for (int r = 0; r < repeat; ++r) {
      for (size_t i = 0; i < modes.size(); ++i) {
        ResetPeakRss();
        const uint64_t rss0 = CurrentRss();
        if (cold) drop_cache();
        const double t0 = Now();
        bytes[i] = modes[i].run();
        secs[i].push_back(Now() - t0);
        const uint64_t peak = PeakRssNow();
        peak_growth[i] = std::max(peak_growth[i], peak > rss0 ? peak - rss0 : 0);
      }
    }
    for (size_t i = 0; i < modes.size(); ++i) {
      const uint64_t want = modes[i].raw ? view_total : total;
      if (bytes[i] != want) std::printf("warning: %s consumed %llu bytes, expected %llu\n", modes[i].name,
                                        static_cast<unsigned long long>(bytes[i]), static_cast<unsigned long long>(want));
      std::vector<double> ratio;
      for (int r = 0; r < repeat; ++r) ratio.push_back(secs[0][r] / secs[i][r]);
      const double t = Median(secs[i]);
      std::printf("%-28s %6s %10.2f %9.3f %7.2fx (%.2f-%.2f) %14.1f\n", modes[i].name, cold ? "cold" : "warm",
                  static_cast<double>(total) / t / 1e9, t, Median(ratio), *std::min_element(ratio.begin(), ratio.end()),
                  *std::max_element(ratio.begin(), ratio.end()), static_cast<double>(peak_growth[i]) / (1 << 20));
    }
  }
  std::printf("load average at the end: %s\n", bench::LoadAverage().c_str());
  if (!direct_ok) std::printf("(no O_DIRECT baseline: the filesystem of the shards refuses O_DIRECT)\n");
  std::printf("(cold: POSIX_FADV_DONTNEED on every shard before each run; x pread = raw pread time / mode time,\n"
              " target >= 0.8; peak RSS = growth of VmHWM over the mode, reused buffer %.1f MiB; peak RSS of the\n"
              " whole process %.1f MiB)\n",
              static_cast<double>(dst.size()) / (1 << 20), static_cast<double>(PeakRss()) / (1 << 20));
  if (cleanup) fs::remove_all(dir);
  return 0;
}
