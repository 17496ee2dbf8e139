#include "kimi/synth_output.h"

#include <filesystem>
#include <optional>

#include "util/file.h"
#include "util/lock_file.h"
#include "util/output_guard.h"

namespace k3pack::kimi {
namespace {

namespace fs = std::filesystem;

// An interrupted synth's temp files (`<name>.tmp` of the atomic writers) in
// the directory and its tokenizer/: ours to remove before starting over.
void RemoveTempFiles(const std::string& dir) {
  for (const fs::path& d : {fs::path(dir), fs::path(dir) / "tokenizer"}) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(d, ec)) {
      if (e.is_regular_file(ec) && e.path().extension() == ".tmp") fs::remove(e.path(), ec);
    }
  }
}

// GGUF files without the record of the options they were written with: a
// model an older k3pack's synth wrote (before the record existed), or one
// another tool wrote. Either way this k3pack cannot tell it is the model
// asked for, and the refusal says why.
bool HoldsGgufWithoutSynthRecord(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(fs::path(dir) / kProfileSidecar, ec)) return false;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".gguf") return true;
  }
  return false;
}

}  // namespace

Result<SynthOutput> WriteSynthModelInto(const SynthOutputRequest& request) {
  const synth::SynthOptions& o = request.options;
  const std::string& dir = o.out_dir;
  const nlohmann::json recipe = SynthRecipe(o);
  const std::string marker = (fs::path(dir) / kSynthPartialMarker).string();
  OutputSpec spec;
  spec.option = request.option;
  spec.path = dir;
  spec.directory = true;
  spec.force = request.force;
  spec.force_option = request.force_option;
  spec.is_finished = [&]() -> Result<bool> { return SynthSidecarRecords(dir, recipe, request.args_given); };
  spec.why_refused = request.why_refused;
  if (HoldsGgufWithoutSynthRecord(dir)) {
    spec.why_refused += " (it holds GGUF files but no " + std::string(kProfileSidecar) +
                        ", the record of the options `k3pack synth` wrote them with: an older k3pack, or another "
                        "tool, wrote them)";
  }
  // Held from the look at the directory to the last file: a second synth
  // into it took the first one's marker for an interrupted run and removed
  // its temporary files under it. A missing directory is locked once made.
  std::optional<LockFile> lock;
  auto take_lock = [&]() -> Status {
    K3_ASSIGN_OR_RETURN(LockFile taken, LockFile::Acquire(dir, "writing a synthetic model into " + dir));
    lock = std::move(taken);
    return Status::OK();
  };
  if (std::error_code ec; fs::is_directory(dir, ec)) K3_RETURN_IF_ERROR(take_lock());
  // true: the finished model is there.
  auto look = [&]() -> Result<bool> {
    if (HoldsMarker(dir, kSynthPartialMarker)) {
      // Our own interrupted (or failed) write: start over, as its message said.
      if (request.note) request.note(dir + " holds an interrupted synth; starting over");
      RemoveTempFiles(dir);
      return false;
    }
    K3_ASSIGN_OR_RETURN(OutputAction action, DecideOutput(spec));
    return action == OutputAction::kAlreadyBuilt;
  };
  SynthOutput out;
  K3_ASSIGN_OR_RETURN(out.already_built, look());
  if (out.already_built) return out;
  // Named by the option, as every writer names a read-only place.
  K3_RETURN_IF_ERROR(CheckOutputDirWritable(request.option, dir));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Error("cannot create directory " + dir + ": " + ec.message());
  if (!lock) {
    K3_RETURN_IF_ERROR(take_lock());
    // Another synth may have made and filled it since the first look (then
    // this one waited for it, or it was quicker still): look again, locked.
    K3_ASSIGN_OR_RETURN(out.already_built, look());
    if (out.already_built) return out;
  }
  // Marked before the first byte, and the old sidecar dropped: until the new
  // sidecar is written the directory is no finished model.
  K3_RETURN_IF_ERROR(WriteFileAtomic(marker, "k3pack synth is writing this directory; the next synth into it starts over\n"));
  fs::remove(fs::path(dir) / kProfileSidecar, ec);
  K3_ASSIGN_OR_RETURN(out.written, synth::WriteSynthModel(o));
  K3_ASSIGN_OR_RETURN(out.profile, WriteSynthSidecar(dir, out.written.config_path, recipe));
  fs::remove(marker, ec);
  return out;
}

}  // namespace k3pack::kimi
