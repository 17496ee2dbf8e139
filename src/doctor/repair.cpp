// `k3pack repair --fix ssm-a`: a repaired copy of a shard set in which only
// ssm_a tensors holding raw A_log are rewritten as -exp(A_log).
//
// The input is never modified. Each output shard is copied segment by
// segment (copy_file_range, which lets the filesystem share extents; holes
// stay holes), then the repaired tensor bytes are written over their range,
// then the temp file is fsynced and renamed into place.
#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <span>

#include "doctor/internal.h"
#include "pack/copy.h"
#include "util/lock_file.h"
#include "util/utf8.h"

namespace k3pack::doctor {

namespace fs = std::filesystem;

namespace {

// Copies [0, size) of `src` into `dst` (created empty), data segments only.
Result<uint64_t> CopySparse(int src, int dst, uint64_t size) {
  uint64_t copied = 0;
  std::vector<uint8_t> buf;
  for (const Segment& seg : MapRange(src, 0, size)) {
    if (seg.hole) continue;
    uint64_t done = 0;
    bool plain = false;
    while (done < seg.length) {
      const uint64_t n = std::min<uint64_t>(seg.length - done, 1ull << 30);
      if (!plain) {
        loff_t in_off = static_cast<loff_t>(seg.offset + done), out_off = in_off;
        const ssize_t r = ::copy_file_range(src, &in_off, dst, &out_off, n, 0);
        if (r > 0) {
          done += static_cast<uint64_t>(r);
          continue;
        }
        if (r == 0) return Error("source ended early at offset " + std::to_string(seg.offset + done), ErrorKind::kEOF);
        if (errno != EXDEV && errno != ENOSYS && errno != EINVAL && errno != EOPNOTSUPP) {
          return Error::FromErrno("copy_file_range failed", errno);
        }
        plain = true;  // fall back to read + write
        buf.resize(16u << 20);
      }
      const size_t m = static_cast<size_t>(std::min<uint64_t>(n, buf.size()));
      K3_ASSIGN_OR_RETURN(size_t got, PreadFull(src, buf.data(), m, seg.offset + done));
      if (got != m) return Error("source ended early at offset " + std::to_string(seg.offset + done + got), ErrorKind::kEOF);
      K3_RETURN_IF_ERROR(PwriteFull(dst, buf.data(), m, seg.offset + done));
      done += m;
    }
    copied += seg.length;
  }
  if (::ftruncate(dst, static_cast<off_t>(size)) != 0) return Error::FromErrno("cannot set the output size", errno);
  return copied;
}

Status CopyFileAtomic(const std::string& from, const std::string& to, uint64_t* copied) {
  K3_ASSIGN_OR_RETURN(UniqueFd in, OpenReadOnly(from));
  K3_ASSIGN_OR_RETURN(uint64_t size, FileSize(from));
  K3_ASSIGN_OR_RETURN(AtomicFile out, AtomicFile::Create(to));
  auto n = CopySparse(in.get(), out.fd(), size);
  if (!n.ok()) return out.Fail(n.error());
  if (copied) *copied += *n;
  return out.Commit();
}

// OUT may be written: missing, empty, or holding a repair's own output (a
// finished one, replaced by `--force`, or an unfinished one with its
// marker, or only the temporary a kill left of the marker).
bool HoldsOnlyRepairOutput(const std::string& out_dir) {
  std::error_code ec;
  return fs::is_empty(out_dir, ec) || HoldsMarker(out_dir, kRepairMarkerName) ||
         fs::exists(fs::path(out_dir) / kRepairRecordName, ec);
}

}  // namespace

nlohmann::json RepairResult::ToJson() const {
  nlohmann::json rep = nlohmann::json::array();
  for (const RepairedTensor& r : repaired) {
    rep.push_back({{"name", r.name},
                   {"file", r.file},
                   {"data_offset", r.data_offset},
                   {"nbytes", r.nbytes},
                   {"before", {{"min", r.before.min}, {"max", r.before.max}, {"count", r.before.count}}}});
  }
  nlohmann::json j = {{"out_dir", out_dir},           {"shards_written", shards_written},
                      {"sidecars_copied", sidecars_copied}, {"repaired", rep},
                      {"bytes_copied", bytes_copied}, {"remaining_problems", remaining_problems}};
  // remaining_problems quote doctor's objects (GGUF names may be any bytes).
  if (auto bad = EscapeInvalidUtf8Members(j); !bad.empty()) j["not_utf8"] = bad;
  return j;
}

namespace {

// The ssm_a tensors to rewrite: raw A_log only. Any other failing form is
// refused with every reason, since -exp() of it would not be a trustworthy
// A_log.
Result<std::vector<const internal::SsmAVerdict*>> ChooseRepairs(const internal::ShardView& view,
                                                                const std::vector<internal::SsmAVerdict>& verdicts) {
  std::vector<const internal::SsmAVerdict*> todo;
  std::string refusals;
  for (const auto& v : verdicts) {
    const internal::Shard& sh = view.shards[v.shard];
    if (!sh.DataReadable(*v.info)) {
      refusals += "\n  " + v.name + ": its data is cut off (truncated shard)";
    } else if (!v.stats ||
               (v.info->type != GgmlType::F32 && v.info->type != GgmlType::F16 && v.info->type != GgmlType::F64)) {
      // BF16 too: gguf-py hands BF16 out as raw bytes, so SGLang refuses it
      // whatever the values; a type change would move every later byte.
      refusals += "\n  " + v.name + ": stored as " + std::string(GgmlTypeName(v.info->type)) +
                  ", not F32/F16/F64; SGLang refuses it whatever the values, and changing the type in place is "
                  "impossible";
    } else {
      switch (v.stats->form) {
        case SsmAForm::kNegExp:
        case SsmAForm::kTinyNegative: break;  // SGLang accepts these; left as they are
        case SsmAForm::kRawALog: todo.push_back(&v); break;
        default:
          refusals += "\n  " + v.name + ": values look " + SsmAFormName(v.stats->form) + " (" +
                      "min " + std::to_string(v.stats->min) + ", max " + std::to_string(v.stats->max) +
                      "); -exp() would not give a trustworthy A_log";
      }
    }
  }
  if (!refusals.empty()) {
    return Error("refusing to repair: some ssm_a tensors fail SGLang's check but are not plain raw A_log:" + refusals)
        .WithHint("raw A_log means some values > 0 and all in [-1, " + std::to_string(static_cast<int>(kMaxRawALog)) +
                  "]; see docs/doctor.md (repair rule). Re-export the GGUF from the checkpoint instead.");
  }
  if (todo.empty()) return Error("nothing to repair: no ssm_a tensor holds raw A_log (run `k3pack doctor`)");
  return todo;
}

// -exp(x) of F64 values in double: the doctor classifies them as floats,
// which would round the repaired values to float precision.
std::vector<uint8_t> NegExpOfF64(std::span<const uint8_t> raw) {
  std::vector<uint8_t> out(raw.size());
  for (size_t i = 0; i + 8 <= raw.size(); i += 8) {
    double d;
    std::memcpy(&d, raw.data() + i, 8);
    d = -std::exp(d);
    std::memcpy(out.data() + i, &d, 8);
  }
  return out;
}

// Shard i of the input, copied sparse to final_path with its repaired ssm_a
// tensors rewritten in place, published atomically.
Status WriteRepairedShard(const internal::Shard& sh, uint32_t i, const std::vector<const internal::SsmAVerdict*>& todo,
                          const std::string& final_path, RepairResult& result) {
  K3_ASSIGN_OR_RETURN(UniqueFd src, OpenReadOnly(sh.path));
  K3_ASSIGN_OR_RETURN(AtomicFile dst, AtomicFile::Create(final_path));
  // Errors name the shard being written and the one read.
  auto failed = [&](const Error& e) { return dst.Fail(e.WithContext("copying " + sh.path)); };
  auto n = CopySparse(src.get(), dst.fd(), sh.size);
  if (!n.ok()) return failed(n.error());
  result.bytes_copied += *n;
  for (const internal::SsmAVerdict* v : todo) {
    if (v->shard != i) continue;
    std::vector<uint8_t> bytes;
    if (v->info->type == GgmlType::F64) {
      bytes = NegExpOfF64(sh.Bytes(*v->info));
    } else {
      std::vector<float> fixed(v->values.size());
      for (size_t k = 0; k < fixed.size(); ++k) fixed[k] = -std::exp(v->values[k]);
      K3_ASSIGN_OR_RETURN(bytes, EncodeFloatTensor(v->info->type, fixed));
    }
    if (bytes.size() != v->info->nbytes) return Error("internal: re-encoded " + v->name + " has the wrong size");
    if (Status st = PwriteFull(dst.fd(), bytes.data(), bytes.size(), v->info->data_offset); !st.ok()) {
      return failed(st.error());
    }
    result.repaired.push_back({v->name, final_path, v->info->data_offset, v->info->nbytes, *v->stats});
  }
  K3_RETURN_IF_ERROR(dst.Commit());
  result.shards_written.push_back(final_path);
  return Status::OK();
}

// The sidecars SGLang's tooling looks for beside the shards: config.json
// and the tokenizer directory's files.
Status CopySidecars(const fs::path& src_dir, const std::string& out_dir, RepairResult& result) {
  std::error_code ec;
  if (fs::is_regular_file(src_dir / "config.json", ec)) {
    K3_RETURN_IF_ERROR(CopyFileAtomic((src_dir / "config.json").string(), (fs::path(out_dir) / "config.json").string(),
                                      &result.bytes_copied));
    result.sidecars_copied.push_back("config.json");
  }
  if (fs::is_directory(src_dir / "tokenizer", ec)) {
    fs::create_directories(fs::path(out_dir) / "tokenizer", ec);
    // Not recursive, links followed, as SGLang; a listing that fails is an
    // error, not a tokenizer left out of the output without a word.
    K3_ASSIGN_OR_RETURN(const std::vector<std::string> names,
                        RegularFileNames((src_dir / "tokenizer").string(), "tokenizer directory"));
    for (const std::string& name : names) {
      K3_RETURN_IF_ERROR(CopyFileAtomic((src_dir / "tokenizer" / name).string(),
                                        (fs::path(out_dir) / "tokenizer" / name).string(), &result.bytes_copied));
      result.sidecars_copied.push_back("tokenizer/" + name);
    }
    K3_RETURN_IF_ERROR(FsyncPath((fs::path(out_dir) / "tokenizer").string()));
  }
  return Status::OK();
}

}  // namespace

Result<RepairResult> Repair(const std::string& in, const std::string& out_dir, const RepairOptions& options) {
  for (const std::string& f : options.fixes) {
    if (f != "ssm-a") return Error("unknown fix '" + f + "' (available: ssm-a)");
  }
  std::error_code ec;
  if (fs::exists(out_dir, ec)) {
    if (!fs::is_directory(out_dir, ec) || !HoldsOnlyRepairOutput(out_dir)) {
      return Error("refusing to write into " + out_dir + ": it exists and is not an empty directory",
                   ErrorKind::kFileExists);
    }
  }
  auto say = [&](const std::string& s) {
    if (options.progress) options.progress(s);
  };

  // Examine the input with doctor's own reader and rules.
  Report scratch;
  internal::Collector col(&scratch);
  auto view = internal::DiscoverAndOpen(in, col);
  if (!view || scratch.unusable) return Error("cannot read the input " + in + ": run `k3pack doctor " + in + "`");
  for (const internal::Shard& s : view->shards) {
    if (!s.file) {
      // Why, as doctor found it (the reader's offset and rule): "is
      // unreadable" alone sent the user to another command to learn it.
      std::string why;
      for (const Finding& f : scratch.findings)
        if (f.severity == Severity::kError && (f.file == s.path || f.object == s.path)) {
          const std::string named = s.path + ": ";  // the message may name the shard again
          why = ": " + (f.message.starts_with(named) ? f.message.substr(named.size()) : f.message);
          break;
        }
      return Error("shard " + s.path + " is unreadable" + why + "; repair needs every shard (run `k3pack doctor`)");
    }
  }
  // A copy would drop the download tool's marker and look complete.
  for (const Finding* f : scratch.With("download-in-progress")) {
    return Error("refusing to repair: " + f->object + " is still being downloaded (" + f->message + ")")
        .WithHint("finish the download first; a repaired copy would hide that parts of it are still zeros");
  }
  const std::vector<internal::SsmAVerdict> verdicts = internal::ExamineSsmA(*view);  // `todo` points into it
  K3_ASSIGN_OR_RETURN(const std::vector<const internal::SsmAVerdict*> todo, ChooseRepairs(*view, verdicts));

  RepairResult result;
  result.out_dir = out_dir;
  fs::create_directories(out_dir, ec);
  if (ec) return Error::FromErrno("cannot create " + out_dir, ec.value());
  // Two repairs into one directory would leave a set of shards from both.
  K3_ASSIGN_OR_RETURN(LockFile out_lock, LockFile::Acquire(out_dir, "repairing a shard set into " + out_dir));
  {
    // Before the first shard: from here to the record, OUT is an unfinished repair.
    std::string fixes;
    for (const std::string& f : options.fixes) fixes += (fixes.empty() ? "" : ",") + f;
    const nlohmann::json marker = {{"k3pack_repair_in_progress", {{"input", ResolvedPathOrGiven(in)}, {"fix", fixes}}}};
    K3_RETURN_IF_ERROR(WriteFileAtomic((fs::path(out_dir) / kRepairMarkerName).string(), marker.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n"));
  }
  for (uint32_t i = 0; i < view->shards.size(); ++i) {
    const std::string final_path = (fs::path(out_dir) / fs::path(view->shards[i].path).filename()).string();
    say("repair: writing " + final_path);
    K3_RETURN_IF_ERROR(WriteRepairedShard(view->shards[i], i, todo, final_path, result));
  }
  if (options.copy_sidecars) K3_RETURN_IF_ERROR(CopySidecars(view->dir, out_dir, result));
  if (!options.keep_marker) {
    K3_RETURN_IF_ERROR(FsyncPath(out_dir));  // the files are there before the marker goes
    fs::remove(fs::path(out_dir) / kRepairMarkerName, ec);
  }
  K3_RETURN_IF_ERROR(FsyncPath(out_dir));
  say("repair: checking the output");
  K3_ASSIGN_OR_RETURN(result.remaining_problems, CheckRepairedOutput(out_dir, options.profile));
  return result;
}

Result<std::vector<std::string>> CheckRepairedOutput(const std::string& out_dir, kimi::Profile profile) {
  // The whole doctor: no ssm_a error may remain.
  DiagnoseOptions dopt;
  dopt.profile = profile;
  const Report check = Diagnose({out_dir}, dopt);
  std::vector<std::string> remaining;
  for (const Finding& f : check.findings) {
    // The repair's own marker stands until its record is written, after this.
    if (f.severity != Severity::kError || f.code == "repair-unfinished") continue;
    if (f.code.rfind("ssm-a-", 0) == 0) {
      return Error("internal error: the repaired copy still fails: " + f.code + " " + f.object + ": " + f.message);
    }
    remaining.push_back(f.code + " " + f.object);
  }
  return remaining;
}

}  // namespace k3pack::doctor
