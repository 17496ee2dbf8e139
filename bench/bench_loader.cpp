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
// Three numbers per run, best of R:
//   memcpy-ram   memcpy of the same volume between two heap buffers;
//   memcpy-map   memcpy of exactly the emitted byte ranges out of fresh
//                read-only mappings of the shards (the floor for any reader);
//   loader       NonExpertStream (all checks, zero-copy views) with the
//                consumer memcpy-ing every emitted tensor to the same buffer.
// ratio = loader / memcpy-map (target >= 0.8). Timings are never asserted.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--manifest") manifest = next();
    else if (a == "--gguf") gguf_dir = next();
    else if (a == "--mib") mib = std::stoull(next());
    else if (a == "--repeat") repeat = std::stoi(next());
    else if (a == "--dir") dir = next();
    else if (a == "--holes") holes = true;
    else {
      std::fprintf(stderr, "usage: bench_loader [--manifest M | --gguf DIR] [--mib N] [--repeat R] [--dir D] [--holes]\n");
      return 2;
    }
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
  std::vector<uint8_t> dst(std::min<uint64_t>(max_tensor, 256ull << 20) + 64);
  std::vector<uint8_t> src(dst.size());
  std::memset(src.data(), 0x5a, src.size());
  std::memset(dst.data(), 0, dst.size());
  auto copy_view = [&](const uint8_t* p, uint64_t n) {
    for (uint64_t off = 0; off < n; off += dst.size()) {
      const uint64_t k = std::min<uint64_t>(dst.size(), n - off);
      std::memcpy(dst.data(), p + off, k);
    }
  };

  double best_ram = 1e30, best_map = 1e30, best_loader = 1e30;
  uint64_t loader_bytes = 0;
  for (int r = 0; r < repeat; ++r) {
    double t0 = Now();
    for (uint64_t done = 0; done < total; done += src.size()) {
      std::memcpy(dst.data(), src.data(), std::min<uint64_t>(src.size(), total - done));
    }
    best_ram = std::min(best_ram, Now() - t0);

    t0 = Now();
    for (const Range& rg : ranges) {
      auto map = MappedFile::Open(rg.path).value();
      for (auto [off, n] : rg.spans) copy_view(map->data() + off, n);
    }
    best_map = std::min(best_map, Now() - t0);

    t0 = Now();
    auto s = loader::NonExpertStream::Open(manifest).value();
    loader_bytes = 0;
    Status st = s.ForEach([&](loader::NamedTensor&& t) -> Status {
      copy_view(t.data.data(), t.data.size());
      loader_bytes += t.data.size();
      return Status::OK();
    });
    if (!st.ok()) {
      std::fprintf(stderr, "bench_loader: %s\n", st.message().c_str());
      return 1;
    }
    best_loader = std::min(best_loader, Now() - t0);
  }
  const double gb = static_cast<double>(total) / 1e9;
  std::printf("non-routed bytes   %.3f GB in %zu shard(s)\n", gb, ranges.size());
  std::printf("memcpy-ram         %8.2f GB/s  (%.3f s)\n", gb / best_ram, best_ram);
  std::printf("memcpy-map         %8.2f GB/s  (%.3f s)\n", gb / best_map, best_map);
  std::printf("loader + memcpy    %8.2f GB/s  (%.3f s)\n", gb / best_loader, best_loader);
  std::printf("ratio loader/memcpy-map  %.2fx   loader/memcpy-ram  %.2fx\n", best_map / best_loader,
              best_ram / best_loader);
  std::printf("peak RSS           %.1f MiB (copy buffers %.1f MiB)\n", static_cast<double>(PeakRss()) / (1 << 20),
              2.0 * static_cast<double>(dst.size()) / (1 << 20));
  if (loader_bytes != total) std::printf("warning: loader bytes %llu != %llu\n",
                                         static_cast<unsigned long long>(loader_bytes),
                                         static_cast<unsigned long long>(total));
  if (cleanup) fs::remove_all(dir);
  return 0;
}
