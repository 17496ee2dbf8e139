// Doctor finds each injected fault with the right diagnosis, and several
// faults at once, without inventing others.
#include "doctor_test_util.h"

#include <linux/capability.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>

#include "../forked_child.h"

namespace dtest {
namespace {

using doctor::Report;
using doctor::Severity;
using synth::Fault;

const doctor::Finding* One(const Report& r, const std::string& code) {
  auto v = r.With(code);
  return v.size() == 1 ? v.front() : nullptr;
}

TEST(Doctor, CleanTinyModelIsHealthyUnderScaled) {
  auto dir = TempDir("clean");
  Synth(dir);
  Report r = Scaled({dir.string()});
  EXPECT_EQ(r.ExitCode(), 0) << Dump(r);
  EXPECT_EQ(r.Count(Severity::kError), 0u) << Dump(r);
  EXPECT_EQ(r.Count(Severity::kWarning), 0u) << Dump(r);
  EXPECT_EQ(r.files.size(), 3u);
  EXPECT_GT(r.tensors_examined, 100u);
  // A single shard path examines the whole set.
  Report one = Scaled({(dir / "KIMI-K3-SYNTH-00002-of-00003.gguf").string()});
  EXPECT_EQ(one.ExitCode(), 0) << Dump(one);
  EXPECT_EQ(one.files.size(), 3u);
}

TEST(Doctor, TinyModelFailsTheKimiK3ProfileWithSglangsText) {
  auto dir = TempDir("k3profile");
  Synth(dir);
  Report r = doctor::Diagnose({dir.string()});
  EXPECT_EQ(r.ExitCode(), 1);
  const doctor::Finding* f = One(r, "config-invalid");
  ASSERT_NE(f, nullptr) << Dump(r);
  EXPECT_EQ(f->sglang_error.rfind("Kimi K3 model invariants do not match the audited model: expected={", 0), 0u)
      << f->sglang_error;
  EXPECT_EQ(f->sglang_exception, "ValueError");
}

struct FaultCase {
  Fault fault;
  std::string code;
  std::string object_suffix;  // the finding's object ends with this
  std::string sglang_prefix;  // SGLang's text starts with this ("" = none)
};

class FaultTest : public ::testing::TestWithParam<FaultCase> {};

TEST_P(FaultTest, FindsTheFaultAndNothingElse) {
  const FaultCase& c = GetParam();
  auto dir = TempDir(std::string(synth::FaultName(c.fault)));
  Synth(dir, {c.fault});
  Report r = Scaled({dir.string()});
  EXPECT_EQ(r.ExitCode(), 1) << Dump(r);
  EXPECT_EQ(ErrorCodes(r), std::set<std::string>{c.code}) << Dump(r);
  auto fs = r.With(c.code);
  ASSERT_FALSE(fs.empty()) << Dump(r);
  const doctor::Finding& f = *fs.front();
  EXPECT_TRUE(f.object.size() >= c.object_suffix.size() &&
              f.object.compare(f.object.size() - c.object_suffix.size(), c.object_suffix.size(), c.object_suffix) == 0)
      << f.object;
  EXPECT_EQ(f.sglang_error.rfind(c.sglang_prefix, 0), 0u) << f.sglang_error;
  EXPECT_FALSE(f.meaning.empty());
  EXPECT_FALSE(f.fix.empty());
  EXPECT_FALSE(f.message.empty());
}

INSTANTIATE_TEST_SUITE_P(
    Synth, FaultTest,
    ::testing::Values(
        FaultCase{Fault::kRawSsmA, "ssm-a-raw-a-log", "blk.0.ssm_a", "Kimi-K3 GGUF ssm_a must contain only -exp(A_log) values"},
        FaultCase{Fault::kNanSsmA, "ssm-a-nonfinite", ".ssm_a", "Kimi-K3 GGUF ssm_a must contain finite floating values"},
        FaultCase{Fault::kZeroSsmA, "ssm-a-zero", ".ssm_a", "Kimi-K3 GGUF ssm_a must contain only -exp(A_log) values"},
        FaultCase{Fault::kBadSplitNo, "split-no-mismatch", "KIMI-K3-SYNTH-00002-of-00003.gguf", "GGUF split.no mismatch for /"},
        FaultCase{Fault::kStaleTensorCount, "split-tensor-count-mismatch", "split.tensors.count", "GGUF split.tensors.count="},
        FaultCase{Fault::kMissingExpert, "expert-missing", "blk.3.ffn_gate_exps.weight",
                  "routed expert tensor coverage mismatch: missing=[(3, 'gate')], extra=[]"},
        FaultCase{Fault::kWrongExpertDtype, "expert-dtype", "blk.1.ffn_gate_exps.weight", "unexpected expert dtype for (1, 'gate'): "},
        FaultCase{Fault::kUnknownTensorName, "tensor-name-unknown", "blk.1.ffn_mystery.weight",
                  "unsupported Kimi-K3 GGUF tensor name: blk.1.ffn_mystery.weight"},
        FaultCase{Fault::kTruncatedShard, "gguf-truncated", "KIMI-K3-SYNTH-00003-of-00003.gguf", ""}),
    [](const auto& info) {
      std::string n(synth::FaultName(info.param.fault));
      for (char& ch : n) ch = ch == '-' ? '_' : ch;
      return n;
    });

TEST(Doctor, SplitNoMismatchQuotesTheResolvedPathAndBothNumbers) {
  auto dir = TempDir("splitno");
  auto res = Synth(dir, {Fault::kBadSplitNo});
  Report r = Scaled({dir.string()});
  const doctor::Finding* f = One(r, "split-no-mismatch");
  ASSERT_NE(f, nullptr) << Dump(r);
  auto real = ResolvePath(res.shard_paths[1]);
  ASSERT_TRUE(real.ok());
  EXPECT_EQ(f->sglang_error, "GGUF split.no mismatch for " + *real + ": 2 != 1");
}

TEST(Doctor, TruncatedShardStillListsItsTensorsSoCoverageStaysAccurate) {
  auto dir = TempDir("trunc");
  Synth(dir, {Fault::kTruncatedShard});
  Report r = Scaled({dir.string()});
  const doctor::Finding* f = One(r, "gguf-truncated");
  ASSERT_NE(f, nullptr) << Dump(r);
  ASSERT_TRUE(f->details.contains("cut_off_tensors"));
  EXPECT_EQ(f->details["cut_off_tensors"].size(), 1u) << f->details.dump();
  // Nothing reported missing: the cut shard's tensor list was still read.
  EXPECT_FALSE(r.Has("tensor-missing")) << Dump(r);
  EXPECT_FALSE(r.Has("expert-missing")) << Dump(r);
  EXPECT_FALSE(r.Has("check-skipped")) << Dump(r);
}

// Before, a tensor offset off the packed order that points past the end (one
// set to 2^40) was called a truncated download ("re-download this shard"):
// the rule broken is the packed order, which the message now names.
TEST(Doctor, AnOffsetPastTheEndIsABrokenHeaderNotATruncatedFile) {
  auto dir = TempDir("offset");
  auto res = Synth(dir);
  const std::string shard = res.shard_paths[2];
  uint64_t field = 0;
  std::string name;
  {
    auto f = gguf::GgufFile::Open(shard);
    ASSERT_TRUE(f.ok()) << f.error().message();
    const gguf::TensorInfo& t = (*f)->tensors().back();
    name = t.name;
    field = t.info_offset + 8 + t.name.size() + 4 + 8ull * t.n_dims + 4;
  }
  const uint64_t far = 1ull << 40;
  WriteAt(shard, field, &far, sizeof far);
  Report r = Scaled({dir.string()});
  EXPECT_FALSE(r.Has("gguf-truncated")) << Dump(r);
  const doctor::Finding* f = One(r, "gguf-unreadable");
  ASSERT_NE(f, nullptr) << Dump(r);
  EXPECT_NE(f->message.find("tensor '" + name + "' has offset 1099511627776, expected "), std::string::npos)
      << f->message;
}

TEST(Doctor, ReportsEveryFaultOfOneSetInOneRun) {
  auto dir = TempDir("many");
  Synth(dir, {Fault::kRawSsmA, Fault::kNanSsmA, Fault::kZeroSsmA, Fault::kBadSplitNo, Fault::kStaleTensorCount,
              Fault::kMissingExpert, Fault::kWrongExpertDtype, Fault::kUnknownTensorName, Fault::kTruncatedShard});
  Report r = Scaled({dir.string()});
  EXPECT_EQ(r.ExitCode(), 1);
  const std::set<std::string> want = {"ssm-a-raw-a-log", "ssm-a-nonfinite", "ssm-a-zero", "split-no-mismatch",
                                      "split-tensor-count-mismatch", "expert-missing", "expert-dtype",
                                      "tensor-name-unknown", "gguf-truncated"};
  EXPECT_EQ(ErrorCodes(r), want) << Dump(r);
  // Three different KDA layers carry the three ssm_a faults.
  std::set<std::string> ssm;
  for (const auto& f : r.findings) {
    if (f.code.rfind("ssm-a-", 0) == 0) ssm.insert(f.object);
  }
  EXPECT_EQ(ssm.size(), 3u);
}

TEST(Doctor, KeepsGoingPastAnUnreadableShard) {
  auto dir = TempDir("garbage");
  auto res = Synth(dir, {Fault::kRawSsmA});
  // Shard 2 becomes garbage: the other two are still examined.
  {
    std::ofstream out(res.shard_paths[1], std::ios::binary | std::ios::trunc);
    out << "this is not a GGUF file";
  }
  Report r = Scaled({dir.string()});
  EXPECT_EQ(r.ExitCode(), 1);
  EXPECT_TRUE(r.Has("gguf-unreadable")) << Dump(r);
  EXPECT_TRUE(r.Has("ssm-a-raw-a-log")) << Dump(r);  // blk.0 lives in shard 1
  EXPECT_FALSE(r.Has("tensor-missing")) << Dump(r);  // not claimed: shard 2 may hold them
  EXPECT_TRUE(r.Has("check-skipped")) << Dump(r);
}

TEST(Doctor, MissingShardAndStrayGguf) {
  auto dir = TempDir("missing");
  auto res = Synth(dir);
  fs::remove(res.shard_paths[2]);
  { std::ofstream(dir / "mmproj.gguf") << "x"; }
  Report r = Scaled({dir.string()});
  EXPECT_EQ(r.ExitCode(), 1);
  const doctor::Finding* inc = One(r, "shard-set-incomplete");
  ASSERT_NE(inc, nullptr) << Dump(r);
  EXPECT_EQ(inc->sglang_error, "GGUF shard set is incomplete: count=3, numbers=[1, 2]");
  EXPECT_TRUE(r.Has("stray-gguf")) << Dump(r);
  EXPECT_TRUE(r.Has("split-count-mismatch")) << Dump(r);
}

// The repair copies the tokenizer files beside the shards after every shard
// is written. A link there that cannot be followed for another reason than a
// missing target (a loop: ELOOP) made directory_entry::is_regular_file()
// throw filesystem_error out of Repair, after hours of copying, leaving its
// marker. It is skipped, as a broken link is and as the manifest writer's
// listing of the same directory skips it.
TEST(Doctor, RepairSkipsATokenizerLinkThatLoops) {
  synth::SynthResult raw = Synth(TempDir("repair-loop"), {synth::Fault::kRawSsmA});
  const fs::path in = fs::path(raw.shard_paths.front()).parent_path();
  ASSERT_TRUE(fs::is_directory(in / "tokenizer"));
  fs::create_symlink("loop", in / "tokenizer" / "loop");
  const fs::path out = TempDir("repair-loop-out") / "o";
  Result<doctor::RepairResult> rep = Error("not run");
  ASSERT_NO_THROW(rep = doctor::Repair(in.string(), out.string(), {}));
  ASSERT_TRUE(rep.ok()) << rep.error().message();
  EXPECT_FALSE(fs::exists(out / "tokenizer" / "loop"));
  EXPECT_FALSE(rep->sidecars_copied.empty());
  EXPECT_FALSE(fs::exists(out / doctor::kRepairMarkerName));
}

// The repair listed the tokenizer directory with an iterator whose failures
// it never saw: a directory it could not read made an output without the
// tokenizer files, reported as a success. A listing that fails (at its start,
// as here, or mid-way, which no test can bring about on demand) is an error.
TEST(Doctor, RepairReportsATokenizerDirectoryItCannotList) {
  synth::SynthResult raw = Synth(TempDir("repair-unlisted"), {synth::Fault::kRawSsmA});
  const fs::path in = fs::path(raw.shard_paths.front()).parent_path();
  const fs::path out = TempDir("repair-unlisted-out") / "o";
  const fs::path said = out.parent_path() / "said.txt";
  ASSERT_EQ(::chmod((in / "tokenizer").c_str(), 0), 0);
  const int code = k3test::InForkedChild([&] {
    if (::geteuid() == 0) {
      // Root reads any directory: give up the capabilities that let it.
      __user_cap_header_struct head{_LINUX_CAPABILITY_VERSION_3, 0};
      __user_cap_data_struct caps[2] = {};
      if (::syscall(SYS_capget, &head, caps) != 0) ::_exit(3);
      for (int cap : {CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH}) caps[cap / 32].effective &= ~(1u << (cap % 32));
      if (::syscall(SYS_capset, &head, caps) != 0) ::_exit(3);
    }
    Result<doctor::RepairResult> rep = doctor::Repair(in.string(), out.string(), {});
    std::ofstream(said) << (rep.ok() ? "OK" : rep.error().message());
    ::_exit(rep.ok() ? 1 : 0);
  });
  ::chmod((in / "tokenizer").c_str(), 0755);
  std::ifstream f(said);
  const std::string message((std::istreambuf_iterator<char>(f)), {});
  ASSERT_NE(code, 3) << "cannot drop the capabilities here";
  EXPECT_EQ(code, 0) << message;
  EXPECT_EQ(message, "cannot list tokenizer directory " + (in / "tokenizer").string() + ": Permission denied");
}

}  // namespace
}  // namespace dtest
