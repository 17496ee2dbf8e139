// `k3pack load`: stream the non-routed weights of a manifest exactly as the
// SGLang server would receive them, and report what came out (counts,
// bytes, throughput), or dump every tensor as a .npy file for inspection.
#include <sys/resource.h>

#include <csignal>
#include <cstdlib>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/implied_inputs.h"
#include "cli/output_rule.h"
#include "cli/preflight.h"
#include "k3pack/loader.h"
#include "loader/npy.h"
#include "pack/build_inputs.h"
#include "util/file.h"
#include "util/format.h"
#include "util/lock_file.h"
#include "util/json_text.h"

namespace k3pack::cli {
namespace {

using loader::NamedTensor;
using nlohmann::json;

std::string Bytes(uint64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.2f %s" : "%.0f %s", v, units[u]);
  return buf;
}

uint64_t PeakRssBytes() {
  struct rusage ru {};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;
}

// Reads every byte of a tensor (a cheap order-dependent checksum), in
// pieces, releasing each piece of a mapped view after reading it so a big
// embedding never sits in memory whole.
uint64_t TouchAndSum(const NamedTensor& t) {
  constexpr size_t kPiece = size_t{16} << 20;
  uint64_t acc = 0;
  for (size_t off = 0; off < t.data.size(); off += kPiece) {
    const auto piece = t.data.subspan(off, std::min(kPiece, t.data.size() - off));
    const uint8_t* p = piece.data();
    size_t n = piece.size();
    uint64_t a = 0, b = 0, c = 0, d = 0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
      uint64_t w[4];
      std::memcpy(w, p + i, 32);
      a += w[0];
      b ^= w[1];
      c += w[2];
      d ^= w[3];
    }
    for (; i < n; ++i) a += p[i];
    acc = acc * 1099511628211ULL + (a ^ (b << 1) ^ (c << 2) ^ (d << 3));
    if (t.zero_copy) loader::ReleasePages(piece);
  }
  return acc;
}

std::string SafeFileName(const std::string& name) {
  std::string s;
  for (char c : name) s.push_back(c == '/' || c == '\0' ? '_' : c);
  return s;
}

// Present in DIR while `load --dump` writes it: an interrupted dump (Ctrl-C,
// kill, a failed write) is then the next dump's to start over, where its
// .npy files alone were refused as "not the dump of this run". A JSON object
// (docs/FORMATS.md): {"k3pack_dump_in_progress": {"manifest": M, "found":
// [the .npy files DIR held before that dump began]}}.
constexpr const char* kDumpPartialMarker = ".k3pack-dump.partial";

bool IsNpyFile(const std::filesystem::directory_entry& e) {
  std::error_code ec;
  return e.is_regular_file(ec) && !e.is_symlink(ec) && e.path().extension() == ".npy";
}

// The first entry of `dir` that is not a regular .npy file (what a dump
// holds), or "" when there is none.
std::string FirstNonNpyEntry(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (!IsNpyFile(e)) return e.path().string();
  }
  return "";
}

std::vector<std::string> NpyFilesIn(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (IsNpyFile(e)) names.push_back(e.path().filename().string());
  }
  return names;
}

// Whether DIR holds an unfinished dump: its marker, or only the temporary a
// kill between naming it and renaming it left. *found: the marker's list of
// files that were there before that dump; nullopt when it cannot be read
// (the temporary's list was not read, and starting over took every .npy
// file of DIR, the user's own among them, for the dump's).
bool UnfinishedDumpIn(const std::string& dir, std::optional<std::set<std::string>>* found) {
  found->reset();
  if (!HoldsMarker(dir, kDumpPartialMarker)) return false;
  if (auto text = ReadMarker(dir, kDumpPartialMarker)) {
    const json j = ParseJsonOrDiscarded(*text);
    if (j.is_object() && j.contains("k3pack_dump_in_progress") && j["k3pack_dump_in_progress"].is_object() &&
        j["k3pack_dump_in_progress"].contains("found") && j["k3pack_dump_in_progress"]["found"].is_array()) {
      found->emplace();
      for (const auto& f : j["k3pack_dump_in_progress"]["found"]) {
        if (f.is_string()) (*found)->insert(f.get<std::string>());
      }
    }
  }
  return true;
}

// Starting over from an interrupted dump: what it wrote goes (every .npy
// file DIR did not hold before it, which may be another model's), and so do
// its marker's temporary and the .npy writers' named temporaries
// (`<name>.npy.<pid>.<n>.tmp`, where the filesystem has no unnamed ones).
// What is left is what the interrupted dump found, as an uninterrupted one
// leaves it. Without its list (`found` nullopt) no .npy file goes: the
// dump writes its own anew.
void RemoveUnfinishedDump(const std::string& dir, const std::optional<std::set<std::string>>& found) {
  std::error_code ec;
  std::vector<std::filesystem::path> doomed;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const size_t npy = name.rfind(".npy.");
    const bool temp = IsAtomicTempNameOf(name, kDumpPartialMarker) ||
                      (npy != std::string::npos && IsAtomicTempNameOf(name, name.substr(0, npy + 4)));
    if (temp || (found && IsNpyFile(e) && !found->contains(name))) doomed.push_back(e.path());
  }
  for (const auto& path : doomed) std::filesystem::remove(path, ec);
}

// Marks DIR as a dump under way, before its first .npy file.
Status MarkDumpInProgress(const std::string& dir, const std::string& manifest) {
  const json marker = {{"k3pack_dump_in_progress", {{"manifest", ResolvedPathOrGiven(manifest)}, {"found", NpyFilesIn(dir)}}}};
  return WriteFileAtomic(dir + "/" + kDumpPartialMarker,
                         marker.dump(-1, ' ', false, json::error_handler_t::replace) + "\n");
}

// The dump is whole: DIR is no longer an interrupted dump.
Status UnmarkDump(const std::string& dir) {
  K3_RETURN_IF_ERROR(RemoveIfExists(dir + "/" + kDumpPartialMarker));
  return FsyncPath(dir);
}

// What the manifest's stream will emit, from one walk that touches no
// tensor's bytes (views only; a fraction of a second at full scale): its
// bytes (the progress total) and, given a dump directory, the bytes the dump
// takes beyond the files of the same names already there (--force replaces
// them).
struct StreamSize {
  uint64_t emitted = 0, dump_needs = 0;
};
Result<StreamSize> SizeStream(const std::string& manifest, loader::LoadOptions opts, const std::string& dump_dir) {
  opts.copy = opts.prefetch = opts.populate = opts.verify_metadata = false;
  opts.on_shard = nullptr;
  K3_ASSIGN_OR_RETURN(loader::NonExpertStream stream, loader::NonExpertStream::Open(manifest, opts));
  StreamSize size;
  uint64_t npy = 0, replaced = 0;
  K3_RETURN_IF_ERROR(stream.ForEach([&](NamedTensor&& t) -> Status {
    size.emitted += t.data.size();
    if (!dump_dir.empty()) {
      npy += loader::NpyHeader(t).size() + t.data.size();
      if (auto there = FileSize(dump_dir + "/" + SafeFileName(t.name) + ".npy"); there.ok()) replaced += *there;
    }
    return Status::OK();
  }));
  size.dump_needs = npy > replaced ? npy - replaced : 0;
  return size;
}

// A dump that cannot fit is refused before its first file: it wrote until
// the disk was full (55 GB of a full-scale model's 62 GB), then failed.
Status CheckDumpFits(const std::string& dir, const std::string& manifest, uint64_t need) {
  std::filesystem::path at = dir.empty() ? "." : dir;
  std::error_code ec;
  while (!std::filesystem::exists(at, ec) && at.has_parent_path() && at.parent_path() != at) at = at.parent_path();
  if (!std::filesystem::exists(at, ec)) at = ".";
  K3_ASSIGN_OR_RETURN(const uint64_t free, pack::AvailableBytes(at.string()));
  if (need <= free) return Status::OK();
  return Error::FromErrno("--dump " + dir + ": the dump needs " + HumanBytes(need) +
                              " more (every emitted tensor as .npy) and the filesystem of " + at.string() + " has " +
                              HumanBytes(free) + " free",
                          ENOSPC)
      .WithHint("free space there or pass --dump a directory on another filesystem; `k3pack load " +
                ShellQuoted(manifest) + "` checks the whole stream without writing it");
}

// What a dump run decided about DIR, under DIR's lock.
struct DumpDecision {
  std::optional<LockFile> lock;  // held from the look at DIR to the last file
  bool compare = false;          // the same dump may be there: compare, write nothing
};

// The overwrite rule for the dump (output_rule.h), under DIR's lock as
// synth's and repair's outputs: two dumps into one DIR mixed the two
// models' files, or the later one refused the earlier one's files as "not
// the dump of this run"; now the second waits (--wait) or is refused naming
// the first. Which files a run writes is known only as the tensors stream,
// so a non-empty DIR holding only .npy files is a candidate for "already
// built": the run compares each tensor's .npy bytes with the file instead of
// writing it, and DIR is already built when it holds exactly those files
// (left untouched); anything else is refused without --force. An
// interrupted dump (its marker) is started over.
Result<DumpDecision> DecideDump(const std::string& dir, bool force, const std::string& manifest,
                                uint64_t dump_needs) {
  DumpDecision d;
  auto take_lock = [&]() -> Status {
    K3_ASSIGN_OR_RETURN(LockFile taken, LockFile::Acquire(dir, "writing a tensor dump into " + dir));
    d.lock = std::move(taken);
    return Status::OK();
  };
  auto look = [&]() -> Status {
    std::optional<std::set<std::string>> found;
    if (UnfinishedDumpIn(dir, &found)) {
      Narrate("load", "note: " + dir + " holds an interrupted dump; starting over");
      RemoveUnfinishedDump(dir, found);
      d.compare = false;
      return Status::OK();
    }
    const std::string foreign = FirstNonNpyEntry(dir);
    OutputSpec spec;
    spec.option = "--dump";
    spec.path = dir;
    spec.directory = true;
    spec.force = force;
    spec.is_finished = [&]() -> Result<bool> { return foreign.empty(); };
    spec.why_refused = "it holds " + foreign + ", which `k3pack load --dump` does not write";
    K3_ASSIGN_OR_RETURN(OutputAction action, DecideOutput(spec));
    d.compare = action == OutputAction::kAlreadyBuilt;
    return Status::OK();
  };
  if (std::error_code ec; std::filesystem::is_directory(dir, ec)) K3_RETURN_IF_ERROR(take_lock());
  K3_RETURN_IF_ERROR(look());
  if (!d.compare) K3_RETURN_IF_ERROR(CheckOutputDirWritable("--dump", dir));
  if (!d.compare) K3_RETURN_IF_ERROR(CheckDumpFits(dir, manifest, dump_needs));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Error("cannot create dump directory " + dir + ": " + ec.message());
  if (!d.lock) {
    // Another dump may have made and filled it since the first look (this
    // one then waited for it): look again, locked.
    K3_RETURN_IF_ERROR(take_lock());
    K3_RETURN_IF_ERROR(look());
  }
  if (!d.compare) K3_RETURN_IF_ERROR(MarkDumpInProgress(dir, manifest));
  return d;
}

// The command's options and the rules between them.
Args LoadArgs() {
  Args args("load", "[--manifest] M.json|DIR [--summary | --dump DIR | --json] [--verify-metadata]",
            "Streams the non-routed weights named by an adapter manifest in SGLang's exact order and form\n"
            "(routed expert payloads are skipped without being read) and reports what was emitted.");
  args.Option("--manifest", "adapter manifest (SGLANG-KIMI-GGMLMOEPACK-ADAPTER-v1), or the directory holding it under "
                              "SGLang's name", std::nullopt, true)
      .PositionalAsOption("--manifest")
      .Flag("--summary", "print a summary (the default)")
      .Option("--dump", "write every emitted tensor to DIR/<name>.npy (a new or empty DIR; the same dump already there is "
                        "reported as already built)")
      .Flag("--force", "with --dump: write into a non-empty DIR (files of the same name are replaced)")
      .Flag("--json", "print the summary as JSON")
      .Flag("--list", "also list every emitted tensor (name, dtype, shape, kind)")
      .Flag("--verify-metadata",
            "also check each shard's metadata_sha256 (and whole-file sha256 where the manifest has one) and every "
            "tensor's offset/size/shape")
      .Flag("--sglang-compat", "reproduce SGLang exactly: BF16 as raw uint8 bytes, no ssm_a shape check")
      .Flag("--no-read", "do not read tensor bytes (walk and check only)")
      .Flag("--copy", "read every tensor with pread into a fresh buffer instead of handing out map views")
      .Flag("--populate", "map each tensor's pages in with one MADV_POPULATE_READ instead of page faults")
      .Flag("--quiet", "deprecated: same as --progress none")
      .Exclusive({"--summary", "--dump", "--json"})
      .Exclusive({"--no-read", "--copy"}, "--copy reads every tensor into a fresh buffer")
      .Exclusive({"--no-read", "--populate"}, "--populate reads every tensor's pages in")
      .Exclusive({"--no-read", "--dump"}, "--dump reads every tensor to write it")
      .Exclusive({"--copy", "--populate"}, "--populate maps the views that --copy replaces with fresh buffers")
      .Exclusive({"--quiet", "--progress"}, "--quiet is the old spelling of --progress none")
      .Requires("--force", {"--dump"}, "it only applies to the dump directory");
  AddProgressOption(args);
  AddWaitOption(args);
  args.Requires("--wait", {"--dump"}, "only the dump directory is written, and so locked");
  return args;
}

// What the options ask the load for.
struct LoadValues {
  ProgressMode mode{};
  bool as_json = false;
  bool list = false;
  bool read_bytes = true;
  std::string dump_dir;  // "" without --dump
};

// Reports a bad --progress and returns its exit status; 0 when the values
// are good.
int ParseLoadValues(const Args& args, LoadValues* out) {
  auto mode = ProgressModeOf(args);
  if (!mode.ok()) return ReportError("load", mode.error(), 2);
  if (args.Has("--quiet")) {
    Narrate("load", "note: --quiet is deprecated and will be removed; use --progress none");
    *mode = ProgressMode::kNone;
  }
  *out = LoadValues{*mode, args.Has("--json"), args.Has("--list"), !args.Has("--no-read"), args.Get("--dump")};
  return 0;
}

loader::LoadOptions LoadOptionsOf(const Args& args, const LoadValues& v) {
  loader::LoadOptions opts;
  opts.verify_metadata = args.Has("--verify-metadata");
  opts.sglang_compat = args.Has("--sglang-compat");
  opts.copy = args.Has("--copy");
  opts.populate = args.Has("--populate");
  // The stream's read-ahead (MADV_WILLNEED on the next tensors) makes the
  // kernel read every non-routed byte: --no-read must not ask for them (62 GB
  // and 49 s on a full-size checkpoint for a walk that reads nothing).
  opts.prefetch = v.read_bytes || !v.dump_dir.empty();
  return opts;
}

// What the stream emitted, as the summary reports it.
struct LoadTally {
  std::map<std::string, uint64_t> by_kind, by_dtype;
  uint64_t checksum = 0, bytes = 0;
  json listing = json::array();      // --list --json
  std::set<std::string> dump_files;  // the files this run writes (or compared)
  std::string dump_differs;          // compare_dump: why DIR is not this run's dump
};

// K3PACK_TEST_STOP_AFTER_DUMP_FILES: the N of DumpTensor's test seam (0: none).
size_t StopAfterDumpFiles() {
  const char* seam = std::getenv("K3PACK_TEST_STOP_AFTER_DUMP_FILES");
  return seam ? std::strtoull(seam, nullptr, 10) : 0;
}

// --dump: writes the tensor's .npy file into DIR or, when DIR may already
// hold this run's dump (`compare_dump`), compares the file with it.
Status DumpTensor(const std::string& dump_dir, bool compare_dump, size_t stop_after_files, const NamedTensor& t,
                  LoadTally* tally) {
  const std::string file = SafeFileName(t.name) + ".npy", path = dump_dir + "/" + file;
  const bool first = tally->dump_files.insert(file).second;
  if (compare_dump) {
    K3_ASSIGN_OR_RETURN(bool same, loader::NpyFileHolds(path, t));
    if (!same || !first) {
      // Stops the stream: the rerun's dump is not the one there.
      tally->dump_differs = path + (!first                      ? " would be written twice by this run"
                                    : std::filesystem::exists(path) ? " differs from what this run writes"
                                                                    : " is missing");
      return Error(tally->dump_differs);
    }
  } else {
    K3_RETURN_IF_ERROR(loader::WriteNpy(path, t));
    // Test seam: stop (SIGSTOP) once N files are written, so a test
    // interrupts a dump half done with a real signal.
    if (tally->dump_files.size() == stop_after_files) ::raise(SIGSTOP);
  }
  return Status::OK();
}

// --list: the tensor's line, or with --json its entry.
void ListTensor(const NamedTensor& t, bool as_json, json* listing) {
  if (as_json) {
    listing->push_back({{"name", t.name}, {"source", t.source_name}, {"kind", loader::TensorKindName(t.kind)},
                        {"dtype", loader::DTypeName(t.dtype)}, {"shape", t.shape}, {"nbytes", t.data.size()},
                        {"zero_copy", t.zero_copy}});
  } else {
    std::cout << t.name << "  " << loader::DTypeName(t.dtype) << loader::PyTupleRepr(t.shape) << "  "
              << loader::TensorKindName(t.kind) << (t.zero_copy ? " (view)" : "") << "  <- " << t.source_name
              << "\n";
  }
}

// Every tensor of the stream: counted, then dumped (or compared with the
// dump there) or read, and listed. `pr` is the progress line the stream's
// shard callback updates too.
Status StreamTensors(loader::NonExpertStream* stream, const LoadValues& v, bool compare_dump,
                     ProgressReporter* progress, Progress* pr, LoadTally* tally) {
  const size_t stop_after_files = StopAfterDumpFiles();
  Status st = stream->ForEach([&](NamedTensor&& t) -> Status {
    tally->by_kind[loader::TensorKindName(t.kind)]++;
    tally->by_dtype[loader::DTypeName(t.dtype)]++;
    tally->bytes += t.data.size();
    pr->done_bytes = tally->bytes;
    progress->Update(*pr);
    if (!v.dump_dir.empty()) {
      K3_RETURN_IF_ERROR(DumpTensor(v.dump_dir, compare_dump, stop_after_files, t, tally));
    } else if (v.read_bytes) {
      tally->checksum = tally->checksum * 31 + TouchAndSum(t);
    }
    if (v.list) ListTensor(t, v.as_json, &tally->listing);
    return Status::OK();
  });
  if (st.ok()) {
    pr->done_objects = pr->total_objects;
    progress->Update(*pr);
  }
  return st;
}

// The first entry of DIR that is not a file of this run's dump, as the
// reason DIR is not that dump ("" when there is none).
std::string EntryNotDumpedByThisRun(const std::string& dump_dir, const std::set<std::string>& dump_files) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dump_dir, ec)) {
    if (!dump_files.contains(e.path().filename().string())) return e.path().string() + " is not written by this run";
  }
  return "";
}

// Refuses DIR, which holds something other than this run's dump.
int RefuseDumpDir(const std::string& dump_dir, const std::string& dump_differs) {
  OutputSpec dump_spec;
  dump_spec.option = "--dump";
  dump_spec.path = dump_dir;
  dump_spec.directory = true;
  dump_spec.why_refused = "it is not the dump of this run (" + dump_differs + ")";
  return ReportError("load", RefuseExisting(dump_spec));
}

// How long the stream took, and its rate.
struct LoadTime {
  double secs = 0;
  double gbps = 0;
};

void PrintLoadJson(const Args& args, const LoadValues& v, const loader::LoadStats& s, const LoadTally& tally,
                   const LoadTime& time) {
  json out = {{"manifest", args.Get("--manifest")},
              {"shards", s.shards_opened},
              {"source_tensors", s.source_tensors},
              {"routed_skipped", s.routed_skipped},
              {"routed_skipped_bytes", s.routed_skipped_bytes},
              {"emitted", s.emitted},
              {"emitted_bytes", tally.bytes},
              {"zero_copy_tensors", s.zero_copy_tensors},
              {"zero_copy_bytes", s.zero_copy_bytes},
              {"computed_bytes", s.computed_bytes},
              {"copied_bytes", s.copied_bytes},
              {"by_kind", tally.by_kind},
              {"by_dtype", tally.by_dtype},
              {"bytes_read", v.read_bytes || !v.dump_dir.empty()},
              {"seconds", time.secs},
              {"gb_per_s", time.gbps},
              {"peak_rss_bytes", PeakRssBytes()}};
  if (v.read_bytes && v.dump_dir.empty()) out["checksum"] = tally.checksum;
  if (v.list) out["tensors"] = tally.listing;
  PrintJson(out);
}

void PrintLoadSummary(const Args& args, const LoadValues& v, const loader::LoadStats& s, const LoadTally& tally,
                      const LoadTime& time, bool compare_dump) {
  std::cout << "manifest        " << args.Get("--manifest") << "\n"
            << "shards          " << s.shards_opened << "\n"
            << "source tensors  " << s.source_tensors << " (" << s.routed_skipped << " routed aggregates skipped, "
            << Bytes(s.routed_skipped_bytes) << " not read)\n"
            << "emitted         " << s.emitted << " tensors, " << Bytes(tally.bytes) << " (" << s.zero_copy_tensors
            << " zero-copy views, " << Bytes(s.zero_copy_bytes) << "; " << Bytes(s.computed_bytes) << " computed"
            << (s.copied_bytes ? " in fresh buffers, " + Bytes(s.copied_bytes) + " read with pread" : std::string()) << ")\n";
  std::cout << "by kind        ";
  for (const auto& [k, n] : tally.by_kind) std::cout << " " << k << "=" << n;
  std::cout << "\nby dtype       ";
  for (const auto& [k, n] : tally.by_dtype) std::cout << " " << k << "=" << n;
  char rate[64];
  std::snprintf(rate, sizeof rate, "%.3f s, %.2f GB/s", time.secs, time.gbps);
  std::cout << "\ntime            " << rate << (v.read_bytes || !v.dump_dir.empty() ? "" : " (bytes not read)") << "\n"
            << "peak RSS        " << Bytes(PeakRssBytes()) << "\n";
  if (compare_dump) {
    ReportAlreadyBuilt("load", v.dump_dir, false);
  } else if (!v.dump_dir.empty()) {
    std::cout << "dumped to       " << v.dump_dir << "\n";
  }
}

int RunLoad(const std::vector<std::string>& argv) {
  Args args = LoadArgs();
  int code = 0;
  if (!args.Parse(argv, &code)) return code;
  ManifestInDirectory(args, "load");
  LoadValues v;
  if (int failed = ParseLoadValues(args, &v)) return failed;
  if (Status e = CheckInputExists("--manifest", args.Get("--manifest"), ".manifest.json"); !e.ok()) {
    return ReportError("load", e.error());
  }
  auto wait = LockWaitOf(args, "load");
  if (!wait.ok()) return ReportError("load", wait.error(), kExitUsage);
  const ScopedLockWait waiting(*wait);
  loader::LoadOptions opts = LoadOptionsOf(args, v);
  // One walk serves the dump's room check and the progress total.
  Result<StreamSize> size = StreamSize{};
  if (!v.dump_dir.empty() || v.mode != ProgressMode::kNone) size = SizeStream(args.Get("--manifest"), opts, v.dump_dir);
  DumpDecision dump;  // compare: false without --dump
  if (!v.dump_dir.empty()) {
    if (!size.ok()) return ReportError("load", WithMovedModelHint(size.error(), args.Get("--manifest")));
    auto decided = DecideDump(v.dump_dir, args.Has("--force"), args.Get("--manifest"), size->dump_needs);
    if (!decided.ok()) return ReportError("load", WithMovedModelHint(decided.error(), args.Get("--manifest")));
    dump = std::move(*decided);
  }
  // Progress: bytes emitted of the total a walk of the stream gives up front
  // (the fraction and ETA moved by whole shards before), and shards entered.
  auto progress = StartProgress(v.mode);
  Progress pr;
  pr.phase = "load";
  pr.unit = "shards";
  if (progress->mode() != ProgressMode::kNone) {
    // A stream that could not be walked fails the same way below.
    if (size.ok()) pr.total_bytes = size->emitted;
    opts.on_shard = [&](uint32_t index, const std::string&, uint32_t count) {
      pr.done_objects = index;
      pr.total_objects = count;
      progress->Update(pr);
    };
  }
  auto t0 = std::chrono::steady_clock::now();
  auto stream = loader::NonExpertStream::Open(args.Get("--manifest"), opts);
  if (!stream.ok()) return ReportError("load", WithMovedModelHint(stream.error(), args.Get("--manifest")));
  LoadTally tally;
  Status st = StreamTensors(&*stream, v, dump.compare, progress.get(), &pr, &tally);
  progress->Finish();
  if (dump.compare && tally.dump_differs.empty() && st.ok()) {
    // Every file of this run's dump is there with its bytes; DIR is that
    // dump only if it holds nothing else.
    tally.dump_differs = EntryNotDumpedByThisRun(v.dump_dir, tally.dump_files);
  }
  if (!tally.dump_differs.empty()) return RefuseDumpDir(v.dump_dir, tally.dump_differs);
  if (!st.ok()) return ReportError("load", WithMovedModelHint(st.error(), args.Get("--manifest")));
  if (!v.dump_dir.empty() && !dump.compare) {
    if (Status unmarked = UnmarkDump(v.dump_dir); !unmarked.ok()) return ReportError("load", unmarked.error());
  }
  LoadTime time;
  time.secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  time.gbps = time.secs > 0 ? static_cast<double>(tally.bytes) / time.secs / 1e9 : 0;
  if (v.as_json) {
    PrintLoadJson(args, v, stream->stats(), tally, time);
  } else {
    PrintLoadSummary(args, v, stream->stats(), tally, time, dump.compare);
  }
  return 0;
}

}  // namespace

K3_COMMAND("load", "stream the non-routed weights of a manifest as SGLang receives them", RunLoad);

}  // namespace k3pack::cli
