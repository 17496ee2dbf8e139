// `k3pack inspect`: what a GGUF file or shard set holds, for people and (with
// --json) for scripts. Long metadata arrays are summarized, never dumped.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/stats_json.h"
#include "k3pack/gguf.h"
#include "k3pack/quant.h"
#include "util/file.h"
#include "util/format.h"
#include "util/utf8.h"

namespace k3pack::cli {
namespace {

using gguf::Value;
using gguf::ValueType;
using nlohmann::json;

constexpr uint64_t kArrayPreview = 8;

json ScalarJson(const Value& v) {
  switch (v.type) {
    case ValueType::kString: return v.str;
    case ValueType::kBool: return v.u64 != 0;
    case ValueType::kFloat32: case ValueType::kFloat64: return v.f64;
    case ValueType::kInt8: case ValueType::kInt16: case ValueType::kInt32: case ValueType::kInt64: return v.i64;
    default: return v.u64;
  }
}

json ArrayElementJson(const Value& v, uint64_t i) {
  switch (v.array_type) {
    case ValueType::kString: return v.strings[i];
    case ValueType::kBool: return v.ArrayInt(i) != 0;
    case ValueType::kFloat32: case ValueType::kFloat64: return v.ArrayFloat(i);
    case ValueType::kUint64: return v.ArrayUint64(i);  // above INT64_MAX too, as gguf-py shows it
    default: return v.ArrayInt(i);
  }
}

// GGUF strings are bytes. One that is not UTF-8 is shown escaped (util/utf8.h:
// each invalid byte as the text \xNN) and the object holding it lists the
// field in "not_utf8" ("key", "value", "elements", "name", ...), so JSON
// output stays valid and says what was escaped.
void MarkNotUtf8(json& obj, const std::string& field) {
  if (!obj.contains("not_utf8")) obj["not_utf8"] = json::array();
  obj["not_utf8"].push_back(field);
}

json ValueJson(const std::string& key, const Value& v) {
  json out = {{"type", gguf::ValueTypeName(v.type)}};
  if (!IsValidUtf8(key)) MarkNotUtf8(out, "key");
  if (v.type != ValueType::kArray) {
    out["value"] = ScalarJson(v);
    if (EscapeInvalidUtf8InJson(out["value"]) > 0) MarkNotUtf8(out, "value");
    return out;
  }
  out["element_type"] = gguf::ValueTypeName(v.array_type);
  out["count"] = v.array_count;
  json items = json::array();
  for (uint64_t i = 0; i < std::min(v.array_count, kArrayPreview); ++i) items.push_back(ArrayElementJson(v, i));
  EscapeInvalidUtf8InJson(items);
  out[v.array_count > kArrayPreview ? "head" : "value"] = items;
  if (v.array_type == ValueType::kString) {
    // Counted over the whole array, not only the preview: one bad token in a
    // vocabulary of 160k is worth knowing about.
    uint64_t bad = 0;
    for (const std::string& e : v.strings) bad += IsValidUtf8(e) ? 0 : 1;
    if (bad > 0) {
      MarkNotUtf8(out, "elements");
      out["not_utf8_elements"] = bad;
    }
  }
  return out;
}

std::string ValueText(const json& j) {
  std::string note;
  if (j.contains("not_utf8")) {
    note = " (not UTF-8:";
    for (const auto& f : j["not_utf8"]) note += " " + f.get<std::string>();
    if (j.contains("not_utf8_elements")) note += " x" + std::to_string(j["not_utf8_elements"].get<uint64_t>());
    note += "; shown with \\xNN escapes)";
  }
  if (!j.contains("element_type")) {
    std::string s = j["value"].dump();
    return (s.size() > 100 ? s.substr(0, 97) + "..." : s) + note;
  }
  const bool more = j.contains("head");
  std::string s = "[" + j["element_type"].get<std::string>() + " x " + std::to_string(j["count"].get<uint64_t>()) + "] ";
  std::string items = (more ? j["head"] : j["value"]).dump();
  if (more) items.insert(items.size() - 1, ", ...");
  return s + (items.size() > 100 ? items.substr(0, 97) + "...]" : items) + note;
}

struct Inspected {
  std::vector<std::shared_ptr<const gguf::GgufFile>> files;
  std::string label;
};

Result<Inspected> OpenForInspect(const std::string& path, bool file_only) {
  Inspected out;
  if (file_only) {
    K3_ASSIGN_OR_RETURN(auto f, gguf::GgufFile::Open(path));
    out.files.push_back(f);
    out.label = path;
    return out;
  }
  gguf::ShardSetOptions opts;
  opts.expected_architecture = "";  // inspect any architecture
  K3_ASSIGN_OR_RETURN(gguf::ShardSet set, gguf::ShardSet::Open(path, opts));
  out.files = set.shards();
  out.label = (std::filesystem::path(set.directory()) / set.prefix()).string();
  return out;
}

// Drops this process's mapping of [p, p + n) (whole pages inside it). The
// page cache keeps the bytes; without this, decoding a full-size checkpoint
// kept every decoded page mapped: 11 GB of resident file pages after 9 GB.
void ReleasePages(const uint8_t* p, uint64_t n) { ReleaseMappedPages({p, static_cast<size_t>(n)}); }

// Decoded bytes between two progress reports inside one tensor.
constexpr uint64_t kStatsReportBytes = uint64_t{64} << 20;

// Decoded-value summary of one tensor; null (with the reason) for types that
// have no decoder, so a script never mistakes "not computed" for zeros.
// `on_bytes(done)` reports the bytes of this tensor decoded so far, every
// kStatsReportBytes: one expert stack of a full-size checkpoint is several GB.
json StatsJson(const gguf::GgufFile& f, const gguf::TensorInfo& t,
               const std::function<void(uint64_t done)>& on_bytes = {}) {
  if (!quant::CanDequantize(t.type)) return {{"error", "no decoder for " + std::string(GgmlTypeName(t.type))}};
  if (t.ne[0] <= 0) {
    return {{"min", nullptr}, {"max", nullptr}, {"mean", nullptr}, {"nan_count", 0}, {"inf_count", 0}, {"count", 0}};
  }
  const std::span<const uint8_t> data = f.TensorData(t);
  const uint64_t row_bytes = GgmlRowBytes(t.type, static_cast<uint64_t>(t.ne[0]));
  uint64_t released = 0;
  auto st = quant::ComputeStats(t.type, data, t.ne[0], static_cast<uint64_t>(t.n_elements() / t.ne[0]),
                                kStatsReportBytes, [&](uint64_t rows_done) {
                                  const uint64_t done = std::min<uint64_t>(rows_done * row_bytes, data.size());
                                  ReleasePages(data.data() + released, done - released);
                                  released = done;
                                  if (on_bytes) on_bytes(done);
                                });
  if (!st.ok()) return {{"error", st.error().message()}};
  return TensorStatsJson(*st);
}

struct StatsRequest {
  bool enabled = false;
  std::string match;  // substring of the tensor name; empty: every tensor
  ProgressReporter* progress = nullptr;
};

json ToJson(const Inspected& in, const StatsRequest& stats) {
  const gguf::GgufFile& first = *in.files.front();
  json shards = json::array(), tensors = json::array(), metadata = json::object(), by_type = json::object();
  uint64_t total_bytes = 0, total_size = 0;
  // Progress of --stats: bytes of the matching tensors decoded.
  Progress pr;
  pr.phase = "stats";
  pr.unit = "tensors";
  if (stats.enabled) {
    for (const auto& f : in.files) {
      for (const auto& t : f->tensors()) {
        if (t.name.find(stats.match) == std::string::npos) continue;
        pr.total_bytes += t.nbytes;
        pr.total_objects += 1;
      }
    }
  }
  for (const auto& kv : first.metadata()) metadata[EscapeInvalidUtf8(kv.key)] = ValueJson(kv.key, kv.value);
  for (size_t s = 0; s < in.files.size(); ++s) {
    const gguf::GgufFile& f = *in.files[s];
    shards.push_back({{"index", s}, {"path", f.path()}, {"size", f.file_size()}, {"version", f.version()},
                      {"alignment", f.alignment()}, {"data_offset", f.data_offset()},
                      {"tensor_count", f.tensors().size()}, {"kv_count", f.metadata().size()}});
    if (auto bad = EscapeInvalidUtf8Members(shards.back()); !bad.empty()) shards.back()["not_utf8"] = bad;
    total_size += f.file_size();
    for (const auto& t : f.tensors()) {
      tensors.push_back({{"name", t.name}, {"type", std::string(GgmlTypeName(t.type))},
                         {"type_id", static_cast<uint32_t>(t.type)}, {"shape", t.shape()}, {"shard", s},
                         {"data_offset", t.data_offset}, {"nbytes", t.nbytes}});
      if (stats.enabled && t.name.find(stats.match) != std::string::npos) {
        const uint64_t before = pr.done_bytes;
        tensors.back()["stats"] = StatsJson(f, t, [&](uint64_t done) {
          pr.done_bytes = before + done;
          if (stats.progress) stats.progress->Update(pr);
        });
        pr.done_bytes = before + t.nbytes;
        pr.done_objects += 1;
        if (stats.progress) stats.progress->Update(pr);
      }
      if (auto bad = EscapeInvalidUtf8Members(tensors.back()); !bad.empty()) tensors.back()["not_utf8"] = bad;
      std::string type(GgmlTypeName(t.type));
      if (!by_type.contains(type)) by_type[type] = {{"tensors", 0}, {"bytes", uint64_t{0}}};
      by_type[type]["tensors"] = by_type[type]["tensors"].get<int>() + 1;
      by_type[type]["bytes"] = by_type[type]["bytes"].get<uint64_t>() + t.nbytes;
      total_bytes += t.nbytes;
    }
  }
  if (stats.progress) stats.progress->Finish();
  json out = {{"path", in.label}, {"architecture", first.architecture()}, {"shard_count", in.files.size()},
              {"tensor_count", tensors.size()}, {"tensor_bytes", total_bytes}, {"file_bytes", total_size}};
  if (auto bad = EscapeInvalidUtf8Members(out); !bad.empty()) out["not_utf8"] = bad;
  out["shards"] = std::move(shards);
  out["metadata"] = std::move(metadata);
  out["tensors"] = std::move(tensors);
  out["bytes_by_type"] = std::move(by_type);
  return out;
}

// A tensor's name for the text tables (escaped in ToJson), marked when it is not UTF-8.
std::string ShownName(const json& t) {
  return t["name"].get<std::string>() + (t.contains("not_utf8") ? " (not UTF-8)" : "");
}

void PrintText(const json& j, bool with_tensors) {
  std::cout << "GGUF " << (j["shard_count"] == 1 ? "file" : "shard set") << ": " << j["path"].get<std::string>()
            << "\n  architecture: " << j["architecture"].get<std::string>() << "\n  shards: " << j["shard_count"]
            << "   tensors: " << j["tensor_count"] << "   tensor data: " << HumanBytes(j["tensor_bytes"])
            << "   files: " << HumanBytes(j["file_bytes"]) << "\n\nmetadata (" << j["metadata"].size()
            << " keys, shard 0):\n";
  for (const auto& [key, v] : j["metadata"].items()) {
    std::printf("  %-48s %-8s %s\n", key.c_str(), v["type"].get<std::string>().c_str(), v["text"].get<std::string>().c_str());
  }
  std::cout << "\nshards:\n";
  for (const auto& s : j["shards"]) {
    std::printf("  %3d  %-60s %12s  v%d  align %-4d data@%-10llu %5d tensors\n", s["index"].get<int>(),
                std::filesystem::path(s["path"].get<std::string>()).filename().c_str(),
                HumanBytes(s["size"]).c_str(), s["version"].get<int>(), s["alignment"].get<int>(),
                static_cast<unsigned long long>(s["data_offset"].get<uint64_t>()), s["tensor_count"].get<int>());
  }
  if (with_tensors) {
    std::cout << "\ntensors:\n";
    for (const auto& t : j["tensors"]) {
      std::printf("  %-44s %-8s %-22s shard %-3d @%-14llu %12llu B\n", ShownName(t).c_str(),
                  t["type"].get<std::string>().c_str(), t["shape"].dump().c_str(), t["shard"].get<int>(),
                  static_cast<unsigned long long>(t["data_offset"].get<uint64_t>()),
                  static_cast<unsigned long long>(t["nbytes"].get<uint64_t>()));
    }
  }
  bool header = false;
  for (const auto& t : j.value("tensors", json::array())) {
    if (!t.contains("stats")) continue;
    if (!header) {
      std::printf("\ndecoded values (bit-exact ggml dequantization):\n  %-44s %-8s %13s %13s %13s %6s %6s\n", "tensor",
                  "type", "min", "max", "mean", "NaN", "inf");
      header = true;
    }
    const json& st = t["stats"];
    if (st.contains("error")) {
      std::printf("  %-44s %-8s %s\n", ShownName(t).c_str(), t["type"].get<std::string>().c_str(),
                  st["error"].get<std::string>().c_str());
      continue;
    }
    auto num = [&](const char* k) { return st[k].is_number() ? st[k].get<double>() : NAN; };
    std::printf("  %-44s %-8s %13.6g %13.6g %13.6g %6llu %6llu\n", ShownName(t).c_str(),
                t["type"].get<std::string>().c_str(), num("min"), num("max"), num("mean"),
                (unsigned long long)st["nan_count"].get<uint64_t>(), (unsigned long long)st["inf_count"].get<uint64_t>());
  }
  std::cout << "\nbytes by type:\n";
  for (const auto& [type, v] : j["bytes_by_type"].items()) {
    std::printf("  %-8s %6d tensors  %12s\n", type.c_str(), v["tensors"].get<int>(), HumanBytes(v["bytes"]).c_str());
  }
}

int RunInspect(const std::vector<std::string>& argv) {
  Args args("inspect", "PATH [--json] [--summary] [--file-only] [--stats [--match TEXT]]",
            "Show the header, metadata, tensor table and per-shard summary of a GGUF file or split shard set.\n"
            "--stats decodes every tensor (bit-exact with ggml) and adds min/max/mean and NaN/inf counts; on a\n"
            "full-size checkpoint that reads every byte, so narrow it with --match.");
  args.Positional("PATH", "a .gguf file, any shard of a split set, or a directory holding one set");
  args.Flag("--json", "print machine-readable JSON (stable keys)");
  args.Flag("--summary", "omit the per-tensor table");
  args.Flag("--file-only", "inspect only this file, not the shard set it belongs to");
  args.Flag("--stats", "decode tensors and report min/max/mean and NaN/inf counts");
  args.Option("--match", "with --stats: only tensors whose name contains TEXT");
  args.Requires("--match", {"--stats"}, "it selects the tensors whose statistics are computed");
  AddProgressOption(args);
  int code = 0;
  if (!args.Parse(argv, &code)) return code;
  auto mode = ProgressModeOf(args);
  if (!mode.ok()) return ReportError("inspect", mode.error(), 2);
  auto in = OpenForInspect(args.positionals()[0], args.Has("--file-only"));
  if (!in.ok()) return ReportError("inspect", in.error());
  if (args.Has("--match")) {
    // A filter that matches nothing would print a table without a single
    // statistic, which reads like success.
    size_t count = 0, matching = 0;
    for (const auto& f : in->files)
      for (const auto& t : f->tensors()) {
        ++count;
        matching += t.name.find(args.Get("--match")) != std::string::npos;
      }
    if (matching == 0)
      return ReportError("inspect", Error("--match '" + args.Get("--match") + "': no tensor name of " + in->label +
                                          " contains it (" + std::to_string(count) + " tensors)")
                                        .WithHint("--match takes part of a tensor name, e.g. blk.1.ffn_gate_exps or "
                                                  "ssm_a; `k3pack inspect " + args.positionals()[0] +
                                                  "` lists them"));
  }
  std::unique_ptr<ProgressReporter> progress;
  if (args.Has("--stats")) progress = StartProgress(*mode);
  json j = ToJson(*in, StatsRequest{args.Has("--stats"), args.Get("--match"), progress.get()});
  if (args.Has("--summary") && !args.Has("--stats")) j.erase("tensors");
  if (args.Has("--json")) {
    PrintJson(j);
    return 0;
  }
  for (auto& [key, v] : j["metadata"].items()) v["text"] = ValueText(v);
  PrintText(j, !args.Has("--summary"));
  return 0;
}

}  // namespace

K3_COMMAND("inspect", "show what a GGUF file or shard set holds", RunInspect);

}  // namespace k3pack::cli
