// Pack build throughput next to `cp` of the same byte volume on the same
// filesystem, in the same run.
//
//   bench_pack [--dir DIR] [--mib N] [--runs R] [--threads T]
//
// Writes a synthetic model whose routed experts total about N MiB (default
// 1024) into DIR (default: a temp dir beside /tmp), then alternates
//   cp:   `cp` of the GGUF shards (same byte volume as the pack) + fsync
//   pack: BuildPack (copies, SHA-256 of every payload, checkpoints, fsyncs)
// R times each (default 3), dropping the page cache before every run
// (drop_caches when permitted, otherwise POSIX_FADV_DONTNEED on the inputs),
// and prints each run's ratio pack/cp (paired, so load changes between runs
// cancel out), where the pack's time went, and the median ratio with its
// range and the load average (target: >= 0.95 in every run).
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "k3pack/gguf.h"
#include "k3pack/kimi.h"
#include "k3pack/pack.h"
#include "k3pack/synth.h"

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
  for (const auto& f : files) {
    int in = ::open(f.c_str(), O_RDONLY);
    if (in >= 0) {
      ::posix_fadvise(in, 0, 0, POSIX_FADV_DONTNEED);
      ::close(in);
    }
  }
  return false;
}

std::string LoadAvg() {
  char buf[128] = {0};
  int fd = ::open("/proc/loadavg", O_RDONLY);
  if (fd < 0) return "?";
  ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  std::string s(buf, n > 0 ? static_cast<size_t>(n) : 0);
  // "1.00 0.90 0.80 2/100 1234": the three averages.
  size_t cut = 0;
  for (int sp = 0; sp < 3 && cut != std::string::npos; ++sp) cut = s.find(' ', cut + (sp ? 1 : 0));
  return s.substr(0, cut);
}

// CPU seconds (user + system) of this process or of its waited-for children.
double CpuSeconds(int who) {
  struct rusage ru {};
  ::getrusage(who, &ru);
  auto sec = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return sec(ru.ru_utime) + sec(ru.ru_stime);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
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
  int runs = 3, threads = 4;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--dir") dir = argv[i + 1];
    else if (a == "--mib") mib = std::strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--runs") runs = std::atoi(argv[i + 1]);
    else if (a == "--threads") threads = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: bench_pack [--dir DIR] [--mib N] [--runs R] [--threads T]\n");
      return 2;
    }
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

  std::vector<double> cp_rate, pack_rate, ratio;
  bool dropped = false;
  const std::string out = dir + "/bench.expert-major.pack";
  for (int r = 0; r < runs; ++r) {
    // cp
    std::filesystem::remove_all(dir + "/cp");
    std::filesystem::create_directories(dir + "/cp");
    dropped = DropCaches(model->shard_paths);
    const double cp_cpu0 = CpuSeconds(RUSAGE_CHILDREN);
    auto t0 = Clock::now();
    std::string cmd = "cp";
    for (const auto& p : model->shard_paths) cmd += " '" + p + "'";
    cmd += " '" + dir + "/cp/' && sync -f '" + dir + "/cp'";
    if (std::system(cmd.c_str()) != 0) return 1;
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    cp_rate.push_back(cp_bytes / s / 1e6);
    std::printf("run %d: cp   %8.1f MB/s (%.2f s, %.2f CPU-s)  load %s\n", r, cp_bytes / s / 1e6, s,
                CpuSeconds(RUSAGE_CHILDREN) - cp_cpu0, LoadAvg().c_str());
    std::filesystem::remove_all(dir + "/cp");

    // pack
    for (const auto& f : {out, pack::DigestsPathFor(out)}) std::filesystem::remove(f);
    DropCaches(model->shard_paths);
    pack::BuildOptions bo;
    bo.out_path = out;
    bo.safety_margin_gib = 0;
    bo.threads = threads;
    const double pack_cpu0 = CpuSeconds(RUSAGE_SELF);
    t0 = Clock::now();
    auto b = pack::BuildPack(*experts, bo);
    if (!b.ok()) {
      std::fprintf(stderr, "pack: %s\n", b.error().message().c_str());
      return 1;
    }
    s = std::chrono::duration<double>(Clock::now() - t0).count();
    pack_rate.push_back(pack_bytes / s / 1e6);
    ratio.push_back(pack_rate.back() / cp_rate.back());
    const auto& ph = b->phases;
    const double pack_cpu = CpuSeconds(RUSAGE_SELF) - pack_cpu0;
    std::printf("run %d: pack %8.1f MB/s (%.2f s, %.2f CPU-s, %d threads; copy %.2f s wall, thread-s: read %.2f write %.2f "
                "hash %.2f; checkpoints %.2f s, finalize %.2f s)  ratio %.2fx\n",
                r, pack_rate.back(), s, pack_cpu, threads, ph.copy_wall, ph.read, ph.write, ph.hash, ph.checkpoint,
                ph.finalize, ratio.back());
  }
  std::printf("page cache: %s\n", dropped ? "dropped (drop_caches) before every run"
                                          : "inputs evicted with POSIX_FADV_DONTNEED (drop_caches not permitted)");
  std::printf("median of %d: cp %.1f MB/s, pack %.1f MB/s; ratio pack/cp (paired per run) = %.2fx, range "
              "%.2f-%.2fx; load %s (target >= 0.95x in every run)\n",
              runs, Median(cp_rate), Median(pack_rate), Median(ratio), *std::min_element(ratio.begin(), ratio.end()),
              *std::max_element(ratio.begin(), ratio.end()), LoadAvg().c_str());
  std::filesystem::remove_all(dir);
  return 0;
}
