// bench_manifest: scan + manifest time on the full-scale Kimi-K3 structure
// (93 layers, 896 experts, 19 shards; tensor data as sparse holes), next to
// a baseline measured in the same run: raw preads of exactly the bytes the
// manifest must read (every shard's metadata region + the pack header/index).
//
// usage: bench_manifest [WORK_DIR] [--repeat N]
//   WORK_DIR keeps the synthetic model and pack between runs (default: a
//   fresh temp dir, removed at exit). The pack is made sparse directly from
//   the layout (header + index, payload holes), byte-identical to what the
//   builder writes for all-zero payloads, so the bench needs ~1 GB of disk.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bench_args.h"
#include "bench_measure.h"
#include "k3pack/gguf.h"
#include "k3pack/kimi.h"
#include "k3pack/manifest.h"
#include "k3pack/pack.h"
#include "k3pack/synth.h"
#include "manifest/pyjson.h"
#include "manifest/scan.h"
#include "pack/format.h"
#include "util/file.h"

namespace fs = std::filesystem;
using namespace k3pack;

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <typename T>
T Must(Result<T> r, const char* what) {
  if (!r.ok()) {
    std::fprintf(stderr, "bench_manifest: %s: %s\n", what, r.error().message().c_str());
    std::exit(1);
  }
  return std::move(r).value();
}
void Must(Status s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "bench_manifest: %s: %s\n", what, s.error().message().c_str());
    std::exit(1);
  }
}

// Header + index written, payloads left as a hole of the right length.
Status WriteSparsePack(const std::string& path, const pack::ExpertSet& experts) {
  std::vector<pack::LayerRoleBytes> layers;
  for (size_t i = 0; i < experts.layers.size(); ++i) {
    pack::LayerRoleBytes l;
    l.layer = experts.layers[i];
    for (int r = 0; r < 3; ++r) l.expert_bytes[r] = experts.by_layer[i][r].expert_bytes;
    layers.push_back(l);
  }
  K3_ASSIGN_OR_RETURN(pack::PackLayout layout, pack::PackLayout::Make(layers, experts.num_experts));
  std::vector<uint8_t> prefix = layout.EncodePrefix();
  int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
  if (fd < 0) return Error::FromErrno("open " + path, errno);
  UniqueFd owned(fd);
  K3_RETURN_IF_ERROR(PwriteFull(fd, prefix.data(), prefix.size(), 0));
  if (::ftruncate(fd, static_cast<off_t>(layout.final_size())) != 0) return Error::FromErrno("ftruncate", errno);
  return Status::OK();
}

// The floor: read exactly the bytes a manifest needs (metadata regions + index).
double BaselineRead(const gguf::ShardSet& shards, const std::string& pack_path, uint64_t index_end) {
  const double t0 = Now();
  std::vector<uint8_t> buf;
  uint64_t sink = 0;
  auto read_range = [&](const std::string& path, uint64_t n) {
    UniqueFd fd = Must(OpenReadOnly(path), "open");
    buf.resize(n);
    Must(PreadFull(fd.get(), buf.data(), n, 0), "pread");
    sink += buf.empty() ? 0 : buf[n / 2];
  };
  for (const auto& f : shards.shards()) read_range(f->path(), f->data_offset());
  read_range(pack_path, index_end);
  const double dt = Now() - t0;
  if (sink == 42) std::printf(" ");
  return dt;
}

}  // namespace

int main(int argc, char** argv) {
  std::string work;
  int repeat = 3;
  const char* usage = "bench_manifest [WORK_DIR] [--repeat N]";
  bench::ExitOnHelp(argc, argv, usage);
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--repeat" && i + 1 < argc) repeat = static_cast<int>(bench::PositiveArg(argv[++i], usage));
    else if (work.empty()) work = bench::PositionalArg(argv[i], usage);
    else bench::ExitUsage(usage);
  }
  bool temp = work.empty();
  if (temp) work = (fs::temp_directory_path() / ("bench_manifest-" + std::to_string(getpid()))).string();
  fs::create_directories(work);
  const std::string model_dir = work + "/model";
  const std::string pack_path = work + "/KIMI-K3-SYNTH.expert-major.pack";

  if (!fs::exists(model_dir + "/config.json")) {
    std::printf("writing k3-structure synthetic model to %s ...\n", model_dir.c_str());
    std::fflush(stdout);
    synth::SynthOptions o = Must(synth::PresetOptions("k3-structure"), "preset");
    o.out_dir = model_dir;
    const double t0 = Now();
    Must(synth::WriteSynthModel(o), "synth");
    std::printf("  done in %.1f s\n", Now() - t0);
  }
  kimi::ModelSpec spec = Must(kimi::LoadModelSpec(model_dir + "/config.json", kimi::Profile::kKimiK3), "spec");
  gguf::ShardSet shards = Must(gguf::ShardSet::Open(model_dir), "shards");
  pack::ExpertSet experts = Must(pack::CollectExperts(shards, spec), "experts");
  if (!fs::exists(pack_path)) Must(WriteSparsePack(pack_path, experts), "sparse pack");
  const uint64_t index_end = pack::kHeaderBytes + experts.layers.size() * experts.num_experts * 3 * pack::kEntryBytes;

  manifest::CreateOptions mo;
  mo.gguf_dir = model_dir;
  mo.expert_pack = pack_path;
  mo.model_config = model_dir + "/config.json";
  mo.tokenizer_dir = model_dir + "/tokenizer";
  mo.payload_samples = 6;
  mo.profile = kimi::Profile::kKimiK3;

  double best_open = 1e9, best_scan = 1e9, best_collect = 1e9, best_validate = 1e9, best_tok = 1e9,
         best_write = 1e9, best_validate0 = 1e9;
  size_t manifest_bytes = 0;
  // Cold: the shards' and the pack's pages dropped before the baseline and
  // again before the manifest (the files are written by now, so nothing
  // dirty stays). Each round pairs the manifest with the baseline before it.
  auto drop_all = [&] {
    for (const auto& f : shards.shards()) bench::EvictFromPageCache(f->path());
    bench::EvictFromPageCache(pack_path);
    for (const auto& e : fs::directory_iterator(mo.tokenizer_dir)) bench::EvictFromPageCache(e.path().string());
  };
  std::vector<double> base_s[2], total_s[2];  // [cold]
  nlohmann::json m;
  for (int rep = 0; rep < repeat; ++rep) {
    for (int cold : {1, 0}) {
      if (cold) drop_all();
      base_s[cold].push_back(BaselineRead(shards, pack_path, index_end));
      if (cold) drop_all();
      double t0 = Now();
      m = Must(manifest::CreateManifest(mo), "create");
      std::string text = manifest::SerializeManifest(m);
      Must(WriteFileAtomic(work + "/manifest.json", text), "write");
      total_s[cold].push_back(Now() - t0);
      manifest_bytes = text.size();
    }

    // Breakdown of the same work.
    double t0 = Now();
    gguf::ShardSet s2 = Must(gguf::ShardSet::Open(model_dir), "open");
    double t1 = Now();
    nlohmann::json src = Must(manifest::ScanSourceJson(s2), "scan");
    double t2 = Now();
    pack::ExpertSet e2 = Must(pack::CollectExperts(s2, spec), "collect");
    double t3 = Now();
    pack::ValidateOptions vo;
    vo.payload_samples = 6;
    nlohmann::json ps = Must(pack::ValidatePack(pack_path, e2, vo), "validate");
    const double t4 = Now();
    best_validate = std::min(best_validate, t4 - t3);
    vo.payload_samples = 0;
    (void)Must(pack::ValidatePack(pack_path, e2, vo), "validate0");
    const double t4_tok = Now();
    best_validate0 = std::min(best_validate0, t4_tok - t4);
    nlohmann::json tok = Must(manifest::TokenizerSectionJson(mo.tokenizer_dir), "tokenizer");
    double t5 = Now();
    std::string t = manifest::SerializeManifest(m);
    double t6 = Now();
    best_open = std::min(best_open, t1 - t0);
    best_scan = std::min(best_scan, t2 - t1);
    best_collect = std::min(best_collect, t3 - t2);
    best_tok = std::min(best_tok, t5 - t4_tok);
    best_write = std::min(best_write, t6 - t5);
  }

  std::printf("k3-structure: %zu shards, %zu tensors, pack %llu entries, manifest %zu bytes (medians of %d paired "
              "rounds)\n",
              shards.shards().size(), shards.tensor_count(),
              static_cast<unsigned long long>(experts.layers.size() * experts.num_experts * 3), manifest_bytes, repeat);
  for (int cold : {1, 0}) {
    std::vector<double> ratio;
    for (size_t i = 0; i < total_s[cold].size(); ++i) ratio.push_back(total_s[cold][i] / base_s[cold][i]);
    std::sort(ratio.begin(), ratio.end());
    std::printf("  %s: baseline raw pread of metadata + pack index %.3f s; k3pack manifest (scan + validate + write) "
                "%.3f s = %.2fx the baseline (range %.2f-%.2fx; target <= 0.6 s, SGLang 11.67 s cold)\n",
                cold ? "cold" : "warm", bench::Median(base_s[cold]), bench::Median(total_s[cold]), bench::Median(ratio), ratio.front(),
                ratio.back());
  }
  std::printf("  warm breakdown (best of %d): shard open/parse %.3f s | source inventory %.3f s | expert collect %.3f s "
              "| pack validate (6 samples) %.3f s [0 samples %.3f s] | tokenizer %.3f s | serialize %.3f s\n",
              repeat, best_open, best_scan, best_collect, best_validate, best_validate0, best_tok, best_write);
  std::printf("  load average at the end: %s\n", bench::LoadAverage().c_str());
  if (temp) {
    std::error_code ec;
    fs::remove_all(work, ec);
  }
  return 0;
}
