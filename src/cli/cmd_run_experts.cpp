// `k3pack run-experts`: one Kimi-K3 routed-expert block per layer for a few
// synthetic tokens, with the expert bytes served by the expert store from the
// pack, checked bit for bit against the same block computed from the GGUF
// source tensors. Prints the outputs' checksums and timing.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/ep_options.h"
#include "cli/implied_inputs.h"
#include "cli/mib_option.h"
#include "cli/output_rule.h"
#include "cli/preflight.h"
#include "cli/trace_args.h"
#include "k3pack/ep.h"
#include "k3pack/gguf.h"
#include "k3pack/manifest.h"
#include "k3pack/run_experts.h"
#include "k3pack/trace.h"
#include "manifest/manifest_output.h"
#include "manifest/recorded_inputs.h"
#include "util/file.h"
#include "util/format.h"

namespace k3pack::cli {
namespace {

using nlohmann::json;

// --gguf-dir must hold the shards the manifest records (count, then each
// shard's size, header digest and tensor records, as verify compares them),
// checked before any run: another model's shards would otherwise make every
// layer differ and look like wrong bytes served from the pack.
Status CheckGgufDirHoldsRecordedShards(const std::string& gguf_dir, const std::string& manifest_path) {
  K3_ASSIGN_OR_RETURN(std::vector<std::string> paths, gguf::ShardSet::Discover(gguf_dir));
  K3_ASSIGN_OR_RETURN(json raw, manifest::ReadManifestJson(manifest_path));
  json source = raw.at("source");  // ReadManifest has checked the section
  json& shards = source["shards"];
  const std::string hint =
      "run-experts compares the pack with these shards, so another model's would make every output differ; pass "
      "the shard directory of the model the manifest was built from, or omit --gguf-dir to use the recorded shards";
  if (!shards.is_array() || shards.size() != paths.size()) {
    return Error("--gguf-dir " + gguf_dir + " holds " + std::to_string(paths.size()) + " shard(s), the manifest " +
                 manifest_path + " records " + std::to_string(shards.is_array() ? shards.size() : 0))
        .WithHint(hint);
  }
  for (size_t i = 0; i < paths.size(); ++i) {
    K3_ASSIGN_OR_RETURN(std::string resolved, ResolvePath(paths[i]));  // the manifest records resolved paths
    shards[i]["path"] = resolved;
  }
  K3_ASSIGN_OR_RETURN(manifest::SourceDifference diff, manifest::CompareSourceWithShards(source));
  if (diff.kind == manifest::SourceDifference::Kind::kNone) return Status::OK();
  if (diff.kind == manifest::SourceDifference::Kind::kInventory) {
    // Every record matches; only the digest over the paths put in above
    // differs. A copy of the recorded shards, or another checkpoint with
    // the same headers: the headers cannot tell which (it was called
    // "another model's" outright, a copy included).
    return Error("--gguf-dir " + gguf_dir + " holds shards whose headers and tensor records match the ones the "
                 "manifest " + manifest_path + " records, but at other paths: a copy of them, or another checkpoint "
                 "with the same layout, which the headers cannot tell apart")
        .WithHint("omit --gguf-dir to compare with the recorded shards, or write a manifest for these shards (`k3pack "
                  "manifest " + ShellQuoted(gguf_dir) + " --pack PACK --manifest NEW.json`) and pass it");
  }
  const Status why = manifest::SourceDifferenceStatus(diff);
  const std::string what = why.ok() ? diff.detail : why.error().message().substr(0, why.error().message().find('\n'));
  return Error("--gguf-dir " + gguf_dir + " does not hold the shards the manifest " + manifest_path +
               " records: " + what)
      .WithHint(hint);
}

// A rank manifest must record the same source shards as --manifest: rank
// packs of another checkpoint with the same layout open and serve fine, and
// only make the ranks' sum differ from the single store's, which reads as a
// bug in the EP path rather than the wrong files. Compared per shard: size,
// header digest, and the whole-file SHA-256 where both record one (the only
// record that tells two checkpoints with identical headers apart).
Status SameSourceShards(const manifest::Manifest& full, const std::string& full_path, const manifest::Manifest& rank,
                        const std::string& rank_path) {
  const auto& a = full.source.shards;
  const auto& b = rank.source.shards;
  const std::string rule = ": every rank pack must be built from the checkpoint of --manifest";
  if (a.size() != b.size()) {
    return Error("--rank-manifests " + rank_path + " records " + std::to_string(b.size()) + " source shard(s), " +
                 full_path + " records " + std::to_string(a.size()) + rule);
  }
  for (size_t i = 0; i < a.size(); ++i) {
    std::string field;
    if (a[i].size != b[i].size) field = "size";
    else if (a[i].metadata_sha256 != b[i].metadata_sha256) field = "metadata_sha256";
    else if (a[i].sha256 && b[i].sha256 && *a[i].sha256 != *b[i].sha256) field = "sha256";
    if (field.empty()) continue;
    return Error("--rank-manifests " + rank_path + " records another source than " + full_path + ": shard " +
                 std::to_string(i) + " differs in source.shards[" + std::to_string(i) + "]." + field + rule)
        .WithHint("rebuild that rank's pack from the shards " + full_path + " records");
  }
  return Status::OK();
}

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
  if (r.mismatched_values == 0) {
    std::printf("  OK: identical to the GGUF source, bit for bit (%zu values)\n", r.from_store.size());
  } else {
    std::printf("  MISMATCH: %llu of %zu values differ (max |diff| %g): the pack served wrong bytes for this layer\n",
                (unsigned long long)r.mismatched_values, r.from_store.size(), r.max_abs_diff);
  }
  if (r.ep_size <= 1) return;
  for (const store::EpRankRun& k : r.ranks)
    std::printf("  rank %u (experts %u..%u): %llu routes in %llu calls, hits %llu, misses %llu, %s read, %.4f s\n",
                k.rank, k.first_expert, k.end_expert - 1, (unsigned long long)k.routes,
                (unsigned long long)k.acquire_calls, (unsigned long long)k.hits, (unsigned long long)k.misses,
                HumanBytes(k.bytes_read).c_str(), k.seconds);
  if (r.rank_mismatched_values == 0) {
    std::printf("  OK: the %u ranks' summed partials equal the single store's output, bit for bit (sha256 %.16s)\n",
                r.ep_size, r.ranks_sha256.c_str());
  } else {
    std::printf("  MISMATCH: %llu of %zu values of the %u ranks' sum differ from the single store's\n",
                (unsigned long long)r.rank_mismatched_values, r.from_ranks.size(), r.ep_size);
  }
}

// --rank-manifests as the N rank manifests, rank 0 first (empty when not
// given). An empty entry (",A", "A,") is a usage error naming it: it was
// "cannot open : No such file". A directory stands for the rank's manifest
// in it, as a directory does for --manifest. A manifest of another rank
// than its place is named: the store's refusal told a library caller's fix.
Result<std::vector<std::string>> RankManifestsOf(const Args& a, int64_t ep_size) {
  if (!a.Has("--rank-manifests")) return std::vector<std::string>{};
  std::vector<std::string> list = trace_args::CommaFields(a.Get("--rank-manifests"));
  if (list.size() != static_cast<size_t>(ep_size)) {
    return Error("--rank-manifests lists " + std::to_string(list.size()) + " manifests for --ep-size " +
                 std::to_string(ep_size) + ": give one per rank, rank 0 first");
  }
  for (size_t r = 0; r < list.size(); ++r) {
    if (list[r].empty())
      return Error("--rank-manifests entry " + std::to_string(r) + " is empty in '" + a.Get("--rank-manifests") +
                   "': give " + std::to_string(ep_size) + " manifest paths, rank 0 first, comma-separated");
    const ep::Rank rank{static_cast<uint32_t>(ep_size), static_cast<uint32_t>(r)};
    std::error_code ec;  // a name too long or a directory this user may not search: the open says so later
    if (std::filesystem::is_directory(list[r], ec))
      list[r] = (std::filesystem::path(list[r]) / RankManifestName(manifest::kDefaultManifestName, rank)).string();
    auto m = manifest::ReadManifest(list[r]);
    if (m.ok() && m->k3pack && m->k3pack->ep && m->k3pack->ep->size == rank.size && m->k3pack->ep->rank != rank.rank)
      return Error("--rank-manifests entry " + std::to_string(r) + " (" + list[r] + ") is the manifest of rank " +
                   std::to_string(m->k3pack->ep->rank) + " of " + std::to_string(rank.size) +
                   ": list them rank 0 first");
  }
  return list;
}

// The overwrite rule for --trace-out, the shared one (output_rule.h):
// `is_this_run` says whether the existing file is what this run writes.
OutputSpec TraceOutSpec(const Args& a, const std::string& path, const std::string& why_refused,
                        std::function<bool()> is_this_run) {
  OutputSpec spec;
  spec.option = "--trace-out";
  spec.path = path;
  spec.force = a.Has("--force");
  spec.why_refused = why_refused;
  spec.not_own_kind = [path] { return NotAFileOf(path, FileStart::kTrace, "a routing trace"); };
  spec.is_finished = [is_this_run = std::move(is_this_run)]() -> Result<bool> { return is_this_run(); };
  return spec;
}

// Writes this run's trace unless the file already holds exactly its bytes
// (then it is left untouched: kAlreadyBuilt); any other existing file is
// refused without --force.
Result<OutputAction> WriteTraceOut(const Args& a, const std::string& path, const trace::Trace& t) {
  const std::string bytes = trace::EncodeTrace(t);
  auto holds_bytes = [&] {
    auto old = ReadFileToString(path);
    return old.ok() && *old == bytes;
  };
  K3_ASSIGN_OR_RETURN(OutputAction action,
                      DecideOutput(TraceOutSpec(a, path, "it is not the trace of this run (other options or inputs)",
                                                holds_bytes)));
  if (action != OutputAction::kAlreadyBuilt) K3_RETURN_IF_ERROR(WriteFileAtomic(path, bytes));
  return action;
}

// The command's options and the rules between them.
Args RunExpertsArgs() {
  Args a("run-experts", "[--manifest] M.json|DIR [--layer L | --all-layers] [--tokens N] [options]",
         "Run Kimi-K3 routed-expert blocks (router, top-k, SiTU experts, weighted sum) for N synthetic tokens with\n"
         "the expert bytes served by the expert store from the pack, and check the outputs bit for bit against the\n"
         "same blocks computed straight from the GGUF source tensors. Exit code 1 when any output differs.");
  a.Option("--manifest", "adapter manifest (pack path and source shards come from it), or the directory holding it "
                           "under SGLang's name", std::nullopt, true)
      .PositionalAsOption("--manifest")
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
      .Option("--ep-size", "also run each block as N expert-parallel ranks (one thread and rank store each) and\n"
                           "check their summed partial outputs against the single store's, bit for bit", "1")
      .Option("--rank-manifests", "with --ep-size N: the manifests of N rank packs, rank 0 first, comma-separated\n"
                                  "(default: N rank stores over the full pack)")
      .Option("--trace-out", "run the layers as one stack (each layer's input is the previous layer's residual\n"
                             "stream) and write their routes as a trace (format v2) with router look-ahead: per\n"
                             "row, layer L+1's router applied to layer L's MoE input (docs/store.md)")
      .Option("--predict-k", "with --trace-out: predicted experts per row (default: top_k)")
      .Flag("--predict-next-token", "with --trace-out: also record next-token predictions (a proxy: each layer's\n"
                                    "own router on the token's own MoE input; docs/store.md)")
      .Flag("--force", "replace an existing --trace-out file (the same trace already there is reported)")
      .Flag("--json", "print the results as JSON")
      .Exclusive({"--layer", "--all-layers"})
      .Requires("--predict-k", {"--trace-out"}, "predictions are recorded only in the trace")
      .Requires("--predict-next-token", {"--trace-out"}, "predictions are recorded only in the trace")
      .Requires("--force", {"--trace-out"}, "it only applies to the trace file")
      .RequiresValueOtherThan("--rank-manifests", "--ep-size", "1", "they are the manifests of the --ep-size ranks");
  AddProgressOption(a);
  return a;
}

// Every option value of the run, checked before any file is read (a bad
// one is a usage error, exit 2).
struct RunValues {
  int64_t tokens = 0, seed = 0, mib = 0, threads = 0, ep_size = 0;
  std::vector<std::string> rank_manifests;  // rank 0 first; empty: rank views of the full pack
  std::string trace_out;                    // "" without --trace-out
  int64_t predict_k = 0;                    // 0: top_k
};

// Reports the first bad value and returns its exit status; 0 when all are good.
int ParseRunValues(const Args& a, RunValues* out) {
  auto tokens = a.GetInt("--tokens"), seed = a.GetInt("--seed"), mib = a.GetInt("--cache-mib"),
       threads = a.GetInt("--threads"), ep_size = a.GetInt("--ep-size");
  for (auto* v : {&tokens, &seed, &mib, &threads, &ep_size}) {
    if (!v->ok()) return ReportError("run-experts", v->error(), 2);
  }
  // Each bound named with the value given: one lumped "must be positive" was
  // wrong for a value above an upper bound (--ep-size 99999999999).
  const struct {
    const char* name;
    int64_t value, lo, hi;
  } ranges[] = {{"--tokens", *tokens, 1, 1000000},
                {"--cache-mib", *mib, 1, kMaxMib},
                {"--threads", *threads, 1, 256},  // as build, pack and trace sweep: 2,000,000 ran, 280x slower
                {"--seed", *seed, 0, INT64_MAX},
                {"--ep-size", *ep_size, 1, 65536}};
  for (const auto& r : ranges) {
    if (r.value >= r.lo && r.value <= r.hi) continue;
    const std::string bound = r.value < r.lo ? "at least " + std::to_string(r.lo) : "at most " + std::to_string(r.hi);
    return ReportError("run-experts", Error(std::string(r.name) + " must be " + bound + ", got " + a.Get(r.name)), 2);
  }
  // A usage error before the manifest is read, as in trace replay (it was
  // the store's open failing, exit 1).
  if (Status io = trace_args::CheckIoBackendName("--io", a.Get("--io")); !io.ok())
    return ReportError("run-experts", io.error(), 2);
  auto rank_manifests = RankManifestsOf(a, *ep_size);
  if (!rank_manifests.ok()) return ReportError("run-experts", rank_manifests.error(), 2);
  int64_t predict_k = 0;
  if (a.Has("--predict-k")) {
    auto pk = a.GetInt("--predict-k");
    if (!pk.ok()) return ReportError("run-experts", pk.error(), 2);
    if (*pk < 1 || *pk > 65536)
      return ReportError("run-experts", Error("--predict-k must be in 1..65536, got " + a.Get("--predict-k")), 2);
    predict_k = *pk;
  }
  *out = RunValues{*tokens, *seed, *mib, *threads, *ep_size, std::move(*rank_manifests), a.Get("--trace-out"),
                   predict_k};
  return 0;
}

// What the run reads: the manifest, the GGUF source shards the pack is
// checked against, and the pack.
struct RunInputs {
  manifest::Manifest m;
  std::string gguf_path;  // --gguf-dir, or the manifest's first source shard
  gguf::ShardSet source;
  std::string pack_path;  // --pack, or the manifest's expert pack
};

// Reads the manifest and opens the source shards (--gguf-dir is checked to
// hold the recorded ones). Reports a refusal and returns its exit status; 0
// when the inputs are open.
int OpenRunInputs(const Args& a, std::unique_ptr<RunInputs>* out) {
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
  if (!a.Get("--gguf-dir").empty()) {
    if (Status same = CheckGgufDirHoldsRecordedShards(gguf_path, a.Get("--manifest")); !same.ok())
      return ReportError("run-experts", same.error());
  }
  std::string pack_path = a.Has("--pack") ? a.Get("--pack") : m->expert_pack.path;
  *out = std::make_unique<RunInputs>(
      RunInputs{std::move(m).value(), std::move(gguf_path), std::move(source).value(), std::move(pack_path)});
  return 0;
}

store::StoreOptions StoreOptionsOf(const Args& a, const RunValues& v) {
  store::StoreOptions so;
  so.cache_bytes = static_cast<uint64_t>(v.mib) << 20;
  so.io_backend = a.Get("--io");
  so.direct_io = a.Has("--direct");
  return so;
}

// --trace-out names none of the inputs and may be written. Reports a
// refusal and returns its exit status.
int CheckTraceOutBeforeRun(const Args& a, const RunValues& v, const RunInputs& in) {
  const std::string& trace_out = v.trace_out;
  std::vector<NamedPath> inputs = {{"--manifest", a.Get("--manifest")}, {"--pack", in.pack_path},
                                   {"--gguf-dir", in.gguf_path}};
  for (const auto& sh : in.m.source.shards) inputs.push_back({"source shard", sh.path});
  for (const auto& rm : v.rank_manifests) inputs.push_back({"--rank-manifests", rm});
  if (Status e = CheckOutputsAreNotInputs({{"--trace-out", trace_out}}, inputs); !e.ok())
    return ReportError("run-experts", e.error());
  // Checked before any work. The trace is known only once the layers ran:
  // an existing file that is not a k3pack trace at all is refused now, a
  // trace is compared with this run's after it (WriteTraceOut).
  if (Status w = CheckOutputWritable("--trace-out", trace_out); !w.ok()) return ReportError("run-experts", w.error());
  auto action = DecideOutput(TraceOutSpec(a, trace_out, "it is not a k3pack trace",
                                          [&] { return trace::ReadTrace(trace_out).ok(); }));
  if (!action.ok()) return ReportError("run-experts", action.error());
  return 0;
}

// The stores the layers are served from.
struct RunStores {
  std::shared_ptr<store::ExpertStore> full;               // over the full pack
  std::vector<std::shared_ptr<store::ExpertStore>> ranks;  // --ep-size > 1: one per rank, rank 0 first
};

// Opens the store over the full pack. Reports a refusal and returns its
// exit status.
int OpenFullStore(const Args& a, const RunInputs& in, const store::StoreOptions& so,
                  std::shared_ptr<store::ExpertStore>* out) {
  auto st = store::ExpertStore::Open(in.pack_path, a.Get("--manifest"), so);
  if (!st.ok()) return ReportError("run-experts", WithMovedModelHint(st.error(), a.Get("--manifest")));
  if (const ep::Rank rank = (*st)->info().ep; !rank.whole()) {
    // A rank pack serves only its own experts, and the run routes to all.
    return ReportError("run-experts",
                       Error(a.Get("--manifest") + " is the manifest of a rank pack, " +
                             ep::Describe(rank, (*st)->info().num_experts) +
                             ": it serves only that rank's experts, and run-experts routes tokens to every expert")
                           .WithHint("pass the full pack's manifest, with --ep-size " + std::to_string(rank.size) +
                                     " --rank-manifests <the " + std::to_string(rank.size) +
                                     " rank manifests, rank 0 first> to run through the rank packs"),
                       2);
  }
  *out = std::move(st).value();
  return 0;
}

// The EP ranks' stores: over their rank packs, or rank views of the full pack.
// Reports a refusal and returns its exit status.
int OpenRankStores(const Args& a, const RunValues& v, const RunInputs& in, const store::StoreOptions& so,
                   std::vector<std::shared_ptr<store::ExpertStore>>* out) {
  for (uint32_t rank = 0; v.ep_size > 1 && rank < static_cast<uint32_t>(v.ep_size); ++rank) {
    store::StoreOptions ro = so;
    ro.ep = ep::Rank{static_cast<uint32_t>(v.ep_size), rank};
    ro.ep_names = ep::kCliNames;  // a bad size is this command's --ep-size
    std::string rank_pack = in.pack_path, rank_manifest = a.Get("--manifest");
    if (!v.rank_manifests.empty()) {
      rank_manifest = v.rank_manifests[rank];
      auto rm = manifest::ReadManifest(rank_manifest);
      if (!rm.ok()) return ReportError("run-experts", rm.error());
      if (Status same = SameSourceShards(in.m, a.Get("--manifest"), *rm, rank_manifest); !same.ok())
        return ReportError("run-experts", same.error().WithContext("EP rank " + std::to_string(rank)));
      rank_pack = rm->expert_pack.path;
    }
    auto rs = store::ExpertStore::Open(rank_pack, rank_manifest, ro);
    if (!rs.ok()) return ReportError("run-experts", rs.error().WithContext("EP rank " + std::to_string(rank)));
    out->push_back(*rs);
  }
  return 0;
}

// The layers to run: every routed one, --layer, or the first routed one.
// Reports a refusal and returns its exit status.
int ChooseLayers(const Args& a, const std::vector<uint32_t>& active, std::vector<uint32_t>* layers) {
  if (a.Has("--all-layers")) {
    *layers = active;
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
    layers->push_back(static_cast<uint32_t>(*l));
  } else if (!active.empty()) {
    layers->push_back(active.front());
  }
  return 0;
}

store::ExpertRunOptions RunOptionsOf(const Args& a, const RunValues& v) {
  store::ExpertRunOptions o;
  o.tokens = static_cast<uint32_t>(v.tokens);
  o.seed = static_cast<uint64_t>(v.seed);
  o.threads = static_cast<int>(v.threads);
  o.quantize_activations = !a.Has("--float-dots");
  o.ep_size = static_cast<uint32_t>(v.ep_size);
  return o;
}

// What the layers that ran came to.
struct RunTally {
  json runs = json::array();  // --json: each layer's result
  bool all_match = true;
  json prediction = nullptr;  // --trace-out: the look-ahead's accuracy and the trace
  size_t ran = 0;             // layers run
};

// One layer's result: a JSON entry with --json, else printed.
void ReportRun(const Args& a, const store::ExpertRunResult& r, RunTally* tally) {
  if (a.Has("--json")) {
    tally->runs.push_back(store::ExpertRunJson(r));
  } else {
    PrintRun(r);
  }
}

// How well the stack's routers predicted the routes.
void PrintPredictions(const store::LayerStackResult& stack, bool next_token) {
  if (stack.predicted_routes) {
    std::printf("router look-ahead (layer L+1's router on layer L's MoE input, top-%u): %llu of %llu routes "
                "predicted (%.1f%%)\n",
                stack.predict_k, (unsigned long long)stack.predicted_right,
                (unsigned long long)stack.predicted_routes, 100.0 * stack.accuracy());
    for (size_t i = 0; i < stack.layer_routes.size(); ++i)
      std::printf("  layer %u -> %u: %.1f%%\n", stack.layers[i].layer, stack.layers[i + 1].layer,
                  100.0 * double(stack.layer_right[i]) / double(std::max<uint64_t>(1, stack.layer_routes[i])));
  } else {
    std::printf("router look-ahead: one layer only, nothing to predict\n");
  }
  if (next_token)
    std::printf("next-token proxy (each layer's router on the previous token's input): %llu of %llu routes "
                "predicted (%.1f%%)\n",
                (unsigned long long)stack.next_token_right, (unsigned long long)stack.next_token_routes,
                100.0 * double(stack.next_token_right) / double(std::max<uint64_t>(1, stack.next_token_routes)));
}

// --trace-out: the layers run as one stack, and their routes are written as
// a trace. Reports a failure and returns its exit status.
int RunStackToTrace(const Args& a, const RunValues& v, const RunInputs& in, const RunStores& stores,
                    const std::vector<uint32_t>& layers, store::ExpertRunOptions o, ProgressReporter* progress,
                    RunTally* tally) {
  const std::string& trace_out = v.trace_out;
  const uint32_t experts = stores.full->info().num_experts;
  if (v.predict_k > static_cast<int64_t>(experts))
    return ReportError("run-experts", Error("--predict-k " + std::to_string(v.predict_k) + " exceeds the " +
                                            std::to_string(experts) + " experts per layer"), 2);
  o.predict_k = static_cast<uint32_t>(v.predict_k);
  o.predict_next_token = a.Has("--predict-next-token");
  auto stack = store::RunLayerStack(*stores.full, in.source, o, layers, stores.ranks);
  progress->Finish();
  if (!stack.ok()) return ReportError("run-experts", stack.error());
  for (const auto& r : stack->layers) {
    ++tally->ran;
    tally->all_match = tally->all_match && r.matches();
    ReportRun(a, r, tally);
  }
  auto written = WriteTraceOut(a, trace_out, stack->trace);
  if (!written.ok()) return ReportError("run-experts", written.error());
  const bool already_built = *written == OutputAction::kAlreadyBuilt;
  tally->prediction = store::LayerStackJson(*stack);
  tally->prediction["trace"] = trace_out;
  if (already_built) {
    tally->prediction["trace_already_built"] = true;
    if (a.Has("--json"))
      Narrate("run-experts", AlreadyBuiltLine(trace_out));
  }
  if (!a.Has("--json")) {
    PrintPredictions(*stack, o.predict_next_token);
    if (already_built) {
      ReportAlreadyBuilt("run-experts", trace_out, false);
    } else {
      std::printf("wrote %s (format v%u): %zu records\n", trace_out.c_str(), stack->trace.version(),
                  stack->trace.records.size());
    }
  }
  return 0;
}

// The layers run one by one, their results reported once all have run.
// Reports a failure and returns its exit status.
int RunEachLayer(const Args& a, const RunInputs& in, const RunStores& stores, const std::vector<uint32_t>& layers,
                 store::ExpertRunOptions o, ProgressReporter* progress, RunTally* tally) {
  std::vector<store::ExpertRunResult> finished;
  if (o.progress && !layers.empty()) o.progress(store::LayerProgress(0, layers.size()));
  for (size_t i = 0; i < layers.size(); ++i) {
    o.layer = layers[i];
    ++tally->ran;
    auto r = store::RunRoutedExperts(*stores.full, in.source, o, stores.ranks);
    if (!r.ok()) return ReportError("run-experts", r.error());
    if (o.progress) o.progress(store::LayerProgress(i + 1, layers.size()));
    tally->all_match = tally->all_match && r->matches();
    finished.push_back(std::move(*r));
  }
  progress->Finish();  // the bar's line ends before the results are printed
  for (const auto& r : finished) ReportRun(a, r, tally);
  return 0;
}

// The rank stores, then the full one: a close that fails fails the run.
int CloseStores(const RunStores& stores) {
  for (auto& rs : stores.ranks) {
    if (Status c = rs->Close(); !c.ok()) return ReportError("run-experts", c.error());
  }
  Status closed = stores.full->Close();
  if (!closed.ok()) return ReportError("run-experts", closed.error());
  return 0;
}

// The run's verdict: the JSON of every layer, or one line over several layers.
void PrintSummary(const Args& a, const RunInputs& in, const RunTally& tally) {
  if (a.Has("--json")) {
    json j{{"pack", in.pack_path}, {"gguf", in.gguf_path}, {"all_match", tally.all_match}, {"layers", tally.runs}};
    if (!tally.prediction.is_null()) j["prediction"] = tally.prediction;
    PrintJson(j);
  } else if (tally.ran > 1) {
    std::printf("%zu layers: %s\n", tally.ran,
                tally.all_match ? "all identical to the GGUF source" : "MISMATCHES found");
  }
}

int RunExperts(const std::vector<std::string>& argv) {
  Args a = RunExpertsArgs();
  int code = 0;
  if (!a.Parse(argv, &code)) return code;
  ManifestInDirectory(a, "run-experts");
  auto progress_mode = ProgressModeOf(a);
  if (!progress_mode.ok()) return ReportError("run-experts", progress_mode.error(), kExitUsage);
  RunValues v;
  if (int failed = ParseRunValues(a, &v)) return failed;
  std::unique_ptr<RunInputs> in;
  if (int failed = OpenRunInputs(a, &in)) return failed;
  // A size the model's experts refuse is a bad value (exit 2, as in pack and
  // trace sweep), said once, not as rank 0's store failing to open.
  if (v.ep_size > 1 && in->m.expert_pack.num_experts != 0)
    if (Status st = ep::CheckRank(ep::Rank{static_cast<uint32_t>(v.ep_size), 0}, in->m.expert_pack.num_experts,
                                  ep::kCliNames);
        !st.ok())
      return ReportError("run-experts", st.error(), kExitUsage);
  const store::StoreOptions so = StoreOptionsOf(a, v);
  if (!v.trace_out.empty()) {
    if (int failed = CheckTraceOutBeforeRun(a, v, *in)) return failed;
  }
  RunStores stores;
  if (int failed = OpenFullStore(a, *in, so, &stores.full)) return failed;
  if (int failed = OpenRankStores(a, v, *in, so, &stores.ranks)) return failed;
  std::vector<uint32_t> layers;
  if (int failed = ChooseLayers(a, stores.full->info().active_layer_ids, &layers)) return failed;
  if (!v.trace_out.empty())
    if (Status fits = trace::CheckModelFits(layers.size(), stores.full->info().num_experts); !fits.ok())
      return ReportError("run-experts", Error("--trace-out: " + fits.error().message()), kExitUsage);
  store::ExpertRunOptions o = RunOptionsOf(a, v);
  // Layers take seconds to minutes each at Kimi-K3's dimensions: the run
  // shows how many of them are done.
  auto progress = StartProgress(*progress_mode);
  o.progress = progress->Fn();
  RunTally tally;
  const int failed = v.trace_out.empty()
                         ? RunEachLayer(a, *in, stores, layers, o, progress.get(), &tally)
                         : RunStackToTrace(a, v, *in, stores, layers, o, progress.get(), &tally);
  if (failed) return failed;
  if (int close_failed = CloseStores(stores)) return close_failed;
  PrintSummary(a, *in, tally);
  return tally.all_match ? 0 : 1;
}

}  // namespace

K3_COMMAND("run-experts", "run routed-expert blocks from the pack through the store, checked against the GGUF source",
           RunExperts);

}  // namespace k3pack::cli
