// Discovery and opening of the shards, and the split-set checks of SGLang's
// scanner, each rule reported on its own instead of stopping at the first.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>

#include "doctor/internal.h"
#include "kimi/synth_output.h"
#include "util/file.h"
#include "util/pyrepr.h"
#include "util/utf8.h"

namespace k3pack::doctor::internal {

namespace fs = std::filesystem;

namespace {

// Parses the header of a file whose data is cut off: the header bytes are
// copied into a sparse temp file that is much longer than needed, so the
// reader's bounds checks pass and the tensor infos can be examined; the
// caller reads data only from the real file, and only where it exists.
Result<std::shared_ptr<const gguf::GgufFile>> ParseCutOff(const std::string& path, uint64_t size) {
  K3_ASSIGN_OR_RETURN(UniqueFd in, OpenReadOnly(path));
  std::string tmpl = (fs::temp_directory_path() / "k3pack-doctor-XXXXXX").string();
  UniqueFd tmp(::mkstemp(tmpl.data()));
  if (!tmp.valid()) return Error::FromErrno("cannot create a temp file in " + fs::temp_directory_path().string(), errno);
  ::unlink(tmpl.c_str());  // the descriptor keeps it alive; nothing is left behind
  for (uint64_t prefix = std::min<uint64_t>(size, 16ull << 20);; prefix = std::min<uint64_t>(size, prefix * 4)) {
    std::vector<uint8_t> buf(static_cast<size_t>(prefix));
    auto got = PreadFull(in.get(), buf.data(), buf.size(), 0);
    if (!got.ok()) return got.error().WithContext("cannot read " + path);
    Status copied = PwriteFull(tmp.get(), buf.data(), *got, 0);
    if (!copied.ok()) return copied.error().WithContext("cannot read the header of " + path + ": temporary copy");
    if (::ftruncate(tmp.get(), static_cast<off_t>(size + (1ull << 40))) != 0) {
      return Error::FromErrno("cannot read the header of " + path + ": cannot extend its temporary copy", errno);
    }
    // Labelled with the user's file: messages about the parsed header must
    // name it, not /proc/self/fd/N.
    K3_ASSIGN_OR_RETURN(auto map, MappedFile::OpenLabelled("/proc/self/fd/" + std::to_string(tmp.get()), path));
    gguf::ReadOptions ro;
    ro.require_packed_offsets = false;
    auto parsed = gguf::GgufFile::Parse(map, ro);
    // A header longer than the copied prefix would have been read as zeros.
    if (parsed.ok() && (*parsed)->data_offset() <= prefix) return parsed;
    if (prefix >= size || prefix >= (1ull << 30)) {
      if (!parsed.ok()) return parsed.error();
      return Error("the header itself is cut off");
    }
  }
}

// A k3pack writer that stopped before its end leaves its marker (or the
// marker's own temporary): the shards are not to be trusted, however
// complete they look.
void ReportUnfinishedWriters(const std::string& dir, Collector& out) {
  struct Writer {
    const char* marker;
    const char* code;
    const char* command;
  };
  for (const Writer& w : {Writer{kimi::kSynthPartialMarker, "synth-unfinished", "k3pack synth"},
                          Writer{kRepairMarkerName, "repair-unfinished", "k3pack repair"}}) {
    if (!HoldsMarker(dir, w.marker)) continue;
    Finding& f = out.Add(w.code, dir,
                         std::string("a `") + w.command + "` into this directory did not finish (its marker " +
                             w.marker + " is there)");
    f.details = {{"marker", (fs::path(dir) / w.marker).string()}};
  }
}

void OpenShard(Shard& s, Collector& out) {
  auto real = MappedFile::Open(s.path);
  if (!real.ok()) {
    if (!ReportBrokenLink(s, out) && !ReportProcessCannotRead(real.error(), s.path, out)) {
      out.Add("gguf-unreadable", s.path, real.error().message(), {}, s.path);
    }
    return;
  }
  CheckDownloadLeftovers(s, out);
  s.real = *real;
  s.size = s.real->size();
  auto strict = gguf::GgufFile::Parse(s.real);
  if (strict.ok()) {
    s.file = *strict;
    s.strict_ok = true;
    return;
  }
  const std::string why = strict.error().message();
  gguf::ReadOptions lenient;
  lenient.require_packed_offsets = false;
  auto l = gguf::GgufFile::Parse(s.real, lenient);
  if (l.ok()) {
    s.file = *l;
    out.Add("gguf-header-invalid", s.path, why, {}, s.path);
    return;
  }
  // Only a whole header whose tensor data runs past the end is parsed again
  // from an extended copy. A broken header (a length running past the end)
  // would make that parse read the zero extension: gigabytes for a 2 KB file
  // (found by cli_json_fuzz).
  // Nor is a header whose strict read failed on another rule first (a
  // tensor offset off the packed order, e.g. one set to 2^40): the data then
  // lies past the end because the offset is wrong, not because the file was
  // cut, and "re-download" would not help.
  if (l.error().message().find(") is not within the file (size ") == std::string::npos ||
      why.find(") is not within the file (size ") == std::string::npos) {
    out.Add("gguf-unreadable", s.path, why, {}, s.path);
    return;
  }
  auto cut = ParseCutOff(s.path, s.size);
  if (!cut.ok()) {
    out.Add("gguf-unreadable", s.path, why, {}, s.path);
    return;
  }
  s.file = *cut;
  s.truncated = true;
  std::vector<std::string> names;
  uint64_t need = 0;
  for (const gguf::TensorInfo& t : s.file->tensors()) {
    need = std::max(need, t.data_offset + t.nbytes);
    if (t.data_offset + t.nbytes > s.size) names.push_back(t.name);
  }
  std::string list;
  for (size_t i = 0; i < names.size() && i < 8; ++i) list += (i ? ", " : "") + names[i];
  if (names.size() > 8) list += ", ... (" + std::to_string(names.size()) + " in all)";
  Finding& f = out.Add("gguf-truncated", s.path,
                       "file is " + std::to_string(s.size) + " bytes but its tensors need " + std::to_string(need) +
                           " (" + std::to_string(need - s.size) + " missing); cut-off tensors: " + list,
                       {}, s.path);
  f.details = {{"size", s.size}, {"needed", need}, {"cut_off_tensors", names}};
}

void OpenAll(const std::vector<std::string>& paths, ShardView& v, Collector& out) {
  for (const std::string& p : paths) {
    Shard s;
    s.path = p;
    s.name = gguf::ParseShardName(fs::path(p).filename().string());
    OpenShard(s, out);
    if (!s.file) v.all_readable = false;
    out.report().files.push_back(p);
    v.shards.push_back(std::move(s));
  }
}

void IndexTensors(ShardView& v, Collector& out) {
  for (uint32_t i = 0; i < v.shards.size(); ++i) {
    if (!v.shards[i].file) continue;
    for (const gguf::TensorInfo& t : v.shards[i].file->tensors()) {
      if (v.tensors.emplace(t.name, Located{&t, i}).second) v.order.push_back(t.name);
    }
  }
  out.report().tensors_examined += v.order.size();
  if (v.shards.size() == 1 && !v.shards[0].file) {
    out.report().unusable = true;  // the only file is not a GGUF we can read
  }
}

// Every *.gguf of a directory, grouped the way SGLang's discovery sees them.
struct DirectoryGgufs {
  std::map<std::string, std::map<uint32_t, std::string>> sets;  // prefix -> number -> path
  std::map<std::string, std::set<int64_t>> counts;               // prefix -> the counts its names give
  std::vector<std::pair<int64_t, int64_t>> numbered;  // (number, count) of every numbered file, any prefix
  std::vector<std::string> unnumbered;                // sorted
  int list_errno = 0;  // the listing failed: SGLang's glob finds nothing there
};

DirectoryGgufs ScanGgufs(const fs::path& dir) {
  DirectoryGgufs found;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path& e = it->path();
    if (e.extension() != ".gguf") continue;
    if (auto n = gguf::ParseShardName(e.filename().string())) {
      found.sets[n->prefix][n->number] = e.string();
      found.counts[n->prefix].insert(n->count);
      found.numbered.emplace_back(n->number, n->count);
    } else {
      found.unnumbered.push_back(e.string());
    }
  }
  found.list_errno = ec.value();
  std::sort(found.unnumbered.begin(), found.unnumbered.end());
  return found;
}

// The numbered set `prefix` as SGLang takes it (every numbered *.gguf of the
// directory for one set): other sets and stray files beside it, counts that
// disagree, numbers missing. Returns the set's files in number order.
std::vector<std::string> CheckNumberedSet(const DirectoryGgufs& found, const std::string& prefix, const fs::path& dir,
                                          ShardView& v, Collector& out) {
  const std::string whole = gguf::SglangSetError(found.numbered);
  for (const auto& [p, files] : found.sets) {
    if (p == prefix) continue;
    Finding& f = out.Add("several-shard-sets", v.dir,
                         "besides '" + prefix + "' the directory holds the set '" + p + "' (" +
                             std::to_string(files.size()) + " file(s): " + fs::path(files.begin()->second).filename().string() +
                             (files.size() > 1 ? ", ..." : "") + "); only '" + prefix + "' was examined",
                         whole);
    f.details = {{"examined_prefix", prefix}, {"other_prefix", p}, {"other_files", files.size()}};
  }
  for (const auto& u : found.unnumbered) {
    out.Add("stray-gguf", u, "not a numbered shard of '" + prefix + "'",
            "GGUF shard name does not contain NNNNN-of-NNNNN: " + ResolvedPathOrGiven(u), u);
  }
  const auto& files = found.sets.at(prefix);
  const auto& cs = found.counts.at(prefix);
  std::vector<int64_t> numbers;
  std::vector<std::string> chosen;
  for (const auto& [num, p] : files) numbers.push_back(num), chosen.push_back(p);
  if (cs.size() > 1) {
    out.Add("shard-count-disagree", v.dir + "/" + prefix + "-*.gguf",
            "file names give the counts " + PySet({cs.begin(), cs.end()}),
            "GGUF shard filenames disagree on split count: " + PySet({cs.begin(), cs.end()}));
  } else {
    const int64_t count = *cs.begin();
    bool complete = static_cast<int64_t>(numbers.size()) == count;
    for (size_t i = 0; complete && i < numbers.size(); ++i) complete = numbers[i] == static_cast<int64_t>(i + 1);
    if (!complete) {
      std::vector<int64_t> missing;
      std::set<int64_t> have(numbers.begin(), numbers.end());
      for (int64_t k = 1; k <= count; ++k) {
        if (!have.count(k)) missing.push_back(k);
      }
      // A missing shard is often still there under a download tool's name.
      std::vector<std::string> partial;
      for (int64_t k : missing) {
        const std::string name = gguf::ShardFileName(prefix, static_cast<uint32_t>(k), static_cast<uint32_t>(count));
        for (std::string& p : DownloadLeftovers((dir / name).string())) partial.push_back(std::move(p));
      }
      std::string partial_list;
      for (const std::string& p : partial) partial_list += (partial_list.empty() ? "" : ", ") + fs::path(p).filename().string();
      Finding& f = out.Add("shard-set-incomplete", v.dir + "/" + prefix + "-*.gguf",
                           std::to_string(numbers.size()) + " of " + std::to_string(count) +
                               " shard files present; missing numbers " + PyList(missing) +
                               (partial.empty() ? "" : "; unfinished downloads of them are there: " + partial_list),
                           "GGUF shard set is incomplete: count=" + std::to_string(count) +
                               ", numbers=" + PyList(numbers));
      f.details = {{"count", count}, {"present", numbers}, {"missing", missing}, {"partial_downloads", partial}};
      if (!partial.empty()) {
        f.fix = "Finish (resume) the downloads of " + partial_list +
                " so that each is saved under its shard name, or download the missing shards again.";
      }
      v.all_readable = false;  // tensors of the missing shards cannot be checked
    }
  }
  return chosen;
}

}  // namespace

std::optional<ShardView> DiscoverAndOpen(const std::string& path, Collector& out) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    const std::string bare = FileNamedWithSlash(path);
    out.Add("input-missing", path,
            bare.empty() ? "no such file or directory"
                         : "it " + EndsInSlashButNames(bare) + " (pass it without the '/')");
    out.report().unusable = true;
    return std::nullopt;
  }
  ShardView v;
  std::vector<std::string> chosen;
  const bool is_dir = fs::is_directory(path, ec);
  fs::path dir = is_dir ? fs::path(path) : fs::path(path).parent_path();
  if (dir.empty()) dir = ".";
  v.dir = dir.string();
  ReportUnfinishedWriters(v.dir, out);

  const DirectoryGgufs found = ScanGgufs(dir);
  if (found.list_errno != 0) {
    const std::string shown = ResolvedPathOrGiven(v.dir);
    // Out of descriptors, the directory could not be opened to list it: its
    // permissions are not at fault.
    if (IsOpenFileLimit(found.list_errno)) {
      ReportProcessCannotRead(Error::FromErrno("cannot list " + shown, found.list_errno), v.dir, out);
      out.report().unusable = true;
      return std::nullopt;
    }
    // Examined alone, a shard of it passed as "healthy" (0 files checked),
    // where SGLang's discovery finds nothing.
    const Error error = gguf::NoGgufFilesError(shown, found.list_errno);
    Finding& f = out.Add("no-gguf-files", v.dir,
                         "the directory cannot be listed: " + std::string(std::strerror(found.list_errno)),
                         error.headline());
    f.fix = "Give this user read and search permission on " + shown +
            " (SGLang's glob skips a directory it cannot list, so it finds no shards there).";
    out.report().unusable = true;
    return std::nullopt;
  }
  std::string prefix;
  bool single_unnumbered = false;
  if (!is_dir) {
    auto n = gguf::ParseShardName(fs::path(path).filename().string());
    if (n) prefix = n->prefix;
  } else if (!found.sets.empty()) {
    size_t best = 0;
    for (const auto& [p, files] : found.sets) {
      if (files.size() > best) best = files.size(), prefix = p;
    }
  }

  if (!prefix.empty()) {
    chosen = CheckNumberedSet(found, prefix, dir, v, out);
    v.prefix = prefix;
  } else if (!is_dir || !found.unnumbered.empty()) {
    const std::string single = is_dir ? found.unnumbered.front() : path;
    for (const auto& u : found.unnumbered) {
      if (fs::equivalent(u, single, ec)) continue;
      out.Add("stray-gguf", u, "another unnumbered GGUF file beside " + single,
              "GGUF shard name does not contain NNNNN-of-NNNNN: " + ResolvedPathOrGiven(u), u);
    }
    single_unnumbered = true;
    chosen.push_back(single);
    v.prefix = fs::path(single).stem().string();
  } else {
    out.Add("no-gguf-files", path, "the directory contains no *.gguf file",
            "no GGUF files found in " + ResolvedPathOrGiven(path));
    out.report().unusable = true;
    return std::nullopt;
  }

  OpenAll(chosen, v, out);
  if (single_unnumbered && v.shards.front().file) {
    out.Add("gguf-not-numbered", v.shards.front().path,
            "the model is a single file without the -NNNNN-of-NNNNN.gguf suffix",
            "Kimi GGUF name is not a numbered shard: " + ResolvedPathOrGiven(v.shards.front().path),
            v.shards.front().path);
  }
  IndexTensors(v, out);
  return v;
}

std::optional<ShardView> OpenListed(const std::vector<std::string>& paths, Collector& out) {
  if (paths.empty()) return std::nullopt;
  ShardView v;
  v.dir = fs::path(paths.front()).parent_path().string();
  if (v.dir.empty()) v.dir = ".";
  if (auto n = gguf::ParseShardName(fs::path(paths.front()).filename().string())) v.prefix = n->prefix;
  bool any = false;
  for (const std::string& p : paths) {
    std::error_code ec;
    if (fs::exists(p, ec)) {
      OpenAll({p}, v, out);
      any = true;
    } else {
      // Keeps its place, so the others' split.no still line up; the manifest
      // check reports it (manifest-shard-changed).
      Shard missing;
      missing.path = p;
      missing.name = gguf::ParseShardName(fs::path(p).filename().string());
      v.shards.push_back(std::move(missing));
      v.all_readable = false;
    }
  }
  if (!any) return std::nullopt;
  IndexTensors(v, out);
  return v;
}

void CheckStringsAreUtf8(const ShardView& view, Collector& out) {
  for (const Shard& s : view.shards) {
    if (!s.file) continue;
    auto check = [&](const std::string& bytes, const std::string& what, uint64_t offset) {
      const std::string error = PythonUtf8DecodeError(bytes);
      if (error.empty()) return;
      Finding& f = out.Add("gguf-not-utf8", bytes,
                           what + " at file offset " + std::to_string(offset) +
                               " is not UTF-8; k3pack reads it as bytes, SGLang's GGUF reader decodes it and fails",
                           error, s.path);
      f.details = {{"kind", what}, {"offset", offset}};
    };
    for (const gguf::KeyValue& kv : s.file->metadata()) check(kv.key, "metadata key", kv.offset);
    for (const gguf::TensorInfo& t : s.file->tensors()) check(t.name, "tensor name", t.info_offset);
  }
}

namespace {

// SGLang's split-key rules, shard after shard, against what the first
// readable shard holds.
class SplitChecker {
 public:
  SplitChecker(const ShardView& view, Collector& out)
      : view_(view), out_(out), numbered_(!view.shards.empty() && view.shards.front().name.has_value()) {}

  void CheckShard(uint32_t i) {
    const Shard& s = view_.shards[i];
    if (!s.file) return;
    const gguf::GgufFile& f = *s.file;
    if (!numbered_ && f.Find("split.count") == nullptr) {
      arch0_ = f.architecture();
      have0_ = true;
      has_arch0_ = f.Find("general.architecture") != nullptr;
      if (!has_arch0_) {
        out_.Add("split-key-missing", "general.architecture", "no general.architecture key",
                 "GGUF metadata is missing required field 'general.architecture'", s.path);
      }
      return;
    }
    auto count = Key(s, "split.count");
    auto no = Key(s, "split.no");
    auto tcount = Key(s, "split.tensors.count");
    // The index the file's name gives it: its position in a complete set
    // (SGLang's rule). With a shard missing (shard-set-incomplete) the
    // positions shift, so the name's number is the fact to compare with.
    const int64_t index = s.name ? static_cast<int64_t>(s.name->number) - 1 : static_cast<int64_t>(i);
    if (no && *no != index) {
      Finding& fd = out_.Add("split-no-mismatch", s.path,
                             "split.no is " + std::to_string(*no) + " but the file is shard index " +
                                 std::to_string(index) + " (number " + std::to_string(index + 1) + " in its name)",
                             "GGUF split.no mismatch for " + ResolvedPathOrGiven(s.path) + ": " + std::to_string(*no) +
                                 " != " + std::to_string(index),
                             s.path);
      fd.details = {{"split_no", *no}, {"shard_index", index}};
    }
    const bool has_arch = f.Find("general.architecture") != nullptr;
    if (!has_arch && i > 0) ReportArchitectureMissing(s, i);
    if (!have0_) {
      have0_ = true;
      has_arch0_ = has_arch;
      count0_ = count;
      tcount0_ = tcount;
      arch0_ = f.architecture();
      if (!has_arch && i == 0) {
        out_.Add("split-key-missing", "general.architecture", "shard 0 has no general.architecture key",
                 "GGUF metadata is missing required field 'general.architecture'", s.path);
      }
    } else if ((count && count != count0_) || (tcount && tcount != tcount0_) ||
               (has_arch && f.architecture() != arch0_)) {
      std::string what;
      if (count && count != count0_) what += " split.count=" + std::to_string(*count) + " (shard 0: " + Shown(count0_) + ")";
      if (tcount && tcount != tcount0_) {
        what += " split.tensors.count=" + std::to_string(*tcount) + " (shard 0: " + Shown(tcount0_) + ")";
      }
      if (has_arch && f.architecture() != arch0_) what += " general.architecture=" + PyRepr(f.architecture());
      out_.Add("split-metadata-mismatch", s.path, "differs from shard 0:" + what,
               "GGUF split metadata mismatch at " + ResolvedPathOrGiven(s.path), s.path);
    }
  }

  // Unset: shard 0 has no such key (any value, a negative one too, is a
  // value SGLang compares with what it finds).
  const std::optional<int64_t>& count0() const { return count0_; }
  const std::optional<int64_t>& tensor_count0() const { return tcount0_; }
  // The first readable shard's architecture, when it has the key.
  std::optional<std::string> architecture0() const {
    return have0_ && has_arch0_ ? std::optional<std::string>(arch0_) : std::nullopt;
  }

 private:
  static std::string Shown(const std::optional<int64_t>& v) { return v ? std::to_string(*v) : std::string("none"); }

  std::optional<int64_t> Key(const Shard& s, const char* key) {
    const gguf::Value* v = s.file->Find(key);
    if (v == nullptr) {
      if (numbered_ || s.file->Find("split.count") != nullptr) {
        out_.Add("split-key-missing", key, std::string("shard has no ") + key,
                 std::string("GGUF metadata is missing required field '") + key + "'", s.path);
      }
      return std::nullopt;
    }
    auto x = v->AsInt();
    if (!x) out_.Add("split-key-missing", key, std::string(key) + " is not an integer", {}, s.path);
    return x;
  }

  // SGLang's scanner reads the key from every shard; k3pack only from the
  // first (llama.cpp's gguf-split writes it there only).
  void ReportArchitectureMissing(const Shard& s, uint32_t i) {
    if (has_arch0_) {
      Finding& fd = out_.Add("architecture-first-shard-only", "general.architecture",
                             "shard " + std::to_string(i) + " has no general.architecture key (shard 0 has " +
                                 PyRepr(arch0_) + "); k3pack accepts this set, SGLang's scanner does not",
                             "GGUF metadata is missing required field 'general.architecture'", s.path);
      fd.details = {{"shard_index", i}, {"architecture", arch0_}};
    } else {
      out_.Add("split-key-missing", "general.architecture",
               "shard " + std::to_string(i) + " has no general.architecture key",
               "GGUF metadata is missing required field 'general.architecture'", s.path);
    }
  }

  const ShardView& view_;
  Collector& out_;
  const bool numbered_;
  std::optional<int64_t> count0_, tcount0_;
  std::string arch0_;
  bool have0_ = false;
  bool has_arch0_ = false;  // the first readable shard holds general.architecture
};

// Tensors named in two shards (the view keeps the first occurrence), and the
// total against split.tensors.count.
void CheckTensorCounts(const ShardView& view, const std::optional<int64_t>& tcount0, Collector& out) {
  std::map<std::string, uint32_t> first;
  uint64_t total = 0;
  for (uint32_t i = 0; i < view.shards.size(); ++i) {
    if (!view.shards[i].file) continue;
    for (const gguf::TensorInfo& t : view.shards[i].file->tensors()) {
      ++total;
      auto [it, fresh] = first.emplace(t.name, i);
      if (!fresh) {
        out.Add("duplicate-tensor", t.name, "in shard " + std::to_string(it->second) + " and shard " + std::to_string(i),
                "duplicate GGUF tensor across shards: " + t.name, view.shards[i].path);
      }
    }
  }
  if (tcount0 && view.all_readable && *tcount0 != static_cast<int64_t>(total)) {
    Finding& f = out.Add("split-tensor-count-mismatch", "split.tensors.count",
                         "split.tensors.count says " + std::to_string(*tcount0) + ", the shards hold " +
                             std::to_string(total) + " tensors",
                         "GGUF split.tensors.count=" + std::to_string(*tcount0) + ", found " + std::to_string(total),
                         view.shards.front().path);
    f.details = {{"recorded", *tcount0}, {"found", total}};
  }
}

}  // namespace

void CheckSplit(const ShardView& view, Collector& out) {
  SplitChecker split(view, out);
  for (uint32_t i = 0; i < view.shards.size(); ++i) split.CheckShard(i);
  if (const auto& count0 = split.count0(); count0 && *count0 != static_cast<int64_t>(view.shards.size())) {
    out.Add("split-count-mismatch", "split.count",
            "split.count says " + std::to_string(*count0) + " shards, " + std::to_string(view.shards.size()) +
                " file(s) found",
            "GGUF split.count=" + std::to_string(*count0) + ", found " + std::to_string(view.shards.size()) + " files",
            view.shards.front().path);
  }
  CheckTensorCounts(view, split.tensor_count0(), out);
  if (auto arch0 = split.architecture0(); arch0 && *arch0 != "kimi-k3") {
    out.Add("architecture-mismatch", "general.architecture", "general.architecture is " + PyRepr(*arch0),
            "expected GGUF architecture 'kimi-k3', got " + PyRepr(*arch0), view.shards.front().path);
  }
}

}  // namespace k3pack::doctor::internal
