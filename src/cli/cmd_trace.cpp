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

// A name `flag` gives must be a cache policy: a usage error up front (exit 2),
// not a failure after the trace has been read.
Status CheckPolicyName(const std::string& flag, const std::string& name) {
  const auto known = store::PolicyNames();
  if (std::find(known.begin(), known.end(), name) != known.end()) return Status::OK();
  std::string list;
  for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
  return Error(flag + ": unknown cache policy '" + name + "' (known: " + list + ")");
}

// Every field of a comma-separated value, empty ones included: getline drops a
// trailing empty field, so "lru," read as "lru" and a typo passed unnoticed.
std::vector<std::string> CommaFields(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t comma; (comma = s.find(',', start)) != std::string::npos; start = comma + 1)
    out.push_back(s.substr(start, comma - start));
  out.push_back(s.substr(start));
  return out;
}

Result<std::vector<uint64_t>> ParseList(const std::string& s, const std::string& what) {
  std::vector<uint64_t> out;
  for (const std::string& item : CommaFields(s)) {
    // Digits only: stoull took "-1" as 2^64-1 (a 57646075230342348800% cache
    // share), and " 8" or "+8" as 8.
    uint64_t v = 0;
    auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || p != item.data() + item.size())
      return Error(what + " must be a comma-separated list of non-negative integers, got '" + s + "'");
    out.push_back(v);
  }
  if (std::find(out.begin(), out.end(), 0) != out.end()) return Error(what + " values must be at least 1, got '" + s + "'");
  return out;
}

// A trace without records is a valid file but no measurement: its table
// would read 0% for every policy and Belady alike.
Status HasRecords(const std::string& path, const trace::Trace& t) {
  if (!t.records.empty()) return Status::OK();
  return Error(path + ": the trace has no records (no acquire call to replay)");
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
  if (a.version() != b.version() || a.num_experts != b.num_experts || a.top_k != b.top_k ||
      a.layer_ids != b.layer_ids || a.ids != b.ids || a.records.size() != b.records.size())
    return false;
  for (size_t i = 0; i < a.records.size(); ++i) {
    const trace::Record &x = a.records[i], &y = b.records[i];
    if (x.layer != y.layer || x.rows != y.rows || x.request != y.request || x.is_prefill != y.is_prefill ||
        x.offset != y.offset || x.has_row_requests != y.has_row_requests ||
        x.has_predictions != y.has_predictions || x.has_token_predictions != y.has_token_predictions)
      return false;
  }
  // The v2 fields too: predictions can change while the routes stay the same.
  return a.predict_k == b.predict_k && a.row_requests == b.row_requests && a.predictions == b.predictions &&
         a.token_predictions == b.token_predictions;
}

// An SVG written by an earlier `trace sweep` (its title line is ours).
bool IsOurPlot(const std::string& path) {
  auto text = ReadFileToString(path);
  return text.ok() && text->rfind("<svg", 0) == 0 && text->find("hit rate vs cache size") != std::string::npos;
}

// An output of a trace command is never one of its inputs (--manifest, or
// the --trace a sweep reads), not even with --force.
Status NotAnInput(const Args& a, const std::string& option, const std::string& path,
                  std::initializer_list<const char*> input_options) {
  std::vector<NamedPath> inputs;
  for (const char* in : input_options) {
    if (a.Has(in) && !a.Get(in).empty()) inputs.push_back({in, a.Get(in)});
  }
  return CheckOutputsAreNotInputs({{option, path}}, inputs);
}

// The overwrite rule for a plot: it is regenerated from the table; an
// existing file is replaced only when it is one of ours (an earlier sweep's
// plot) or with --force, never a user's file. Checked for every plot before
// the sweep runs, so a refusal leaves no plot of the run written.
Status CheckPlotPath(const Args& a, const std::string& path) {
  K3_RETURN_IF_ERROR(NotAnInput(a, "--svg", path, {"--trace", "--manifest"}));
  return CheckRegeneratedOutput(a, "--svg", path, "it is not a plot written by `k3pack trace sweep`", IsOurPlot);
}

// An existing file is kept when it already holds these bytes.
Status WritePlot(const std::string& path, const std::string& svg) {
  auto old = ReadFileToString(path);
  if (old.ok() && *old == svg) return Status::OK();
  return WriteFileAtomic(path, svg);
}

// A stats JSON written by an earlier k3pack store (the snapshot's own keys).
bool IsOurStats(const std::string& path) {
  auto text = ReadFileToString(path);
  if (!text.ok()) return false;
  json j = json::parse(*text, nullptr, false);
  return j.is_object() && j.contains("cache_policy") && j.contains("k3pack") && j["k3pack"].is_object() &&
         j["k3pack"].contains("effective_capacity_experts");
}

// The overwrite rule for `trace replay --stats`: the stats of a run are
// never "already built"; an existing file is replaced only when an earlier
// k3pack run wrote it, or with --force; an input is never replaced.
Status CheckStatsPath(const Args& a, const std::string& path) {
  K3_RETURN_IF_ERROR(
      CheckRegeneratedOutput(a, "--stats", path, "it is not a stats file written by a k3pack store", IsOurStats));
  // What --force may replace is the store's rule: a stats file only.
  return store::CheckStatsFile(path, "--stats");
}

// An integer option within [lo, hi] (a usage error naming the option and
// its range otherwise: a cast to uint32_t wrapped 4294967297 to 1).
Status IntInRange(const Args& a, const std::string& name, int64_t lo, int64_t hi, int64_t* dst) {
  K3_ASSIGN_OR_RETURN(int64_t v, a.GetInt(name));
  if (v < lo || v > hi)
    return Error(name + " must be an integer in " + std::to_string(lo) + ".." + std::to_string(hi) + ", got " +
                 a.Get(name));
  *dst = v;
  return Status::OK();
}

Status U32InRange(const Args& a, const std::string& name, uint32_t lo, uint32_t* dst) {
  int64_t v = 0;
  K3_RETURN_IF_ERROR(IntInRange(a, name, lo, UINT32_MAX, &v));
  *dst = static_cast<uint32_t>(v);
  return Status::OK();
}

// The largest object `--object-bytes` may give (64 GiB; K3's is 11,956,224
// bytes): 0 made every policy beat Belady (no byte is ever read) and -1
// wrapped to 2^64-1. With at most trace::kMaxObjects objects a cache of
// every object stays far below 2^64 bytes.
constexpr int64_t kMaxObjectBytes = int64_t{1} << 36;
// The most reads `--queue-depth` may keep in flight: the pread backend runs
// a thread per read (2147483647 started 32k threads before failing), and
// SGLang's drop-in store uses 64.
constexpr int64_t kMaxQueueDepth = 1024;

Status CheckObjectBytesOption(const Args& a) {
  if (a.Has("--manifest")) return Status::OK();  // the manifest's sizes (the option is refused or unused)
  int64_t v = 0;
  return IntInRange(a, "--object-bytes", 1, kMaxObjectBytes, &v);
}

Status QueueDepthOption(const Args& a, uint32_t* depth) {
  int64_t v = 0;
  K3_RETURN_IF_ERROR(IntInRange(a, "--queue-depth", 1, kMaxQueueDepth, &v));
  *depth = static_cast<uint32_t>(v);
  return Status::OK();
}

// --sizes: at least 1, each once (the JSON and the table are keyed by size,
// as by policy), and no more than any trace's objects (a size times the
// object bytes wrapped past 2^64 into a "cannot evict" error).
Result<std::vector<uint64_t>> ParseSizes(const std::string& s) {
  K3_ASSIGN_OR_RETURN(std::vector<uint64_t> sizes, ParseList(s, "--sizes"));
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] > trace::kMaxObjects)
      return Error("--sizes " + std::to_string(sizes[i]) + " is more than any trace's objects (at most " +
                   std::to_string(trace::kMaxObjects) + " = 2^24), got '" + s + "'");
    if (std::find(sizes.begin(), sizes.begin() + i, sizes[i]) != sizes.begin() + i)
      return Error("--sizes names " + std::to_string(sizes[i]) + " twice, got '" + s + "'");
  }
  return sizes;
}

// A cache of more objects than the trace has holds every one: its row would
// be a share above 100% (4e12% for a huge size), not a measurement.
Status SizesFitObjects(const std::vector<uint64_t>& sizes, const store::ObjectSpace& space, uint32_t ep_size,
                       const std::string& what) {
  const uint64_t objects = ep_size ? space.num_objects() / ep_size : space.num_objects();
  const uint64_t largest = *std::max_element(sizes.begin(), sizes.end());
  if (largest <= objects) return Status::OK();
  return Error("--sizes " + std::to_string(largest) + " is more than the " + std::to_string(objects) + " objects " +
               (ep_size ? "of each EP rank of " : "of ") + what + " (" +
               std::to_string(space.num_active_layers()) + " layers x " + std::to_string(space.num_experts) +
               " experts" + (ep_size ? " / " + std::to_string(ep_size) + " ranks" : std::string()) +
               "): such a cache holds every object")
      .WithHint("pass --sizes of at most " + std::to_string(objects));
}

// The timed table's prefetch rows at the next-layer horizon replay the
// trace's next-layer predictions: without any they equal the demand rows.
std::string NoNextLayerPredictionsNote(const trace::Trace& t, const std::string& horizon) {
  if (horizon == "token") return "";
  if (std::any_of(t.records.begin(), t.records.end(), [](const auto& r) { return r.has_predictions; })) return "";
  return "the trace has no next-layer predictions: the prefetch rows read nothing ahead and equal the demand "
         "rows (write it with `k3pack trace gen --predict`)";
}

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

// Generator options shared by `trace gen` and `trace sweep`.
void AddGenOptions(Args& a) {
  std::string families;
  for (const auto& f : trace::FamilyNames()) families += (families.empty() ? "" : " | ") + f;
  a.Option("--family", "preset: " + families + " (docs/store.md); the options below override it", "kimi")
      .Option("--manifest", "take layers / experts / top_k from this adapter manifest (or the directory holding it "
                            "under SGLang's name)")
      .Option("--layers", "routed layers (numbered from --first-layer)", "92")
      .Option("--first-layer", "first routed layer id", "1")
      .Option("--experts", "experts per layer", "896")
      .Option("--top-k", "experts per token", "16")
      .Option("--requests", "requests in all")
      .Option("--concurrent", "requests decoded side by side (a new one starts when one finishes)")
      .Flag("--batched", "one call per layer per decode step, a row per active request (row requests recorded)")
      .Option("--domains", "requests share the popularity of domain request % N (0: each its own)")
      .Option("--prompt-tokens", "prompt tokens per request")
      .Option("--decode-tokens", "decoded tokens per request")
      .Option("--prefill-chunk", "rows per prefill record (0: one record per prompt token, SGLang's Kimi path)")
      .Option("--reuse", "chance an expert of the previous token is routed again")
      .Option("--skew", "global Zipf exponent of expert popularity per layer")
      .Option("--request-skew", "per-request (or per-domain) Zipf exponent")
      .Option("--drift", "per token and layer, this share of experts trade popularity")
      .Flag("--predict", "record predicted next-layer expert ids (trace format v2)")
      .Option("--predict-accuracy", "mean share of next-layer experts predicted right", "0.95")
      .Option("--predict-surprise", "share of rows whose predictions all miss (correlated misses)", "0")
      .Flag("--predict-next-token", "record predicted ids of the same layer for each row's next token (format v2;\n"
                                    "same accuracy model, its own random stream: routes unchanged)")
      .Option("--seed", "random seed", "1");
}

// The generator's prediction knobs mean nothing unless predictions are
// written: `by` are the options that ask for them.
void RequirePredictions(Args& a, const std::vector<std::string>& by) {
  a.Requires("--predict-accuracy", by).Requires("--predict-surprise", by);
}

// --manifest gives the dimensions: an explicit one that disagrees with it
// was silently replaced by the manifest's (a usage error now, naming both).
Status ManifestAgrees(const Args& a, const store::ObjectSpace& s) {
  const std::string m = a.Get("--manifest");
  const uint64_t first = s.active_layer_ids.empty() ? 0 : s.active_layer_ids.front();
  for (auto [name, value] : {std::pair<const char*, uint64_t>{"--layers", s.active_layer_ids.size()},
                             {"--first-layer", first},
                             {"--experts", s.num_experts},
                             {"--top-k", s.top_k}}) {
    if (!a.Has(name) || a.Get(name) == std::to_string(value)) continue;
    return Error(std::string(name) + " " + a.Get(name) + " disagrees with --manifest " + m + ", which gives " +
                 std::to_string(value))
        .WithHint("leave out " + std::string(name) + " (--manifest gives the layers, experts and top_k), or "
                  "--manifest (to give the dimensions yourself)");
  }
  return Status::OK();
}

Status CheckDims(const trace::GenOptions& o) {
  if (o.top_k == 0 || o.top_k > o.num_experts || o.num_experts > 65536)
    return Error("--top-k must be in 1..--experts and --experts at most 65536, got --top-k " +
                 std::to_string(o.top_k) + " --experts " + std::to_string(o.num_experts));
  return Status::OK();
}

// The reader's limit on objects (trace::kMaxObjects): a trace the reader
// would refuse is not written.
Status CheckObjects(uint64_t layers, uint32_t experts) {
  if (layers * experts <= trace::kMaxObjects) return Status::OK();
  return Error("--layers " + std::to_string(layers) + " x --experts " + std::to_string(experts) + " = " +
               std::to_string(layers * experts) + " objects, more than a trace may declare (" +
               std::to_string(trace::kMaxObjects) + " = 2^24; docs/FORMATS.md): at most " +
               std::to_string(trace::kMaxObjects / experts) + " layers of " + std::to_string(experts) + " experts");
}

// The generator's size bounds (trace::Generate refuses them too), named by
// the options that set them, before anything is allocated.
Status CheckGenSizes(const trace::GenOptions& o) {
  const uint64_t layers = o.layer_ids.size(), objects = layers * o.num_experts;
  K3_RETURN_IF_ERROR(CheckObjects(layers, o.num_experts));
  if (trace::GeneratedRoutes(o) > trace::kMaxGeneratedRoutes)
    return Error("--requests " + std::to_string(o.requests) + " x (--prompt-tokens " +
                 std::to_string(o.prompt_tokens) + " + --decode-tokens " + std::to_string(o.decode_tokens) + ") x " +
                 std::to_string(layers) + " layers x top-" + std::to_string(o.top_k) + " is more than the " +
                 std::to_string(trace::kMaxGeneratedRoutes) + " routes (2^30) a generated trace may hold");
  if (trace::GeneratorWeights(o) > trace::kMaxGeneratorWeights)
    return Error("--domains " + std::to_string(o.domains) + " and --concurrent " + std::to_string(o.concurrent) +
                 " with " + std::to_string(o.requests) + " requests keep more than the generator's " +
                 std::to_string(trace::kMaxGeneratorWeights) + " (2^27) popularity weights of " +
                 std::to_string(objects) + " objects each (a domain's, or a request's, weights per object)");
  return Status::OK();
}

Status GenOptionsFromArgs(const Args& a, const std::string& family, trace::GenOptions* o) {
  uint32_t layers = 0, first = 0;
  int64_t seed = 0;
  // No layers would leave the generator its default (92 of them).
  K3_RETURN_IF_ERROR(U32InRange(a, "--layers", 1, &layers));
  K3_RETURN_IF_ERROR(U32InRange(a, "--first-layer", 0, &first));
  if (uint64_t{first} + layers - 1 > UINT32_MAX)
    return Error("--first-layer " + a.Get("--first-layer") + " with --layers " + a.Get("--layers") +
                 " numbers layers beyond 4294967295, the largest layer id: --first-layer must be at most " +
                 std::to_string(uint64_t{UINT32_MAX} - layers + 1));
  K3_RETURN_IF_ERROR(U32InRange(a, "--experts", 0, &o->num_experts));
  K3_RETURN_IF_ERROR(U32InRange(a, "--top-k", 0, &o->top_k));
  // Any seed a 64-bit integer holds (a cast to uint32_t refused 99999999999).
  K3_RETURN_IF_ERROR(IntInRange(a, "--seed", 0, INT64_MAX, &seed));
  o->seed = static_cast<uint64_t>(seed);
  o->layer_ids.clear();
  if (a.Has("--manifest")) {
    K3_RETURN_IF_ERROR(CheckInputExists("--manifest", a.Get("--manifest"), ".manifest.json"));
    K3_ASSIGN_OR_RETURN(store::ObjectSpace s, store::SpaceFromManifest(a.Get("--manifest")));
    K3_RETURN_IF_ERROR(ManifestAgrees(a, s));
    o->layer_ids = s.active_layer_ids;
    o->num_experts = s.num_experts;
    o->top_k = s.top_k;
  } else {
    // Checked before the layer list is made (--layers 4294967295 allocated it).
    K3_RETURN_IF_ERROR(CheckDims(*o));
    K3_RETURN_IF_ERROR(CheckObjects(layers, o->num_experts));
    for (uint32_t l = 0; l < layers; ++l) o->layer_ids.push_back(first + l);
  }
  o->predict = a.Has("--predict");
  o->predict_next_token = a.Has("--predict-next-token");
  K3_ASSIGN_OR_RETURN(o->predict_accuracy, a.GetDouble("--predict-accuracy"));
  K3_ASSIGN_OR_RETURN(o->predict_surprise, a.GetDouble("--predict-surprise"));
  if (!trace::ApplyFamily(family, o)) {
    std::string known;
    for (const auto& f : trace::FamilyNames()) known += (known.empty() ? "" : ", ") + f;
    return Error("unknown trace family '" + family + "' (known: " + known + ")", ErrorKind::kValue);
  }
  // At least 1 request and 1 concurrent: --concurrent 0 silently ran as 1.
  for (auto [name, lo, dst] : {std::tuple{"--requests", 1u, &o->requests}, {"--concurrent", 1u, &o->concurrent},
                               {"--domains", 0u, &o->domains}, {"--prompt-tokens", 0u, &o->prompt_tokens},
                               {"--decode-tokens", 0u, &o->decode_tokens}, {"--prefill-chunk", 0u, &o->prefill_chunk}})
    if (a.Has(name)) K3_RETURN_IF_ERROR(U32InRange(a, name, lo, dst));
  if (a.Has("--batched")) o->batched = true;
  for (auto [name, dst] : {std::pair{"--reuse", &o->reuse}, {"--skew", &o->skew},
                           {"--request-skew", &o->request_skew}, {"--drift", &o->drift}})
    if (a.Has(name)) {
      K3_ASSIGN_OR_RETURN(*dst, a.GetDouble(name));
    }
  // The generator's own rules, checked here to name the option (a usage
  // error); a --family preset only sets values within them.
  auto within = [&](const char* name, double v, bool open_top = false) -> Status {
    if (v >= 0 && (open_top ? v < 1 : v <= 1)) return Status::OK();
    return Error(std::string(name) + " must be within [0, 1" + (open_top ? ")" : "]") + ", got " + a.Get(name));
  };
  K3_RETURN_IF_ERROR(within("--reuse", o->reuse));
  K3_RETURN_IF_ERROR(within("--drift", o->drift));
  K3_RETURN_IF_ERROR(within("--predict-accuracy", o->predict_accuracy));
  K3_RETURN_IF_ERROR(within("--predict-surprise", o->predict_surprise, true));
  // A negative exponent used to read as a flat popularity (0).
  for (auto [name, v] : {std::pair{"--skew", o->skew}, {"--request-skew", o->request_skew}})
    if (v < 0) return Error(std::string(name) + " must be at least 0 (0: flat popularity), got " + a.Get(name));
  K3_RETURN_IF_ERROR(CheckDims(*o));
  if (uint64_t{o->prompt_tokens} + o->decode_tokens == 0)
    return Error("--prompt-tokens and --decode-tokens are both 0: no tokens to generate");
  return CheckGenSizes(*o);
}

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
      .Flag("--force", "replace an existing --stats file that is not a k3pack stats file")
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
    auto progress = StartProgress(*mode, "trace replay");
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
  return Error("--svg " + path + " is a directory; it names the plot file")
      .WithHint("give a file path, such as " + (path.empty() || path.back() == '/' ? path : path + "/") +
                "trace-sweep.svg (with --family all: one plot per family beside it, named PATH-FAMILY.svg)");
}

int RunSweep(const std::vector<std::string>& argv) {
  Args a("trace sweep", "[--trace T | --family F|all] [options]",
         "Simulates every policy, Belady's optimum and (for generated traces) the distribution-informed bound over\n"
         "a range of cache sizes, prints a table and writes an SVG plot of hit rate vs cache size. Without --trace\n"
         "the --family preset is generated (seed --seed); --family all sweeps every family.");
  a.Option("--trace", "trace file (default: generate --family)")
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
      .Flag("--force", "replace an existing --svg file that is not a k3pack plot")
      .Option("--threads", "simulation threads", "2")
      .Option("--ep-size", "expert-parallel ranks: each rank replays only the routes to its experts with its own "
              "cache; --sizes are per rank (no plot, no informed bound)")
      .Flag("--timing", "timed replay instead: stall time, bytes and prefetch per token (generated traces get predictions)")
      .Option("--compute-us", "--timing: compute time of one routed layer per decode call (prefill: per row)", "350")
      .Option("--ssd-gbps", "--timing: SSD read bandwidth, GB/s", "7")
      .Option("--ssd-latency-us", "--timing: SSD latency per read", "80")
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
      .Option("--h2d-gbps", "--timing: host-to-device copy bandwidth, GB/s (PCIe-4 x16)", "25")
      .Option("--h2d-latency-us", "--timing: latency per host-to-device copy", "10")
      .Flag("--json", "print the table as JSON");
  AddGenOptions(a);
  AddProgressOption(a);
  for (const char* timing : {"--compute-us", "--ssd-gbps", "--ssd-latency-us", "--queue-depth", "--prefetch-budget-mib",
                             "--staged", "--horizon", "--keep-predicted", "--device-mib", "--device-policy", "--h2d-gbps", "--h2d-latency-us"}) {
    a.Requires(timing, {"--timing"});
  }
  // --timing generates the predictions it replays.
  RequirePredictions(a, {"--predict", "--predict-next-token", "--timing"});
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
  a.Exclusive({"--timing", "--no-belady"}, "the timed table's optimum is Belady with perfect prefetch");
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
  int code = 0;
  if (!a.Parse(argv, &code)) return code;
  ManifestInDirectory(a, "trace sweep");
  auto mode = ProgressModeOf(a);
  if (!mode.ok()) return ReportError("trace sweep", mode.error(), 2);
  auto threads = a.GetInt("--threads");
  if (!threads.ok() || *threads < 1 || *threads > 256)
    return ReportError("trace sweep", Error("--threads must be an integer in 1..256"), 2);
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
    auto cu_r = a.GetDouble("--compute-us"), bw_r = a.GetDouble("--ssd-gbps"), lat_r = a.GetDouble("--ssd-latency-us");
    // A value that is no (finite) number: the parser's error names it.
    for (const Status& st : {cu_r.status(), bw_r.status(), lat_r.status()})
      if (!st.ok()) return ReportError("trace sweep", st.error(), 2);
    cu = *cu_r, bw = *bw_r, lat = *lat_r;
    if (cu < 0 || bw <= 0 || lat < 0)
      return ReportError("trace sweep",
                         Error("--compute-us and --ssd-latency-us must be non-negative numbers, --ssd-gbps "
                               "positive"), 2);
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
    auto h2d_r = a.GetDouble("--h2d-gbps"), h2d_lat_r = a.GetDouble("--h2d-latency-us");
    for (const Status& st : {h2d_r.status(), h2d_lat_r.status()})
      if (!st.ok()) return ReportError("trace sweep", st.error(), 2);
    h2d = *h2d_r, h2d_lat = *h2d_lat_r;
    if (h2d <= 0 || h2d_lat < 0)
      return ReportError("trace sweep", Error("--h2d-latency-us must be a non-negative number, --h2d-gbps positive"),
                         2);
    to.device_bytes = dev;
    to.device_policy = a.Get("--device-policy");
    if (Status st = CheckPolicyName("--device-policy", to.device_policy); !st.ok())
      return ReportError("trace sweep", st.error(), 2);
    to.h2d_bytes_per_s = h2d * 1e9;
    to.h2d_latency_s = h2d_lat * 1e-6;
  }
  // Every plot path is checked before the first simulation, and the plots
  // are written only once every family has run: a refusal or a failure
  // leaves none of this run's plots behind.
  const bool plots = ep_size == 0 && !a.Has("--timing");
  auto plot_path = [&](const std::string& family) {
    return families.size() > 1 ? PerFamilyPath(a.Get("--svg"), family) : a.Get("--svg");
  };
  if (plots) {
    if (Status st = CheckPlotIsAFile(a.Get("--svg")); !st.ok()) return ReportError("trace sweep", st.error(), 2);
    for (const std::string& family : families)
      if (Status st = CheckPlotPath(a, plot_path(family)); !st.ok()) return ReportError("trace sweep", st.error());
  }
  // Every family's trace is made and checked (its sizes included) before
  // the first simulation: a refusal at the fourth family used to come after
  // three families' simulations.
  std::vector<std::unique_ptr<SweepInput>> inputs;
  for (const std::string& family : families) {
    auto in = std::make_unique<SweepInput>();
    in->family = family;
    trace::Trace& t = in->t;
    if (family.empty()) {
      auto r = trace::ReadTrace(a.Get("--trace"));
      if (!r.ok()) return ReportError("trace sweep", r.error());
      t = std::move(r).value();
      if (Status st = HasRecords(a.Get("--trace"), t); !st.ok()) return ReportError("trace sweep", st.error());
    } else {
      trace::GenOptions o;
      o.truth = &in->truth;  // before the checks: the generator keeps every request's weights for it
      Status gs = GenOptionsFromArgs(a, family, &o);
      if (!gs.ok()) return ReportError("trace sweep", gs.error(), 2);
      o.truth = &in->truth;
      if (a.Has("--timing")) o.predict = true;
      if (a.Has("--timing") && a.Get("--horizon") != "layer") o.predict_next_token = true;
      auto r = trace::Generate(o);
      if (!r.ok()) return ReportError("trace sweep", r.error());
      t = std::move(r).value();
      in->have_truth = true;
    }
    auto space = SpaceFor(a, t);
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
    in->sizes = given_sizes;
    // The least cache that serves every call: a call's distinct objects are
    // co-resident (a batched call or a prefill chunk: up to rows x top_k).
    // With --ep-size a smaller size is reported as unavailable per rank.
    const uint64_t least = store::LargestCall(in->seq);
    if (!a.Has("--sizes")) {
      std::string note;
      // With --ep-size the defaults are shares of one rank's objects.
      in->sizes = ep_size ? store::DefaultSweepSizes(store::RankSpace(in->space, ep_size), &note, "each EP rank")
                          : store::DefaultSweepSizes(in->space, &note, "the model", least);
      if (!note.empty()) std::cerr << "k3pack trace sweep: note: " << note << "\n";
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
    // Without next-token predictions every policy's prefetch row would
    // silently equal demand-only.
    if (a.Has("--timing") && horizon != "layer" &&
        std::none_of(t.records.begin(), t.records.end(), [](const auto& r) { return r.has_token_predictions; }))
      return ReportError("trace sweep", Error(a.Get("--trace") + ": the trace has no next-token predictions, "
                                              "which --horizon " + horizon + " replays")
                                            .WithHint("write it with `k3pack trace gen --predict-next-token`"));
    inputs.push_back(std::move(in));
  }
  std::vector<std::pair<std::string, std::string>> plot_files;  // path, SVG
  json all = json::object();
  std::string text;
  for (const auto& in : inputs) {
    const std::string& family = in->family;
    const trace::Trace& t = in->t;
    const store::ObjectSpace& space = in->space;
    const store::CallSeq& seq = in->seq;
    const std::vector<uint64_t>& sizes = in->sizes;
    if (a.Has("--timing")) {
      auto progress = StartProgress(*mode, "trace sweep");
      auto rows =
          store::TimedSweep(t, seq, space, policies, sizes, to, static_cast<unsigned>(*threads), progress->Fn());
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
      if (families.size() > 1) all[family] = fj;
      else all = fj;
      char head[256];
      std::snprintf(head, sizeof head,
                    "%s%stimed replay: %.0f us/layer, SSD %.1f GB/s, %.0f us, queue depth %u, %llu tokens, "
                    "prefetch horizon: next %s\n",
                    family.c_str(), family.empty() ? "" : ": ", cu, bw, lat, to.queue_depth,
                    (unsigned long long)seq.tokens,
                    horizon == "both" ? "layer (reads), next token (keep hints)" : horizon.c_str());
      text += head;
      if (!unpredicted.empty()) text += "note: " + unpredicted + "\n";
      if (to.keep_predicted) text += "predictions steer eviction: keep rows read nothing ahead; prefetch rows keep too\n";
      if (to.device_bytes) {
        std::snprintf(head, sizeof head, "device tier: %llu MiB = %llu objects (%.2f%%), %s, H2D %.1f GB/s, %.0f us\n",
                      (unsigned long long)(dev >> 20), (unsigned long long)(to.device_bytes / space.max_object_bytes()),
                      100.0 * double(to.device_bytes / space.max_object_bytes()) / double(space.num_objects()),
                      to.device_policy.c_str(), h2d, h2d_lat);
        text += head;
      }
      text += store::TimedText(*rows, space.num_objects());
      continue;
    }
    const bool bounds = !a.Has("--no-belady");
    if (ep_size != 0) {
      auto progress = StartProgress(*mode, "trace sweep");
      auto table = store::EpSweep(seq, space, policies, sizes, ep_size, bounds, static_cast<unsigned>(*threads),
                                  progress->Fn());
      progress->Finish();
      if (!table.ok()) return ReportError("trace sweep", table.error());
      json j = store::EpSweepJson(*table);
      if (families.size() > 1) all[family] = j;
      else all = j;
      text += (family.empty() ? std::string() : family + ": ") + store::EpSweepText(*table);
      continue;
    }
    auto progress = StartProgress(*mode, "trace sweep");
    auto table = store::Sweep(seq, space, policies, sizes, bounds, &t, in->have_truth ? &in->truth : nullptr,
                              static_cast<unsigned>(*threads), progress->Fn(),
                              store::SweepReferences{.learner = a.Has("--learner"),
                                                     .informed_next = a.Has("--informed-next")});
    progress->Finish();
    if (!table.ok()) return ReportError("trace sweep", table.error());
    std::string title = (family.empty() ? std::string() : family + ": ") + "hit rate vs cache size, " +
                        std::to_string(t.layer_ids.size()) + " layers x top-" + std::to_string(t.top_k) + " of " +
                        std::to_string(t.num_experts) + ", " + std::to_string(seq.tokens) + " tokens";
    const std::string svg = plot_path(family);
    plot_files.emplace_back(svg, store::SweepSvg(*table, title));
    json j = store::SweepJson(*table);
    j["svg"] = svg;
    j["tokens"] = seq.tokens;
    j["measured_reuse"] = trace::MeasuredReuse(t);
    if (families.size() > 1) all[family] = j;
    else all = j;
    text += title + "\n" + store::SweepText(*table) + "plot: " + svg + "\n";
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
  const std::string msg = "unknown sub-command '" + sub + "'";
  ReportDispatchError("trace", "k3pack trace: error: " + msg, msg, rest);
  return Usage();
}

}  // namespace

K3_COMMAND("trace", "routing traces: gen, replay on the store, policy sweep vs Belady", RunTrace);

}  // namespace k3pack::cli
