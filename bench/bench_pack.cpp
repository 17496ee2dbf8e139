// Pack build throughput next to a plain copy of the same byte volume on the
// same filesystem, in the same run.
//
//   bench_pack [--dir DIR] [--mib N] [--runs R] [--threads T] [--no-direct]
//
// Writes a synthetic model whose routed experts total about N MiB (default
// 1024) into DIR (default: a temp dir beside /tmp), then runs one warm-up
// round (printed, not counted) and R rounds (default 5) of two pairs, dropping the page cache before every step
// (drop_caches when permitted, otherwise POSIX_FADV_DONTNEED on the inputs):
//   cp:     `cp` of the GGUF shards + sync: the pack's bytes plus the
//           non-expert tensors (about 3% more at 1 GiB, 30% at 64 MiB), so
//           each side's MB/s is over its own bytes and the ratio is of rates
//   pack:   BuildPack as `k3pack pack` runs it (copies, SHA-256 and CRC32C
//           of every payload, checkpoints, fsyncs); its writes are O_DIRECT
//           by default (K3PACK_DIRECT_WRITE=0 makes them buffered), so
//           unless that is set it is the same build as pack-direct
//   direct: an O_DIRECT copy of the shards (16 MiB O_DIRECT reads, each
//           written with O_DIRECT, one at a time, as `dd iflag=direct
//           oflag=direct bs=16M conv=fdatasync` does) + fdatasync
//   pack-direct: BuildPack writing the pack with O_DIRECT
//           (K3PACK_DIRECT_WRITE=1); --no-direct skips this pair
//   direct-x8: the O_DIRECT copy with 8 chunks in flight (8 threads, each
//           reading a chunk and writing it), paired with pack-direct again: a
//           plain copier that keeps the device busy and does no work of its
//           own (no hashing, no checkpoints)
// Within a pair the order alternates round by round (baseline first in even
// rounds, the build first in odd ones), so neither side always follows the
// other's writes. It prints each round's ratios pack/cp and
// pack-direct/direct (paired, so load changes between rounds cancel out),
// where the pack's time went, the median ratios with their range, and the
// baselines' own spread (min-max MB/s): on a virtual disk the baseline alone
// can vary 2x between consecutive rounds, which bounds how far a single
// round's ratio can be trusted (target: >= 0.95 in every round).
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "k3pack/gguf.h"
#include "k3pack/kimi.h"
#include "k3pack/pack.h"
#include "k3pack/synth.h"

#include "bench_args.h"
#include "bench_measure.h"

using namespace k3pack;
using Clock = std::chrono::steady_clock;

namespace {

bool DropCaches(const std::vector<std::string>& files) {
  ::sync();
  int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY);
  if (fd >= 0) {
    bool ok = ::write(fd, "3", 1) == 1;
    ::close(fd);
    if (ok) return true;
  }
  for (const auto& f : files) bench::EvictFromPageCache(f);
  return false;
}

// CPU seconds (user + system) of this process or of its waited-for children.
double CpuSeconds(int who) {
  struct rusage ru {};
  ::getrusage(who, &ru);
  auto sec = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return sec(ru.ru_utime) + sec(ru.ru_stime);
}

// Copies every file into `to_dir` with O_DIRECT reads and writes of up to
// 16 MiB (the tail shorter than a block through the page cache), and
// fdatasyncs each. `depth` threads each copy every depth-th chunk, so up to
// depth reads and writes are in flight together: depth 1 is `dd
// iflag=direct oflag=direct`; depth 8 is a plain copier that keeps the
// device busy. False on any error.
bool DirectCopy(const std::vector<std::string>& files, const std::string& to_dir, int depth) {
  constexpr size_t kChunk = 16u << 20, kAlign = 4096;
  std::vector<std::unique_ptr<void, decltype(&std::free)>> bufs;
  for (int t = 0; t < depth; ++t) {
    void* mem = nullptr;
    if (posix_memalign(&mem, kAlign, kChunk) != 0) return false;
    bufs.emplace_back(mem, &std::free);
  }
  for (const auto& f : files) {
    const std::string to = to_dir + "/" + std::filesystem::path(f).filename().string();
    const int in = ::open(f.c_str(), O_RDONLY | O_DIRECT);
    const int out = ::open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT, 0644);
    const int out_tail = ::open(to.c_str(), O_WRONLY);
    std::atomic<bool> ok = in >= 0 && out >= 0 && out_tail >= 0;
    const off_t size = ok ? static_cast<off_t>(std::filesystem::file_size(f)) : 0;
    auto copy_chunks = [&](int t) {
      auto* buf = static_cast<uint8_t*>(bufs[t].get());
      for (off_t off = static_cast<off_t>(t) * kChunk; ok && off < size; off += static_cast<off_t>(depth) * kChunk) {
        const ssize_t r = ::pread(in, buf, kChunk, off);
        if (r <= 0) {
          ok = false;
          break;
        }
        const size_t whole = static_cast<size_t>(r) / kAlign * kAlign;
        if (!((whole == 0 || ::pwrite(out, buf, whole, off) == static_cast<ssize_t>(whole)) &&
              (whole == static_cast<size_t>(r) ||
               ::pwrite(out_tail, buf + whole, r - whole, off + static_cast<off_t>(whole)) ==
                   static_cast<ssize_t>(r - whole)))) {
          ok = false;
        }
      }
    };
    std::vector<std::thread> workers;
    for (int t = 1; t < depth; ++t) workers.emplace_back(copy_chunks, t);
    copy_chunks(0);
    for (auto& w : workers) w.join();
    ok = ok && ::fdatasync(out_tail) == 0;
    for (int fd : {in, out, out_tail}) {
      if (fd >= 0) ::close(fd);
    }
    if (!ok) return false;
  }
  return true;
}

uint64_t TotalSize(const std::vector<std::string>& files) {
  uint64_t t = 0;
  for (const auto& f : files) t += std::filesystem::file_size(f);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  uint64_t mib = 1024;
  int runs = 5, threads = 4;
  bool with_direct = true;
  const char* usage =
      "bench_pack [--dir DIR] [--mib N] [--runs R] [--threads T] [--no-direct]\n"
      "  pack build of ~N MiB of experts (default 1024) vs cp + sync of the shards (MB/s of each side's own\n"
      "  bytes), and\n"
      "  (unless --no-direct) the build writing with O_DIRECT vs an O_DIRECT copy, one chunk and\n"
      "  8 chunks in flight; R paired\n"
      "  rounds (default 5, the order within a pair alternating), page cache dropped before each\n"
      "  step; DIR: a temp dir by default";
  bench::ExitOnHelp(argc, argv, usage);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--no-direct") {
      with_direct = false;
      continue;
    }
    if (i + 1 >= argc) bench::ExitUsage(usage);
    const char* v = argv[++i];
    if (a == "--dir") dir = bench::PositionalArg(v, usage);
    else if (a == "--mib") mib = bench::PositiveArg(v, usage);
    else if (a == "--runs") runs = static_cast<int>(bench::PositiveArg(v, usage));
    else if (a == "--threads") threads = static_cast<int>(bench::PositiveArg(v, usage));
    else bench::ExitUsage(usage);
  }
  if (dir.empty()) {
    char tmpl[] = "/tmp/k3pack-bench-pack-XXXXXX";
    if (!mkdtemp(tmpl)) return 1;
    dir = tmpl;
  }
  std::filesystem::create_directories(dir);

  // Experts: 3 MoE layers x E experts x (2 x Q2_K + Q3_K) at 2048 x 2048.
  auto opts = synth::PresetOptions("tiny");
  if (!opts.ok()) return 1;
  opts->out_dir = dir + "/model";
  opts->dims.latent = 2048;
  opts->dims.moe_intermediate = 2048;
  const uint64_t object_bytes = 2ull * 2048 * 2048 / 256 * 84 + 2048ull * 2048 / 256 * 110;
  const uint64_t moe_layers = opts->dims.num_layers - opts->dims.first_k_dense;
  opts->dims.num_experts = static_cast<uint32_t>(std::max<uint64_t>(8, (mib << 20) / (object_bytes * moe_layers)));
  opts->dims.top_k = std::min<uint32_t>(opts->dims.top_k, opts->dims.num_experts);
  std::printf("writing synthetic model: %u experts x %llu MoE layers into %s\n", opts->dims.num_experts,
              static_cast<unsigned long long>(moe_layers), opts->out_dir.c_str());
  auto model = synth::WriteSynthModel(*opts);
  if (!model.ok()) {
    std::fprintf(stderr, "synth: %s\n", model.error().message().c_str());
    return 1;
  }
  auto spec = kimi::LoadModelSpec(model->config_path, kimi::Profile::kScaled);
  auto shards = gguf::ShardSet::Open(opts->out_dir);
  if (!spec.ok() || !shards.ok()) {
    std::fprintf(stderr, "load: %s\n", (!spec.ok() ? spec.error() : shards.error()).message().c_str());
    return 1;
  }
  auto experts = pack::CollectExperts(*shards, *spec);
  if (!experts.ok()) {
    std::fprintf(stderr, "experts: %s\n", experts.error().message().c_str());
    return 1;
  }
  const uint64_t pack_bytes = experts->EstimatedPackBytes();
  const uint64_t cp_bytes = TotalSize(model->shard_paths);
  std::printf("pack: %.1f MiB, cp volume (all shards): %.1f MiB, filesystem of %s\n", pack_bytes / 1048576.0,
              cp_bytes / 1048576.0, dir.c_str());

  // One series per pair: the baseline's and the pack's rates, their ratios.
  // base_depth: 0 = cp + sync; n > 0 = an O_DIRECT copy with n chunks in
  // flight, against the build writing with O_DIRECT.
  struct Series {
    const char* base_name;
    const char* pack_name;
    int base_depth;
    std::vector<double> base_rate = {}, pack_rate = {}, ratio = {};
  };
  constexpr int kCeilingDepth = 8;
  Series buffered{"cp", "pack", 0}, direct{"direct", "pack-direct", 1},
      ceiling{"direct-x8", "pack-direct", kCeilingDepth};
  bool dropped = false;
  const std::string out = dir + "/bench.expert-major.pack";
  const std::string copy_dir = dir + "/cp";

  // The baseline: cp + sync, or the O_DIRECT copy. Returns MB/s, 0 on error.
  // Every step starts from the same state: neither side's output on disk.
  auto clean = [&] {
    std::filesystem::remove_all(copy_dir);
    for (const auto& f : {out, pack::DigestsPathFor(out)}) std::filesystem::remove(f);
  };
  auto run_base = [&](int r, const Series& sr) -> double {
    const bool use_direct = sr.base_depth > 0;
    clean();
    std::filesystem::create_directories(copy_dir);
    dropped = DropCaches(model->shard_paths);
    const double cpu0 = CpuSeconds(use_direct ? RUSAGE_SELF : RUSAGE_CHILDREN);
    const auto t0 = Clock::now();
    if (use_direct) {
      if (!DirectCopy(model->shard_paths, copy_dir, sr.base_depth)) return 0;
    } else {
      std::string cmd = "cp";
      for (const auto& p : model->shard_paths) cmd += " '" + p + "'";
      cmd += " '" + copy_dir + "/' && sync -f '" + copy_dir + "'";
      if (std::system(cmd.c_str()) != 0) return 0;
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    std::printf("run %d: %-11s %8.1f MB/s (%.2f s, %.2f CPU-s)  load %s\n", r, sr.base_name,
                cp_bytes / s / 1e6, s, CpuSeconds(use_direct ? RUSAGE_SELF : RUSAGE_CHILDREN) - cpu0,
                bench::LoadAverage().c_str());
    std::filesystem::remove_all(copy_dir);
    return cp_bytes / s / 1e6;
  };
  // The build; direct_write: force K3PACK_DIRECT_WRITE=1 (else as set).
  // Returns MB/s, 0 on error.
  auto run_pack = [&](int r, bool direct_write, const char* name) -> double {
    clean();
    DropCaches(model->shard_paths);
    const char* was = std::getenv("K3PACK_DIRECT_WRITE");
    const std::string saved = was ? was : "";
    if (direct_write) ::setenv("K3PACK_DIRECT_WRITE", "1", 1);
    pack::BuildOptions bo;
    bo.out_path = out;
    bo.safety_margin_gib = 0;
    bo.threads = threads;
    const double cpu0 = CpuSeconds(RUSAGE_SELF);
    const auto t0 = Clock::now();
    auto b = pack::BuildPack(*experts, bo);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (direct_write) {
      if (was) ::setenv("K3PACK_DIRECT_WRITE", saved.c_str(), 1);
      else ::unsetenv("K3PACK_DIRECT_WRITE");
    }
    if (!b.ok()) {
      std::fprintf(stderr, "pack: %s\n", b.error().message().c_str());
      return 0;
    }
    const auto& ph = b->phases;
    std::printf("run %d: %-11s %8.1f MB/s (%.2f s, %.2f CPU-s, %d threads; copy %.2f s wall, thread-s: read %.2f "
                "stage+write %.2f hash %.2f; checkpoints %.2f s, finalize %.2f s)  load %s\n",
                r, name, pack_bytes / s / 1e6, s, CpuSeconds(RUSAGE_SELF) - cpu0, threads, ph.copy_wall, ph.read,
                ph.write, ph.hash, ph.checkpoint, ph.finalize, bench::LoadAverage().c_str());
    return pack_bytes / s / 1e6;
  };
  // One round of a pair, in the order the round's parity gives.
  auto run_pair = [&](int r, Series* series) -> bool {
    const bool use_direct = series->base_depth > 0;
    double base = 0, built = 0;
    for (int step = 0; step < 2; ++step) {
      if ((step == 0) == ((r & 1) == 0)) {
        base = run_base(r, *series);
        if (base <= 0) {
          if (use_direct) std::fprintf(stderr, "direct copy failed (no O_DIRECT on %s?); rerun with --no-direct\n", dir.c_str());
          return false;
        }
      } else if ((built = run_pack(r, use_direct, series->pack_name)) <= 0) {
        return false;
      }
    }
    series->base_rate.push_back(base);
    series->pack_rate.push_back(built);
    series->ratio.push_back(built / base);
    std::printf("run %d: ratio %s/%s %.2fx (%s first)\n", r, series->pack_name, series->base_name,
                series->ratio.back(), (r & 1) == 0 ? series->base_name : series->pack_name);
    return true;
  };

  // A warm-up round first, not counted: the first step after the synthetic
  // model was written reads it while the host still caches it and reuses
  // memory the drop has just freed, which made round 0's cp (always the
  // first step before) up to 2x faster than any later cp.
  {
    Series w_buffered = buffered, w_direct = direct;
    std::printf("warm-up round (not counted):\n");
    if (!run_pair(-1, &w_buffered)) return 1;
    if (with_direct && !run_pair(-1, &w_direct)) return 1;
  }
  for (int r = 0; r < runs; ++r) {
    if (!run_pair(r, &buffered)) return 1;
    if (with_direct && !run_pair(r, &direct)) return 1;
    if (with_direct && !run_pair(r, &ceiling)) return 1;
  }
  std::printf("page cache: %s\n", dropped ? "dropped (drop_caches) before every step"
                                          : "inputs evicted with POSIX_FADV_DONTNEED (drop_caches not permitted)");
  for (const Series* sr : {&buffered, &direct, &ceiling}) {
    if (sr->ratio.empty()) continue;
    const int below = static_cast<int>(std::count_if(sr->ratio.begin(), sr->ratio.end(), [](double x) { return x < 0.95; }));
    auto [bmin, bmax] = std::minmax_element(sr->base_rate.begin(), sr->base_rate.end());
    auto [pmin, pmax] = std::minmax_element(sr->pack_rate.begin(), sr->pack_rate.end());
    std::printf("median of %d: %s %.1f MB/s (range %.1f-%.1f, max/min %.2f), %s %.1f MB/s (range %.1f-%.1f, max/min "
                "%.2f); ratio %s/%s (paired per round) = %.2fx, range %.2f-%.2fx; %d of %d rounds below 0.95x; load %s\n",
                runs, sr->base_name, bench::Median(sr->base_rate), *bmin, *bmax, *bmax / *bmin, sr->pack_name,
                bench::Median(sr->pack_rate), *pmin, *pmax, *pmax / *pmin, sr->pack_name, sr->base_name,
                bench::Median(sr->ratio), *std::min_element(sr->ratio.begin(), sr->ratio.end()),
                *std::max_element(sr->ratio.begin(), sr->ratio.end()), below, runs, bench::LoadAverage().c_str());
  }
  if (!ceiling.ratio.empty()) {
    std::printf("direct-x8 copies with %d O_DIRECT reads and writes in flight and does no work of its own; "
                "pack-direct/direct-x8 compares the build, with its hashing, checkpoints and fsyncs, to a plain "
                "copier that keeps the device busy\n", kCeilingDepth);
  }
  std::filesystem::remove_all(dir);
  return 0;
}
