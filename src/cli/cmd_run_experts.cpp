// `k3pack run-experts`: one Kimi-K3 routed-expert block per layer for a few
// synthetic tokens, with the expert bytes served by the expert store from the
// pack, checked bit for bit against the same block computed from the GGUF
// source tensors. Prints the outputs' checksums and timing.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/preflight.h"
#include "k3pack/gguf.h"
#include "k3pack/manifest.h"
#include "k3pack/run_experts.h"
#include "util/format.h"

namespace k3pack::cli {
namespace {

using nlohmann::json;

void PrintRun(const store::ExpertRunResult& r) {
  std::printf("layer %u: %u token(s) x top-%u of %u experts (hidden %lld -> latent %lld, intermediate %lld)\n",
              r.layer, r.tokens, r.top_k, r.num_experts, (long long)r.hidden, (long long)r.latent, (long long)r.inter);
  for (size_t k = 0; k < r.routed.size() && k < 4; ++k) {
    std::printf("  token %zu experts:", k);
    for (uint32_t e : r.routed[k]) std::printf(" %u", e);
    std::printf("\n");
  }
  if (r.routed.size() > 4) std::printf("  ... %zu more tokens\n", r.routed.size() - 4);
  std::printf("  store : acquire %.4f s (hits %llu, misses %llu, %s read), compute %.4f s, sha256 %.16s\n",
              r.acquire_seconds, (unsigned long long)r.hits, (unsigned long long)r.misses,
              HumanBytes(r.bytes_read).c_str(), r.store_compute_seconds, r.store_sha256.c_str());
  std::printf("  source: compute %.4f s, sha256 %.16s\n", r.source_compute_seconds, r.source_sha256.c_str());
  if (r.matches()) {
    std::printf("  OK: identical to the GGUF source, bit for bit (%zu values)\n", r.from_store.size());
  } else {
    std::printf("  MISMATCH: %llu of %zu values differ (max |diff| %g): the pack served wrong bytes for this layer\n",
                (unsigned long long)r.mismatched_values, r.from_store.size(), r.max_abs_diff);
  }
}

int RunExperts(const std::vector<std::string>& argv) {
  Args a("run-experts", "--manifest M [--layer L | --all-layers] [--tokens N] [options]",
         "Run Kimi-K3 routed-expert blocks (router, top-k, SiTU experts, weighted sum) for N synthetic tokens with\n"
         "the expert bytes served by the expert store from the pack, and check the outputs bit for bit against the\n"
         "same blocks computed straight from the GGUF source tensors. Exit code 1 when any output differs.");
  a.Option("--manifest", "adapter manifest (pack path and source shards come from it)", std::nullopt, true)
      .Option("--layer", "routed layer to run (default: the first active MoE layer)")
      .Flag("--all-layers", "run every active MoE layer")
      .Option("--tokens", "tokens per layer (one acquire of tokens x top_k routes)", "1")
      .Option("--seed", "seed of the N(0,1) hidden states", "1")
      .Option("--gguf-dir", "GGUF source shards (default: the manifest's source shards)")
      .Deprecated("--gguf", "--gguf-dir")
      .Option("--pack", "expert pack (default: the manifest's expert_pack.path)")
      .Option("--cache-mib", "store cache budget in MiB", "4096")
      .Option("--io", "pread | uring", "pread")
      .Flag("--direct", "O_DIRECT reads")
      .Option("--threads", "threads per matrix-vector product", "1")
      .Flag("--float-dots", "float dots on decoded rows instead of ggml's quantized-activation integer dots")
      .Flag("--json", "print the results as JSON");
  int code = 0;
  if (!a.Parse(argv, &code)) return code;
  auto tokens = a.GetInt("--tokens"), seed = a.GetInt("--seed"), mib = a.GetInt("--cache-mib"),
       threads = a.GetInt("--threads");
  for (auto* v : {&tokens, &seed, &mib, &threads}) {
    if (!v->ok()) return ReportError("run-experts", v->error(), 2);
  }
  if (*tokens < 1 || *tokens > 1000000 || *mib < 1 || *threads < 1 || *seed < 0) {
    return ReportError("run-experts", Error("--tokens, --cache-mib and --threads must be positive, --seed >= 0"), 2);
  }
  if (Status e = CheckInputExists("--manifest", a.Get("--manifest"), ".manifest.json"); !e.ok()) {
    return ReportError("run-experts", e.error());
  }
  auto m = manifest::ReadManifest(a.Get("--manifest"));
  if (!m.ok()) return ReportError("run-experts", m.error());
  std::string gguf_path = a.Get("--gguf-dir");
  if (gguf_path.empty()) {
    if (m->source.shards.empty()) return ReportError("run-experts", Error(a.Get("--manifest") + " lists no source shards"));
    gguf_path = m->source.shards.front().path;
  }
  auto source = gguf::ShardSet::Open(gguf_path);
  if (!source.ok()) return ReportError("run-experts", WithMovedModelHint(source.error(), a.Get("--manifest")));

  store::StoreOptions so;
  so.cache_bytes = static_cast<uint64_t>(*mib) << 20;
  so.io_backend = a.Get("--io");
  so.direct_io = a.Has("--direct");
  const std::string pack_path = a.Has("--pack") ? a.Get("--pack") : m->expert_pack.path;
  auto st = store::ExpertStore::Open(pack_path, a.Get("--manifest"), so);
  if (!st.ok()) return ReportError("run-experts", WithMovedModelHint(st.error(), a.Get("--manifest")));

  std::vector<uint32_t> layers;
  const auto& active = (*st)->info().active_layer_ids;
  if (a.Has("--all-layers")) {
    layers = active;
  } else if (a.Has("--layer")) {
    auto l = a.GetInt("--layer");
    if (!l.ok() || *l < 0) return ReportError("run-experts", Error("--layer must be a non-negative integer"), 2);
    if (std::find(active.begin(), active.end(), static_cast<uint32_t>(*l)) == active.end()) {
      std::string range = active.empty() ? "none"
                          : std::to_string(active.front()) + ".." + std::to_string(active.back());
      return ReportError("run-experts",
                         Error("--layer " + std::to_string(*l) + " is not a routed MoE layer of this model")
                             .WithHint("routed layers are " + range + "; pass --layer in that range or --all-layers"),
                         kExitUsage);
    }
    layers.push_back(static_cast<uint32_t>(*l));
  } else if (!active.empty()) {
    layers.push_back(active.front());
  }

  store::ExpertRunOptions o;
  o.tokens = static_cast<uint32_t>(*tokens);
  o.seed = static_cast<uint64_t>(*seed);
  o.threads = static_cast<int>(*threads);
  o.quantize_activations = !a.Has("--float-dots");
  json runs = json::array();
  bool all_match = true;
  for (uint32_t layer : layers) {
    o.layer = layer;
    auto r = store::RunRoutedExperts(**st, *source, o);
    if (!r.ok()) return ReportError("run-experts", r.error());
    all_match = all_match && r->matches();
    if (a.Has("--json")) {
      runs.push_back(store::ExpertRunJson(*r));
    } else {
      PrintRun(*r);
    }
  }
  Status closed = (*st)->Close();
  if (!closed.ok()) return ReportError("run-experts", closed.error());
  if (a.Has("--json")) {
    std::cout << json{{"pack", pack_path}, {"gguf", gguf_path}, {"all_match", all_match}, {"layers", runs}}.dump(2)
              << "\n";
  } else if (layers.size() > 1) {
    std::printf("%zu layers: %s\n", layers.size(), all_match ? "all identical to the GGUF source" : "MISMATCHES found");
  }
  return all_match ? 0 : 1;
}

}  // namespace

K3_COMMAND("run-experts", "run routed-expert blocks from the pack through the store, checked against the GGUF source",
           RunExperts);

}  // namespace k3pack::cli
