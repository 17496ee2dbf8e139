// The stream over the synthetic tiny Kimi-K3 (llama.cpp's exact layout):
// every non-routed tensor comes out once, in order, and each synth fault that
// concerns the loader is reported with SGLang's text.
#include "k3pack/names.h"
#include "k3pack/synth.h"
#include "loader_fixture.h"

namespace k3pack::loader {
namespace {

using namespace testing;  // NOLINT

struct SynthModel {
  std::string manifest;
  std::vector<std::string> shards;
};

SynthModel WriteTiny(const std::string& dir, std::vector<synth::Fault> faults = {}) {
  auto o = synth::PresetOptions("tiny");
  EXPECT_TRUE(o.ok());
  o->out_dir = dir;
  o->faults = std::move(faults);
  auto r = synth::WriteSynthModel(*o);
  EXPECT_TRUE(r.ok()) << r.error().message();
  SynthModel m;
  m.shards = r->shard_paths;
  m.manifest = WriteJson(dir + "/manifest.json", ManifestFor(m.shards));
  return m;
}

TEST(SynthStream, EveryNonRoutedTensorOnceInGgufOrder) {
  TempDir dir("synth");
  SynthModel m = WriteTiny(dir.path);
  // Expected sequence from the files themselves: shard order, info order.
  std::vector<std::string> want;
  uint64_t routed = 0, source = 0;
  for (const auto& path : m.shards) {
    auto f = gguf::GgufFile::Open(path);
    ASSERT_TRUE(f.ok());
    for (const auto& t : (*f)->tensors()) {
      ++source;
      if (kimi::IsRoutedExpertAggregate(t.name)) {
        ++routed;
        continue;
      }
      auto mapping = kimi::MapTensorName(t.name);
      ASSERT_TRUE(mapping.ok()) << mapping.error().message();
      for (const auto& target : mapping->targets) {
        const bool q = kimi::IsSglangQuantized(t.type);
        const std::string rn = kimi::RuntimeName(target.name, q);
        if (q) want.push_back(kimi::QweightTypeName(rn));
        want.push_back(rn);
      }
    }
  }
  auto s = NonExpertStream::Open(m.manifest);
  ASSERT_TRUE(s.ok()) << s.error().message();
  std::optional<Error> err;
  auto out = Drain(*s, &err);
  ASSERT_FALSE(err) << err->message();
  std::vector<std::string> got;
  for (const auto& t : out) got.push_back(t.name);
  EXPECT_EQ(got, want);
  EXPECT_EQ(s->stats().routed_skipped, routed);
  EXPECT_EQ(routed, 3u * 3u);  // layers 1..3, gate/up/down
  EXPECT_EQ(s->stats().source_tensors, source);

  // Spot checks on the real layout: K3 SGLang type requirements, A_log sign.
  size_t alogs = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const NamedTensor& t = out[i];
    if (t.name.ends_with("k_b_qweight_type")) {
      EXPECT_EQ(t.data[0], 2) << t.name;  // Q4_0
    }
    if (t.name.ends_with("v_b_qweight_type")) {
      EXPECT_EQ(t.data[0], 10) << t.name;  // Q2_K
    }
    if (t.kind == TensorKind::kQweightType) {
      ASSERT_LT(i + 1, out.size());
      EXPECT_EQ(out[i + 1].kind, TensorKind::kQweight);  // immediately followed by its qweight
    }
    if (t.kind == TensorKind::kALog) {
      ++alogs;
      EXPECT_EQ(t.dtype, DType::kFloat32);
      EXPECT_EQ(t.shape, std::vector<int64_t>{4});  // (H,)
      for (size_t k = 0; k < 4; ++k) EXPECT_TRUE(std::isfinite(F32At(t, k)));
    }
  }
  EXPECT_GT(alogs, 0u);
}

TEST(SynthStream, FaultsReportSglangTexts) {
  struct Case {
    synth::Fault fault;
    std::string message;
    ErrorKind kind;
  };
  const std::vector<Case> cases = {
      {synth::Fault::kRawSsmA, "Kimi-K3 GGUF ssm_a must contain only -exp(A_log) values", ErrorKind::kValue},
      {synth::Fault::kNanSsmA, "Kimi-K3 GGUF ssm_a must contain finite floating values", ErrorKind::kValue},
      {synth::Fault::kZeroSsmA, "Kimi-K3 GGUF ssm_a must contain only -exp(A_log) values", ErrorKind::kValue},
      {synth::Fault::kUnknownTensorName, "unsupported Kimi-K3 GGUF tensor name: blk.1.ffn_mystery.weight",
       ErrorKind::kKey},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(synth::FaultName(c.fault)));
    TempDir dir("fault");
    SynthModel m = WriteTiny(dir.path, {c.fault});
    auto s = NonExpertStream::Open(m.manifest);
    ASSERT_TRUE(s.ok());
    std::optional<Error> err;
    Drain(*s, &err);
    ASSERT_TRUE(err.has_value());
    // SGLang's text is the first line; a k3pack hint may follow.
    EXPECT_EQ(err->message().substr(0, err->message().find('\n')), c.message);
    EXPECT_EQ(err->kind(), c.kind);
  }
}

}  // namespace
}  // namespace k3pack::loader
