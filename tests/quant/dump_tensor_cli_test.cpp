// `k3pack dump-tensor` end to end on a GGUF written here with known values.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <map>
#include <string>
#include <vector>

#include "k3pack/gguf.h"
#include "../cli_run.h"

namespace k3pack {
namespace {

namespace fs = std::filesystem;

using testing_cli::CliRun;

CliRun RunCli(const std::string& args, const std::string& command = "dump-tensor") {
  return testing_cli::Cli(command + " " + args);
}

gguf::TensorSpec Spec(std::string name, GgmlType type, std::vector<int64_t> ne, std::vector<uint8_t> bytes) {
  auto data = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  return {std::move(name), type, std::move(ne),
          [data](uint64_t off, std::span<uint8_t> out) { std::memcpy(out.data(), data->data() + off, out.size()); }};
}

class DumpTensorCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(K3PACK_BIN)) GTEST_SKIP() << "k3pack CLI not built";
    dir_ = fs::temp_directory_path() / ("k3q-dump-" + std::to_string(getpid()));
    fs::create_directories(dir_);
    path_ = (dir_ / "model.gguf").string();
    std::vector<uint8_t> f32(12 * 4);
    for (int i = 0; i < 12; ++i) {
      const float v = i * 0.5f - 1.0f;
      std::memcpy(&f32[4 * i], &v, 4);
    }
    // Two Q8_0 rows: row 0 has d = 1, qs[j] = j; row 1 has d = 0.25, qs[j] = -j.
    std::vector<uint8_t> q8(2 * 34, 0);
    q8[1] = 0x3C;
    q8[34 + 1] = 0x34;
    for (int j = 0; j < 32; ++j) {
      q8[2 + j] = static_cast<uint8_t>(j);
      q8[34 + 2 + j] = static_cast<uint8_t>(-j);
    }
    std::vector<uint8_t> odd(4 * 4);
    const float odd_values[4] = {1.0f, NAN, INFINITY, -2.0f};
    std::memcpy(odd.data(), odd_values, sizeof odd_values);
    gguf::MetadataBuilder meta;
    meta.Str("general.architecture", "kimi-k3");
    ASSERT_TRUE(gguf::WriteGguf(path_, meta,
                                {Spec("a.weight", GgmlType::F32, {4, 3}, f32),
                                 Spec("q.weight", GgmlType::Q8_0, {32, 2}, q8),
                                 Spec("odd.weight", GgmlType::F32, {4}, odd)})
                    .ok());
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  fs::path dir_;
  std::string path_;
};

TEST_F(DumpTensorCli, JsonValuesAreTheDecodedRows) {
  CliRun r = RunCli(path_ + " q.weight --rows 1:2 --json --stats");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["type"], "Q8_0");
  EXPECT_EQ(j["rows"], nlohmann::json::array({1, 2}));
  ASSERT_EQ(j["values"].size(), 1u);
  ASSERT_EQ(j["values"][0].size(), 32u);
  EXPECT_EQ(j["values"][0][0].get<double>(), 0.0);
  EXPECT_EQ(j["values"][0][5].get<double>(), -1.25);
  EXPECT_EQ(j["values"][0][31].get<double>(), -7.75);
  EXPECT_EQ(j["stats"]["count"], 32);
  EXPECT_EQ(j["stats"]["min"].get<double>(), -7.75);

  CliRun all = RunCli(path_ + " a.weight --json");
  ASSERT_EQ(all.code, 0) << all.out;
  auto ja = nlohmann::json::parse(all.out);
  EXPECT_EQ(ja["shape"], nlohmann::json::array({4, 3}));
  ASSERT_EQ(ja["values"].size(), 3u);  // default: first 4 rows, the tensor has 3
  EXPECT_EQ(ja["values"][2][3].get<double>(), 4.5);
}

TEST_F(DumpTensorCli, TextOutputAndErrors) {
  CliRun r = RunCli(path_ + " q.weight --rows 0");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("q.weight  Q8_0  ne=[32, 2]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("31"), std::string::npos);

  CliRun missing = RunCli(path_ + " nope.weight");
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.out.find("tensor 'nope.weight' not found"), std::string::npos) << missing.out;

  CliRun near = RunCli(path_ + " q.weig");
  EXPECT_NE(near.out.find("similar names: q.weight"), std::string::npos) << near.out;

  CliRun bad_rows = RunCli(path_ + " q.weight --rows 1:9");
  EXPECT_EQ(bad_rows.code, 2);
  EXPECT_NE(bad_rows.out.find("the tensor has 2 rows"), std::string::npos) << bad_rows.out;

  CliRun usage = RunCli(path_);
  EXPECT_EQ(usage.code, 2);
}

// docs/quant.md promises "a hint listing similar names" for an unknown name:
// a typo (letters swapped or dropped) is the common case, and it is neither a
// substring of the real name nor the reverse, so it used to get no names.
TEST_F(DumpTensorCli, AMisspelledNameGetsSimilarNames) {
  CliRun swapped = RunCli(path_ + " q.wieght");
  EXPECT_EQ(swapped.code, 1);
  EXPECT_NE(swapped.out.find("similar names: q.weight"), std::string::npos) << swapped.out;
  CliRun dropped = RunCli(path_ + " odd.weght --json");
  EXPECT_EQ(dropped.code, 1);
  EXPECT_NE(dropped.out.find("similar names: odd.weight"), std::string::npos) << dropped.out;
  // Far from every name: no guess, the pointer to `inspect` instead.
  CliRun far = RunCli(path_ + " blk.7.ffn_gate_exps.weight");
  EXPECT_NE(far.out.find("list the tensors with `k3pack inspect"), std::string::npos) << far.out;
}

// K3PACK_QUANT_ISA with a typo used to leave dequantize on the fastest path
// without a word; a value naming a path is quiet, and the output is the same.
TEST_F(DumpTensorCli, AnIsaCapNamingNoPathIsAWarning) {
  CliRun typo = testing_cli::CliVia("K3PACK_QUANT_ISA=scaler", "dump-tensor " + path_ + " q.weight --rows 0");
  EXPECT_EQ(typo.code, 0) << typo.out;
  EXPECT_NE(typo.out.find("k3pack dump-tensor: warning: K3PACK_QUANT_ISA='scaler' names none of scalar, avx2, "
                          "avx512, auto and is ignored; dequantize uses "),
            std::string::npos)
      << typo.out;
  for (const char* valid : {"scalar", "avx2", "avx512", "auto"}) {
    CliRun r = testing_cli::CliVia(std::string("K3PACK_QUANT_ISA=") + valid, "dump-tensor " + path_ + " q.weight --rows 0");
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(r.out.find("warning"), std::string::npos) << valid << ": " << r.out;
  }
}

// `inspect --stats`: per-tensor statistics of the decoded values.
TEST_F(DumpTensorCli, InspectStatsSummarizesDecodedValues) {
  CliRun r = RunCli(path_ + " --stats --json", "inspect");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  std::map<std::string, nlohmann::json> stats;
  for (const auto& t : j["tensors"]) stats[t["name"].get<std::string>()] = t["stats"];
  ASSERT_EQ(stats.size(), 3u);
  // a.weight: -1, -0.5, ..., 4.5.
  EXPECT_EQ(stats["a.weight"]["min"].get<double>(), -1.0);
  EXPECT_EQ(stats["a.weight"]["max"].get<double>(), 4.5);
  EXPECT_DOUBLE_EQ(stats["a.weight"]["mean"].get<double>(), 1.75);
  EXPECT_EQ(stats["a.weight"]["count"], 12);
  // q.weight: row 0 = 0..31 (d = 1), row 1 = -0.25 * j.
  EXPECT_EQ(stats["q.weight"]["min"].get<double>(), -7.75);
  EXPECT_EQ(stats["q.weight"]["max"].get<double>(), 31.0);
  EXPECT_DOUBLE_EQ(stats["q.weight"]["mean"].get<double>(), (496.0 - 0.25 * 496.0) / 64.0);
  EXPECT_EQ(stats["q.weight"]["nan_count"], 0);
  // NaN and inf are counted, not folded into min/max/mean.
  EXPECT_EQ(stats["odd.weight"]["nan_count"], 1);
  EXPECT_EQ(stats["odd.weight"]["inf_count"], 1);
  EXPECT_EQ(stats["odd.weight"]["min"].get<double>(), -2.0);
  EXPECT_EQ(stats["odd.weight"]["max"].get<double>(), 1.0);

  CliRun only = RunCli(path_ + " --stats --match q.w", "inspect");
  ASSERT_EQ(only.code, 0) << only.out;
  EXPECT_NE(only.out.find("decoded values"), std::string::npos) << only.out;
  EXPECT_NE(only.out.find("q.weight"), std::string::npos);
  EXPECT_EQ(RunCli(path_ + " --match q", "inspect").code, 2) << "--match without --stats is a usage error";
  CliRun none = RunCli(path_ + " --stats --match nothing.like.this", "inspect");
  EXPECT_EQ(none.code, 1) << none.out;
  EXPECT_NE(none.out.find("no tensor name of"), std::string::npos) << none.out;
}

// inspect --stats --json and dump-tensor --stats --json describe the same
// tensor with the same keys and values; the keys are those of
// quant::TensorStats and the Python API's k3pack.tensor_stats (test_ops.py).
TEST_F(DumpTensorCli, InspectAndDumpTensorStatsUseTheSameKeys) {
  CliRun in = RunCli(path_ + " --stats --json", "inspect");
  ASSERT_EQ(in.code, 0) << in.out;
  std::map<std::string, nlohmann::json> by_inspect;
  const nlohmann::json inspected = nlohmann::json::parse(in.out);
  for (const auto& t : inspected["tensors"]) by_inspect[t["name"].get<std::string>()] = t["stats"];
  const std::vector<std::string> keys = {"count", "inf_count", "max", "mean", "min", "nan_count"};
  for (const std::string name : {"a.weight", "q.weight", "odd.weight"}) {
    SCOPED_TRACE(name);
    CliRun d = RunCli(path_ + " " + name + " --rows 0: --stats --json");
    ASSERT_EQ(d.code, 0) << d.out;
    const nlohmann::json dumped = nlohmann::json::parse(d.out)["stats"];
    std::vector<std::string> got;
    for (const auto& [k, v] : dumped.items()) got.push_back(k);
    EXPECT_EQ(got, keys) << dumped.dump();
    EXPECT_EQ(by_inspect[name], dumped) << "inspect: " << by_inspect[name].dump() << "\ndump-tensor: " << dumped.dump();
  }
  // The tensor with a NaN and an inf shows both counts under both commands.
  EXPECT_EQ(by_inspect["odd.weight"]["nan_count"], 1);
  EXPECT_EQ(by_inspect["odd.weight"]["inf_count"], 1);
}

}  // namespace
}  // namespace k3pack
