// The CLI: exit codes, the --json schema, and the repair round trip
// (repair -> doctor healthy -> every byte identical except the ssm_a ranges).
#include <cmath>
#include <cstdlib>

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include <fstream>

#include "doctor_test_util.h"

namespace dtest {
namespace {

using synth::Fault;

TEST(DoctorCli, ExitCodes) {
  auto dir = TempDir("cli-exit");
  Synth(dir);
  EXPECT_EQ(RunCli("doctor --profile scaled " + dir.string()).exit_code, 0);
  auto bad = TempDir("cli-exit-bad");
  Synth(bad, {Fault::kZeroSsmA});
  EXPECT_EQ(RunCli("doctor --profile scaled " + bad.string()).exit_code, 1);
  EXPECT_EQ(RunCli("doctor " + (dir / "no-such-file.gguf").string()).exit_code, 1);  // unusable input: exit 1, status "unusable"
  { std::ofstream(dir / "junk.bin") << "not a gguf"; }
  EXPECT_EQ(RunCli("doctor " + (dir / "junk.bin").string()).exit_code, 1);  // unusable input: exit 1, status "unusable"
  auto empty = TempDir("cli-exit-empty");
  EXPECT_EQ(RunCli("doctor " + empty.string()).exit_code, 1);  // unusable input: exit 1, status "unusable"
  EXPECT_EQ(RunCli("doctor --profile nope " + dir.string()).exit_code, 2);
  EXPECT_EQ(RunCli("doctor").exit_code, 2);  // PATH is required
  // Healthy and broken inputs together: problems found.
  EXPECT_EQ(RunCli("doctor --profile scaled " + dir.string() + " " + bad.string()).exit_code, 1);
}

TEST(DoctorCli, JsonSchema) {
  auto dir = TempDir("cli-json");
  Synth(dir, {Fault::kRawSsmA, Fault::kMissingExpert});
  auto r = RunCli("doctor --json --profile scaled " + dir.string());
  EXPECT_EQ(r.exit_code, 1);
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["schema"], "k3pack-doctor-v1");
  EXPECT_EQ(j["status"], "problems");
  EXPECT_EQ(j["exit_code"], 1);
  EXPECT_EQ(j["profile"], "scaled");
  EXPECT_EQ(j["inputs"], nlohmann::json::array({dir.string()}));
  for (const char* k : {"errors", "warnings", "info", "files", "tensors"}) EXPECT_TRUE(j["summary"][k].is_number()) << k;
  EXPECT_EQ(j["summary"]["files"], 3);
  ASSERT_TRUE(j["checks"].is_array());
  for (const auto& c : j["checks"]) {
    EXPECT_TRUE(c["name"].is_string());
    EXPECT_TRUE(c["ran"].is_boolean());
  }
  std::set<std::string> codes;
  for (const auto& f : j["findings"]) {
    for (const char* k : {"severity", "code", "object", "file", "message", "sglang_error", "sglang_exception", "meaning",
                          "fix"}) {
      EXPECT_TRUE(f[k].is_string()) << k << " in " << f.dump();
    }
    EXPECT_TRUE(f["details"].is_object());
    codes.insert(f["code"]);
  }
  EXPECT_TRUE(codes.count("ssm-a-raw-a-log"));
  EXPECT_TRUE(codes.count("expert-missing"));
  EXPECT_EQ(j["summary"]["errors"], 2);

  auto healthy = TempDir("cli-json-ok");
  Synth(healthy);
  auto h = nlohmann::json::parse(RunCli("doctor --json --profile scaled " + healthy.string()).out, nullptr, false);
  EXPECT_EQ(h["status"], "healthy");
  EXPECT_EQ(h["findings"], nlohmann::json::array());
  auto u = nlohmann::json::parse(RunCli("doctor --json /no/such/path").out, nullptr, false);
  EXPECT_EQ(u["status"], "unusable");
  EXPECT_EQ(u["exit_code"], 1);
}

TEST(DoctorCli, TextReportNamesCodeObjectSglangTextAndFix) {
  auto dir = TempDir("cli-text");
  Synth(dir, {Fault::kRawSsmA});
  auto r = RunCli("doctor --profile scaled " + dir.string());
  EXPECT_NE(r.out.find("ERROR [ssm-a-raw-a-log] blk.0.ssm_a"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("SGLang:  ValueError: Kimi-K3 GGUF ssm_a must contain only -exp(A_log) values"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("k3pack repair"), std::string::npos) << r.out;
}

TEST(RepairCli, RoundTripChangesOnlyTheSsmARanges) {
  auto in = TempDir("rep-in");
  auto res = Synth(in, {Fault::kRawSsmA});
  std::vector<std::string> before;
  for (const auto& p : res.shard_paths) before.push_back(ReadAll(p));
  auto out = TempDir("rep-out") / "fixed";

  auto r = RunCli("repair --json --profile scaled " + in.string() + " " + out.string() + " --fix ssm-a");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  ASSERT_EQ(j["repaired"].size(), 1u) << r.out;
  EXPECT_EQ(j["repaired"][0]["name"], "blk.0.ssm_a");
  EXPECT_EQ(j["remaining_problems"], nlohmann::json::array());

  // The input is untouched.
  for (size_t i = 0; i < res.shard_paths.size(); ++i) EXPECT_EQ(ReadAll(res.shard_paths[i]), before[i]);
  // Config and tokenizer came along.
  EXPECT_EQ(ReadAll(out / "config.json"), ReadAll(in / "config.json"));
  EXPECT_TRUE(fs::exists(out / "tokenizer" / "config.json"));

  // Every byte identical except the repaired range, which holds -exp(raw).
  const std::string file = j["repaired"][0]["file"];
  const uint64_t off = j["repaired"][0]["data_offset"], n = j["repaired"][0]["nbytes"];
  for (size_t i = 0; i < res.shard_paths.size(); ++i) {
    const fs::path o = out / fs::path(res.shard_paths[i]).filename();
    const std::string after = ReadAll(o);
    ASSERT_EQ(after.size(), before[i].size());
    if (o.string() != file) {
      EXPECT_EQ(std::system(("cmp -s " + res.shard_paths[i] + " " + o.string()).c_str()), 0) << o;
      continue;
    }
    EXPECT_EQ(after.compare(0, off, before[i], 0, off), 0);
    EXPECT_EQ(after.compare(off + n, std::string::npos, before[i], off + n, std::string::npos), 0);
    for (uint64_t k = 0; k < n / 4; ++k) {
      float raw, fixed;
      std::memcpy(&raw, before[i].data() + off + 4 * k, 4);
      std::memcpy(&fixed, after.data() + off + 4 * k, 4);
      EXPECT_EQ(fixed, -std::exp(raw)) << k;
      EXPECT_LT(fixed, 0.0f);
    }
  }
  // The output is healthy.
  EXPECT_EQ(RunCli("doctor --profile scaled " + out.string()).exit_code, 0);
}

TEST(RepairCli, RefusesAmbiguousOrUnfixableInputsAndWritesNothing) {
  for (Fault f : {Fault::kZeroSsmA, Fault::kNanSsmA}) {
    auto in = TempDir("rep-refuse");
    Synth(in, {Fault::kRawSsmA, f});
    auto out = TempDir("rep-refuse-out") / "o";
    auto r = RunCli("repair " + in.string() + " " + out.string() + " --fix ssm-a");
    EXPECT_EQ(r.exit_code, 1) << synth::FaultName(f);
    EXPECT_FALSE(fs::exists(out)) << synth::FaultName(f);
  }
  // Nothing to repair in a clean model.
  auto clean = TempDir("rep-clean");
  Synth(clean);
  EXPECT_EQ(RunCli("repair " + clean.string() + " " + (clean / "o").string() + " --fix ssm-a").exit_code, 1);
  EXPECT_FALSE(fs::exists(clean / "o"));
  // OUT must be empty.
  auto in = TempDir("rep-nonempty");
  Synth(in, {Fault::kRawSsmA});
  auto out = TempDir("rep-nonempty-out");
  { std::ofstream(out / "keep.txt") << "x"; }
  EXPECT_EQ(RunCli("repair " + in.string() + " " + out.string() + " --fix ssm-a").exit_code, 1);
  EXPECT_EQ(std::distance(fs::directory_iterator(out), fs::directory_iterator{}), 1);
  // Unknown fix: usage error.
  EXPECT_EQ(RunCli("repair " + in.string() + " " + (out / "x").string() + " --fix everything").exit_code, 2);
}

TEST(RepairCli, ZeroedElementsAreReportedAsZerosAndNeverRewritten) {
  // Values in [-1, 0) with one zeroed element used to count as raw A_log,
  // and repair rewrote them as -exp(x): a silent corruption of good values.
  auto src = TempDir("rep-zeroed-src");
  Synth(src);
  auto in = TempDir("rep-zeroed");
  Rewrite(src, in, {{"blk.1.ssm_a", WithBytes(F32Bytes({-0.5f, -0.2f, 0.0f, -0.9f}))}});
  doctor::Report d = Scaled({in.string()});
  EXPECT_EQ(ErrorCodes(d), std::set<std::string>{"ssm-a-zero"}) << Dump(d);
  doctor::RepairOptions o;
  o.profile = kimi::Profile::kScaled;
  auto r = doctor::Repair(in.string(), (in / "out").string(), o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("blk.1.ssm_a: values look zeroed-elements"), std::string::npos)
      << r.error().message();
  EXPECT_FALSE(fs::exists(in / "out"));
}

// Session 41: "shard P is unreadable" without why (the reader's offset and
// rule were only in doctor's report).
TEST(RepairCli, AnUnreadableShardIsRefusedWithTheReason) {
  auto in = TempDir("rep-unreadable");
  auto synth = Synth(in);
  std::vector<std::string> shards;
  for (const auto& e : fs::directory_iterator(in))
    if (e.path().extension() == ".gguf") shards.push_back(e.path().string());
  std::sort(shards.begin(), shards.end());
  ASSERT_EQ(shards.size(), 3u);
  {
    std::fstream f(shards[1], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    f << std::string(24, 'X');  // the tensor count and more: a header no reader accepts
  }
  doctor::RepairOptions o;
  o.profile = kimi::Profile::kScaled;
  auto r = doctor::Repair(in.string(), (in / "out").string(), o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("shard " + shards[1] + " is unreadable: offset 8: tensor count "),
            std::string::npos)
      << r.error().message();
  EXPECT_FALSE(fs::exists(in / "out"));
}

TEST(RepairCli, MixedFormsAreRefusedWithTheReason) {
  auto src = TempDir("rep-mixed-src");
  Synth(src);
  auto in = TempDir("rep-mixed");
  Rewrite(src, in, {{"blk.1.ssm_a", WithBytes(F32Bytes({-3.0f, -12.0f, 0.4f, 0.2f}))}});
  doctor::RepairOptions o;
  o.profile = kimi::Profile::kScaled;
  auto r = doctor::Repair(in.string(), (in / "out").string(), o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("blk.1.ssm_a: values look mixed-forms"), std::string::npos) << r.error().message();
  EXPECT_FALSE(fs::exists(in / "out"));
}

TEST(RepairCli, F16RawALogIsRepairedInF16) {
  auto src = TempDir("rep-f16-src");
  Synth(src);
  auto in = TempDir("rep-f16");
  auto raw = doctor::EncodeFloatTensor(GgmlType::F16, std::vector<float>{0.25f, -0.5f, 1.0f, 0.0f});
  Rewrite(src, in, {{"blk.2.ssm_a", WithType(GgmlType::F16, *raw)}});
  doctor::RepairOptions o;
  o.profile = kimi::Profile::kScaled;
  auto r = doctor::Repair(in.string(), (in / "out").string(), o);
  ASSERT_TRUE(r.ok()) << r.error().message();
  ASSERT_EQ(r->repaired.size(), 1u);
  EXPECT_TRUE(r->remaining_problems.empty());
  auto set = gguf::ShardSet::Open((in / "out").string());
  ASSERT_TRUE(set.ok());
  auto loc = set->FindTensor("blk.2.ssm_a");
  ASSERT_TRUE(loc.has_value());
  EXPECT_EQ(loc->info->type, GgmlType::F16);
  auto vals = doctor::DecodeFloatTensor(GgmlType::F16, set->shards()[loc->shard_index]->TensorData(*loc->info));
  ASSERT_TRUE(vals.has_value());
  const float want[] = {0.25f, -0.5f, 1.0f, 0.0f};
  for (int k = 0; k < 4; ++k) EXPECT_NEAR((*vals)[k], -std::exp(want[k]), 2e-3 * std::exp(want[k]));
}

}  // namespace
}  // namespace dtest

namespace dtest {
namespace {

TEST(RepairCli, Bf16RawALogIsRefused) {
  auto src = TempDir("rep-bf16-src");
  Synth(src);
  auto in = TempDir("rep-bf16");
  auto raw = doctor::EncodeFloatTensor(GgmlType::BF16, std::vector<float>{0.25f, -0.5f, 1.0f, 0.0f});
  Rewrite(src, in, {{"blk.2.ssm_a", WithType(GgmlType::BF16, *raw)}});
  doctor::Report d = Scaled({in.string()});
  EXPECT_EQ(ErrorCodes(d), std::set<std::string>{"ssm-a-not-float"}) << Dump(d);
  doctor::RepairOptions o;
  o.profile = kimi::Profile::kScaled;
  auto r = doctor::Repair(in.string(), (in / "out").string(), o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("blk.2.ssm_a: stored as BF16"), std::string::npos) << r.error().message();
}

}  // namespace
}  // namespace dtest

namespace dtest {
namespace {

// The real Kimi-K3 structure (93 layers, 896 experts, 19 sparse shards):
// healthy under the strict kimi-k3 profile; a raw A_log is repaired and the
// copy keeps its holes.
TEST(K3Structure, StrictProfileHealthyAndSparseRepair) {
  auto dir = TempDir("k3s");
  auto o = synth::PresetOptions("k3-structure");
  ASSERT_TRUE(o.ok());
  o->out_dir = (dir / "in").string();
  o->faults = {synth::Fault::kRawSsmA};
  auto res = synth::WriteSynthModel(*o);
  ASSERT_TRUE(res.ok()) << res.error().message();
  doctor::Report r = doctor::Diagnose({o->out_dir});
  EXPECT_EQ(ErrorCodes(r), std::set<std::string>{"ssm-a-raw-a-log"}) << Dump(r);
  EXPECT_EQ(r.files.size(), 19u);
  EXPECT_EQ(r.tensors_examined, 2573u);

  auto fixed = doctor::Repair(o->out_dir, (dir / "out").string());
  ASSERT_TRUE(fixed.ok()) << fixed.error().message();
  EXPECT_TRUE(fixed->remaining_problems.empty());
  uint64_t apparent = 0, allocated = 0;
  for (const auto& p : fixed->shards_written) {
    struct stat st;
    ASSERT_EQ(::stat(p.c_str(), &st), 0);
    apparent += static_cast<uint64_t>(st.st_size);
    allocated += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  EXPECT_GT(apparent, 100ull << 30);   // ~1 TB of tensors ...
  EXPECT_LT(allocated, 1ull << 30);    // ... almost all of it holes, kept as holes
  EXPECT_LE(fixed->bytes_copied, 1ull << 30);
  EXPECT_EQ(doctor::Diagnose({(dir / "out").string()}).ExitCode(), 0);
}

}  // namespace
}  // namespace dtest
