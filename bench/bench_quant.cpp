// Dequantization and expert dot-product throughput, each next to a baseline
// measured in the same run: memcpy of the same number of output bytes (for
// decoding) and of the same number of weight bytes (for mat-vec). Decoding
// is timed on one thread and on --threads threads (DequantizeParallel; the
// memcpy baseline is then split the same way). Prints ratios; never asserts
// on timings.
//
//   bench_quant [--elements N] [--reps R] [--threads T] [--types A,B,..] [--json] [--no-matvec]
//
// --json adds one machine-readable line per type (bench_python_quant.py
// compares the Python binding with these figures).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <string>
#include <vector>

#include "bench_args.h"
#include "k3pack/quant.h"

using namespace k3pack;
using Clock = std::chrono::steady_clock;

namespace {

template <typename F>
double BestSeconds(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

// Offsets of the fp16 scale fields per block, made finite (|d| < 2) so the
// timing is of ordinary values.
std::vector<size_t> HalfOffsets(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_1: case GgmlType::Q5_1: case GgmlType::Q4_K: case GgmlType::Q5_K: return {0, 2};
    case GgmlType::Q2_K: return {80, 82};
    case GgmlType::Q3_K: return {108};
    case GgmlType::Q6_K: return {208};
    case GgmlType::TQ1_0: return {52};
    case GgmlType::TQ2_0: return {64};
    case GgmlType::IQ1_M: return {54};
    case GgmlType::MXFP4: case GgmlType::NVFP4: case GgmlType::Q8_K: return {};
    default: return {0};
  }
}

std::vector<uint8_t> RandomTensor(GgmlType t, uint64_t n, std::mt19937_64& rng) {
  const GgmlTypeInfo* info = GgmlTypeInfoFor(t);
  std::vector<uint8_t> b(GgmlRowBytes(t, n));
  for (size_t i = 0; i + 8 <= b.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(&b[i], &v, 8);
  }
  if (info->block_size == 1) {
    // Plain types: finite values only.
    if (t == GgmlType::F16 || t == GgmlType::BF16) for (size_t i = 1; i < b.size(); i += 2) b[i] &= 0x3F;
    if (t == GgmlType::F32) for (size_t i = 3; i < b.size(); i += 4) b[i] &= 0x3F;
    if (t == GgmlType::F64) for (size_t i = 7; i < b.size(); i += 8) b[i] &= 0x3F;
    return b;
  }
  for (size_t blk = 0; blk < b.size() / info->type_size; ++blk) {
    uint8_t* p = &b[blk * info->type_size];
    for (size_t off : HalfOffsets(t)) p[off + 1] &= 0xBF;
    if (t == GgmlType::Q8_K) { const float d = 0.01f; std::memcpy(p, &d, 4); }
    if (t == GgmlType::MXFP4) p[0] = static_cast<uint8_t>(120 + p[0] % 16);
  }
  return b;
}

// memcpy of n floats split over `threads` threads, as DequantizeParallel
// splits: it gives each thread at least 1 MiB of output, so a small tensor
// runs on fewer threads (on one below 2 MiB); the baseline starting all of
// them made the "x MT cpy" ratio 25-62x at 1 MiB.
void ParallelMemcpy(float* dst, const float* src, uint64_t n, int threads) {
  constexpr uint64_t kMinPieceFloats = (uint64_t{1} << 20) / sizeof(float);  // DequantizeParallel's
  threads = static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(std::max(threads, 1)),
                                                std::max<uint64_t>(1, n / kMinPieceFloats)));
  if (threads <= 1) {
    std::memcpy(dst, src, n * 4);
    return;
  }
  const uint64_t per = (n + threads - 1) / threads;
  std::vector<std::thread> pool;
  for (int k = 1; k < threads; ++k) {
    const uint64_t b = std::min<uint64_t>(n, k * per), e = std::min<uint64_t>(n, (k + 1) * per);
    pool.emplace_back([=] { std::memcpy(dst + b, src + b, (e - b) * 4); });
  }
  std::memcpy(dst, src, std::min<uint64_t>(n, per) * 4);
  for (auto& th : pool) th.join();
}

bool Selected(const std::string& list, GgmlType t) {
  if (list.empty()) return true;
  const std::string name(GgmlTypeName(t));
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t comma = list.find(',', pos);
    const std::string item = list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (item == name) return true;
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t n = 2u << 20;  // elements decoded per run (8 MiB of float output)
  int reps = 11;  // best-of: robust to a busy machine
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::string types;
  bool json = false, matvec = true;
  const char* usage = "bench_quant [--elements N] [--reps R] [--threads T] [--types A,B] [--json] [--no-matvec]";
  bench::ExitOnHelp(argc, argv, usage);
  for (int i = 1; i < argc; ++i) {
    const bool has = i + 1 < argc;
    if (!std::strcmp(argv[i], "--elements") && has) n = bench::PositiveArg(argv[++i], usage);
    else if (!std::strcmp(argv[i], "--reps") && has) reps = static_cast<int>(bench::PositiveArg(argv[++i], usage));
    else if (!std::strcmp(argv[i], "--threads") && has) threads = static_cast<int>(bench::PositiveArg(argv[++i], usage));
    else if (!std::strcmp(argv[i], "--types") && has) types = argv[++i];
    else if (!std::strcmp(argv[i], "--json")) json = true;
    else if (!std::strcmp(argv[i], "--no-matvec")) matvec = false;
    else bench::ExitUsage(usage);
  }
  n = n / 256 * 256;
  std::printf("bench_quant: %llu elements per run, best of %d, ISA %s, %d thread(s) for the MT columns\n",
              static_cast<unsigned long long>(n), reps, quant::IsaName(quant::DetectedIsa()), threads);
  std::mt19937_64 rng(42);
  std::vector<float> out(n), copy_dst(n);
  std::vector<float> copy_src(n, 1.0f);
  const double memcpy_s = BestSeconds(reps, [&] { std::memcpy(copy_dst.data(), copy_src.data(), n * 4); });
  const double memcpy_gbs = n * 4.0 / memcpy_s / 1e9;
  const double memcpy_mt_s =
      BestSeconds(reps, [&] { ParallelMemcpy(copy_dst.data(), copy_src.data(), n, threads); });
  const double memcpy_mt_gbs = n * 4.0 / memcpy_mt_s / 1e9;
  std::printf("baseline memcpy of %llu MiB: %.2f GB/s (1 thread), %.2f GB/s (%d threads)\n\n",
              static_cast<unsigned long long>(n * 4 >> 20), memcpy_gbs, memcpy_mt_gbs, threads);
  std::printf("%-8s %10s %12s %9s %12s %9s %12s %8s\n", "type", "in MiB", "out GB/s", "x memcpy", "MT GB/s",
              "x MT cpy", "scalar GB/s", "speedup");
  for (uint32_t id = 0; id < kGgmlTypeCount; ++id) {
    const GgmlType t = static_cast<GgmlType>(id);
    if (!IsValidGgmlType(id) || !quant::CanDequantize(t) || !Selected(types, t)) continue;
    const uint64_t tn = n / GgmlTypeInfoFor(t)->block_size * GgmlTypeInfoFor(t)->block_size;
    const auto src = RandomTensor(t, tn, rng);
    std::span<float> dst(out.data(), tn);
    const double best = BestSeconds(reps, [&] { (void)quant::DequantizeRow(t, src, dst, quant::Isa::kAuto); });
    const double best_mt = BestSeconds(reps, [&] { (void)quant::DequantizeParallel(t, src, dst, threads); });
    const double scalar = BestSeconds(std::max(1, reps / 2),
                                      [&] { (void)quant::DequantizeRow(t, src, dst, quant::Isa::kScalar); });
    const double gbs = tn * 4.0 / best / 1e9, mgbs = tn * 4.0 / best_mt / 1e9, sgbs = tn * 4.0 / scalar / 1e9;
    std::printf("%-8s %10.1f %12.2f %9.2f %12.2f %9.2f %12.2f %7.2fx%s\n", std::string(GgmlTypeName(t)).c_str(),
                src.size() / 1048576.0, gbs, gbs / memcpy_gbs, mgbs, mgbs / memcpy_mt_gbs, sgbs, scalar / best,
                quant::HasKernel(t, quant::Isa::kAvx2) || quant::HasKernel(t, quant::Isa::kAvx512) ? "" : "  (scalar)");
    if (json) {
      std::printf("JSON {\"type\": \"%s\", \"elements\": %llu, \"gbs_1t\": %.4f, \"gbs_mt\": %.4f, \"threads\": %d}\n",
                  std::string(GgmlTypeName(t)).c_str(), static_cast<unsigned long long>(tn), gbs, mgbs, threads);
    }
  }
  if (!matvec) return 0;

  // One Kimi-K3 expert matrix: gate/up are 3072 rows of 3584 latent elements.
  const uint64_t rows = 3072, cols = 3584;
  std::printf("\nexpert mat-vec, %llu x %llu (one K3 gate/up matrix), single thread\n",
              static_cast<unsigned long long>(rows), static_cast<unsigned long long>(cols));
  std::printf("%-8s %6s %10s %10s %12s %9s\n", "type", "act", "MiB", "us", "weight GB/s", "x memcpy");
  std::vector<float> x(cols), y(rows);
  std::normal_distribution<float> g(0, 1);
  for (auto& v : x) v = g(rng);
  for (GgmlType t : {GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K,
                     GgmlType::Q8_0, GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ3_XXS, GgmlType::MXFP4,
                     GgmlType::IQ2_S, GgmlType::BF16}) {
    if (cols % GgmlTypeInfoFor(t)->block_size) continue;
    const auto w = RandomTensor(t, rows * cols, rng);
    std::vector<uint8_t> wcopy(w.size());
    const double base = BestSeconds(reps, [&] { std::memcpy(wcopy.data(), w.data(), w.size()); });
    auto act = quant::PrepareActivation(t, x);
    if (!act.ok()) continue;
    const double s = BestSeconds(reps, [&] { (void)quant::MatVec(w, rows, *act, y, 1); });
    std::printf("%-8s %6s %10.2f %10.0f %12.2f %9.3f\n", std::string(GgmlTypeName(t)).c_str(),
                std::string(GgmlTypeName(act->act_type)).c_str(), w.size() / 1048576.0, s * 1e6, w.size() / s / 1e9,
                base / s);
  }
  return 0;
}
