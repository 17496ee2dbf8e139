// `k3pack dump-tensor`: decode rows of one tensor to float32 and print them,
// bit-exact with ggml's to_float, so a value can be checked by eye or diffed
// against llama.cpp / gguf-py output.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/command.h"
#include "cli/stats_json.h"
#include "util/edit_distance.h"
#include "util/utf8.h"
#include "k3pack/gguf.h"
#include "k3pack/quant.h"

namespace k3pack::cli {
namespace {

using nlohmann::json;

struct Found {
  std::shared_ptr<const gguf::GgufFile> file;
  const gguf::TensorInfo* info = nullptr;
  uint32_t shard = 0;
};

Result<Found> FindTensor(const std::string& path, const std::string& name) {
  gguf::ShardSetOptions opts;
  opts.expected_architecture = "";
  std::vector<std::shared_ptr<const gguf::GgufFile>> files;
  auto set = gguf::ShardSet::Open(path, opts);
  if (set.ok()) {
    files = set->shards();
  } else {
    // A lone file whose name is not a shard name: open just that file.
    auto f = gguf::GgufFile::Open(path);
    if (!f.ok()) return set.error();
    files.push_back(*f);
  }
  // Similar: a name that contains the one asked for or the reverse (a prefix
  // typed short), or a typo within doctor's near-miss distance,
  // max(2, len/8) edits; the closest five, nearest first.
  const size_t limit = std::max<size_t>(2, name.size() / 8);
  std::vector<std::pair<size_t, std::string>> similar;  // (edits, name)
  for (size_t s = 0; s < files.size(); ++s) {
    if (const gguf::TensorInfo* t = files[s]->FindTensor(name)) return Found{files[s], t, static_cast<uint32_t>(s)};
    for (const auto& t : files[s]->tensors()) {
      const bool contains = t.name.find(name) != std::string::npos || name.find(t.name) != std::string::npos;
      const size_t d = EditDistance(name, t.name);
      if (contains || d <= limit) similar.emplace_back(contains ? 0 : d, t.name);
    }
  }
  Error err("tensor '" + name + "' not found in " + path, ErrorKind::kKey);
  if (!similar.empty()) {
    std::stable_sort(similar.begin(), similar.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    std::string h = "similar names:";
    for (size_t i = 0; i < similar.size() && i < 5; ++i) h += " " + similar[i].second;
    return err.WithHint(h);
  }
  return err.WithHint("list the tensors with `k3pack inspect " + path + "`");
}

// "a:b" (half-open), "a:", ":b" or "a" (one row).
Result<std::pair<uint64_t, uint64_t>> ParseRows(const std::string& spec, uint64_t n_rows) {
  auto num = [&](const std::string& s, uint64_t dflt) -> Result<uint64_t> {
    if (s.empty()) return dflt;
    if (s.find_first_not_of("0123456789") != std::string::npos || s.size() > 18) {
      return Error("--rows: '" + spec + "' is not a:b with non-negative integers");
    }
    return static_cast<uint64_t>(std::stoull(s));
  };
  const size_t colon = spec.find(':');
  uint64_t a, b;
  if (colon == std::string::npos) {
    K3_ASSIGN_OR_RETURN(a, num(spec, 0));
    b = a + 1;
  } else {
    K3_ASSIGN_OR_RETURN(a, num(spec.substr(0, colon), 0));
    K3_ASSIGN_OR_RETURN(b, num(spec.substr(colon + 1), n_rows));
  }
  if (a >= b || b > n_rows) {
    return Error("--rows " + spec + ": need a < b <= " + std::to_string(n_rows) + " (the tensor has " +
                 std::to_string(n_rows) + " rows)");
  }
  return std::make_pair(a, b);
}

json FloatJson(float v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return static_cast<double>(v);
}

int RunDumpTensor(const std::vector<std::string>& argv) {
  Args args("dump-tensor", "FILE_OR_DIR NAME [--rows a:b] [--json] [--stats]",
            "Decode rows of one tensor to float32 (bit-exact with ggml's dequantization) and print them.\n"
            "Rows are the ne[1..3] rows of ne[0] elements; the default is the first 4.");
  args.Positional("FILE_OR_DIR NAME", "a .gguf file, a shard, or a directory holding one set; then a tensor name",
                  2, 2);
  args.Option("--rows", "row range a:b (half-open; a: or :b allowed; a single number is one row)");
  args.Flag("--json", "print JSON: name, type, shape, rows, values (non-finite values as \"nan\"/\"inf\"/\"-inf\")");
  args.Flag("--stats", "also print min/max/mean and NaN/Inf counts of the selected rows");
  int code = 0;
  if (!args.Parse(argv, &code)) return code;
  const std::string path = args.positionals()[0], name = args.positionals()[1];
  auto found = FindTensor(path, name);
  if (!found.ok()) return ReportError("dump-tensor", found.error());
  const gguf::TensorInfo& t = *found->info;
  if (!quant::CanDequantize(t.type)) {
    return ReportError("dump-tensor", Error("tensor '" + name + "' has type " + std::string(GgmlTypeName(t.type)) +
                                            ", which has no float decoding"));
  }
  const uint64_t n_rows = t.n_rows();
  std::pair<uint64_t, uint64_t> rows = {0, std::min<uint64_t>(n_rows, 4)};
  if (auto spec = args.GetOpt("--rows")) {
    auto r = ParseRows(*spec, n_rows);
    if (!r.ok()) return ReportError("dump-tensor", r.error(), 2);
    rows = *r;
  }
  const uint64_t row_bytes = t.row_bytes();
  const std::span<const uint8_t> data = found->file->TensorData(t);
  if (data.size() < rows.second * row_bytes) {
    return ReportError("dump-tensor", Error("tensor '" + name + "': " + std::to_string(data.size()) +
                                            " data bytes, rows up to " + std::to_string(rows.second) + " need " +
                                            std::to_string(rows.second * row_bytes), ErrorKind::kEOF));
  }
  const std::span<const uint8_t> sel = data.subspan(rows.first * row_bytes, (rows.second - rows.first) * row_bytes);
  auto values = quant::DequantizeRows(t.type, sel, t.ne[0], rows.second - rows.first);
  if (!values.ok()) return ReportError("dump-tensor", values.error().WithContext(name));
  const size_t ne0 = static_cast<size_t>(t.ne[0]);
  std::optional<quant::TensorStats> stats;
  if (args.Has("--stats")) {
    auto st = quant::ComputeStats(t.type, sel, t.ne[0], rows.second - rows.first);
    if (!st.ok()) return ReportError("dump-tensor", st.error());
    stats = *st;
  }
  if (args.Has("--json")) {
    json out = {{"name", t.name}, {"type", std::string(GgmlTypeName(t.type))},
                {"type_id", static_cast<uint32_t>(t.type)}, {"shape", t.shape()}, {"shard", found->shard},
                {"file", found->file->path()}, {"rows", {rows.first, rows.second}}, {"ne0", ne0}};
    // A GGUF tensor name (or path) that is not UTF-8 is shown escaped (util/utf8.h).
    if (auto bad = EscapeInvalidUtf8Members(out); !bad.empty()) out["not_utf8"] = bad;
    json vals = json::array();
    for (uint64_t r = 0; r < rows.second - rows.first; ++r) {
      json row = json::array();
      for (size_t i = 0; i < ne0; ++i) row.push_back(FloatJson((*values)[r * ne0 + i]));
      vals.push_back(std::move(row));
    }
    out["values"] = std::move(vals);
    if (stats) {
      out["stats"] = TensorStatsJson(*stats);
    }
    std::cout << DumpJsonEscaped(std::move(out), -1) << "\n";
    return 0;
  }
  std::string shape;
  for (int64_t d : t.shape()) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
  std::printf("%s  %s  ne=[%s]  shard %u  rows %llu:%llu of %llu\n", t.name.c_str(),
              std::string(GgmlTypeName(t.type)).c_str(), shape.c_str(), found->shard,
              static_cast<unsigned long long>(rows.first), static_cast<unsigned long long>(rows.second),
              static_cast<unsigned long long>(n_rows));
  for (uint64_t r = 0; r < rows.second - rows.first; ++r) {
    std::printf("row %llu:\n", static_cast<unsigned long long>(rows.first + r));
    for (size_t i = 0; i < ne0; i += 8) {
      std::printf("  [%6zu]", i);
      for (size_t k = i; k < std::min(ne0, i + 8); ++k) std::printf(" %15.9g", (*values)[r * ne0 + k]);
      std::printf("\n");
    }
  }
  if (stats) {
    std::printf("stats: count %llu  min %.9g  max %.9g  mean %.9g  nan %llu  inf %llu\n",
                static_cast<unsigned long long>(stats->count), stats->min, stats->max, stats->mean,
                static_cast<unsigned long long>(stats->nan_count), static_cast<unsigned long long>(stats->inf_count));
  }
  return 0;
}

}  // namespace

K3_COMMAND("dump-tensor", "decode and print rows of one tensor (bit-exact ggml dequantization)", RunDumpTensor);

}  // namespace k3pack::cli
