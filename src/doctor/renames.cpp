// Shards that were renamed, not lost. Discovery judges a set by its file
// names, so renamed shards look like a missing shard (names -00001/3/4-of-
// 00004 for split.no 0..2) or a mixed download. The headers decide: when they
// alone form one complete split, the advice must be to rename, never to
// download a shard that does not exist.
#include <filesystem>

#include "doctor/internal.h"
#include "util/format.h"

namespace k3pack::doctor::internal {

namespace fs = std::filesystem;

namespace {

struct Rename {
  std::string from;  // path as found
  std::string to;    // path the header gives it
};

// Every shard read, one split.count equal to the number of files, and
// split.no a permutation of 0..count-1; then each file's right name follows
// from its header. Empty when the headers do not form such a set, or when
// every name already matches.
std::vector<Rename> RenamesFromHeaders(const ShardView& view) {
  const size_t n = view.shards.size();
  if (view.prefix.empty() || n == 0) return {};
  std::vector<bool> seen(n, false);
  std::vector<Rename> renames;
  for (const Shard& s : view.shards) {
    if (!s.file || !s.name) return {};
    const gguf::Value* count = s.file->Find("split.count");
    const gguf::Value* no = s.file->Find("split.no");
    if (count == nullptr || no == nullptr) return {};
    const auto c = count->AsInt();
    const auto k = no->AsInt();
    if (!c || !k || *c != static_cast<int64_t>(n) || *k < 0 || *k >= *c || seen[static_cast<size_t>(*k)]) return {};
    seen[static_cast<size_t>(*k)] = true;
    const std::string right = gguf::ShardFileName(view.prefix, static_cast<uint32_t>(*k + 1), static_cast<uint32_t>(n));
    const fs::path from(s.path);
    if (from.filename() != right) renames.push_back({s.path, (from.parent_path() / right).string()});
  }
  return renames;
}

// Shell commands that apply the renames. When a target name is another
// shard's current name (shards swapped), everything goes through a
// temporary name first so that no file is overwritten.
std::string RenameCommands(const std::vector<Rename>& renames) {
  bool clash = false;
  for (const Rename& r : renames) {
    for (const Rename& other : renames) clash = clash || r.to == other.from;
  }
  std::string cmds;
  auto mv = [&](const std::string& a, const std::string& b) {
    cmds += (cmds.empty() ? "" : "; ") + std::string("mv -n ") + ShellQuoted(a) + " " + ShellQuoted(b);
  };
  for (const Rename& r : renames) mv(r.from, clash ? r.from + ".renaming" : r.to);
  if (clash) {
    for (const Rename& r : renames) mv(r.from + ".renaming", r.to);
  }
  return cmds;
}

}  // namespace

void CheckRenamedShards(const ShardView& view, Collector& out) {
  const std::vector<Rename> renames = RenamesFromHeaders(view);
  if (renames.empty()) return;
  const std::string n = std::to_string(view.shards.size());
  const std::string commands = RenameCommands(renames);
  // The name-based findings stay (they carry SGLang's texts), but their
  // advice to download or re-split is wrong here.
  for (Finding& f : out.report().findings) {
    if (f.code == "shard-set-incomplete" || f.code == "shard-count-disagree" || f.code == "split-no-mismatch" ||
        f.code == "split-count-mismatch") {
      f.fix = "Nothing is missing: the headers of the " + n + " files form one complete split; rename them (see " +
              "shards-renamed): " + commands;
    }
  }
  std::string list;
  nlohmann::json details = nlohmann::json::array();
  for (const Rename& r : renames) {
    list += (list.empty() ? "" : ", ") + fs::path(r.from).filename().string() + " -> " +
            fs::path(r.to).filename().string();
    details.push_back({{"from", r.from}, {"to", r.to}});
  }
  Finding& f = out.Add("shards-renamed", view.dir + "/" + view.prefix + "-*.gguf",
                       "the headers of the " + n + " files form one complete split (split.count " + n +
                           ", split.no 0.." + std::to_string(view.shards.size() - 1) +
                           ") whose names do not match them: " + list);
  f.fix = "Rename the files to the names their headers give (nothing needs downloading): " + commands;
  f.details = {{"renames", details}};
}

}  // namespace k3pack::doctor::internal
