// Split-set discovery and the cross-shard checks SGLang's scanner and
// llama.cpp's split loader perform, with SGLang's texts where they agree.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>

#include "k3pack/gguf.h"
#include "util/file.h"
#include "util/pyrepr.h"

namespace k3pack::gguf {

namespace fs = std::filesystem;

std::optional<ShardName> ParseShardName(std::string_view file_name) {
  // "<prefix>-NNNNN-of-NNNNN.gguf"
  constexpr std::string_view kExt = ".gguf";
  constexpr size_t kSuffix = 1 + 5 + 4 + 5 + 5;  // "-NNNNN-of-NNNNN.gguf"
  if (file_name.size() < kSuffix) return std::nullopt;
  std::string_view tail = file_name.substr(file_name.size() - kSuffix);
  if (tail[0] != '-' || tail.substr(6, 4) != "-of-" || tail.substr(15) != kExt) return std::nullopt;
  auto digits = [](std::string_view s, uint32_t* out) {
    uint32_t v = 0;
    for (char c : s) {
      if (c < '0' || c > '9') return false;
      v = v * 10 + static_cast<uint32_t>(c - '0');
    }
    *out = v;
    return true;
  };
  ShardName n;
  if (!digits(tail.substr(1, 5), &n.number) || !digits(tail.substr(10, 5), &n.count)) return std::nullopt;
  n.prefix = std::string(file_name.substr(0, file_name.size() - kSuffix));
  return n;
}

std::string ShardFileName(std::string_view prefix, uint32_t number, uint32_t count) {
  char suffix[32];
  std::snprintf(suffix, sizeof suffix, "-%05u-of-%05u.gguf", number, count);
  return std::string(prefix) + suffix;
}

namespace {

// One prefix's numbered files, as SGLang's discovery checks them.
struct Candidate {
  std::string prefix;
  std::vector<std::pair<int64_t, int64_t>> numbered;  // (number, count) of every file
  std::map<uint32_t, std::string> by_number;

  void Add(const ShardName& n, std::string path) {
    numbered.emplace_back(n.number, n.count);
    by_number[n.number] = std::move(path);
  }
};

bool IsComplete(const Candidate& c) { return SglangSetError(c.numbered).empty(); }

Result<std::vector<std::string>> Ordered(const Candidate& c) {
  if (std::string why = SglangSetError(c.numbered); !why.empty()) {
    Error e(why);
    if (why.starts_with("GGUF shard set is incomplete")) {
      return e.WithHint("shard files of the set '" + c.prefix + "' are missing (an unfinished download or write); "
                        "`k3pack doctor` names them and what was left behind");
    }
    return e;
  }
  std::vector<std::string> out;
  for (const auto& [_, p] : c.by_number) out.push_back(p);
  return out;
}

}  // namespace

std::string SglangSetError(const std::vector<std::pair<int64_t, int64_t>>& numbered) {
  std::set<int64_t> counts;
  std::vector<int64_t> numbers;
  for (const auto& [number, count] : numbered) counts.insert(count), numbers.push_back(number);
  if (counts.size() > 1) return "GGUF shard filenames disagree on split count: " + PySet({counts.begin(), counts.end()});
  std::sort(numbers.begin(), numbers.end());
  const int64_t count = counts.empty() ? 0 : *counts.begin();
  bool complete = static_cast<int64_t>(numbers.size()) == count;
  for (size_t i = 0; complete && i < numbers.size(); ++i) complete = numbers[i] == static_cast<int64_t>(i + 1);
  if (complete) return {};
  return "GGUF shard set is incomplete: count=" + std::to_string(count) + ", numbers=" + PyList(numbers);
}

Error NoGgufFilesError(const std::string& dir, int list_errno) {
  if (list_errno == 0) return Error("no GGUF files found in " + dir);
  // Out of descriptors, the directory could not even be opened: neither an
  // empty directory nor one this user may not list.
  if (list_errno == EMFILE || list_errno == ENFILE) return Error::FromErrno("cannot list " + dir, list_errno);
  return Error("no GGUF files found in " + dir, ErrorKind::kValue, list_errno)
      .WithHint("the directory cannot be listed: " + std::string(std::strerror(list_errno)) +
                " (SGLang's glob skips it without a word); give this user read and search permission on it");
}

Result<std::vector<std::string>> ShardSet::Discover(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(fs::path(path), ec)) {
    if (const std::string bare = FileNamedWithSlash(path); !bare.empty()) {
      return Error::FromErrno("GGUF path " + path + " " + EndsInSlashButNames(bare), ENOTDIR)
          .WithHint("pass " + bare + " (without the '/')");
    }
    return Error::FromErrno("GGUF path does not exist: " + path, ENOENT);
  }
  // SGLang resolves the directory before listing it, so every shard path it
  // prints (split.no mismatch, unnumbered shard, ...) is absolute. A shard's
  // own name stays as listed: a symlinked shard keeps its name.
  fs::path p(path);
  if (fs::is_directory(p, ec)) {
    p = ResolvedPathOrGiven(path);
  } else {
    const fs::path parent = p.parent_path().empty() ? fs::path(".") : p.parent_path();
    p = fs::path(ResolvedPathOrGiven(parent.string())) / p.filename();
  }
  const std::string shown = p.string();

  if (!fs::is_directory(p, ec)) {
    auto name = ParseShardName(p.filename().string());
    if (!name) return std::vector<std::string>{shown};  // a single, unsplit file
    Candidate c{name->prefix, {}, {}};
    fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      auto n = ParseShardName(it->path().filename().string());
      if (n && n->prefix == name->prefix) c.Add(*n, it->path().string());
    }
    // SGLang lists the shard's directory for its set; one it cannot list
    // gave "disagree on split count: set()" here.
    if (ec) return NoGgufFilesError(dir.string(), ec.value());
    return Ordered(c);
  }

  std::map<std::string, Candidate> sets;
  std::vector<std::string> unnumbered;
  for (fs::directory_iterator it(p, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path& e = it->path();
    if (e.extension() != ".gguf") continue;
    if (auto n = ParseShardName(e.filename().string())) {
      Candidate& c = sets[n->prefix];
      c.prefix = n->prefix;
      c.Add(*n, e.string());
    } else {
      unnumbered.push_back(e.string());
    }
  }
  if (ec) return NoGgufFilesError(shown, ec.value());
  if (sets.empty()) {
    if (unnumbered.size() == 1) return unnumbered;
    if (unnumbered.empty()) return NoGgufFilesError(shown);
    std::sort(unnumbered.begin(), unnumbered.end());
    std::string list;
    for (const auto& u : unnumbered) list += "\n  " + u;
    return Error("several unrelated GGUF files in " + shown + " and no numbered shard set:" + list)
        .WithHint("pass the path of the model file itself");
  }
  std::vector<const Candidate*> complete;
  for (const auto& [_, c] : sets) {
    if (IsComplete(c)) complete.push_back(&c);
  }
  if (complete.size() == 1) return Ordered(*complete.front());
  if (complete.empty()) {
    // One broken set: report what is wrong with it (SGLang's texts).
    if (sets.size() == 1) return Ordered(sets.begin()->second);
    std::string list;
    for (const auto& [prefix, c] : sets) list += "\n  " + prefix + " (" + std::to_string(c.by_number.size()) + " files)";
    return Error("no complete GGUF shard set in " + shown + "; incomplete sets:" + list);
  }
  std::string list;
  for (const Candidate* c : complete) {
    list += "\n  " + c->prefix + " (" + std::to_string(c->by_number.size()) + " shards: " +
            c->by_number.begin()->second + ")";
  }
  return Error("several complete GGUF shard sets in " + shown + ":" + list)
      .WithHint("name one shard of the set you mean instead of the directory");
}

namespace {

// Reads an integer split key; SGLang requires all three in every shard.
Result<int64_t> RequiredInt(const GgufFile& f, const char* key) {
  const Value* v = f.Find(key);
  if (v == nullptr) {
    return Error("GGUF metadata is missing required field " + PyRepr(key)).WithHint("in " + f.path());
  }
  auto i = v->AsInt();
  if (!i) return Error(f.path() + ": GGUF key " + key + " must be an integer, got " + ValueTypeName(v->type));
  return *i;
}

}  // namespace

Result<ShardSet> ShardSet::Open(const std::string& path, const ShardSetOptions& opts) {
  K3_ASSIGN_OR_RETURN(std::vector<std::string> paths, Discover(path));
  ShardSet set;
  const bool numbered = ParseShardName(fs::path(paths.front()).filename().string()).has_value();
  if (numbered) set.prefix_ = ParseShardName(fs::path(paths.front()).filename().string())->prefix;
  else set.prefix_ = fs::path(paths.front()).stem().string();
  set.dir_ = fs::path(paths.front()).parent_path().string();

  // SGLang's scan_gguf_shards, shard by shard: open, the four required keys
  // (split.count, split.no, split.tensors.count, general.architecture),
  // split.no, agreement with shard 0, then the shard's tensor names against
  // the earlier shards'. Only after the last shard: split.count against the
  // files, split.tensors.count against the tensors, the architecture. So of
  // two faults the one SGLang meets first is reported (a damaged shard 3
  // does not hide a split.no error in shard 1).
  int64_t split_count = 1;
  std::optional<int64_t> tensors_count;  // unset: a plain file without split keys
  std::string arch0;
  std::unordered_map<std::string_view, uint32_t> seen;
  size_t total = 0;
  for (size_t i = 0; i < paths.size(); ++i) {
    K3_ASSIGN_OR_RETURN(auto opened, GgufFile::Open(paths[i], opts.read));
    set.shards_.push_back(std::move(opened));
    const GgufFile& f = *set.shards_.back();
    if (i == 0) arch0 = f.architecture();
    const bool has_split = f.Find("split.count") != nullptr;
    if (numbered || has_split) {  // plain single file: llama.cpp needs no split keys
      K3_ASSIGN_OR_RETURN(int64_t count, RequiredInt(f, "split.count"));
      K3_ASSIGN_OR_RETURN(int64_t no, RequiredInt(f, "split.no"));
      K3_ASSIGN_OR_RETURN(int64_t tcount, RequiredInt(f, "split.tensors.count"));
      // A later shard may lack general.architecture (llama.cpp's gguf-split
      // writes the model's keys into the first shard only): k3pack accepts
      // that, SGLang does not (doctor's architecture-first-shard-only).
      if (i == 0 && f.Find("general.architecture") == nullptr) {
        return Error("GGUF metadata is missing required field 'general.architecture'").WithHint("in " + f.path());
      }
      if (no != static_cast<int64_t>(i)) {
        return Error("GGUF split.no mismatch for " + f.path() + ": " + std::to_string(no) + " != " + std::to_string(i));
      }
      const std::string arch = f.architecture();
      if (i == 0) {
        split_count = count;
        tensors_count = tcount;
      } else if (count != split_count || tcount != tensors_count ||
                 (f.Find("general.architecture") != nullptr && arch != arch0)) {
        return Error("GGUF split metadata mismatch at " + f.path());
      }
    }
    for (const TensorInfo& t : f.tensors()) {
      if (!seen.emplace(t.name, 0).second) return Error("duplicate GGUF tensor across shards: " + t.name);
      ++total;
    }
  }
  if (split_count != static_cast<int64_t>(set.shards_.size())) {
    return Error("GGUF split.count=" + std::to_string(split_count) + ", found " + std::to_string(set.shards_.size()) +
                 " files");
  }
  if (tensors_count && *tensors_count != static_cast<int64_t>(total)) {
    return Error("GGUF split.tensors.count=" + std::to_string(*tensors_count) + ", found " + std::to_string(total));
  }
  if (!opts.expected_architecture.empty() && arch0 != opts.expected_architecture) {
    return Error("expected GGUF architecture " + PyRepr(opts.expected_architecture) + ", got " + PyRepr(arch0));
  }
  return set;
}

size_t ShardSet::tensor_count() const {
  size_t n = 0;
  for (const auto& f : shards_) n += f->tensors().size();
  return n;
}

std::optional<ShardSet::Located> ShardSet::FindTensor(std::string_view name) const {
  for (uint32_t i = 0; i < shards_.size(); ++i) {
    if (const TensorInfo* t = shards_[i]->FindTensor(name)) return Located{t, i};
  }
  return std::nullopt;
}

std::vector<ShardSet::Located> ShardSet::AllTensors() const {
  std::vector<Located> out;
  for (uint32_t i = 0; i < shards_.size(); ++i) {
    for (const TensorInfo& t : shards_[i]->tensors()) out.push_back({&t, i});
  }
  return out;
}

}  // namespace k3pack::gguf
