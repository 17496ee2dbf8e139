// `k3pack trace gen|replay|sweep`: synthetic routing traces, replay on the
// real store (or policy-only simulation), and policy sweeps vs Belady.
#include <algorithm>
#include <charconv>
#include <filesystem>
#include <memory>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <tuple>

#include "cli/command.h"
#include "cli/implied_inputs.h"
#include "cli/mib_option.h"
#include "cli/output_rule.h"
#include "cli/preflight.h"
#include "cli/trace_args.h"
#include "cli/trace_sweep.h"
#include "k3pack/ep.h"
#include "k3pack/manifest.h"
#include "k3pack/trace.h"
#include "store/ep_sweep.h"
#include "store/policy.h"
#include "store/replay.h"
#include "store/store_impl.h"
#include "store/io_engine.h"
#include "store/timed_sim.h"
#include "util/file.h"

namespace k3pack::cli {
namespace {

using nlohmann::json;
constexpr const char* kCmd = "trace";

int Usage() {
  std::cerr << "usage: k3pack trace <gen|replay|sweep> [options]   (k3pack trace <sub> --help)\n";
  return 2;
}

using namespace trace_args;  // NOLINT: the subcommands' shared option handling

int RunGen(const std::vector<std::string>& argv) {
  Args a("trace gen", "--trace TRACE [options]",
         "Writes a seeded synthetic Kimi-like routing trace: every token passes each routed layer and picks top_k\n"
         "distinct experts; each expert of the previous token (same layer) is kept with probability --reuse, the\n"
         "rest are drawn from a per-request Zipf popularity (--request-skew) times a global one (--skew; 0 = flat,\n"
         "like Kimi's balanced router). --family picks a workload preset. Format: docs/store.md.");
  a.Option("--trace", "trace file to write", std::nullopt, true)
      .Deprecated("--out", "--trace")
      .Flag("--force", "replace an existing --trace file (otherwise refused; the same trace already there is reported)");
  AddGenOptions(a);
  a.Flag("--json", "print the summary as JSON");
  RequirePredictions(a, {"--predict", "--predict-next-token"});
  int code = 0;
  if (!a.Parse(argv, &code)) return code;
  // As replay, verify, load and run-experts: before, a directory failed
  // with "cannot read DIR: read failed at offset 0: Is a directory".
  ManifestInDirectory(a, "trace gen");
  trace::GenOptions o;
  Status gs = GenOptionsFromArgs(a, a.Get("--family"), &o);
  if (!gs.ok()) return ReportError("trace gen", gs.error(), 2);
  const std::string out = a.Get("--trace");
  const std::optional<FileStamp> seen = SeeOutput(out);
  auto t = trace::Generate(o);
  if (!t.ok()) return ReportError("trace gen", t.error());
  // The overwrite rule: a trace is cheap to generate, so "finished" means the
  // file already holds exactly these records; anything else is refused
  // (a shard or a manifest passed as --trace by mistake is never replaced).
  if (Status w = CheckOutputWritable("--trace", out); !w.ok()) return ReportError("trace gen", w.error());
  if (Status in = NotAnInput(a, "--trace", out, {"--manifest"}); !in.ok()) return ReportError("trace gen", in.error());
  OutputSpec spec;
  spec.option = "--trace";
  spec.path = out;
  spec.force = a.Has("--force");
  spec.is_finished = [&]() -> Result<bool> {
    auto old = trace::ReadTrace(out);
    return old.ok() && SameTrace(*old, *t);
  };
  spec.why_refused = "it is not this trace";
  spec.not_own_kind = [&] { return NotAFileOf(out, FileStart::kTrace, "a routing trace"); };
  auto action = DecideOutput(spec);
  if (!action.ok()) return ReportError("trace gen", action.error());
  if (*action == OutputAction::kAlreadyBuilt) {
    ReportAlreadyBuilt("trace gen", out, a.Has("--json"), "trace");
    return kExitOk;
  }
  Status st = WriteIfStillAsSeen("--trace", out, seen, [&] { return trace::WriteTrace(out, *t); });
  if (!st.ok()) return ReportError("trace gen", st.error());
  const double reuse = trace::MeasuredReuse(*t);
  json j = {{"trace", out},     {"records", t->records.size()},  {"routes", t->num_routes()},
            {"layers", t->layer_ids.size()}, {"experts", t->num_experts},    {"top_k", t->top_k},
            {"measured_reuse", reuse}, {"seed", o.seed}, {"family", a.Get("--family")},
            {"version", t->version()}};
  if (a.Has("--json")) {
    PrintJson(j);
  } else {
    std::printf("wrote %s (%s, format v%u): %zu records, %llu routes, %zu layers x top-%u of %u experts, measured reuse %.1f%%\n",
                out.c_str(), a.Get("--family").c_str(), t->version(), t->records.size(),
                (unsigned long long)t->num_routes(), t->layer_ids.size(), t->top_k, t->num_experts, 100.0 * reuse);
  }
  return 0;
}

int RunReplay(const std::vector<std::string>& argv) {
  Args a("trace replay", "--trace T [--manifest M.json|DIR] [--cache-mib N] [options]",
         "Replays a trace on the real expert store (real reads from the pack) and reports hit rate, bytes per\n"
         "token, read throughput and latency. With --simulate only the policy runs (no pack, no I/O).");
  a.Option("--trace", "trace file (k3pack trace gen)", std::nullopt, true)
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
  AddProgressOption(a);
  int code = 0;
  if (!a.Parse(argv, &code)) return code;
  ManifestInDirectory(a, "trace replay");
  auto mode = ProgressModeOf(a);
  if (!mode.ok()) return ReportError("trace replay", mode.error(), 2);
  auto cache_bytes = MibOptionBytes(a, "--cache-mib", 1);
  if (!cache_bytes.ok()) return ReportError("trace replay", cache_bytes.error(), 2);
  // Every named value is checked before the trace is read (usage errors).
  if (Status st = CheckPolicyName("--policy", a.Get("--policy")); !st.ok())
    return ReportError("trace replay", st.error(), 2);
  if (auto io = store::ParseIoBackend(a.Get("--io")); !io.ok())
    return ReportError("trace replay", Error("--io: " + io.error().message()), 2);
  if (a.Get("--prefetch") != "none" && a.Get("--prefetch") != "oracle-lookahead")
    return ReportError("trace replay", Error("--prefetch: unknown prefetch mode '" + a.Get("--prefetch") +
                                             "' (known: none, oracle-lookahead)"), 2);
  auto splits = a.GetInt("--read-splits"), look = a.GetInt("--lookahead");
  for (auto [name, v] : {std::pair{"--read-splits", &splits}, {"--lookahead", &look}}) {
    if (!v->ok()) return ReportError("trace replay", v->error(), 2);
    if (**v < 1 || **v > INT32_MAX)
      return ReportError("trace replay", Error(std::string(name) + " must be a positive integer, got " + a.Get(name)), 2);
  }
  uint32_t depth = 0;
  if (Status st = QueueDepthOption(a, &depth); !st.ok()) return ReportError("trace replay", st.error(), 2);
  if (a.Has("--simulate")) {
    if (Status st = CheckObjectBytesOption(a); !st.ok()) return ReportError("trace replay", st.error(), 2);
  }
  auto t = trace::ReadTrace(a.Get("--trace"));
  if (!t.ok()) return ReportError("trace replay", t.error());
  if (Status st = HasRecords(a.Get("--trace"), *t); !st.ok()) return ReportError("trace replay", st.error());
  json report;
  if (a.Has("--simulate")) {
    auto space = SpaceFor(a, *t);
    if (!space.ok()) return ReportError("trace replay", space.error());
    auto seq = store::BuildCallSeq(*t, *space);
    if (!seq.ok()) return ReportError("trace replay", seq.error().WithContext(a.Get("--trace")));
    // Progress in calls simulated: the policy's run, then Belady's.
    auto progress = StartProgress(*mode);
    const bool belady = space->uniform();
    Progress p;
    p.phase = "simulate";
    p.unit = "calls";
    p.total_objects = seq->calls.size() * (belady ? 2 : 1);
    auto calls_done = [&](uint64_t base) {
      return [&, base](uint64_t done) {
        p.done_objects = base + done;
        progress->Update(p);
      };
    };
    auto r = store::Simulate(*seq, *space, a.Get("--policy"), *cache_bytes, calls_done(0));
    if (!r.ok()) {
      progress->Finish();
      return ReportError("trace replay", r.error());
    }
    report = {{"policy", r->policy},
              {"simulate", true},
              {"cache_bytes", *cache_bytes},
              {"effective_capacity_experts", r->capacity_objects},
              {"hits", r->hits},
              {"misses", r->misses},
              {"hit_rate", r->hit_rate()},
              {"evictions", r->evictions},
              {"tokens", seq->tokens},
              {"bytes_read", r->bytes_read},
              {"bytes_per_token", seq->tokens ? double(r->bytes_read) / double(seq->tokens) : 0.0}};
    if (belady && r->capacity_objects >= space->top_k) {
      auto b = store::SimulateBelady(*seq, *space, r->capacity_objects, calls_done(seq->calls.size()));
      if (b.ok()) report["belady_hit_rate"] = b->hit_rate();
    }
    p.done_objects = p.total_objects;  // also when Belady could not run
    progress->Update(p);
    progress->Finish();
  } else {
    if (!a.Has("--manifest")) return ReportError("trace replay", Error("--manifest is required without --simulate"), 2);
    store::ReplayOptions o;
    o.manifest_path = a.Get("--manifest");
    if (Status e = CheckInputExists("--manifest", o.manifest_path, ".manifest.json"); !e.ok())
      return ReportError("trace replay", e.error());
    o.pack_path = a.Get("--pack");
    if (o.pack_path.empty()) {
      auto m = manifest::ReadManifestJson(o.manifest_path);
      if (!m.ok()) return ReportError("trace replay", m.error());
      if (!m->contains("expert_pack") || !(*m)["expert_pack"].contains("path") ||
          !(*m)["expert_pack"]["path"].is_string())
        return ReportError("trace replay", Error(o.manifest_path + " has no expert_pack.path; pass --pack"));
      o.pack_path = (*m)["expert_pack"]["path"].get<std::string>();
    }
    o.store.cache_bytes = *cache_bytes;
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
    o.store.read_splits = *splits;
    o.store.queue_depth = depth;
    o.prefetch = a.Get("--prefetch");
    o.lookahead = static_cast<uint32_t>(*look);
    auto progress = StartProgress(*mode);
    if (progress->mode() != ProgressMode::kNone) {
      o.progress = [&](uint64_t done, uint64_t total) {
        Progress p;
        p.phase = "replay";
        p.unit = "records";
        p.done_objects = done;
        p.total_objects = total;
        progress->Update(p);
      };
    }
    auto r = store::ReplayOnStore(*t, o);
    progress->Finish();
    if (!r.ok()) {
      // A record the store refused is the trace's fault: name it, as
      // --simulate does (the store's own failures name their files).
      const bool record = r.error().message().rfind("trace record ", 0) == 0;
      return ReportError("trace replay", record ? r.error().WithContext(a.Get("--trace")) : r.error());
    }
    report = std::move(r).value();
  }
  if (a.Has("--json")) {
    PrintJson(report);
    return 0;
  }
  std::printf("policy %s, cache %llu MiB = %llu experts (effective capacity)\n",
              report["policy"].get<std::string>().c_str(), (unsigned long long)(*cache_bytes >> 20),
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
  return 0;
}


int RunTrace(const std::vector<std::string>& argv) {
  if (argv.empty()) return Usage();
  const std::string& sub = argv[0];
  std::vector<std::string> rest(argv.begin() + 1, argv.end());
  if (sub == "gen") return RunGen(rest);
  if (sub == "replay") return RunReplay(rest);
  if (sub == "sweep") return RunTraceSweep(rest);
  if (sub == "--help" || sub == "-h") {
    std::cout << "usage: k3pack trace <gen|replay|sweep> [options]\n\n"
                 "  gen     write a synthetic Kimi-like routing trace\n"
                 "  replay  replay a trace on the real store (or --simulate the policy only)\n"
                 "  sweep   hit rate of every policy and Belady over cache sizes (table + SVG)\n\n"
                 "run `k3pack trace <sub> --help` for the options of each\n";
    return 0;
  }
  const std::string msg = "unknown sub-command '" + sub + "'";
  ReportDispatchError("trace", "k3pack trace: error: " + msg, msg, rest);
  return Usage();
}

}  // namespace

K3_COMMAND("trace", "routing traces: gen, replay on the store, policy sweep vs Belady", RunTrace);

}  // namespace k3pack::cli
