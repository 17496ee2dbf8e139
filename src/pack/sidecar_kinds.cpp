#include "pack/sidecar_kinds.h"

#include <filesystem>

#include "k3pack/pack.h"
#include "pack/checkpoint_file.h"
#include "pack/sidecars.h"
#include "util/file.h"
#include "util/output_guard.h"

namespace k3pack::pack {
namespace {

namespace fs = std::filesystem;

// The checkpoint is padded to kCheckpointFileBytes; its format key comes
// after the fingerprint (keys are sorted), well inside the first KiB.
constexpr size_t kLook = kCheckpointFileBytes;

bool HoldsKind(const std::string& head, SidecarKind kind) {
  switch (kind) {
    case SidecarKind::kDigests:
      return BeginsMagic(head, std::string_view(reinterpret_cast<const char*>(kDigestsMagic.data()), 16));
    case SidecarKind::kPartialPack: return BeginsMagic(head, "GGMLMOEPACKv1");
    case SidecarKind::kCheckpoint: return head.find("\"K3PACK-PACK-CHECKPOINT-v1\"") != std::string::npos;
    case SidecarKind::kInputs: return head.find("\"K3PACK-PACK-INPUTS-v1\"") != std::string::npos;
  }
  return false;
}

const char* KindName(SidecarKind kind) {
  switch (kind) {
    case SidecarKind::kDigests: return "a k3pack digest sidecar";
    case SidecarKind::kPartialPack: return "a partial Expert Pack";
    case SidecarKind::kCheckpoint: return "a k3pack build checkpoint";
    case SidecarKind::kInputs: return "a k3pack record of a pack's inputs";
  }
  return "a k3pack file";
}

}  // namespace

std::vector<PackSidecar> PackSidecarsOf(const std::string& pack, bool building) {
  std::vector<PackSidecar> out = {{DigestsPathFor(pack), "its .digests", SidecarKind::kDigests},
                                  {InputsRecordPathFor(pack), "its .inputs", SidecarKind::kInputs}};
  if (!building) return out;
  const std::string ckpt = CheckpointPathFor(pack);
  out.push_back({PartialPathFor(pack), "its .partial", SidecarKind::kPartialPack});
  out.push_back({JournalPathFor(pack), "its .partial.digests", SidecarKind::kDigests});
  out.push_back({ckpt, "its .partial.checkpoint", SidecarKind::kCheckpoint});
  out.push_back({CheckpointSparePathFor(ckpt), "its .partial.checkpoint.spare", SidecarKind::kCheckpoint});
  out.push_back({ckpt + ".tmp", "its .partial.checkpoint.tmp", SidecarKind::kCheckpoint});
  return out;
}

std::string NotOurSidecar(const std::string& path, SidecarKind kind) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) return "";
  // Unreadable: nothing tells it is ours (an empty head would have passed it
  // as a crash's leftover, to be replaced).
  const auto read = ReadFileHead(path, kLook);
  if (!read.ok()) return "it cannot be read, so k3pack cannot tell it is " + std::string(KindName(kind));
  const std::string& head = *read;
  // What a crash leaves: a file created but not yet written (the journal's
  // 128-byte header stays zero until it is sealed, while its records are
  // written; the checkpoint's spare is allocated before it is written).
  const std::string start = head.substr(0, kDigestsHeaderBytes);
  if (start.find_first_not_of('\0') == std::string::npos || HoldsKind(head, kind)) return "";
  return "it is " + DescribeFileStart(path) + ", not " + KindName(kind);
}

Status CheckSideFileNamesFit(const std::string& option, const std::string& pack, bool building) {
  std::vector<std::string> written = {LockPathFor(pack)};
  for (const PackSidecar& s : PackSidecarsOf(pack, building)) written.push_back(s.path);
  const size_t pack_name = fs::path(pack).filename().string().size();
  size_t longest = 0;
  std::string longest_path;
  for (const std::string& path : written) {
    const size_t bytes = fs::path(path).filename().string().size();
    if (bytes > longest) longest = bytes, longest_path = path;
  }
  if (longest <= kFileNameMax) return Status::OK();
  return Error(option + " " + pack + ": the pack's name is " + std::to_string(pack_name) + " bytes, and " +
               (building ? "a build" : "the writer") + " writes " + longest_path + " beside it, a name of " +
               std::to_string(longest) + " bytes, past the " + std::to_string(kFileNameMax) +
               "-byte limit of a file name")
      .WithHint("give the pack a name of at most " + std::to_string(kFileNameMax - (longest - pack_name)) + " bytes");
}

Status CheckSidecarsAreOurs(const std::string& option, const std::string& pack, const std::string& force_option,
                            bool building) {
  for (const PackSidecar& s : PackSidecarsOf(pack, building)) {
    std::error_code ec;
    // The name is what the writers replace or remove: a link is looked at as
    // its target's kind, since removing the name keeps the target.
    const fs::file_status lst = fs::symlink_status(s.path, ec);
    if (!fs::exists(lst)) continue;
    const fs::file_status st = fs::status(s.path, ec);
    std::string what;
    if (fs::is_symlink(lst) && !fs::exists(st)) continue;  // a dangling link: nothing to lose
    if (!fs::is_regular_file(st)) {
      what = "it is " + KindOf(st) + ", not " + KindName(s.kind);
    } else {
      what = NotOurSidecar(s.path, s.kind);
    }
    if (what.empty()) continue;
    return Error("refusing to overwrite existing " + s.path + " (" + option + " (" + s.label + ")): " + what +
                     "; k3pack replaces only a file of the kind it writes there, not even with " + force_option +
                     (building ? " or --restart" : ""),
                 ErrorKind::kFileExists)
        .WithHint("pass another " + option + " path; if that file should go, move or remove it yourself");
  }
  return Status::OK();
}

}  // namespace k3pack::pack
