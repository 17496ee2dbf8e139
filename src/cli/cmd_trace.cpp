// `k3pack trace gen|replay|sweep`: synthetic routing traces, replay on the
// real store (or policy-only simulation), and policy sweeps vs Belady.
#include <cstdio>
#include <iostream>
#include <sstream>

#include "cli/command.h"
#include "cli/output_rule.h"
#include "cli/preflight.h"
#include "k3pack/manifest.h"
#include "k3pack/trace.h"
#include "store/replay.h"
#include "store/store_impl.h"
#include "util/file.h"

namespace k3pack::cli {
namespace {

using nlohmann::json;
constexpr const char* kCmd = "trace";

int Usage() {
  std::cerr << "usage: k3pack trace <gen|replay|sweep> [options]   (k3pack trace <sub> --help)\n";
  return 2;
}

Result<std::vector<uint64_t>> ParseList(const std::string& s, const std::string& what) {
  std::vector<uint64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      uint64_t v = std::stoull(item, &used);
      if (used != item.size()) throw std::invalid_argument(item);
      out.push_back(v);
    } catch (...) {
      return Error(what + " must be a comma-separated list of integers, got '" + s + "'");
    }
  }
  if (out.empty()) return Error(what + " is empty");
  return out;
}

// Object space: the manifest's if given, else the trace's dims with K3's object size.
Result<store::ObjectSpace> SpaceFor(const Args& a, const trace::Trace& t) {
  if (a.Has("--manifest")) {
    K3_RETURN_IF_ERROR(CheckInputExists("--manifest", a.Get("--manifest"), ".manifest.json"));
    K3_ASSIGN_OR_RETURN(store::ObjectSpace s, store::SpaceFromManifest(a.Get("--manifest")));
    if (s.num_experts != t.num_experts || s.top_k != t.top_k)
      return Error("trace dimensions do not match manifest " + a.Get("--manifest"));
    return s;
  }
  K3_ASSIGN_OR_RETURN(int64_t ob, a.GetInt("--object-bytes"));
  return store::SpaceForTrace(t, static_cast<uint64_t>(ob));
}

bool SameTrace(const trace::Trace& a, const trace::Trace& b) {
  if (a.num_experts != b.num_experts || a.top_k != b.top_k || a.layer_ids != b.layer_ids || a.ids != b.ids ||
      a.records.size() != b.records.size())
    return false;
  for (size_t i = 0; i < a.records.size(); ++i) {
    const trace::Record &x = a.records[i], &y = b.records[i];
    if (x.layer != y.layer || x.rows != y.rows || x.request != y.request || x.is_prefill != y.is_prefill ||
        x.offset != y.offset)
      return false;
  }
  return true;
}

// An SVG written by an earlier `trace sweep` (its title line is ours).
bool IsOurPlot(const std::string& path) {
  auto text = ReadFileToString(path);
  return text.ok() && text->rfind("<svg", 0) == 0 && text->find("hit rate vs cache size: ") != std::string::npos;
}

int RunGen(const std::vector<std::string>& argv) {
  Args a("trace gen", "--trace TRACE [options]",
         "Writes a seeded synthetic Kimi-like routing trace: every token passes each routed layer and picks top_k\n"
         "distinct experts; each expert of the previous token (same layer) is kept with probability --reuse, the\n"
         "rest are drawn from a per-request Zipf popularity (--request-skew) times a global one (--skew; 0 = flat,\n"
         "like Kimi's balanced router). Format: docs/store.md.");
  a.Option("--trace", "trace file to write", std::nullopt, true)
      .Deprecated("--out", "--trace")
      .Flag("--force", "replace an existing --trace file (otherwise refused; the same trace already there is reported)")
      .Option("--manifest", "take layers / experts / top_k from this adapter manifest")
      .Option("--layers", "routed layers (numbered from --first-layer)", "92")
      .Option("--first-layer", "first routed layer id", "1")
      .Option("--experts", "experts per layer", "896")
      .Option("--top-k", "experts per token", "16")
      .Option("--requests", "requests, replayed one after another", "4")
      .Option("--prompt-tokens", "prompt tokens per request", "32")
      .Option("--decode-tokens", "decoded tokens per request", "256")
      .Option("--prefill-chunk", "rows per prefill record (0: one record per prompt token, SGLang's Kimi path)", "0")
      .Option("--reuse", "chance an expert of the previous token is routed again", "0.3")
      .Option("--skew", "global Zipf exponent of expert popularity per layer", "0")
      .Option("--request-skew", "per-request Zipf exponent", "0.6")
      .Option("--seed", "random seed", "1")
      .Flag("--json", "print the summary as JSON");
  int code = 0;
  if (!a.Parse(argv, &code)) return code;
  trace::GenOptions o;
  auto geti = [&](const char* name, auto* dst) -> bool {
    auto v = a.GetInt(name);
    if (!v.ok() || *v < 0) {
      ReportError("trace gen", v.ok() ? Error(std::string(name) + " must be non-negative") : v.error(), 2);
      return false;
    }
    *dst = static_cast<std::remove_pointer_t<decltype(dst)>>(*v);
    return true;
  };
  uint32_t layers = 0, first = 0;
  if (!geti("--layers", &layers) || !geti("--first-layer", &first) || !geti("--experts", &o.num_experts) ||
      !geti("--top-k", &o.top_k) || !geti("--requests", &o.requests) || !geti("--prompt-tokens", &o.prompt_tokens) ||
      !geti("--decode-tokens", &o.decode_tokens) || !geti("--prefill-chunk", &o.prefill_chunk) ||
      !geti("--seed", &o.seed))
    return 2;
  for (uint32_t l = 0; l < layers; ++l) o.layer_ids.push_back(first + l);
  for (auto [name, dst] : {std::pair{"--reuse", &o.reuse}, {"--skew", &o.skew}, {"--request-skew", &o.request_skew}}) {
    auto v = a.GetDouble(name);
    if (!v.ok()) return ReportError("trace gen", v.error(), 2);
    *dst = *v;
  }
  const std::string out = a.Get("--trace");
  if (a.Has("--manifest")) {
    Status exists = CheckInputExists("--manifest", a.Get("--manifest"), ".manifest.json");
    if (!exists.ok()) return ReportError("trace gen", exists.error());
    auto s = store::SpaceFromManifest(a.Get("--manifest"));
    if (!s.ok()) return ReportError("trace gen", s.error());
    o.layer_ids = s->active_layer_ids;
    o.num_experts = s->num_experts;
    o.top_k = s->top_k;
  }
  auto t = trace::Generate(o);
  if (!t.ok()) return ReportError("trace gen", t.error());
  // The overwrite rule: a trace is cheap to generate, so "finished" means the
  // file already holds exactly these records; anything else is refused
  // (a shard or a manifest passed as --trace by mistake is never replaced).
  if (Status w = CheckOutputWritable("--trace", out); !w.ok()) return ReportError("trace gen", w.error());
  OutputSpec spec;
  spec.option = "--trace";
  spec.path = out;
  spec.force = a.Has("--force");
  spec.is_finished = [&]() -> Result<bool> {
    auto old = trace::ReadTrace(out);
    return old.ok() && SameTrace(*old, *t);
  };
  spec.why_refused = "it is not this trace";
  auto action = DecideOutput(spec);
  if (!action.ok()) return ReportError("trace gen", action.error());
  if (*action == OutputAction::kAlreadyBuilt) {
    ReportAlreadyBuilt("trace gen", out, a.Has("--json"));
    return kExitOk;
  }
  Status st = trace::WriteTrace(out, *t);
  if (!st.ok()) return ReportError("trace gen", st.error());
  json j = {{"trace", out},     {"records", t->records.size()},  {"routes", t->num_routes()},
            {"layers", t->layer_ids.size()}, {"experts", t->num_experts},    {"top_k", t->top_k},
            {"measured_reuse", trace::MeasuredReuse(*t)}, {"seed", o.seed}};
  if (a.Has("--json")) {
    std::cout << j.dump(2) << "\n";
  } else {
    std::printf("wrote %s: %zu records, %llu routes, %zu layers x top-%u of %u experts, measured reuse %.1f%%\n",
                out.c_str(), t->records.size(), (unsigned long long)t->num_routes(), t->layer_ids.size(),
                t->top_k, t->num_experts, 100.0 * trace::MeasuredReuse(*t));
  }
  return 0;
}

int RunReplay(const std::vector<std::string>& argv) {
  Args a("trace replay", "--trace T --cache-mib N [--manifest M] [options]",
         "Replays a trace on the real expert store (real reads from the pack) and reports hit rate, bytes per\n"
         "token, read throughput and latency. With --simulate only the policy runs (no pack, no I/O).");
  a.Option("--trace", "trace file (k3pack trace gen)", std::nullopt, true)
      .Option("--manifest", "adapter manifest (required unless --simulate)")
      .Option("--pack", "expert pack (default: the manifest's expert_pack.path)")
      .Option("--cache-mib", "host cache budget in MiB", std::nullopt, true)
      .Option("--policy", "reuse-lfu-lru-v2 | lru | decay-lfu | quota-decay", "reuse-lfu-lru-v2")
      .Option("--io", "pread | uring", "pread")
      .Flag("--direct", "O_DIRECT reads")
      .Option("--read-splits", "ranges per object read", "1")
      .Option("--queue-depth", "reads in flight", "16")
      .Option("--prefetch", "none | oracle-lookahead (prefetch the next record's experts)", "none")
      .Option("--lookahead", "records ahead for oracle-lookahead", "1")
      .Option("--stats", "write the store's stats JSON here at close")
      .Option("--object-bytes", "object size for --simulate without --manifest", "11956224")
      .Flag("--simulate", "policy only, no I/O")
      .Flag("--json", "print the report as JSON");
  AddProgressOption(a);
  int code = 0;
  if (!a.Parse(argv, &code)) return code;
  auto mode = ProgressModeOf(a);
  if (!mode.ok()) return ReportError("trace replay", mode.error(), 2);
  auto t = trace::ReadTrace(a.Get("--trace"));
  if (!t.ok()) return ReportError("trace replay", t.error());
  auto mib = a.GetInt("--cache-mib");
  if (!mib.ok() || *mib <= 0) return ReportError("trace replay", Error("--cache-mib must be a positive integer"), 2);
  const uint64_t cache_bytes = static_cast<uint64_t>(*mib) << 20;
  json report;
  if (a.Has("--simulate")) {
    auto space = SpaceFor(a, *t);
    if (!space.ok()) return ReportError("trace replay", space.error());
    auto seq = store::BuildCallSeq(*t, *space);
    if (!seq.ok()) return ReportError("trace replay", seq.error());
    auto r = store::Simulate(*seq, *space, a.Get("--policy"), cache_bytes);
    if (!r.ok()) return ReportError("trace replay", r.error());
    report = {{"policy", r->policy},
              {"simulate", true},
              {"cache_bytes", cache_bytes},
              {"effective_capacity_experts", r->capacity_objects},
              {"hits", r->hits},
              {"misses", r->misses},
              {"hit_rate", r->hit_rate()},
              {"evictions", r->evictions},
              {"tokens", seq->tokens},
              {"bytes_read", r->bytes_read},
              {"bytes_per_token", seq->tokens ? double(r->bytes_read) / double(seq->tokens) : 0.0}};
    if (space->uniform() && r->capacity_objects >= space->top_k) {
      auto b = store::SimulateBelady(*seq, *space, r->capacity_objects);
      if (b.ok()) report["belady_hit_rate"] = b->hit_rate();
    }
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
    o.store.cache_bytes = cache_bytes;
    o.store.policy = a.Get("--policy");
    o.store.io_backend = a.Get("--io");
    o.store.direct_io = a.Has("--direct");
    o.store.stats_path = a.Get("--stats");
    auto splits = a.GetInt("--read-splits"), depth = a.GetInt("--queue-depth"), look = a.GetInt("--lookahead");
    if (!splits.ok() || !depth.ok() || !look.ok() || *look < 1)
      return ReportError("trace replay", Error("--read-splits, --queue-depth and --lookahead must be integers (lookahead >= 1)"), 2);
    o.store.read_splits = *splits;
    o.store.queue_depth = *depth;
    o.prefetch = a.Get("--prefetch");
    o.lookahead = static_cast<uint32_t>(*look);
    auto progress = StartProgress(*mode, "trace replay");
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
    if (!r.ok()) return ReportError("trace replay", r.error());
    report = std::move(r).value();
  }
  if (a.Has("--json")) {
    std::cout << report.dump(2) << "\n";
    return 0;
  }
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
  return 0;
}

int RunSweep(const std::vector<std::string>& argv) {
  Args a("trace sweep", "[--trace T] [options]",
         "Simulates every policy (and Belady's optimum) over a range of cache sizes, prints a table and writes an\n"
         "SVG plot of hit rate vs cache size. Without --trace the default `trace gen` trace (seed --seed) is used.");
  a.Option("--trace", "trace file (default: generate the default trace)")
      .Option("--manifest", "adapter manifest for dimensions and object sizes")
      .Option("--object-bytes", "object size without --manifest", "11956224")
      .Option("--sizes", "cache sizes in objects, comma-separated (default: 0.54%,1%,2%,3.5%,5%,8% of all objects; on a model too small for those, six sizes from top_k up)")
      .Option("--policies", "comma-separated policies", "lru,reuse-lfu-lru-v2,decay-lfu,quota-decay")
      .Flag("--no-belady", "skip Belady's optimum")
      .Option("--svg", "write the plot here", "trace-sweep.svg")
      .Flag("--force", "replace an existing --svg file that is not a k3pack plot")
      .Option("--seed", "seed of the generated trace", "1")
      .Flag("--json", "print the table as JSON");
  AddProgressOption(a);
  int code = 0;
  if (!a.Parse(argv, &code)) return code;
  auto mode = ProgressModeOf(a);
  if (!mode.ok()) return ReportError("trace sweep", mode.error(), 2);
  trace::Trace t;
  if (a.Has("--trace")) {
    auto r = trace::ReadTrace(a.Get("--trace"));
    if (!r.ok()) return ReportError("trace sweep", r.error());
    t = std::move(r).value();
  } else {
    trace::GenOptions o;
    auto seed = a.GetInt("--seed");
    if (!seed.ok()) return ReportError("trace sweep", seed.error(), 2);
    o.seed = static_cast<uint64_t>(*seed);
    if (a.Has("--manifest")) {
      auto s = store::SpaceFromManifest(a.Get("--manifest"));
      if (!s.ok()) return ReportError("trace sweep", s.error());
      o.layer_ids = s->active_layer_ids;
      o.num_experts = s->num_experts;
      o.top_k = s->top_k;
    }
    auto r = trace::Generate(o);
    if (!r.ok()) return ReportError("trace sweep", r.error());
    t = std::move(r).value();
  }
  auto space = SpaceFor(a, t);
  if (!space.ok()) return ReportError("trace sweep", space.error());
  auto seq = store::BuildCallSeq(t, *space);
  if (!seq.ok()) return ReportError("trace sweep", seq.error());
  std::vector<uint64_t> sizes;
  if (a.Has("--sizes")) {
    auto l = ParseList(a.Get("--sizes"), "--sizes");
    if (!l.ok()) return ReportError("trace sweep", l.error(), 2);
    sizes = *l;
  } else {
    std::string note;
    sizes = store::DefaultSweepSizes(*space, &note);
    if (!note.empty()) std::cerr << "k3pack trace sweep: note: " << note << "\n";
  }
  std::vector<std::string> policies;
  {
    std::stringstream ss(a.Get("--policies"));
    std::string p;
    while (std::getline(ss, p, ',')) policies.push_back(p);
  }
  auto progress = StartProgress(*mode, "trace sweep");
  auto table = store::Sweep(*seq, *space, policies, sizes, !a.Has("--no-belady"), progress->Fn());
  progress->Finish();
  if (!table.ok()) return ReportError("trace sweep", table.error());
  std::string title = "hit rate vs cache size: " + std::to_string(t.layer_ids.size()) + " layers x top-" +
                      std::to_string(t.top_k) + " of " + std::to_string(t.num_experts) + ", " +
                      std::to_string(seq->tokens) + " tokens";
  const std::string svg = store::SweepSvg(*table, title);
  OutputSpec spec;
  spec.option = "--svg";
  spec.path = a.Get("--svg");
  spec.force = a.Has("--force");
  // A plot is regenerated from the table; an existing file is replaced only
  // when it is one of ours (an earlier sweep's plot), never a user's file.
  spec.is_finished = [&]() -> Result<bool> {
    auto old = ReadFileToString(spec.path);
    return old.ok() && *old == svg;
  };
  spec.why_refused = "it is not a plot written by `k3pack trace sweep`";
  auto action = DecideOutput(spec);
  if (!action.ok() && IsOurPlot(spec.path)) {
    action = OutputAction::kReplace;  // our own earlier plot: refreshed
  }
  if (!action.ok()) return ReportError("trace sweep", action.error());
  Status st = *action == OutputAction::kAlreadyBuilt ? Status::OK() : WriteFileAtomic(spec.path, svg);
  if (!st.ok()) return ReportError("trace sweep", st.error());
  if (a.Has("--json")) {
    json j = store::SweepJson(*table);
    j["svg"] = a.Get("--svg");
    j["tokens"] = seq->tokens;
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << title << "\n" << store::SweepText(*table) << "plot: " << a.Get("--svg") << "\n";
  }
  return 0;
}

int RunTrace(const std::vector<std::string>& argv) {
  if (argv.empty()) return Usage();
  const std::string& sub = argv[0];
  std::vector<std::string> rest(argv.begin() + 1, argv.end());
  if (sub == "gen") return RunGen(rest);
  if (sub == "replay") return RunReplay(rest);
  if (sub == "sweep") return RunSweep(rest);
  if (sub == "--help" || sub == "-h") {
    std::cout << "usage: k3pack trace <gen|replay|sweep> [options]\n\n"
                 "  gen     write a synthetic Kimi-like routing trace\n"
                 "  replay  replay a trace on the real store (or --simulate the policy only)\n"
                 "  sweep   hit rate of every policy and Belady over cache sizes (table + SVG)\n\n"
                 "run `k3pack trace <sub> --help` for the options of each\n";
    return 0;
  }
  std::cerr << "k3pack trace: error: unknown sub-command '" << sub << "'\n";
  return Usage();
}

}  // namespace

K3_COMMAND("trace", "routing traces: gen, replay on the store, policy sweep vs Belady", RunTrace);

}  // namespace k3pack::cli
