// k3pack verify: checks an expert pack against its manifest: the GGUF shards
// are the ones recorded (size + metadata digest), the pack structure passes
// SGLang's validator and matches the manifest's expert_pack section, then
// payloads: sampled byte compares with the GGUF source (default), or every
// payload against the digest sidecar (--full), optionally also the source.
#include <cstdio>
#include <filesystem>
#include <iostream>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/implied_inputs.h"
#include "cli/preflight.h"
#include "k3pack/manifest.h"
#include "manifest/manifest_output.h"
#include "util/format.h"

namespace k3pack::cli {
namespace {

constexpr const char* kCmd = "verify";

Result<nlohmann::json> Run(const Args& args) {
  manifest::VerifyPackOptions o;
  o.full = args.Has("--full");
  o.against_source = args.Has("--against-source");
  if (args.Has("--samples")) o.samples = *args.GetInt("--samples");  // checked by the caller
  K3_RETURN_IF_ERROR(CheckInputExists("--manifest", args.Get("--manifest"), ".manifest.json"));
  K3_ASSIGN_OR_RETURN(ProgressMode mode, ProgressModeOf(args));  // checked by the caller
  auto progress = StartProgress(mode);
  o.progress = progress->Fn();
  auto r = manifest::VerifyPack(args.Get("--manifest"), o);
  progress->Finish();
  return r;
}

// The model whose files the manifest records when it is not the directory
// the manifest lies in (a model directory copied with its manifest), said as
// a note because verify's checks read those files; "" when it is that one.
std::string NoteModelRecordedElsewhere(const std::string& manifest_path) {
  std::string copied_from, rank_flags;
  if (auto raw = manifest::ReadManifestJson(manifest_path); raw.ok()) {
    copied_from = manifest::ModelDirRecordedElsewhere(*raw, manifest_path);
    rank_flags = manifest::RankFlagsOf(*raw);
  }
  if (copied_from.empty()) return copied_from;
  const std::string dir = std::filesystem::path(manifest_path).parent_path().string();
  const std::string here = dir.empty() ? "." : dir;
  Narrate("verify", "note: " + manifest_path + " records the shards and pack of the model in " + copied_from +
                        ", not the shards beside it in " + here +
                        " (a model directory copied with its manifest?): what is verified is the model in " +
                        copied_from + "; `k3pack build " + ShellQuoted(here) + rank_flags +
                        " --force` gives this directory a pack and manifest of its own");
  return copied_from;
}

// Damaged payloads are repairable in place from the source shards: the hint
// gives the command, with the manifest's own paths where it can be read.
Error WithRepairHint(const Error& error, const std::string& manifest_path) {
  std::string pack = "PACK", dir = "DIR", config = "CONFIG", ep;
  if (auto m = manifest::ReadManifest(manifest_path); m.ok()) {
    pack = m->expert_pack.path;
    if (!m->model.config_path.empty()) config = m->model.config_path;
    if (m->k3pack && m->k3pack->ep) {
      // A rank pack is named after the full pack; give that name back.
      const ep::Rank rank{m->k3pack->ep->size, m->k3pack->ep->rank};
      const std::string tag = rank.FileTag() + ".pack";
      if (pack.ends_with(tag)) pack = pack.substr(0, pack.size() - tag.size()) + ".pack";
      ep = " --ep-size " + std::to_string(rank.size) + " --ep-rank " + std::to_string(rank.rank);
    }
    if (!m->source.shards.empty()) dir = std::filesystem::path(m->source.shards.front().path).parent_path().string();
  }
  return error.WithHint("rewrite exactly the damaged payloads from the GGUF source and re-verify them: "
                        "`k3pack pack --repair-damaged --gguf-dir " + ShellQuoted(dir) + " --model-config " +
                        ShellQuoted(config) + " --pack " + ShellQuoted(pack) + ep +
                        "` (or rerun `k3pack build` with --restart)");
}

void PrintVerifiedText(const nlohmann::json& j) {
  std::printf("EXPERT_PACK_VERIFIED path=%s index_sha256=%s\n", j["pack"].get<std::string>().c_str(),
              j["index_sha256"].get<std::string>().c_str());
  // Holes are checked without a read: the rate is of the bytes read, and
  // the holes are said, so a sparse pack never shows a read speed of 189 GB/s.
  const uint64_t checked = j["bytes_checked"].get<uint64_t>(), read = j["bytes_read"].get<uint64_t>();
  std::string how = HumanBytes(checked);
  if (read < checked) how += " (" + HumanBytes(read) + " read, " + HumanBytes(checked - read) + " sparse holes)";
  std::printf("  shards: %zu unchanged (%s); structure ok; payloads (%s): %llu entries, %s in %s (%.1f MB/s read)\n",
              j["shards_checked"].get<size_t>(), j.value("shard_check", std::string()).c_str(),
              j["payload_mode"].get<std::string>().c_str(),
              j["entries_checked"].get<unsigned long long>(), how.c_str(),
              HumanDuration(j["seconds"].get<double>()).c_str(), j["mb_per_s"].get<double>());
  if (j["entries_checked"].get<uint64_t>() == 0 && j["payload_mode"] == "samples")
    std::printf("  no payload was compared (--samples 0): the structure and the shards' records only\n");
  if (!j.value("tokenizer_checked", true))
    std::printf("  tokenizer: not recorded in the manifest, not checked\n");
  if (j.value("digest_sidecar", "") == "missing")
    std::printf("  no digest sidecar (a pack k3pack did not write): every payload was compared with the GGUF "
                "source only\n");
  if (j.contains("ep")) {
    const auto& e = j["ep"];
    std::printf("  expert-parallel rank %s of %s (experts %s..%u): %s entries of the other ranks skipped "
                "(holes by design)\n",
                e["rank"].dump().c_str(), e["size"].dump().c_str(), e["first_expert"].dump().c_str(),
                e["end_expert"].get<uint32_t>() - 1, e["unowned_entries"].dump().c_str());
    if (e.value("sglang_store_refuses", false))
      std::printf("  SGLang's own store refuses this manifest, as it should (it serves whole packs only): serve it "
                  "with k3pack's stores\n");
    else
      std::printf("  SGLang's own store would take this rank manifest (written before rank manifests carried the "
                  "key it refuses) and serve the other ranks' experts as zeros; to have it refused, rerun this "
                  "rank's `k3pack build`, or: %s\n",
                  e.value("regenerate_with", std::string()).c_str());
  }
}

int RunVerify(const std::vector<std::string>& argv) {
  Args args(kCmd, "[--manifest] M.json|DIR [--samples N | --full [--against-source]] [--json]",
            "Verify an expert pack against its manifest: source shards unchanged (size + header digest), pack\n"
            "structure (SGLang's validator) and index digest, then payloads: N evenly spaced entries byte-compared\n"
            "with the GGUF source (default 6), or every payload against the <pack>.digests sidecar (--full).");
  args.Option("--manifest", "manifest JSON written by `k3pack manifest` / `k3pack build`, or the directory holding "
                              "it under SGLang's name", std::nullopt, true)
      .PositionalAsOption("--manifest")
      .Option("--samples", "evenly spaced payloads compared with the GGUF source (default 6)")
      .Flag("--full", "hash every payload and compare with the digest sidecar (and the default sample with the GGUF source)")
      .Flag("--against-source", "with --full: also compare every payload with the GGUF source")
      .Flag("--json", "print the result as JSON")
      .Exclusive({"--samples", "--full"}, "--full checks every payload against its digest instead of sampling")
      .Requires("--against-source", {"--full"}, "samples are always compared with the source");
  AddProgressOption(args);
  int code = 0;
  if (!args.Parse(argv, &code)) return code;
  // Usage errors (exit 2): conflicting flags and bad values.
  Status usage = [&]() -> Status {
    if (args.Has("--samples")) {
      K3_ASSIGN_OR_RETURN(int64_t n, args.GetInt("--samples"));
      if (n < 0) return Error("--samples must be non-negative");
    }
    return ProgressModeOf(args).status();
  }();
  if (!usage.ok()) return ReportError(kCmd, usage.error(), kExitUsage);
  ManifestInDirectory(args, kCmd);  // after the usage checks: their errors come first
  const std::string manifest_path = args.Get("--manifest");
  const std::string copied_from = NoteModelRecordedElsewhere(manifest_path);
  auto r = Run(args);
  if (!r.ok()) {
    const std::string& msg = r.error().message();
    if (msg.find("expert-pack payload does not match") != std::string::npos && msg.find("\nhint:") == std::string::npos) {
      return ReportError(kCmd, WithRepairHint(r.error(), manifest_path));
    }
    return ReportError(kCmd, WithMovedModelHint(r.error(), manifest_path));
  }
  nlohmann::json j = *r;
  if (!copied_from.empty()) j["model_dir_recorded"] = copied_from;
  if (args.Has("--samples") && j.value("payload_mode", "") == "samples" &&
      *args.GetInt("--samples") > j.value("entries_checked", int64_t{0})) {
    // Nothing is silently capped: say that the request covered every entry.
    Narrate("verify", "note: --samples " + args.Get("--samples") + " is more than the " +
                          std::to_string(j.value("entries_checked", int64_t{0})) +
                          " entries there are to sample: every one was checked");
  }
  if (args.Has("--json")) {
    PrintJson(j);
  } else {
    PrintVerifiedText(j);
  }
  return 0;
}

}  // namespace

K3_COMMAND("verify", "verify a pack against its manifest (sampled or full payload checks)", RunVerify);

}  // namespace k3pack::cli
