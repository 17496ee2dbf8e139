// `k3pack trace replay`: a trace replayed on the real expert store (real
// reads from the pack), or with --simulate on the policy alone.
#include <cstdio>
#include <iostream>
#include <tuple>

#include "cli/command.h"
#include "cli/implied_inputs.h"
#include "cli/mib_option.h"
#include "cli/output_rule.h"
#include "cli/preflight.h"
#include "cli/trace_args.h"
#include "cli/trace_commands.h"
#include "k3pack/manifest.h"
#include "store/store_impl.h"
#include "k3pack/trace.h"
#include "store/io_engine.h"
#include "store/policy.h"
#include "store/replay.h"
#include "store/runtime_options.h"

namespace k3pack::cli {
namespace {

using nlohmann::json;
using namespace trace_args;  // NOLINT: the subcommands' shared option handling

// The replay's options and the rules between them.
Args ReplayArgs() {
  Args a("trace replay", "[--trace] T [--manifest M.json|DIR] [--cache-mib N] [options]",
         "Replays a trace on the real expert store (real reads from the pack) and reports hit rate, bytes per\n"
         "token, read throughput and latency. With --simulate only the policy runs (no pack, no I/O).");
  a.Option("--trace", "trace file (k3pack trace gen)", std::nullopt, true)
      .PositionalAsOption("--trace")
      .Option("--manifest", "adapter manifest, or the directory holding it under SGLang's name (required unless --simulate)")
      .Option("--pack", "expert pack (default: the manifest's expert_pack.path)")
      .Option("--cache-mib", "host cache budget in MiB (SGLang's loader default, cache_vram_mib)", "4096")
      .Option("--policy", "reuse-lfu-lru-v2 | lru | decay-lfu | quota-decay | request-aware | adaptive", "reuse-lfu-lru-v2")
      .Option("--io", "pread | uring", "pread")
      .Flag("--direct", "O_DIRECT reads")
      .Option("--read-splits", "ranges per object read", "1")
      .Option("--queue-depth", "reads in flight", "16")
      .Option("--prefetch", "none | oracle-lookahead (prefetch the next record's experts)", "none")
      .Option("--lookahead", "records ahead for oracle-lookahead", "1")
      .Option("--stats", "write the store's stats JSON here at close (not with --simulate: no store)")
      .Flag("--force", "replace an existing --stats file another store wrote (e.g. SGLang's); a file that is not "
                       "a stats file is never replaced")
      .Option("--object-bytes", "object size for --simulate without --manifest", "11956224")
      .Flag("--simulate", "policy only, no I/O")
      .Flag("--json", "print the report as JSON");
  // --simulate reads nothing: the options of the real store's reads would be ignored.
  for (const char* io : {"--pack", "--io", "--direct", "--read-splits", "--queue-depth", "--prefetch"}) {
    a.Exclusive({"--simulate", io}, "--simulate runs the policy only, without reads");
  }
  // --stats is the expert store's snapshot (SGLang's keys: pack reads, read
  // times, I/O backend); a simulation opens no store. Its numbers (hits,
  // misses, evictions, bytes a store would read) are the report.
  a.Exclusive({"--simulate", "--stats"},
              "--stats writes the expert store's stats and --simulate opens no store (--json prints the "
              "simulation's report)");
  a.Requires("--force", {"--stats"}, "it only applies to the stats file")
      .RequiresValueOtherThan("--lookahead", "--prefetch", "none", "it is how far oracle-lookahead prefetches")
      .Requires("--object-bytes", {"--simulate"}, "a replay reads the manifest's objects");
  // The manifest gives every object's size: a value beside it was ignored
  // (and went unchecked: "5x" and -1 ran).
  a.Exclusive({"--object-bytes", "--manifest"}, "the manifest gives each object's size");
  AddProgressOption(a);
  return a;
}

// The replay's values, checked before the trace is read (usage errors).
struct ReplayValues {
  uint64_t cache_bytes = 0;
  int read_splits = 1;
  uint32_t lookahead = 1;
  uint32_t queue_depth = 0;
};

// Reports the first bad value and returns its exit status; 0 when all are good.
int ParseReplayValues(const Args& a, ReplayValues* out) {
  auto cache_bytes = MibOptionBytes(a, "--cache-mib", 1);
  if (!cache_bytes.ok()) return ReportError("trace replay", cache_bytes.error(), 2);
  // Every named value is checked before the trace is read (usage errors).
  if (Status st = CheckPolicyName("--policy", a.Get("--policy")); !st.ok())
    return ReportError("trace replay", st.error(), 2);
  if (Status io = CheckIoBackendName("--io", a.Get("--io")); !io.ok())
    return ReportError("trace replay", io.error(), 2);
  if (a.Get("--prefetch") != "none" && a.Get("--prefetch") != "oracle-lookahead")
    return ReportError("trace replay", Error("--prefetch: unknown prefetch mode '" + a.Get("--prefetch") +
                                             "' (known: none, oracle-lookahead)"), 2);
  auto splits = a.GetInt("--read-splits"), look = a.GetInt("--lookahead");
  for (auto [name, v, most] : {std::tuple{"--read-splits", &splits, int64_t{store::kMaxReadSplits}},
                               {"--lookahead", &look, int64_t{INT32_MAX}}}) {
    if (!v->ok()) return ReportError("trace replay", v->error(), 2);
    if (**v < 1 || **v > most)
      return ReportError("trace replay", Error(std::string(name) + " must be an integer in 1.." + std::to_string(most) +
                                               ", got " + a.Get(name)), 2);
  }
  uint32_t depth = 0;
  if (Status st = QueueDepthOption(a, &depth); !st.ok()) return ReportError("trace replay", st.error(), 2);
  if (a.Has("--simulate")) {
    if (Status st = CheckObjectBytesOption(a); !st.ok()) return ReportError("trace replay", st.error(), 2);
  }
  *out = ReplayValues{*cache_bytes, static_cast<int>(*splits), static_cast<uint32_t>(*look), depth};
  return 0;
}

// The policy alone over the trace's calls (and Belady's optimum beside it).
int Simulate(const Args& a, const ReplayValues& v, const trace::Trace& t, ProgressMode mode, json* out) {
  auto space = SpaceFor(a, t);
  if (!space.ok()) return ReportError("trace replay", space.error());
  auto seq = store::BuildCallSeq(t, *space);
  if (!seq.ok()) return ReportError("trace replay", seq.error().WithContext(a.Get("--trace")));
  // Progress in calls simulated, one phase per pass: Belady's pass runs at
  // its own speed, so one total over both gave a wrong ETA in the first half.
  auto progress = StartProgress(mode);
  const bool belady = space->uniform();
  Progress p;
  p.phase = "simulate";
  p.unit = "calls";
  p.total_objects = seq->calls.size();
  auto calls_done = [&](const char* phase) {
    return [&, phase](uint64_t done) {
      p.phase = phase;
      p.done_objects = done;
      progress->Update(p);
    };
  };
  auto r = store::Simulate(*seq, *space, a.Get("--policy"), v.cache_bytes, calls_done("simulate"));
  if (!r.ok()) {
    progress->Finish();
    return ReportError("trace replay", r.error().WithContext(a.Get("--trace")));
  }
  json& report = *out;
  report = {{"policy", r->policy},
            {"simulate", true},
            {"cache_bytes", v.cache_bytes},
            {"effective_capacity_experts", r->capacity_objects},
            {"hits", r->hits},
            {"misses", r->misses},
            {"hit_rate", r->hit_rate()},
            {"evictions", r->evictions},
            {"tokens", seq->tokens},
            {"bytes_read", r->bytes_read},
            {"bytes_per_token", seq->tokens ? double(r->bytes_read) / double(seq->tokens) : 0.0}};
  if (belady && r->capacity_objects >= space->top_k) {
    auto b = store::SimulateBelady(*seq, *space, r->capacity_objects, calls_done("belady"));
    if (b.ok()) report["belady_hit_rate"] = b->hit_rate();
  }
  progress->Finish();  // each pass reported its end itself
  return 0;
}

// The trace on the real store: every miss a read from the pack.
int ReplayOnTheStore(const Args& a, const ReplayValues& v, const trace::Trace& t, ProgressMode mode, json* out) {
  if (!a.Has("--manifest")) return ReportError("trace replay", Error("--manifest is required without --simulate"), 2);
  store::ReplayOptions o;
  o.manifest_path = a.Get("--manifest");
  o.trace_path = a.Get("--trace");
  if (Status e = CheckInputExists("--manifest", o.manifest_path, ".manifest.json"); !e.ok())
    return ReportError("trace replay", e.error());
  o.pack_path = a.Get("--pack");
  if (o.pack_path.empty()) {
    auto m = store::ReadStoreManifest(o.manifest_path);
    if (!m.ok()) return ReportError("trace replay", m.error());
    if (!m->contains("expert_pack") || !(*m)["expert_pack"].contains("path") ||
        !(*m)["expert_pack"]["path"].is_string())
      return ReportError("trace replay", Error(o.manifest_path + " has no expert_pack.path; pass --pack"));
    o.pack_path = (*m)["expert_pack"]["path"].get<std::string>();
  }
  o.store.cache_bytes = v.cache_bytes;
  o.store.policy = a.Get("--policy");
  o.store.io_backend = a.Get("--io");
  o.store.direct_io = a.Has("--direct");
  o.store.stats_path = a.Get("--stats");
  if (!o.store.stats_path.empty()) {
    const std::string& stats = o.store.stats_path;
    if (Status w = CheckOutputWritable("--stats", stats); !w.ok()) return ReportError("trace replay", w.error());
    if (Status in = CheckOutputsAreNotInputs({{"--stats", stats}}, {{"--trace", a.Get("--trace")},
                                                                    {"--manifest", o.manifest_path},
                                                                    {"--pack", o.pack_path}});
        !in.ok())
      return ReportError("trace replay", in.error());
    if (Status st = CheckStatsPath(a, stats); !st.ok()) return ReportError("trace replay", st.error());
  }
  o.store.read_splits = v.read_splits;
  o.store.queue_depth = v.queue_depth;
  o.prefetch = a.Get("--prefetch");
  o.lookahead = v.lookahead;
  auto progress = StartProgress(mode);
  o.progress = progress->CountFn("replay", "records");
  auto r = store::ReplayOnStore(t, o);
  progress->Finish();
  if (!r.ok()) {
    // A record the store refused is the trace's fault: name it, as
    // --simulate does (the store's own failures name their files).
    const bool record = r.error().message().rfind("trace record ", 0) == 0;
    return ReportError("trace replay", record ? r.error().WithContext(a.Get("--trace")) : r.error());
  }
  *out = std::move(r).value();
  return 0;
}

void PrintReport(const json& report, uint64_t cache_bytes) {
  std::printf("policy %s, cache %llu MiB = %llu experts (effective capacity)\n",
              report["policy"].get<std::string>().c_str(), (unsigned long long)(cache_bytes >> 20),
              (unsigned long long)report["effective_capacity_experts"].get<uint64_t>());
  std::printf("hits %llu, misses %llu, hit rate %.2f%%",
              (unsigned long long)report["hits"].get<uint64_t>(), (unsigned long long)report["misses"].get<uint64_t>(),
              100.0 * report["hit_rate"].get<double>());
  if (report.contains("belady_hit_rate")) std::printf(" (Belady %.2f%%)", 100.0 * report["belady_hit_rate"].get<double>());
  std::printf("\nbytes read %llu, %.1f MB per token\n", (unsigned long long)report["bytes_read"].get<uint64_t>(),
              report["bytes_per_token"].get<double>() / 1e6);
  if (!report.contains("simulate")) {
    const json& lat = report["read_latency_ms"];
    std::printf("%s%s, %.2f s, %.2f GB/s, read latency ms p50 %.2f p90 %.2f p99 %.2f max %.2f\n",
                report["io_backend"].get<std::string>().c_str(), report["direct_io"].get<bool>() ? " O_DIRECT" : "",
                report["seconds"].get<double>(), report["gb_per_s"].get<double>(), lat["p50"].get<double>(),
                lat["p90"].get<double>(), lat["p99"].get<double>(), lat["max"].get<double>());
    std::printf("open %.3f s, prefetch useful %llu wasted %llu, io errors %llu\n", report["open_seconds"].get<double>(),
                (unsigned long long)report["prefetch_useful"].get<uint64_t>(),
                (unsigned long long)report["prefetch_wasted"].get<uint64_t>(),
                (unsigned long long)report["io_errors"].get<uint64_t>());
  }
}

}  // namespace

int RunTraceReplay(const std::vector<std::string>& argv) {
  Args a = ReplayArgs();
  int code = 0;
  if (!a.Parse(argv, &code)) return code;
  ManifestInDirectory(a, "trace replay");
  auto mode = ProgressModeOf(a);
  if (!mode.ok()) return ReportError("trace replay", mode.error(), 2);
  ReplayValues v;
  if (int failed = ParseReplayValues(a, &v)) return failed;
  auto t = ReadTraceArg(a);
  if (!t.ok()) return ReportError("trace replay", t.error());
  json report;
  if (int failed = a.Has("--simulate") ? Simulate(a, v, *t, *mode, &report) : ReplayOnTheStore(a, v, *t, *mode, &report))
    return failed;
  if (a.Has("--json")) {
    PrintJson(report);
    return 0;
  }
  PrintReport(report, v.cache_bytes);
  return 0;
}

}  // namespace k3pack::cli
