// k3pack build: the whole preparation in one command, GGUF shards ->
// expert pack -> adapter manifest (what SGLang's server start-up runs as two
// tools). A valid pack without its manifest is reused; an interrupted build
// resumes; the overwrite rule (output_rule.h) covers pack and manifest.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>

#include "cli/command.h"
#include "cli/implied_inputs.h"
#include "cli/ep_options.h"
#include "cli/output_rule.h"
#include "cli/pack_plan.h"
#include "cli/preflight.h"
#include "cli/profile.h"
#include "k3pack/doctor.h"
#include "k3pack/gguf.h"
#include "k3pack/manifest.h"
#include "k3pack/pack.h"
#include "manifest/build_output.h"
#include "manifest/pyjson.h"
#include "pack/build_inputs.h"
#include "pack/format.h"
#include "pack/progress.h"
#include "pack/repair_damaged.h"
#include "util/file.h"
#include "util/format.h"
#include "util/process_limits.h"

namespace k3pack::cli {
namespace {

constexpr const char* kCmd = "build";

// --restart over a finished pack repairs it in place; with --force the pack
// is rebuilt (the repair ran and --force was dropped without a word).
bool RepairsExisting(const Args& args) { return args.Has("--restart") && !args.Has("--force"); }

void Say(bool json, const std::string& s) {
  if (!json) {
    std::printf("%s\n", s.c_str());
    std::fflush(stdout);
  }
}

// Option values (a bad one is a usage error, exit 2).
struct Values : CopyValues {
  int64_t samples = 0;
  EpChoice ep;
};

Result<Values> ParseValues(const Args& args) {
  Values v;
  if (args.Has("--profile")) K3_RETURN_IF_ERROR(kimi::ParseProfile(args.Get("--profile")).status());
  K3_ASSIGN_OR_RETURN(v.samples, args.GetInt("--payload-samples"));
  if (v.samples < 0) return Error("--payload-samples must be non-negative");
  K3_ASSIGN_OR_RETURN(static_cast<CopyValues&>(v), ParseCopyValues(args));
  K3_ASSIGN_OR_RETURN(v.ep, ParseEpOptions(args));
  // A given config is checked here, before the "using ..." lines; an implied
  // one once it is found.
  K3_RETURN_IF_ERROR(CheckEpChoiceForConfig(v.ep, args.Get("--model-config")));
  return v;
}

// Doctor's error findings (SGLang refuses or mis-loads; e.g. BF16 matrices)
// refuse the build unless --allow-unsupported (doctor::CheckSglangCanLoad).
Status RefuseWhatSglangCannotLoad(const Args& args, const PackPlan& plan) {
  Status st = doctor::CheckSglangCanLoad(plan.experts.shard_paths.front(), plan.profile, args.Get("--model-config"),
                                         args.Get("--tokenizer-dir"), args.Has("--allow-mixed-types"));
  // A shard the process could not read (permissions, `ulimit -n`, `ulimit
  // -v`) is no problem of the model: doctor and --allow-unsupported are no
  // way out of it.
  if (st.ok() || IsProcessCannotRead(st.error().sys_errno())) return st;
  const std::string doctor = doctor::DoctorCommand(args.Get("--gguf-dir"), plan.profile, args.Get("--model-config"),
                                                   args.Get("--tokenizer-dir"), args.Has("--allow-mixed-types"));
  return st.error().WithHint("run `" + doctor + "` for every problem and its fix; pass --allow-unsupported to build "
                             "the pack anyway");
}

// Where the manifest of `pack` goes: --manifest or SGLang's name beside the
// pack; beside a rank pack, one manifest per rank, named with .epR-of-N.
std::string ManifestPathOf(const Args& args, const std::string& pack, const std::optional<ep::Rank>& rank) {
  std::string path = args.Get("--manifest");
  if (path.empty()) path = (std::filesystem::path(pack).parent_path() / kDefaultManifestName).string();
  if (!rank) return path;
  const std::filesystem::path mp(path);
  return (mp.parent_path() / RankManifestName(mp.filename().string(), *rank)).string();
}

// What the manifest's path can be told without reading anything: not an
// input, writable where it must be written, and no file of another kind.
Status PreflightManifest(const Args& args, const std::string& path, const std::vector<NamedPath>& inputs) {
  K3_RETURN_IF_ERROR(CheckOutputsAreNotInputs({{"--manifest", path}}, inputs));
  return manifest::CheckManifestOutputFile("--manifest", path, args.Has("--force"));
}

// Whether the manifest at `path` records the shards' whole-file SHA-256
// (true where it cannot be read: nothing to add then).
bool RecordsWholeShardHashes(const std::string& path) {
  auto m = manifest::ReadManifestJson(path);
  if (!m.ok()) return true;
  const nlohmann::json* v = m->contains("verification") ? &(*m)["verification"] : nullptr;
  return !(v && v->is_object() && v->contains("full_source_hashes") && (*v)["full_source_hashes"] == false);
}

// One pack and its manifest: the full pack, or the rank pack of `rank`.
// `shard_sha256` carries whole-shard SHA-256s from one rank's build to the
// next (--ep-rank all hashes the shards once).
Result<nlohmann::json> RunOne(const Args& args, const Values& v, const std::optional<ep::Rank>& rank,
                              std::map<std::string, std::string>* shard_sha256) {
  const bool json = args.Has("--json");
  const std::string tokenizer_dir = args.Get("--tokenizer-dir");
  // Preflight, before a byte is copied: shards, tokenizer, config, outputs.
  K3_RETURN_IF_ERROR(CheckGgufDir("--gguf-dir", args.Get("--gguf-dir")));
  K3_RETURN_IF_ERROR(CheckTokenizerDir("--tokenizer-dir", tokenizer_dir));
  // The checkpoint and the manifest are judged in the pack plan's own pass
  // (under the pack's lock, and before a lock file is made for a refusal).
  std::string manifest_path;
  OutputAction maction{};
  std::optional<FileStamp> manifest_seen;  // what the judged manifest path held
  std::set<std::string> told;  // the pass runs twice where no lock file was there yet
  auto judge_the_rest = [&](const PackPlan& plan) -> Status {
    const std::string& out = plan.pack;
    if (!args.Has("--allow-unsupported")) K3_RETURN_IF_ERROR(RefuseWhatSglangCannotLoad(args, plan));
    manifest_path = ManifestPathOf(args, out, rank);
    manifest::BuildManifestRequest request;
    request.path = manifest_path;
    request.force = args.Has("--force");
    request.pack_path = out;
    request.pack_action = plan.action;
    request.pack_section = plan.valid_section;
    request.pack_repair = plan.repair;
    request.inputs = plan.inputs;
    request.tokenizer_dir = tokenizer_dir;
    // Given only: the default judges no finished manifest (one built with
    // 10 was rewritten with 6 by a plain rerun).
    if (args.Has("--payload-samples")) request.payload_samples = v.samples;
    request.full_pack_hash = args.Has("--full-pack-hash");
    request.note = [&](const std::string& why) {
      if (told.insert(why).second) Narrate(kCmd, "note: " + why);
    };
    manifest_seen = SeeOutput(manifest_path);
    K3_ASSIGN_OR_RETURN(maction, manifest::DecideBuildManifest(request));
    return Status::OK();
  };
  // Mixed expert types only when asked for, as `k3pack pack`: SGLang's
  // validator refuses them. --restart with a finished pack: check every
  // payload and repair what is damaged (never silently reuse a corrupt pack).
  auto before_the_pack = [&](const PackPlan& plan) {
    return PreflightManifest(args, ManifestPathOf(args, plan.pack, rank), plan.inputs);
  };
  K3_ASSIGN_OR_RETURN(PackPlan plan, PlanPack(args, args.Has("--allow-mixed-types"), RepairsExisting(args), rank,
                                              judge_the_rest, before_the_pack));
  const kimi::Profile profile = plan.profile;
  const pack::ExpertSet& experts = plan.experts;
  const std::string out = plan.pack;
  if (maction == OutputAction::kAlreadyBuilt) {
    // Asked for (the default) but not in the finished manifest: kept as it
    // is (the pack and manifest are sound), with the one command that adds them.
    if (!rank && !args.Has("--no-full-source-hashes") && !RecordsWholeShardHashes(manifest_path)) {
      // The manifest this build would write, from `k3pack manifest`: the
      // options that shape it are passed on.
      std::string command = "k3pack manifest " + ShellQuoted(args.Get("--gguf-dir")) + " --pack " + ShellQuoted(out) +
                            " --manifest " + ShellQuoted(manifest_path);
      for (const char* option : {"--model-config", "--tokenizer-dir", "--profile", "--payload-samples"})
        if (!args.Get(option).empty()) command += std::string(" ") + option + " " + ShellQuoted(args.Get(option));
      if (args.Has("--full-pack-hash")) command += " --full-pack-hash";
      Narrate(kCmd, "note: " + manifest_path + " was written without whole-shard SHA-256 of the shards "
                    "(--no-full-source-hashes) and is kept as it is; `" + command +
                    " --force` writes it with them (reads every shard once)");
    }
    return nlohmann::json{{"already_built", true}, {"manifest", manifest_path}, {"pack", out}};
  }

  bool reused = false;
  pack::BuildResult built;
  std::vector<std::string> repaired;
  if (plan.repair) {
    K3_ASSIGN_OR_RETURN(pack::RepairDamagedResult rep,
                        pack::RepairDamagedPayloads(out, experts, pack::MakeProgressPrinter(v.mode, rank), rank));
    for (const auto& w : rep.repaired) Say(json, "rewrote " + w + " from the source");
    if (!rep.why_source.empty()) {
      Say(json, "wrote the digest sidecar " + rep.sidecar_written + " anew (every payload compared with the shards: " +
                    rep.why_source + ")");
    } else if (!rep.sidecar_written.empty()) {
      Say(json, "wrote the missing digest sidecar " + rep.sidecar_written + " (every payload compared with the shards)");
    }
    Say(json, "EXPERT_PACK_CHECKED path=" + out + " entries=" + std::to_string(rep.entries_checked) +
                  " damaged_rewritten=" + std::to_string(rep.repaired.size()));
    repaired = rep.repaired;
    reused = true;
  } else if (plan.action == OutputAction::kAlreadyBuilt) {
    const nlohmann::json& valid = plan.valid_section;
    Say(json, "EXPERT_PACK_VALID path=" + out + " entries=" + valid["index_count"].dump() +
                  " size=" + valid["size"].dump() + " samples=" + valid["payload_samples_verified"].dump());
    reused = true;
  } else {
    pack::BuildOptions bopts;
    bopts.out_path = out;
    bopts.safety_margin_gib = v.margin;
    bopts.restart = args.Has("--restart");
    bopts.replace_existing = plan.action == OutputAction::kReplace;  // kept until the new pack is done
    bopts.threads = v.threads;
    bopts.hash_sources = !args.Has("--no-full-source-hashes") && shard_sha256->empty();  // beside the copy
    bopts.ep = rank;
    bopts.progress = pack::MakeProgressPrinter(v.mode, rank);
    bopts.log = [](const std::string& s) { Narrate(kCmd, s); };
    bopts.started = [&] {
      Say(json, "EXPERT_PACK_BUILD_START output=" + out + " size=" + std::to_string(experts.EstimatedPackBytes()));
    };
    K3_ASSIGN_OR_RETURN(built, pack::BuildPack(experts, bopts));
  }

  // Test seam: the pack is done and the manifest not begun; the pack's lock
  // (the plan's) still keeps every other writer of the pack out.
  if (const char* seam = std::getenv("K3PACK_TEST_STOP_BEFORE_MANIFEST"); seam != nullptr && std::string(seam) == "1") {
    ::raise(SIGSTOP);
  }

  // Manifest.
  manifest::CreateOptions mo;
  mo.gguf_dir = args.Get("--gguf-dir");
  mo.expert_pack = out;
  mo.model_config = args.Get("--model-config");
  mo.tokenizer_dir = tokenizer_dir;
  mo.payload_samples = v.samples;
  mo.full_source_hashes = !args.Has("--no-full-source-hashes");
  shard_sha256->insert(built.source_sha256.begin(), built.source_sha256.end());
  mo.known_shard_sha256 = *shard_sha256;
  mo.ep = rank;
  mo.full_pack_hash = args.Has("--full-pack-hash");
  mo.profile = profile;
  if (v.mode != pack::ProgressMode::kNone) {
    // Step lines on a terminal or with json; logs get the 10 s lines only.
    if (v.mode != pack::ProgressMode::kLines)
      mo.progress = [](const std::string& s) { Narrate(kCmd, s); };
    mo.pack_progress = pack::MakeProgressPrinter(v.mode, rank);
  }
  if (std::filesystem::is_directory(mo.gguf_dir) == false) {
    mo.gguf_dir = std::filesystem::path(experts.shard_paths.front()).parent_path().string();  // a shard path was given
  }
  K3_ASSIGN_OR_RETURN(nlohmann::json m, manifest::CreateManifest(mo));
  // Another build of this manifest path (with another pack) may have
  // written it while this one copied: it is then refused, not replaced.
  K3_RETURN_IF_ERROR(WriteIfStillAsSeen("--manifest", manifest_path, manifest_seen,
                                        [&] { return manifest::WriteManifest(manifest_path, m); }));
  K3_ASSIGN_OR_RETURN(std::string resolved, ResolvePath(manifest_path));
  nlohmann::json summary = manifest::ManifestSummary(resolved, m);
  summary["pack"] = m["expert_pack"]["path"];
  summary["pack_size"] = m["expert_pack"]["size"];
  summary["pack_reused"] = reused;
  if (plan.repair) summary["damaged_rewritten"] = repaired;
  summary["profile"] = kimi::ProfileName(profile);
  if (rank) summary["ep"] = m["k3pack"]["ep"];
  if (mo.full_source_hashes) {
    // The manifest hashed any shard it was not given: later ranks reuse them.
    for (const auto& s : m["source"]["shards"]) {
      if (s.contains("sha256") && s["sha256"].is_string()) (*shard_sha256)[s["path"].get<std::string>()] = s["sha256"];
    }
  }
  if (!reused) {
    summary["pack_seconds"] = built.seconds;
    summary["copied_bytes"] = built.copied_bytes;
    summary["resumed_objects"] = built.resumed_objects;
  }
  return summary;
}

Result<nlohmann::json> Run(const Args& args, const Values& v) {
  // The shards are hashed once for all the ranks' manifests.
  std::map<std::string, std::string> shard_sha256;
  // Each rank's manifest as its build will judge it, short of reading it.
  auto manifest_of_rank = [&](const std::string& rank_pack, const ep::Rank& rank) -> Status {
    return PreflightManifest(args, ManifestPathOf(args, rank_pack, rank), {});
  };
  K3_RETURN_IF_ERROR(PreflightEveryRank(args, v.ep, args.Has("--allow-mixed-types"), RepairsExisting(args),
                                        manifest_of_rank));
  return RunPerRank(v.ep, "rank_builds",
                    [&](std::optional<ep::Rank> rank) { return RunOne(args, v, rank, &shard_sha256); });
}

// An already-built result's paths as a fresh build's JSON gives them.
nlohmann::json AbsoluteOutputs(const nlohmann::json& j) {
  const std::string manifest = ResolvedPathOrGiven(j["manifest"].get<std::string>());
  return {{"manifest", manifest}, {"path", manifest}, {"pack", ResolvedPathOrGiven(j["pack"].get<std::string>())}};
}

void PrintBuilt(const nlohmann::json& j, bool json_mode) {
  if (j.contains("already_built")) {
    ReportAlreadyBuilt(kCmd, j["manifest"].get<std::string>(), json_mode, "manifest", AbsoluteOutputs(j));
    return;
  }
  std::printf("EXPERT_PACK_READY path=%s size=%s%s\n", j["pack"].get<std::string>().c_str(),
              j["pack_size"].dump().c_str(), j["pack_reused"].get<bool>() ? " (reused)" : "");
  std::printf("MANIFEST_READY path=%s profile=%s entries=%s payload_samples_verified=%s%s\n",
              j["manifest"].get<std::string>().c_str(), j["profile"].get<std::string>().c_str(),
              j["pack_entries"].dump().c_str(), j["payload_samples_verified"].dump().c_str(),
              j.contains("ep") ? (" ep_rank=" + j["ep"]["rank"].dump() + " ep_size=" + j["ep"]["size"].dump()).c_str()
                               : "");
}

int RunBuild(const std::vector<std::string>& argv) {
  StopCleanlyOnSignals(kCmd);  // before any work: an early Ctrl-C is a clean stop too
  Args args(kCmd,
            "[--gguf-dir] DIR [--model-config CONFIG] [--tokenizer-dir TOK] [--pack PACK] [--manifest M.json] [options]",
            "Build the expert pack (resumable) and then write the SGLang adapter manifest, in one command.\n"
            "Everything is checked before a byte is copied. An interrupted build resumes; a finished pack with its\n"
            "manifest is reported as already built; anything else at the output paths is refused without --force.\n"
            "With --ep-size N --ep-rank R|all: expert-parallel rank packs (<pack stem>.epR-of-N.pack) and their\n"
            "manifests (<manifest stem>.epR-of-N.manifest.json, with k3pack.ep recording the rank).");
  args.Option("--gguf-dir", "directory holding the <prefix>-NNNNN-of-NNNNN.gguf shards", std::nullopt, true)
      .PositionalAsOption("--gguf-dir")
      .Option("--model-config", "HF config.json of the model (default: config.json beside the shards, else the tokenizer directory's)")
      .Option("--tokenizer-dir", "tokenizer/config directory the server loads (default: found beside the shards as SGLang's server finds it)")
      .Option("--pack", "pack path (default: <dir>/<prefix>.expert-major.pack beside the shards)", "")
      .Deprecated("--out", "--pack")
      .Option("--manifest", std::string("manifest path (default: ") + kDefaultManifestName + " beside the pack)", "")
      .Flag("--allow-mixed-types", "allow expert dtypes to differ by role or layer (SGLang's validator refuses such a pack)")
      .Option("--payload-samples", "pack entries byte-compared with GGUF for the manifest", "6")
      .Flag("--full-source-hashes", "record the SHA-256 of every whole shard (the default; computed beside the copy)")
      .Flag("--no-full-source-hashes", "do not record whole-shard SHA-256s (then same-size edits outside the "
                                       "metadata go unnoticed)")
      .Exclusive({"--full-source-hashes", "--no-full-source-hashes"})
      .Flag("--full-pack-hash", "record the SHA-256 of the whole pack")
      .Flag("--allow-unsupported", "build even when doctor finds errors SGLang raises on (e.g. BF16 matrices)")
      .Flag("--json", "print only the result as JSON (otherwise text)");
  AddProfileOption(args);
  AddForceFlag(args, "pack and manifest");
  AddWaitOption(args);
  AddCopyOptions(args, "discard an interrupted partial build instead of resuming it; over a finished pack, compare "
                       "every payload with the shards and rewrite only those that differ (with --force: rebuild it)");
  AddEpOptions(args);
  int code = 0;
  if (!args.Parse(argv, &code)) return code;
  auto wait = LockWaitOf(args, kCmd);
  if (!wait.ok()) return ReportError(kCmd, wait.error(), kExitUsage);
  const k3pack::ScopedLockWait waiting(*wait);
  // Bad values first: a usage error comes before the "using ..." lines.
  auto v = ParseValues(args);
  if (!v.ok()) return ReportError(kCmd, v.error(), kExitUsage);
  if (Status s = FillImpliedInputs(args, kCmd, {.tokenizer_dir = true, .model_config = true}); !s.ok())
    return ReportError(kCmd, s.error(), kExitUsage);
  if (Status s = CheckEpChoiceForConfig(v->ep, args.Get("--model-config")); !s.ok())
    return ReportError(kCmd, s.error(), kExitUsage);
  if (Status s = CheckMixedTypesBeforeRun(args); !s.ok()) return ReportError(kCmd, s.error(), kExitUsage);
  auto r = Run(args, *v);
  if (!r.ok()) return ReportError(kCmd, r.error(), pack::InterruptExitCode(r.error()));
  const nlohmann::json& j = *r;
  if (j.contains("already_built") && !j.contains("rank_builds")) {
    ReportAlreadyBuilt(kCmd, j["manifest"].get<std::string>(), args.Has("--json"), "manifest", AbsoluteOutputs(j));
    return kExitOk;
  }
  if (args.Has("--json")) {
    std::cout << manifest::PyJsonDumps(j, manifest::PyJsonStyle::kIndent2Ascii) << "\n";
  } else if (j.contains("rank_builds")) {
    for (const auto& one : j["rank_builds"]) PrintBuilt(one, false);
  } else {
    PrintBuilt(j, false);
  }
  return 0;
}

}  // namespace

K3_COMMAND("build", "GGUF shards -> expert pack -> adapter manifest, in one command", RunBuild);

}  // namespace k3pack::cli
