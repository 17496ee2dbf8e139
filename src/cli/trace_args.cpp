#include "cli/trace_args.h"

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
#include "store/io_engine.h"
#include "store/policy.h"
#include "store/replay.h"
#include "store/store_impl.h"
#include "store/timed_sim.h"
#include "util/file.h"

namespace k3pack::cli::trace_args {

using nlohmann::json;

// A name `flag` gives must be a cache policy: a usage error up front (exit 2),
// not a failure after the trace has been read.
Status CheckPolicyName(const std::string& flag, const std::string& name) {
  const auto known = store::PolicyNames();
  if (std::find(known.begin(), known.end(), name) != known.end()) return Status::OK();
  std::string list;
  for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
  return Error(flag + ": unknown cache policy '" + name + "' (known: " + list + ")");
}

Status CheckIoBackendName(const std::string& flag, const std::string& name) {
  if (auto io = store::ParseIoBackend(name); !io.ok()) return Error(flag + ": " + io.error().message());
  return Status::OK();
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

Result<trace::Trace> ReadTraceArg(const Args& a) {
  const std::string path = a.Get("--trace");
  // `trace sweep all` (the argument is the trace) meant the family.
  const auto families = trace::FamilyNames();
  const bool family = a.command() == "trace sweep" &&
                      (path == "all" || std::find(families.begin(), families.end(), path) != families.end());
  K3_RETURN_IF_ERROR(CheckInputExists("--trace", path, ".trace",
                                      family ? "did you mean --family " + path + "? (the argument is a trace file)"
                                             : "write one with `k3pack trace gen`"));
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return Error("--trace " + path + " is a directory, not a trace file", ErrorKind::kFileNotFound)
        .WithHint("pass the file `k3pack trace gen` or `k3pack run-experts --trace-out` wrote");
  }
  K3_ASSIGN_OR_RETURN(trace::Trace t, trace::ReadTrace(path));
  K3_RETURN_IF_ERROR(HasRecords(path, t));
  return t;
}

Result<std::optional<store::ObjectSpace>> ManifestSpace(const Args& a) {
  if (!a.Has("--manifest")) return std::optional<store::ObjectSpace>();
  K3_RETURN_IF_ERROR(CheckInputExists("--manifest", a.Get("--manifest"), ".manifest.json"));
  K3_ASSIGN_OR_RETURN(store::ObjectSpace s, store::SpaceFromManifest(a.Get("--manifest")));
  return std::optional<store::ObjectSpace>(std::move(s));
}

Error UnknownFamily(const std::string& family, bool every_family) {
  std::string known;
  for (const auto& f : trace::FamilyNames()) known += (known.empty() ? "" : ", ") + f;
  if (every_family) known += ", or all";
  return Error("unknown trace family '" + family + "' (known: " + known + ")", ErrorKind::kValue);
}

Result<store::ObjectSpace> SpaceFor(const Args& a, const trace::Trace& t) {
  K3_ASSIGN_OR_RETURN(std::optional<store::ObjectSpace> m, ManifestSpace(a));
  return SpaceFor(a, std::move(m), t);
}

Result<store::ObjectSpace> SpaceFor(const Args& a, std::optional<store::ObjectSpace> m, const trace::Trace& t) {
  if (m) {
    if (m->num_experts != t.num_experts || m->top_k != t.top_k)
      return store::TraceDimensionMismatch(a.Has("--trace") ? a.Get("--trace") : std::string(), t,
                                           a.Get("--manifest"), m->num_experts, m->top_k);
    return std::move(*m);
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
  // The title is in the first lines: a multi-GB file given as --svg by a
  // slip was read whole only to be refused.
  auto head = ReadFileHead(path, 64 << 10);
  return head.ok() && head->starts_with("<svg") && head->find("hit rate vs cache size") != std::string::npos;
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
  return CheckRegeneratedOutput(a, "--svg", path, "it is not a plot written by `k3pack trace sweep`", IsOurPlot,
                                FileStart::kSvg, "an SVG plot");
}

// An existing file is kept when it already holds these bytes.
Status WritePlot(const std::string& path, const std::string& svg) {
  std::error_code ec;
  if (std::filesystem::file_size(path, ec) == svg.size() && !ec) {  // else not these bytes: not read
    auto old = ReadFileToString(path);
    if (old.ok() && *old == svg) return Status::OK();
  }
  return WriteFileAtomic(path, svg);
}

// A stats JSON written by an earlier k3pack store, the host store's or the
// drop-in's (both have k3pack's section with its io_backend).
bool IsOurStats(const std::string& path) {
  const std::optional<json> j = store::ReadStoreStats(path);
  return j && j->contains("k3pack") && (*j)["k3pack"].is_object() && (*j)["k3pack"].contains("io_backend");
}

// The overwrite rule for `trace replay --stats`: the stats of a run are
// never "already built"; an existing file is replaced when a k3pack store
// wrote it, or with --force when another store did (SGLang's); anything
// else never (the store's rule, checked first: its refusal offers no --force).
Status CheckStatsPath(const Args& a, const std::string& path) {
  K3_RETURN_IF_ERROR(store::CheckStatsFile(path, "--stats"));
  return CheckRegeneratedOutput(a, "--stats", path, "it is a stats file another store wrote (SGLang's?)", IsOurStats,
                                FileStart::kJson, "a stats file");
}

// An integer option within [lo, hi] (a usage error naming the option and
// its range otherwise: a cast to uint32_t wrapped 4294967297 to 1).
Status IntInRange(const Args& a, const std::string& name, int64_t lo, int64_t hi, int64_t* dst,
                  const std::string& range) {
  const Error outside(name + " must be an integer in " +
                      (range.empty() ? std::to_string(lo) + ".." + std::to_string(hi) : range) + ", got " +
                      a.Get(name));
  auto v = a.GetInt(name);
  if (!v.ok()) {
    // An integer past 64 bits is outside this range too: "from -2^63 to
    // 2^63-1" contradicted the range said for -1.
    const std::string& text = a.Get(name);
    const size_t digits = text.starts_with('-') ? 1 : 0;
    const bool integer = text.size() > digits && text.find_first_not_of("0123456789", digits) == std::string::npos;
    return integer ? outside : v.error();
  }
  if (*v < lo || *v > hi) return outside;
  *dst = *v;
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
                   trace::kMaxObjectsText + "), got '" + s + "'");
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
// trace's next-layer predictions: without any they equal the demand rows,
// or at --horizon both (keep hints from the next-token predictions) the
// keep rows.
std::string NoNextLayerPredictionsNote(const trace::Trace& t, const std::string& horizon) {
  if (horizon == "token") return "";
  const std::string equal = horizon == "both" ? "the keep rows (their hints are the next-token predictions)"
                                              : "the demand rows";
  if (t.layer_ids.size() < 2)
    return "the trace routes one layer: there is no next layer to predict, so the prefetch rows read nothing "
           "ahead and equal " + equal + " (--horizon token predicts the same layer's next token)";
  if (std::any_of(t.records.begin(), t.records.end(), [](const auto& r) { return r.has_predictions; })) return "";
  return "the trace has no next-layer predictions: the prefetch rows read nothing ahead and equal " + equal +
         " (write it with `k3pack trace gen --predict`)";
}


nlohmann::json ReuseJson(const std::optional<double>& reuse) {
  return reuse ? nlohmann::json(*reuse) : nlohmann::json(nullptr);
}

// Generator options shared by `trace gen` and `trace sweep`.
void AddGenOptions(Args& a, bool every_family) {
  std::string families;
  for (const auto& f : trace::FamilyNames()) families += (families.empty() ? "" : " | ") + f;
  if (every_family) families += " | all (each in turn)";
  a.Option("--family", "preset: " + families + " (docs/store.md); the options below override it", "kimi")
      .Option("--manifest", "take layers / experts / top_k from this adapter manifest (or the directory holding it "
                            "under SGLang's name)")
      .Option("--layers", "routed layers (numbered from --first-layer)", "92")
      .Option("--first-layer", "first routed layer id", "1")
      .Option("--experts", "experts per layer (1..65536)", "896")
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
      .Flag("--predict", "record predicted next-layer expert ids (trace format v2; their own random stream: routes\n"
                         "unchanged, whatever the accuracy)")
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
  if (o.num_experts == 0 || o.num_experts > 65536)
    return Error("--experts must be in 1..65536 (trace ids are 16-bit), got " + std::to_string(o.num_experts));
  if (o.top_k == 0 || o.top_k > o.num_experts)
    return Error("--top-k must be in 1..--experts, got --top-k " + std::to_string(o.top_k) + " --experts " +
                 std::to_string(o.num_experts));
  return Status::OK();
}

// The reader's limit on objects (trace::kMaxObjects): a trace the reader
// would refuse is not written.
Status CheckObjects(uint64_t layers, uint32_t experts) {
  if (layers * experts <= trace::kMaxObjects) return Status::OK();
  return Error("--layers " + std::to_string(layers) + " x --experts " + std::to_string(experts) + " = " +
               std::to_string(layers * experts) + " objects, more than a trace may declare (" +
               trace::kMaxObjectsText + "; docs/FORMATS.md): at most " +
               std::to_string(trace::kMaxObjects / experts) + " layers of " + std::to_string(experts) + " experts");
}

// The generator's size bounds (trace::Generate refuses them too), named by
// the options that set them, before anything is allocated.
Status CheckGenSizes(const trace::GenOptions& o) {
  const uint64_t layers = o.layer_ids.size(), objects = layers * o.num_experts;
  K3_RETURN_IF_ERROR(CheckObjects(layers, o.num_experts));
  const std::string passes = "--requests " + std::to_string(o.requests) + " x (--prompt-tokens " +
                             std::to_string(o.prompt_tokens) + " + --decode-tokens " +
                             std::to_string(o.decode_tokens) + ") x " + std::to_string(layers) + " layers";
  if (trace::GeneratedRoutes(o) > trace::kMaxGeneratedRoutes)
    return Error(passes + " x top-" + std::to_string(o.top_k) + " is more than the " +
                 std::to_string(trace::kMaxGeneratedRoutes) + " routes (2^30) a generated trace may hold");
  if (trace::GeneratedPasses(o) > trace::kMaxGeneratedPasses)
    return Error(passes + " is more than the " + std::to_string(trace::kMaxGeneratedPasses) +
                 " token passes (2^26) a generated trace may hold (each is a record in memory, whatever the top-k)");
  if (trace::GeneratorWeights(o) > trace::kMaxGeneratorWeights)
    return Error("--domains " + std::to_string(o.domains) + " and --concurrent " + std::to_string(o.concurrent) +
                 " with " + std::to_string(o.requests) + " requests keep more than the generator's " +
                 std::to_string(trace::kMaxGeneratorWeights) + " (2^27) popularity weights of " +
                 std::to_string(objects) + " objects each (a domain's, or a request's, weights per object)");
  return Status::OK();
}

Status GenOptionsFromArgs(const Args& a, const std::string& family, const store::ObjectSpace* manifest,
                          trace::GenOptions* o) {
  uint32_t layers = 0, first = 0;
  int64_t seed = 0;
  // No layers would leave the generator its default (92 of them).
  K3_RETURN_IF_ERROR(U32InRange(a, "--layers", 1, &layers));
  K3_RETURN_IF_ERROR(U32InRange(a, "--first-layer", 0, &first));
  if (uint64_t{first} + layers - 1 > UINT32_MAX)
    return Error("--first-layer " + a.Get("--first-layer") + " with --layers " + a.Get("--layers") +
                 " numbers layers beyond 4294967295, the largest layer id: --first-layer must be at most " +
                 std::to_string(uint64_t{UINT32_MAX} - layers + 1));
  // Trace ids are 16-bit.
  int64_t experts = 0;
  K3_RETURN_IF_ERROR(IntInRange(a, "--experts", 1, 65536, &experts));
  o->num_experts = static_cast<uint32_t>(experts);
  // The range said is the rule's, 1..the experts (of the manifest when one
  // is given; a value inside that disagrees with its top_k is refused by
  // ManifestAgrees); "1..4294967295" was said for 0.
  if (!manifest || a.Has("--top-k")) {  // a manifest's replaces the default
    const int64_t top_k_most = manifest ? int64_t{manifest->num_experts} : experts;
    int64_t top_k = 0;
    K3_RETURN_IF_ERROR(IntInRange(a, "--top-k", 1, top_k_most, &top_k,
                                  (manifest ? "1..the manifest's experts " : "1..--experts ") +
                                      std::to_string(top_k_most)));
    o->top_k = static_cast<uint32_t>(top_k);
  }
  // Any seed a 64-bit integer holds (a cast to uint32_t refused 99999999999).
  K3_RETURN_IF_ERROR(IntInRange(a, "--seed", 0, INT64_MAX, &seed));
  o->seed = static_cast<uint64_t>(seed);
  o->layer_ids.clear();
  if (manifest != nullptr) {
    K3_RETURN_IF_ERROR(ManifestAgrees(a, *manifest));
    o->layer_ids = manifest->active_layer_ids;
    o->num_experts = manifest->num_experts;
    o->top_k = manifest->top_k;
  } else {
    // Checked before the layer list is made (--layers 4294967295 allocated it).
    K3_RETURN_IF_ERROR(CheckObjects(layers, o->num_experts));
    for (uint32_t l = 0; l < layers; ++l) o->layer_ids.push_back(first + l);
  }
  o->predict = a.Has("--predict");
  o->predict_next_token = a.Has("--predict-next-token");
  K3_ASSIGN_OR_RETURN(o->predict_accuracy, a.GetDouble("--predict-accuracy"));
  K3_ASSIGN_OR_RETURN(o->predict_surprise, a.GetDouble("--predict-surprise"));
  if (!trace::ApplyFamily(family, o)) return UnknownFamily(family, /*every_family=*/false);
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
  if (o->predict_accuracy > 1.0 - o->predict_surprise + 1e-12) {
    char most[32];
    std::snprintf(most, sizeof most, "%.6g", 1.0 - o->predict_surprise);
    return Error("--predict-accuracy " + a.Get("--predict-accuracy") + " with --predict-surprise " +
                 a.Get("--predict-surprise") + " cannot be met: the rows that are no surprise would have to be "
                 "right more often than always (accuracy / (1 - surprise) > 1)")
        .WithHint("give --predict-accuracy of at most " + std::string(most) + " (1 - --predict-surprise)");
  }
  // A negative exponent used to read as a flat popularity (0).
  for (auto [name, v] : {std::pair{"--skew", o->skew}, {"--request-skew", o->request_skew}})
    if (v < 0) return Error(std::string(name) + " must be at least 0 (0: flat popularity), got " + a.Get(name));
  K3_RETURN_IF_ERROR(CheckDims(*o));
  if (uint64_t{o->prompt_tokens} + o->decode_tokens == 0)
    return Error("--prompt-tokens and --decode-tokens are both 0: no tokens to generate");
  return CheckGenSizes(*o);
}

}  // namespace k3pack::cli::trace_args
