// `k3pack trace gen|replay|sweep`: the dispatcher and `trace gen` (synthetic
// routing traces); replay and sweep live in cmd_trace_replay.cpp and
// cmd_trace_sweep.cpp.
#include <cstdio>
#include <functional>
#include <iostream>
#include <optional>

#include "cli/command.h"
#include "cli/implied_inputs.h"
#include "cli/output_rule.h"
#include "cli/preflight.h"
#include "cli/trace_args.h"
#include "cli/trace_commands.h"
#include "k3pack/trace.h"
#include "util/file.h"

namespace k3pack::cli {
namespace {

using nlohmann::json;

int Usage() {
  std::cerr << "usage: k3pack trace <gen|replay|sweep> [options]   (k3pack trace <sub> --help)\n";
  return 2;
}

using namespace trace_args;  // NOLINT: the subcommands' shared option handling

int RunGen(const std::vector<std::string>& argv) {
  Args a("trace gen", "[--trace] TRACE [options]",
         "Writes a seeded synthetic Kimi-like routing trace: every token passes each routed layer and picks top_k\n"
         "distinct experts; each expert of the previous token (same layer) is kept with probability --reuse, the\n"
         "rest are drawn from a per-request Zipf popularity (--request-skew) times a global one (--skew; 0 = flat,\n"
         "like Kimi's balanced router). --family picks a workload preset; an option below without a default shown\n"
         "takes the preset's value (docs/store.md lists each family's). Format: docs/store.md.");
  a.Option("--trace", "trace file to write", std::nullopt, true)
      .Deprecated("--out", "--trace")
      .PositionalAsOption("--trace")
      .Flag("--force", "replace an existing --trace file (otherwise refused; the same trace already there is reported)");
  AddGenOptions(a);
  a.Flag("--json", "print the summary as JSON");
  AddProgressOption(a);
  RequirePredictions(a, {"--predict", "--predict-next-token"});
  int code = 0;
  if (!a.Parse(argv, &code)) return code;
  auto mode = ProgressModeOf(a);
  if (!mode.ok()) return ReportError("trace gen", mode.error(), 2);
  // As replay, verify, load and run-experts: before, a directory failed
  // with "cannot read DIR: read failed at offset 0: Is a directory".
  ManifestInDirectory(a, "trace gen");
  auto manifest = ManifestSpace(a);
  if (!manifest.ok()) return ReportError("trace gen", manifest.error());
  trace::GenOptions o;
  Status gs = GenOptionsFromArgs(a, a.Get("--family"), manifest->has_value() ? &**manifest : nullptr, &o);
  if (!gs.ok()) return ReportError("trace gen", gs.error(), 2);
  const std::string out = a.Get("--trace");
  const std::optional<FileStamp> seen = SeeOutput(out);
  // The overwrite rule: "finished" means the file already holds exactly
  // these records; anything else is refused (a shard or a manifest passed as
  // --trace by mistake is never replaced). All but the comparison is
  // checked before generating: a large trace takes tens of seconds, and a
  // directory or a JSON file as --trace was refused only after them.
  auto spec = [&](std::function<bool()> finished, const std::string& why_refused) {
    OutputSpec s;
    s.option = "--trace";
    s.path = out;
    s.force = a.Has("--force");
    s.is_finished = [finished = std::move(finished)]() -> Result<bool> { return finished(); };
    s.why_refused = why_refused;
    s.not_own_kind = [&] { return NotAFileOf(out, FileStart::kTrace, "a routing trace"); };
    return s;
  };
  if (Status w = CheckOutputWritable("--trace", out); !w.ok()) return ReportError("trace gen", w.error());
  if (Status in = NotAnInput(a, "--trace", out, {"--manifest"}); !in.ok()) return ReportError("trace gen", in.error());
  if (auto early = DecideOutput(spec([&] { return trace::ReadTrace(out).ok(); }, "it is not a k3pack trace"));
      !early.ok())
    return ReportError("trace gen", early.error());
  // A trace of many requests at K3 dimensions takes tens of seconds.
  auto progress = StartProgress(*mode);
  o.progress = progress->CountFn("gen", "tokens");
  auto t = trace::Generate(o);
  progress->Finish();
  if (!t.ok()) return ReportError("trace gen", t.error());
  auto action = DecideOutput(spec(
      [&] {
        auto old = trace::ReadTrace(out);
        return old.ok() && SameTrace(*old, *t);
      },
      "it is not this trace"));
  if (!action.ok()) return ReportError("trace gen", action.error());
  if (*action == OutputAction::kAlreadyBuilt) {
    ReportAlreadyBuilt("trace gen", out, a.Has("--json"), "trace");
    return kExitOk;
  }
  Status st = WriteIfStillAsSeen("--trace", out, seen, [&] { return trace::WriteTrace(out, *t); });
  if (!st.ok()) return ReportError("trace gen", st.error());
  if (o.predict && t->layer_ids.size() < 2)
    Narrate("trace gen", "note: --predict recorded no predictions: the trace routes one layer, so there is no next "
                         "layer to predict (--predict-next-token predicts the same layer's next token)");
  const std::optional<double> reuse = trace::MeasuredReuse(*t);
  json j = {{"trace", out},     {"records", t->records.size()},  {"routes", t->num_routes()},
            {"layers", t->layer_ids.size()}, {"experts", t->num_experts},    {"top_k", t->top_k},
            {"measured_reuse", ReuseJson(reuse)}, {"seed", o.seed}, {"family", a.Get("--family")},
            {"version", t->version()}};
  if (a.Has("--json")) {
    PrintJson(j);
  } else {
    char measured[64] = "measured reuse n/a (no token follows another of its request)";
    if (reuse) std::snprintf(measured, sizeof measured, "measured reuse %.1f%%", 100.0 * *reuse);
    std::printf("wrote %s (%s, format v%u): %zu records, %llu routes, %zu layers x top-%u of %u experts, %s\n",
                out.c_str(), a.Get("--family").c_str(), t->version(), t->records.size(),
                (unsigned long long)t->num_routes(), t->layer_ids.size(), t->top_k, t->num_experts, measured);
  }
  return 0;
}

int RunTrace(const std::vector<std::string>& argv) {
  if (argv.empty()) return Usage();
  const std::string& sub = argv[0];
  std::vector<std::string> rest(argv.begin() + 1, argv.end());
  if (sub == "gen") return RunGen(rest);
  if (sub == "replay") return RunTraceReplay(rest);
  if (sub == "sweep") return RunTraceSweep(rest);
  if (sub == "--help" || sub == "-h") {
    std::cout << "usage: k3pack trace <gen|replay|sweep> [options]\n\n"
                 "  gen     write a synthetic Kimi-like routing trace\n"
                 "  replay  replay a trace on the real store (or --simulate the policy only)\n"
                 "  sweep   hit rate of the policies and Belady over cache sizes (table + SVG)\n\n"
                 "run `k3pack trace <sub> --help` for the options of each\n";
    return 0;
  }
  const std::string msg = sub.starts_with("-") ? "missing sub-command (gen, replay or sweep) before " + sub
                                               : "unknown sub-command '" + sub + "'";
  ReportDispatchError("trace", "k3pack trace: error: " + msg, msg, argv);
  return Usage();
}

}  // namespace

K3_COMMAND("trace", "routing traces: gen, replay on the store, policy sweep vs Belady", RunTrace);

}  // namespace k3pack::cli
