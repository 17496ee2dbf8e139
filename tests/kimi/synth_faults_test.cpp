// Each --fault produces exactly its defect, visible when the files are read back.
#include <gtest/gtest.h>

#include <cmath>

#include "kimi/tensors.h"
#include "synth_test_util.h"

namespace k3pack::synth {
namespace {

using testing::F32Values;
using testing::TempDir;
using testing::Tiny;

Result<SynthResult> WriteWith(const TempDir& dir, Fault f) {
  SynthOptions o = Tiny(dir.path());
  o.faults = {f};
  return WriteSynthModel(o);
}

std::vector<float> SsmA(const gguf::ShardSet& set, const std::string& name) {
  auto loc = set.FindTensor(name);
  EXPECT_TRUE(loc) << name;
  if (!loc) return {};
  return F32Values(*set.shards()[loc->shard_index], *loc->info);
}

TEST(SynthFaults, RawSsmA) {
  TempDir dir;
  auto res = WriteWith(dir, Fault::kRawSsmA);
  ASSERT_TRUE(res.ok()) << res.error().message();
  ASSERT_EQ(res->fault_notes.size(), 1u);
  EXPECT_EQ(res->fault_notes[0], "raw-ssm-a: blk.0.ssm_a");
  auto set = gguf::ShardSet::Open(dir.path());
  ASSERT_TRUE(set.ok()) << set.error().message();
  auto v = SsmA(*set, "blk.0.ssm_a");
  bool pos = false, neg = false;
  for (float x : v) {
    EXPECT_TRUE(std::isfinite(x));
    EXPECT_LE(std::fabs(x), 0.52f);
    pos |= x > 0;
    neg |= x < 0;
  }
  EXPECT_TRUE(pos && neg);
  for (float x : SsmA(*set, "blk.1.ssm_a")) EXPECT_LE(x, -1.0f);  // other layers untouched
}

TEST(SynthFaults, NanSsmA) {
  TempDir dir;
  ASSERT_TRUE(WriteWith(dir, Fault::kNanSsmA).ok());
  auto set = gguf::ShardSet::Open(dir.path());
  ASSERT_TRUE(set.ok());
  int nans = 0;
  for (float x : SsmA(*set, "blk.1.ssm_a")) nans += std::isnan(x);
  EXPECT_EQ(nans, 1);
  for (float x : SsmA(*set, "blk.0.ssm_a")) EXPECT_LT(x, 0.0f);
}

TEST(SynthFaults, ZeroSsmA) {
  TempDir dir;
  ASSERT_TRUE(WriteWith(dir, Fault::kZeroSsmA).ok());
  auto set = gguf::ShardSet::Open(dir.path());
  ASSERT_TRUE(set.ok());
  auto v = SsmA(*set, "blk.2.ssm_a");
  ASSERT_EQ(v.size(), 4u);
  for (float x : v) EXPECT_EQ(x, 0.0f);
}

TEST(SynthFaults, BadSplitNo) {
  TempDir dir;
  auto res = WriteWith(dir, Fault::kBadSplitNo);
  ASSERT_TRUE(res.ok()) << res.error().message();
  auto f = gguf::GgufFile::Open(res->shard_paths[1]);
  ASSERT_TRUE(f.ok()) << f.error().message();  // still a valid GGUF on its own
  EXPECT_EQ(*(*f)->Find("split.no")->AsInt(), 2);
  auto set = gguf::ShardSet::Open(dir.path());
  ASSERT_FALSE(set.ok());
  EXPECT_NE(set.error().message().find("split.no"), std::string::npos) << set.error().message();
}

TEST(SynthFaults, StaleTensorCount) {
  TempDir dir;
  auto res = WriteWith(dir, Fault::kStaleTensorCount);
  ASSERT_TRUE(res.ok()) << res.error().message();
  for (const auto& p : res->shard_paths) {
    auto f = gguf::GgufFile::Open(p);
    ASSERT_TRUE(f.ok());
    EXPECT_EQ(*(*f)->Find("split.tensors.count")->AsInt(), 108);
  }
  auto set = gguf::ShardSet::Open(dir.path());
  ASSERT_FALSE(set.ok());
  EXPECT_NE(set.error().message().find("split.tensors.count"), std::string::npos) << set.error().message();
}

TEST(SynthFaults, MissingExpert) {
  TempDir dir;
  auto res = WriteWith(dir, Fault::kMissingExpert);
  ASSERT_TRUE(res.ok()) << res.error().message();
  auto set = gguf::ShardSet::Open(dir.path());
  ASSERT_TRUE(set.ok()) << set.error().message();  // consistent counts: only the tensor is missing
  EXPECT_EQ(set->tensor_count(), 106u);
  EXPECT_FALSE(set->FindTensor("blk.3.ffn_gate_exps.weight"));
  EXPECT_TRUE(set->FindTensor("blk.3.ffn_up_exps.weight"));
  EXPECT_TRUE(set->FindTensor("blk.2.ffn_gate_exps.weight"));
}

TEST(SynthFaults, WrongExpertDtype) {
  TempDir dir;
  auto res = WriteWith(dir, Fault::kWrongExpertDtype);
  ASSERT_TRUE(res.ok()) << res.error().message();
  auto set = gguf::ShardSet::Open(dir.path());
  ASSERT_TRUE(set.ok()) << set.error().message();
  EXPECT_EQ(set->FindTensor("blk.1.ffn_gate_exps.weight")->info->type, GgmlType::Q4_K);
  EXPECT_EQ(set->FindTensor("blk.1.ffn_up_exps.weight")->info->type, GgmlType::Q2_K);
  EXPECT_EQ(set->FindTensor("blk.2.ffn_gate_exps.weight")->info->type, GgmlType::Q2_K);
  EXPECT_EQ(res->fault_notes[0], "wrong-expert-dtype: blk.1.ffn_gate_exps.weight is Q4_K instead of Q2_K");
}

TEST(SynthFaults, UnknownTensorName) {
  TempDir dir;
  ASSERT_TRUE(WriteWith(dir, Fault::kUnknownTensorName).ok());
  auto set = gguf::ShardSet::Open(dir.path());
  ASSERT_TRUE(set.ok()) << set.error().message();
  EXPECT_EQ(set->tensor_count(), 108u);
  EXPECT_TRUE(set->FindTensor("blk.1.ffn_mystery.weight"));
}

TEST(SynthFaults, TruncatedShard) {
  TempDir dir;
  auto res = WriteWith(dir, Fault::kTruncatedShard);
  ASSERT_TRUE(res.ok()) << res.error().message();
  EXPECT_TRUE(gguf::GgufFile::Open(res->shard_paths[0]).ok());
  auto last = gguf::GgufFile::Open(res->shard_paths.back());
  ASSERT_FALSE(last.ok());
  EXPECT_NE(last.error().message().find("output.weight"), std::string::npos) << last.error().message();
  EXPECT_FALSE(gguf::ShardSet::Open(dir.path()).ok());
}

TEST(SynthFaults, CombinedOnATwoLayerModel) {
  TempDir dir;
  SynthOptions o = Tiny(dir.path());
  o.dims.num_layers = 2;  // layer 0 dense KDA, layer 1 MoE MLA (the last layer)
  o.faults = {Fault::kMissingExpert, Fault::kWrongExpertDtype, Fault::kRawSsmA};
  auto res = WriteSynthModel(o);
  ASSERT_TRUE(res.ok()) << res.error().message();
  EXPECT_EQ(res->fault_notes.size(), 3u);
  auto set = gguf::ShardSet::Open(dir.path());
  ASSERT_TRUE(set.ok()) << set.error().message();
  EXPECT_FALSE(set->FindTensor("blk.1.ffn_gate_exps.weight"));
  EXPECT_EQ(set->FindTensor("blk.1.ffn_up_exps.weight")->info->type, GgmlType::Q4_K);
  o.faults = {Fault::kRawSsmA, Fault::kNanSsmA};  // only one KDA layer to hit
  auto clash = WriteSynthModel(o);
  ASSERT_FALSE(clash.ok());
  EXPECT_NE(clash.error().message().find("blk.0.ssm_a"), std::string::npos) << clash.error().message();
}

TEST(SynthFaults, CleanModelHasNoFaultNotesAndNamesParse) {
  TempDir dir;
  auto res = WriteSynthModel(Tiny(dir.path()));
  ASSERT_TRUE(res.ok());
  EXPECT_TRUE(res->fault_notes.empty());
  for (Fault f : AllFaults()) {
    auto back = ParseFault(FaultName(f));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, f);
  }
  auto bad = ParseFault("nan-everything");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("truncated-shard"), std::string::npos);
}

}  // namespace
}  // namespace k3pack::synth
