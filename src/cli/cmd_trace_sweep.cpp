// `k3pack trace sweep`: every policy, Belady's optimum and the informed
// bound over a range of cache sizes (table + SVG plot); with --timing the
// timed replay (stalls, bytes, prefetch), with --ep-size per rank.
#include "cli/trace_commands.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <cstdio>
#include <iostream>

#include "cli/command.h"
#include "cli/implied_inputs.h"
#include "cli/mib_option.h"
#include "cli/trace_args.h"
#include "k3pack/ep.h"
#include "k3pack/trace.h"
#include "store/ep_sweep.h"
#include "store/policy.h"
#include "store/replay.h"
#include "store/timed_sim.h"

namespace k3pack::cli {
namespace {

using nlohmann::json;
using namespace trace_args;  // NOLINT: the subcommands' shared option handling

// One family's (or --trace's) input to the sweep, made before any simulation.
struct SweepInput {
  std::string family;  // "" for --trace
  trace::Trace t;
  trace::TrueDistribution truth;
  bool have_truth = false;
  store::ObjectSpace space;
  store::CallSeq seq;
  std::vector<uint64_t> sizes;
};

// The options AddGenOptions declares that only shape a generated trace
// (--manifest also gives `trace sweep --trace` its object space).
constexpr const char* kGenOnlyOptions[] = {
    "--family",         "--layers",        "--first-layer",   "--experts",   "--top-k",
    "--requests",       "--concurrent",    "--batched",       "--domains",   "--prompt-tokens",
    "--decode-tokens",  "--prefill-chunk", "--reuse",         "--skew",      "--request-skew",
    "--drift",          "--predict",       "--predict-accuracy", "--predict-surprise",
    "--predict-next-token", "--seed"};

// `path` with "-<family>" before its extension (one plot per family):
// plot.svg -> plot-kimi.svg; a path without one gets ".svg" too (plot ->
// plot-kimi.svg, where it got no extension before).
std::string PerFamilyPath(const std::string& path, const std::string& family) {
  size_t dot = path.rfind('.');
  size_t slash = path.rfind('/');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash) || dot == slash + 1)
    return path + "-" + family + ".svg";
  return path.substr(0, dot) + "-" + family + path.substr(dot);
}

// --svg names a file: a directory (`--svg adir/` became `adir/-kimi`) is
// refused before anything runs.
Status CheckPlotIsAFile(const std::string& path) {
  std::error_code ec;
  if (!path.empty() && path.back() != '/' && !std::filesystem::is_directory(path, ec)) return Status::OK();
  const bool named_so = !path.empty() && path.back() == '/' && !std::filesystem::exists(path, ec);
  return Error("--svg " + path + (named_so ? " ends in '/', so it names a directory" : " is a directory") +
               "; it names the plot file")
      .WithHint("give a file path, such as " + (path.empty() || path.back() == '/' ? path : path + "/") +
                "trace-sweep.svg (with --family all: one plot per family beside it, named PATH-FAMILY.svg)");
}

// The sweep's options and the rules between them.
Args SweepArgs() {
  Args a("trace sweep", "[[--trace] T | --family F|all] [options]",
         "Simulates the --policies (every policy but request-aware by default), Belady's optimum and (for generated\n"
         "traces) the distribution-informed bound over a range of cache sizes, prints a table and writes an SVG plot\n"
         "of hit rate vs cache size. Without --trace the --family preset is generated (seed --seed); --family all\n"
         "sweeps every family.");
  a.Option("--trace", "trace file (default: generate --family)")
      .PositionalAsOption("--trace")
      .Option("--object-bytes", "object size without --manifest", "11956224")
      .Option("--sizes", "cache sizes in objects, comma-separated (default: 0.54,1,2,3.5,5,8,12,20% of all objects; on a model too small for those, sizes from top_k up)")
      .Option("--policies", "comma-separated policies", "lru,reuse-lfu-lru-v2,decay-lfu,quota-decay,adaptive")
      .Flag("--no-belady", "skip Belady's optimum and the informed bound")
      .Flag("--learner", "also the learning reference (generated traces): the informed bound's rule told each\n"
            "request's popularity values but not which expert holds which, learned from its routes (slower)")
      .Flag("--informed-next", "also the informed bound told each request's true next call of every layer (generated\n"
            "traces): what 100%-accurate next-token predictions could add to eviction")
      .Option("--svg", "write the plot here (with --family all: one per family, named PATH-FAMILY.svg)",
              "trace-sweep.svg")
      .Flag("--force", "replace an existing --svg image another program wrote; a file that is not an SVG is never replaced")
      .Option("--threads", "simulation threads", "2")
      .Option("--ep-size", "expert-parallel ranks: each rank replays only the routes to its experts with its own "
              "cache; --sizes are per rank (no plot, no informed bound)")
      .Flag("--timing", "timed replay instead: stall time, bytes and prefetch per token (generated traces get predictions)")
      .Option("--compute-us", "--timing: compute time of one routed layer per decode call (prefill: per row), 0..1e9", "350")
      .Option("--ssd-gbps", "--timing: SSD read bandwidth, GB/s, 0.001..10000", "7")
      .Option("--ssd-latency-us", "--timing: SSD latency per read, 0..1e9", "80")
      .Option("--queue-depth", "--timing: SSD reads in flight", "16")
      .Option("--prefetch-budget-mib", "--timing: speculative reads in flight, MiB (0: no cap)", "0")
      .Flag("--staged", "--timing: also prefetch with the store's staging rule (reads outside the cache)")
      .Option("--horizon", "--timing: what a call's prefetch predicts: layer (the next layer) | token (this layer\n"
              "at the request's next token; generated traces get --predict-next-token) | both (reads the next\n"
              "layer's, keep hints from the next token's; needs --keep-predicted)", "layer")
      .Flag("--keep-predicted", "--timing: the predictions also steer eviction: a resident predicted object is\n"
            "evicted only after every unpredicted one, until its call starts (prefetch rows)")
      .Option("--device-mib", "--timing: device (VRAM) tier in front of the host cache, MiB (0: none)", "0")
      .Option("--device-policy", "--timing: the device tier's policy (lru: the GPU tier's slots)", "lru")
      .Option("--h2d-gbps", "--timing: host-to-device copy bandwidth, GB/s (PCIe-4 x16), 0.001..10000", "25")
      .Option("--h2d-latency-us", "--timing: latency per host-to-device copy, 0..1e9", "10")
      .Flag("--json", "print the table as JSON");
  AddGenOptions(a, /*every_family=*/true);
  AddProgressOption(a);
  for (const char* timing : {"--compute-us", "--ssd-gbps", "--ssd-latency-us", "--queue-depth", "--prefetch-budget-mib",
                             "--staged", "--horizon", "--keep-predicted", "--device-mib", "--device-policy", "--h2d-gbps", "--h2d-latency-us"}) {
    a.Requires(timing, {"--timing"});
  }
  // Only the timed replay reads predictions, and it generates the ones it
  // replays: without --timing these changed nothing in the table.
  for (const char* predict : {"--predict", "--predict-next-token"})
    a.Requires(predict, {"--timing"}, "only the timed replay reads predictions, and it generates its own");
  RequirePredictions(a, {"--timing"});
  a.Exclusive({"--object-bytes", "--manifest"}, "the manifest gives each object's size");
  // The device tier's options describe a tier that --device-mib 0 leaves out.
  for (const char* device : {"--device-policy", "--h2d-gbps", "--h2d-latency-us"}) {
    a.RequiresValueOtherThan(device, "--device-mib", "0", "there is no device tier without one");
  }
  // The timed and the expert-parallel sweeps are tables of their own: no
  // plot, and the timed one always reports Belady with perfect prefetch.
  a.Exclusive({"--timing", "--ep-size"}, "the timed replay models one store");
  for (const char* mode : {"--timing", "--ep-size"}) {
    for (const char* plot : {"--svg", "--force"}) a.Exclusive({mode, plot}, std::string(mode) + " writes no plot");
  }
  a.Exclusive({"--timing", "--no-belady"}, "the timed table always has Belady with perfect prefetch, its reference");
  a.Exclusive({"--learner", "--trace"}, "the learning reference needs a generated trace (--family)");
  a.Exclusive({"--informed-next", "--trace"}, "the informed bound needs a generated trace (--family)");
  a.Exclusive({"--informed-next", "--no-belady"}, "it is a column beside the informed bound");
  // A sweep of --trace generates nothing: these were silently ignored, and
  // the table looked like the one of the options asked for.
  for (const char* gen : kGenOnlyOptions) {
    if (std::string(gen) != "--family")
      a.Exclusive({gen, "--trace"}, "it shapes a generated trace, and --trace reads one");
  }
  a.Exclusive({"--family", "--trace"}, "--trace reads a trace instead of generating the family");
  for (const char* mode : {"--ep-size", "--timing"}) {
    a.Exclusive({"--learner", mode}, "the learning reference is a column of the plain sweep");
    a.Exclusive({"--informed-next", mode}, "the informed bound is a column of the plain sweep");
  }
  return a;
}

// The timed replay's times (µs) and rates (GB/s) are finite numbers in
// these ranges: --ssd-gbps 1e-300 printed 300-digit stalls, and
// --compute-us 1e300 left the clock no precision after the first call.
struct TimingRange {
  double lo, hi;
  const char* text;
};
constexpr TimingRange kTimes{0, 1e9, "0..1e9 (up to 1,000 s)"};
constexpr TimingRange kRates{1e-3, 1e4, "0.001..10000 (1 MB/s to 10 TB/s)"};

Status TimingValue(const Args& a, const char* name, const TimingRange& range, double* value) {
  // A value that is no (finite) number: the parser's error names it.
  K3_ASSIGN_OR_RETURN(*value, a.GetDouble(name));
  if (*value < range.lo || *value > range.hi)
    return Error(std::string(name) + " must be in " + range.text + ", got " + a.Get(name));
  return Status::OK();
}

// Every option value of the sweep, checked before any trace is made (a bad
// one is a usage error, exit 2).
struct SweepValues {
  unsigned threads = 2;
  std::vector<std::string> policies;
  uint32_t ep_size = 0;  // 0: no --ep-size
  std::string horizon;
  std::vector<std::string> families;  // "" for --trace
  std::vector<uint64_t> given_sizes;  // --sizes, or empty for the defaults
  // --timing: the timed replay's options, and the values its header shows.
  store::TimingOptions to;
  double cu = 0, bw = 0, lat = 0, h2d = 0, h2d_lat = 0;
  uint64_t dev = 0;
};

// Reports the first bad value and returns its exit status; 0 when all are good.
int ParseSweepValues(const Args& a, SweepValues* out) {
  auto threads = a.GetInt("--threads");
  if (!threads.ok() || *threads < 1 || *threads > 256)
    return ReportError("trace sweep", Error("--threads must be an integer in 1..256, got '" + a.Get("--threads") + "'"),
                       2);
  std::vector<std::string> policies;
  for (const std::string& p : CommaFields(a.Get("--policies"))) {
    if (Status st = CheckPolicyName("--policies", p); !st.ok()) return ReportError("trace sweep", st.error(), 2);
    // The JSON is keyed by policy: a second run of one would hide the first.
    if (std::find(policies.begin(), policies.end(), p) != policies.end())
      return ReportError("trace sweep", Error("--policies names " + p + " twice, got '" + a.Get("--policies") + "'"), 2);
    policies.push_back(p);
  }
  uint32_t ep_size = 0;  // 0: no --ep-size
  if (a.Has("--ep-size")) {
    auto n = a.GetInt("--ep-size");
    if (!n.ok()) return ReportError("trace sweep", n.error(), 2);
    // 0 is refused too: it is this code's "no --ep-size", and taking it so ran
    // a plain sweep (and wrote its plot) for an explicit --ep-size 0.
    if (*n < 1) return ReportError("trace sweep", Error("--ep-size must be at least 1, got " + a.Get("--ep-size")), 2);
    if (*n > UINT32_MAX)
      return ReportError("trace sweep", Error("--ep-size must be at most " + std::to_string(UINT32_MAX) + ", got " +
                                              a.Get("--ep-size")), 2);
    ep_size = static_cast<uint32_t>(*n);
  }
  const std::string horizon = a.Get("--horizon");
  if (horizon != "layer" && horizon != "token" && horizon != "both")
    return ReportError("trace sweep", Error("--horizon must be layer, token or both, got '" + horizon + "'"), 2);
  if (horizon == "both" && !a.Has("--keep-predicted"))
    return ReportError("trace sweep", Error("--horizon both needs --keep-predicted: its next-token predictions are "
                                            "the keep hints, and without them it replays as --horizon layer"), 2);
  std::vector<std::string> families;
  if (a.Has("--trace")) families.push_back("");
  else if (a.Get("--family") == "all") families = trace::FamilyNames();
  else families.push_back(a.Get("--family"));
  const auto known = trace::FamilyNames();
  if (!a.Has("--trace") && std::find(known.begin(), known.end(), families.front()) == known.end())
    return ReportError("trace sweep", UnknownFamily(a.Get("--family"), /*every_family=*/true), 2);
  std::vector<uint64_t> given_sizes;
  if (a.Has("--sizes")) {
    auto l = ParseSizes(a.Get("--sizes"));
    if (!l.ok()) return ReportError("trace sweep", l.error(), 2);
    given_sizes = *l;
  }
  if (Status st = CheckObjectBytesOption(a); !st.ok()) return ReportError("trace sweep", st.error(), 2);
  // The timed replay's values, checked once before any trace is made.
  store::TimingOptions to;
  double cu = 0, bw = 0, lat = 0, h2d = 0, h2d_lat = 0;
  uint64_t dev = 0;
  if (a.Has("--timing")) {
    if (Status st = TimingValue(a, "--compute-us", kTimes, &cu); !st.ok()) return ReportError("trace sweep", st.error(), 2);
    if (Status st = TimingValue(a, "--ssd-gbps", kRates, &bw); !st.ok()) return ReportError("trace sweep", st.error(), 2);
    if (Status st = TimingValue(a, "--ssd-latency-us", kTimes, &lat); !st.ok())
      return ReportError("trace sweep", st.error(), 2);
    uint32_t qd = 0;
    if (Status st = QueueDepthOption(a, &qd); !st.ok()) return ReportError("trace sweep", st.error(), 2);
    auto budget = MibOptionBytes(a, "--prefetch-budget-mib", 0);
    if (!budget.ok()) return ReportError("trace sweep", budget.error(), 2);
    to.layer_compute_s = cu * 1e-6;
    to.ssd_bytes_per_s = bw * 1e9;
    to.ssd_latency_s = lat * 1e-6;
    to.queue_depth = qd;
    to.prefetch_budget_bytes = *budget;
    to.prefetch_staged = a.Has("--staged");
    to.keep_predicted = a.Has("--keep-predicted");
    if (horizon != "layer")
      to.lookahead = horizon == "token" ? store::TimingOptions::Lookahead::kNextToken
                                        : store::TimingOptions::Lookahead::kBoth;
    auto dev_r = MibOptionBytes(a, "--device-mib", 0);
    if (!dev_r.ok()) return ReportError("trace sweep", dev_r.error(), 2);
    dev = *dev_r;
    if (Status st = TimingValue(a, "--h2d-gbps", kRates, &h2d); !st.ok()) return ReportError("trace sweep", st.error(), 2);
    if (Status st = TimingValue(a, "--h2d-latency-us", kTimes, &h2d_lat); !st.ok())
      return ReportError("trace sweep", st.error(), 2);
    to.device_bytes = dev;
    to.device_policy = a.Get("--device-policy");
    if (Status st = CheckPolicyName("--device-policy", to.device_policy); !st.ok())
      return ReportError("trace sweep", st.error(), 2);
    to.h2d_bytes_per_s = h2d * 1e9;
    to.h2d_latency_s = h2d_lat * 1e-6;
  }
  *out = SweepValues{static_cast<unsigned>(*threads), std::move(policies), ep_size, horizon, std::move(families),
                     std::move(given_sizes), to, cu, bw, lat, h2d, h2d_lat, dev};
  return 0;
}

// One family's (or --trace's) trace, object space, calls and sizes, checked.
// Reports a refusal and returns its exit status; 0 when the input is made.
int MakeSweepInput(const Args& a, const SweepValues& v, const std::string& family,
                   std::unique_ptr<SweepInput>* out) {
  const uint32_t ep_size = v.ep_size;
  const std::string& horizon = v.horizon;
  auto in = std::make_unique<SweepInput>();
  in->family = family;
  trace::Trace& t = in->t;
  auto manifest = ManifestSpace(a);
  if (!manifest.ok()) return ReportError("trace sweep", manifest.error());
  if (family.empty()) {
    auto r = ReadTraceArg(a);
    if (!r.ok()) return ReportError("trace sweep", r.error());
    t = std::move(r).value();
  } else {
    trace::GenOptions o;
    o.truth = &in->truth;  // before the checks: the generator keeps every request's weights for it
    Status gs = GenOptionsFromArgs(a, family, manifest->has_value() ? &**manifest : nullptr, &o);
    if (!gs.ok()) return ReportError("trace sweep", gs.error(), 2);
    o.truth = &in->truth;
    if (a.Has("--timing")) o.predict = true;
    if (a.Has("--timing") && a.Get("--horizon") != "layer") o.predict_next_token = true;
    auto r = trace::Generate(o);
    if (!r.ok()) return ReportError("trace sweep", r.error());
    t = std::move(r).value();
    in->have_truth = true;
  }
  auto space = SpaceFor(a, std::move(manifest).value(), t);
  if (!space.ok()) return ReportError("trace sweep", space.error());
  in->space = std::move(space).value();
  for (const char* reference : {"--learner", "--informed-next"}) {
    if (!a.Has(reference) || in->space.uniform()) continue;
    return ReportError("trace sweep",
                       Error(std::string(reference) + " needs objects of one size, and the objects of " +
                             a.Get("--manifest") + " differ in size")
                           .WithHint("leave out --manifest and give the dimensions with --layers, --experts and "
                                     "--top-k"),
                       2);
  }
  auto seq = store::BuildCallSeq(t, in->space);
  if (!seq.ok())
    return ReportError("trace sweep", family.empty() ? seq.error().WithContext(a.Get("--trace")) : seq.error());
  in->seq = std::move(seq).value();
  if (ep_size != 0) {
    if (Status st = ep::CheckRank(ep::Rank{ep_size, 0}, in->space.num_experts, ep::kCliNames); !st.ok())
      return ReportError("trace sweep", st.error(), 2);
  }
  const std::string what = family.empty() ? "--trace " + a.Get("--trace") : "family " + family;
  in->sizes = v.given_sizes;
  // The least cache that serves every call: a call's distinct objects are
  // co-resident (a batched call or a prefill chunk: up to rows x top_k).
  // With --ep-size a smaller size is reported as unavailable per rank.
  const uint64_t least = store::LargestCall(in->seq);
  if (!a.Has("--sizes")) {
    std::string note;
    // With --ep-size the defaults are shares of one rank's objects.
    if (ep_size) {
      // A token routes at most a rank's experts of a layer: with fewer of
      // them than top_k, sizes from top_k up were more than a rank holds
      // (sizes --sizes refuses).
      store::ObjectSpace rank = store::RankSpace(in->space, ep_size);
      rank.top_k = std::min(rank.top_k, rank.num_experts);
      in->sizes = store::DefaultSweepSizes(rank, &note, "each EP rank");
    } else {
      in->sizes = store::DefaultSweepSizes(in->space, &note, "the model", least);
    }
    if (!note.empty()) Narrate("trace sweep", "note: " + note);
  } else {
    if (Status st = SizesFitObjects(in->sizes, in->space, ep_size, what); !st.ok())
      return ReportError("trace sweep", st.error(), 2);
    const uint64_t smallest = *std::min_element(in->sizes.begin(), in->sizes.end());
    if (ep_size == 0 && smallest < least)
      return ReportError("trace sweep",
                         Error("--sizes " + std::to_string(smallest) + " is below the largest call of " + what +
                               ": " + std::to_string(least) + " distinct objects stay co-resident while it runs")
                             .WithHint("pass --sizes of at least " + std::to_string(least) +
                                       " (a batched call or a prefill chunk needs up to rows x top_k objects)"),
                         2);
  }
  // A device tier too small for a call, as --sizes below the largest call: a
  // usage error naming the family (under --family all it was exit 1, unnamed).
  if (a.Has("--timing") && v.dev != 0) {
    const uint64_t need = store::LargestCallBytes(in->seq, in->space);
    if (v.dev < need)
      return ReportError("trace sweep",
                         Error("--device-mib " + a.Get("--device-mib") + " is below the largest call of " + what +
                               ": its " + std::to_string(need) + " bytes stay on the device while it runs")
                             .WithHint("pass --device-mib of at least " + std::to_string((need + (1u << 20) - 1) >> 20)),
                         2);
  }
  // Without next-token predictions every policy's prefetch row would
  // silently equal demand-only.
  if (a.Has("--timing") && horizon != "layer" &&
      std::none_of(t.records.begin(), t.records.end(), [](const auto& r) { return r.has_token_predictions; }))
    return ReportError("trace sweep", Error(a.Get("--trace") + ": the trace has no next-token predictions, "
                                            "which --horizon " + horizon + " replays")
                                          .WithHint("write it with `k3pack trace gen --predict-next-token`, or from a model with "
                                                    "`k3pack run-experts M --all-layers --trace-out T --predict-next-token`"));
  *out = std::move(in);
  return 0;
}

// The timed replay of one input: stall time, bytes and prefetch per token.
int SweepTimed(const SweepValues& v, const SweepInput& in, ProgressMode mode, json* out, std::string* text_out) {
  const std::string& family = in.family;
  const trace::Trace& t = in.t;
  const store::ObjectSpace& space = in.space;
  const store::CallSeq& seq = in.seq;
  const store::TimingOptions& to = v.to;
  const std::string& horizon = v.horizon;
  std::string& text = *text_out;
  auto progress = StartProgress(mode);
  auto rows = store::TimedSweep(t, seq, space, v.policies, in.sizes, to, v.threads, progress->Fn());
  progress->Finish();
  if (!rows.ok()) return ReportError("trace sweep", rows.error());
  json j = json::array();
  for (const auto& row : *rows) {
    const auto& r = row.result;
    j.push_back({{"capacity_objects", row.capacity_objects}, {"policy", r.policy}, {"prefetch", r.prefetch},
                 {"staged", r.staged}, {"keep_predicted", r.keep_predicted},
                 {"stall_per_token_s", r.stall_per_token_s()}, {"bytes_per_token", r.bytes_per_token()},
                 {"stall_free_fraction", r.stall_free_fraction()}, {"late_prefetches", r.late_prefetches},
                 {"prefetch_useful_bytes", r.prefetch_useful_bytes},
                 {"prefetch_wasted_bytes", r.prefetch_wasted_bytes}, {"tokens", r.tokens},
                 // The exact counts behind the ratios, as the untimed sweep gives them.
                 {"hits", r.hits}, {"accesses", r.accesses}, {"bytes_read", r.bytes_read},
                 {"prefetch_bytes", r.prefetch_bytes}, {"stall_s", r.stall_s}});
    if (to.device_bytes) {
      j.back()["device_policy"] = r.device_policy;
      j.back()["host_hits"] = r.host_hits;
      j.back()["bytes_copied_per_token"] = r.copied_per_token();
      j.back()["prefetch_copied_bytes"] = r.prefetch_copied_bytes;
    }
  }
  json fj = {{"timing", j}, {"tokens", seq.tokens}, {"horizon", horizon}, {"keep_predicted", to.keep_predicted}};
  if (to.device_bytes)
    fj["device"] = {{"bytes", to.device_bytes}, {"policy", to.device_policy},
                    {"h2d_bytes_per_s", to.h2d_bytes_per_s}, {"h2d_latency_s", to.h2d_latency_s}};
  // --horizon token refuses a trace without its predictions; the layer
  // horizon replays one, but its prefetch rows are then demand-only.
  const std::string unpredicted = NoNextLayerPredictionsNote(t, horizon);
  if (!unpredicted.empty()) fj["note"] = unpredicted;
  *out = std::move(fj);
  char head[256];
  std::snprintf(head, sizeof head,
                "%s%stimed replay: %.0f us/layer, SSD %.1f GB/s, %.0f us, queue depth %u, %llu tokens, "
                "prefetch horizon: next %s\n",
                family.c_str(), family.empty() ? "" : ": ", v.cu, v.bw, v.lat, to.queue_depth,
                (unsigned long long)seq.tokens,
                horizon == "both" ? "layer (reads), next token (keep hints)" : horizon.c_str());
  text += head;
  if (!unpredicted.empty()) text += "note: " + unpredicted + "\n";
  if (to.keep_predicted) text += "predictions steer eviction: keep rows read nothing ahead; prefetch rows keep too\n";
  if (to.device_bytes) {
    std::snprintf(head, sizeof head, "device tier: %llu MiB = %llu objects (%.2f%%), %s, H2D %.1f GB/s, %.0f us\n",
                  (unsigned long long)(v.dev >> 20), (unsigned long long)(to.device_bytes / space.max_object_bytes()),
                  100.0 * double(to.device_bytes / space.max_object_bytes()) / double(space.num_objects()),
                  to.device_policy.c_str(), v.h2d, v.h2d_lat);
    text += head;
  }
  text += store::TimedText(*rows, space.num_objects());
  return 0;
}

// The expert-parallel sweep of one input: each rank's cache over its routes.
int SweepEp(const SweepValues& v, const SweepInput& in, bool bounds, ProgressMode mode, json* out, std::string* text) {
  auto progress = StartProgress(mode);
  auto table = store::EpSweep(in.seq, in.space, v.policies, in.sizes, v.ep_size, bounds, v.threads, progress->Fn());
  progress->Finish();
  if (!table.ok()) return ReportError("trace sweep", table.error());
  *out = store::EpSweepJson(*table);
  *text += (in.family.empty() ? std::string() : in.family + ": ") + store::EpSweepText(*table);
  return 0;
}

// The plain sweep of one input: hit rate of every policy and the bounds per
// size; its plot is kept in `plots` (written once every input has run).
int SweepHitRates(const Args& a, const SweepValues& v, const SweepInput& in, const std::string& svg, ProgressMode mode,
                  json* out, std::string* text, std::vector<std::pair<std::string, std::string>>* plots) {
  const trace::Trace& t = in.t;
  auto progress = StartProgress(mode);
  auto table = store::Sweep(in.seq, in.space, v.policies, in.sizes, !a.Has("--no-belady"), &t,
                            in.have_truth ? &in.truth : nullptr, v.threads, progress->Fn(),
                            store::SweepReferences{.learner = a.Has("--learner"),
                                                   .informed_next = a.Has("--informed-next")});
  progress->Finish();
  if (!table.ok()) return ReportError("trace sweep", table.error());
  const std::string title = (in.family.empty() ? std::string() : in.family + ": ") + "hit rate vs cache size, " +
                            std::to_string(t.layer_ids.size()) + " layers x top-" + std::to_string(t.top_k) + " of " +
                            std::to_string(t.num_experts) + ", " + std::to_string(in.seq.tokens) + " tokens";
  plots->emplace_back(svg, store::SweepSvg(*table, title));
  json j = store::SweepJson(*table);
  j["svg"] = svg;
  j["tokens"] = in.seq.tokens;
  j["measured_reuse"] = ReuseJson(trace::MeasuredReuse(t));
  *out = std::move(j);
  *text += title + "\n" + store::SweepText(*table) + "plot: " + svg + "\n";
  return 0;
}

}  // namespace

int RunTraceSweep(const std::vector<std::string>& argv) {
  Args a = SweepArgs();
  int code = 0;
  if (!a.Parse(argv, &code)) return code;
  ManifestInDirectory(a, "trace sweep");
  auto mode = ProgressModeOf(a);
  if (!mode.ok()) return ReportError("trace sweep", mode.error(), 2);
  SweepValues v;
  if (int failed = ParseSweepValues(a, &v)) return failed;
  const std::vector<std::string>& families = v.families;
  const uint32_t ep_size = v.ep_size;
  // Every plot path is checked before the first simulation, and the plots
  // are written only once every family has run: a refusal or a failure
  // leaves none of this run's plots behind.
  const bool plots = ep_size == 0 && !a.Has("--timing");
  auto plot_path = [&](const std::string& family) {
    return families.size() > 1 ? PerFamilyPath(a.Get("--svg"), family) : a.Get("--svg");
  };
  if (plots) {
    if (Status st = CheckPlotIsAFile(a.Get("--svg")); !st.ok()) return ReportError("trace sweep", st.error());
    for (const std::string& family : families)
      if (Status st = CheckPlotPath(a, plot_path(family)); !st.ok()) return ReportError("trace sweep", st.error());
  }
  // Every family's trace is made and checked (its sizes included) before
  // the first simulation: a refusal at the fourth family used to come after
  // three families' simulations.
  std::vector<std::unique_ptr<SweepInput>> inputs(families.size());
  for (size_t i = 0; i < families.size(); ++i) {
    if (int failed = MakeSweepInput(a, v, families[i], &inputs[i])) return failed;
  }
  std::vector<std::pair<std::string, std::string>> plot_files;  // path, SVG
  json all = json::object();
  std::string text;
  for (const auto& in : inputs) {
    json j;
    int failed = a.Has("--timing") ? SweepTimed(v, *in, *mode, &j, &text)
                 : ep_size != 0    ? SweepEp(v, *in, !a.Has("--no-belady"), *mode, &j, &text)
                                   : SweepHitRates(a, v, *in, plot_path(in->family), *mode, &j, &text, &plot_files);
    if (failed) return failed;
    if (families.size() > 1) all[in->family] = std::move(j);
    else all = std::move(j);
  }
  for (const auto& [path, svg] : plot_files) {
    if (Status st = WritePlot(path, svg); !st.ok()) return ReportError("trace sweep", st.error());
  }
  if (a.Has("--json")) {
    PrintJson((families.size() > 1 ? json{{"families", all}} : all));
  } else {
    std::cout << text;
  }
  return 0;
}

}  // namespace k3pack::cli
