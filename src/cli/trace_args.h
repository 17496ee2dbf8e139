// The `k3pack trace` subcommands' shared option handling: parsing and range
// checks of their values (usage errors that name the option and its range),
// the generator options `trace gen` and `trace sweep` share, and the
// overwrite rules of their outputs (plots, stats).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "cli/command.h"
#include "k3pack/error.h"
#include "k3pack/trace.h"
#include "store/object_space.h"

namespace k3pack::cli::trace_args {

// A name `flag` gives must be a cache policy: a usage error up front (exit 2),
// not a failure after the trace has been read.
Status CheckPolicyName(const std::string& flag, const std::string& name);
// The same for an I/O backend (`--io` of trace replay and run-experts).
Status CheckIoBackendName(const std::string& flag, const std::string& name);

// Every field of a comma-separated value, empty ones included: getline drops a
// trailing empty field, so "lru," read as "lru" and a typo passed unnoticed.
std::vector<std::string> CommaFields(const std::string& s);

Result<std::vector<uint64_t>> ParseList(const std::string& s, const std::string& what);

// A trace without records is a valid file but no measurement: its table
// would read 0% for every policy and Belady alike.
Status HasRecords(const std::string& path, const trace::Trace& t);

// The trace --trace names, read and with records. A path that is missing or
// is a directory is named with the option (the reader's "cannot read dd:
// read failed at offset 0: Is a directory" named neither).
Result<trace::Trace> ReadTraceArg(const Args& a);

// The object space --manifest describes, or nullopt without one. A manifest
// that cannot be read or is not a finished adapter manifest is a bad input
// (exit 1), not a usage error.
Result<std::optional<store::ObjectSpace>> ManifestSpace(const Args& a);
// Object space: the manifest's if given, else the trace's dims with K3's object size.
Result<store::ObjectSpace> SpaceFor(const Args& a, const trace::Trace& t);
// The same with ManifestSpace's result already read (a sweep of every
// family reads the manifest once per family, not twice).
Result<store::ObjectSpace> SpaceFor(const Args& a, std::optional<store::ObjectSpace> manifest,
                                    const trace::Trace& t);
// "unknown trace family 'X' (known: ...)", with `all` where a sweep takes it.
Error UnknownFamily(const std::string& family, bool every_family);

bool SameTrace(const trace::Trace& a, const trace::Trace& b);

// An SVG written by an earlier `trace sweep` (its title line is ours).
bool IsOurPlot(const std::string& path);

// An output of a trace command is never one of its inputs (--manifest, or
// the --trace a sweep reads), not even with --force.
Status NotAnInput(const Args& a, const std::string& option, const std::string& path,
                  std::initializer_list<const char*> input_options);

// The overwrite rule for a plot: it is regenerated from the table; an
// existing file is replaced only when it is one of ours (an earlier sweep's
// plot) or with --force, never a user's file. Checked for every plot before
// the sweep runs, so a refusal leaves no plot of the run written.
Status CheckPlotPath(const Args& a, const std::string& path);

// An existing file is kept when it already holds these bytes.
Status WritePlot(const std::string& path, const std::string& svg);

// A stats JSON written by an earlier k3pack store (the snapshot's own keys).
bool IsOurStats(const std::string& path);

// The overwrite rule for `trace replay --stats`: the stats of a run are
// never "already built"; an existing file is replaced only when an earlier
// k3pack run wrote it, or with --force; an input is never replaced.
Status CheckStatsPath(const Args& a, const std::string& path);

// An integer option within [lo, hi] (a usage error naming the option and
// its range otherwise: a cast to uint32_t wrapped 4294967297 to 1).
// `range` (default "lo..hi") is what the message says the range is.
Status IntInRange(const Args& a, const std::string& name, int64_t lo, int64_t hi, int64_t* dst,
                  const std::string& range = "");

Status U32InRange(const Args& a, const std::string& name, uint32_t lo, uint32_t* dst);

Status CheckObjectBytesOption(const Args& a);

Status QueueDepthOption(const Args& a, uint32_t* depth);

// --sizes: at least 1, each once (the JSON and the table are keyed by size,
// as by policy), and no more than any trace's objects (a size times the
// object bytes wrapped past 2^64 into a "cannot evict" error).
Result<std::vector<uint64_t>> ParseSizes(const std::string& s);

// A cache of more objects than the trace has holds every one: its row would
// be a share above 100% (4e12% for a huge size), not a measurement.
Status SizesFitObjects(const std::vector<uint64_t>& sizes, const store::ObjectSpace& space, uint32_t ep_size,
                       const std::string& what);

// The timed table's prefetch rows at the next-layer horizon replay the
// trace's next-layer predictions: without any they equal the demand rows.
std::string NoNextLayerPredictionsNote(const trace::Trace& t, const std::string& horizon);

// A measured reuse (trace::MeasuredReuse) for a JSON summary: null when
// nothing was measured (no row follows another of its request in its layer).
nlohmann::json ReuseJson(const std::optional<double>& reuse);

// Generator options shared by `trace gen` and `trace sweep` (whose --family
// also takes `all`: every_family).
void AddGenOptions(Args& a, bool every_family = false);

// The generator's prediction knobs mean nothing unless predictions are
// written: `by` are the options that ask for them.
void RequirePredictions(Args& a, const std::vector<std::string>& by);

// --manifest gives the dimensions: an explicit one that disagrees with it
// was silently replaced by the manifest's (a usage error now, naming both).
Status ManifestAgrees(const Args& a, const store::ObjectSpace& s);

Status CheckDims(const trace::GenOptions& o);

// The reader's limit on objects (trace::kMaxObjects): a trace the reader
// would refuse is not written.
Status CheckObjects(uint64_t layers, uint32_t experts);

// The generator's size bounds (trace::Generate refuses them too), named by
// the options that set them, before anything is allocated.
Status CheckGenSizes(const trace::GenOptions& o);

// The generator's options; `manifest` (ManifestSpace's, or null) gives the
// dimensions. Every refusal is a usage error.
Status GenOptionsFromArgs(const Args& a, const std::string& family, const store::ObjectSpace* manifest,
                          trace::GenOptions* o);

}  // namespace k3pack::cli::trace_args
