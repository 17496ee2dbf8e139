// run-experts takes the model's MoE hyperparameters from the GGUF: the SiTU
// constants (kimi-k3.activation.situ_beta / situ_linear_beta) and the gating
// function, which only sigmoid (2) may be (docs/CONFORMANCE.md, Kimi-K3 layout).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "built_tiny_model.h"
#include "k3pack/run_experts.h"

namespace k3pack::store {
namespace {

class RunExpertsHparamsTest : public testing_model::BuiltTinyModelTest {
 protected:
  static void SetUpTestSuite() { BuildModel("k3-run-experts-hparams"); }

  // Overwrites the value bytes of a scalar key of shard 0 in place.
  static void Patch(const std::string& key, const void* value, size_t size) {
    gguf::ShardSet set = Source();
    const gguf::GgufFile& f = set.first();
    uint64_t at = 0;
    for (const auto& kv : f.metadata()) {
      if (kv.key == key) at = kv.offset + 8 + kv.key.size() + 4;
    }
    ASSERT_NE(at, 0u) << key;
    const std::string path = f.path();
    std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(static_cast<std::streamoff>(at));
    io.write(static_cast<const char*>(value), static_cast<std::streamsize>(size));
    ASSERT_TRUE(io.good());
  }

  static Result<ExpertRunResult> Run() {
    auto store = OpenStore();
    gguf::ShardSet source = Source();
    ExpertRunOptions o;
    o.layer = store->info().active_layer_ids.front();
    o.tokens = 2;
    o.seed = 5;
    o.quantize_activations = false;
    return RunRoutedExperts(*store, source, o);
  }
};

TEST_F(RunExpertsHparamsTest, SituConstantsAndGatingComeFromTheGguf) {
  auto base = Run();
  ASSERT_TRUE(base.ok()) << base.error().message();
  ASSERT_TRUE(base->matches());

  const float beta = 1.5f, lambda = 3.0f;
  Patch("kimi-k3.activation.situ_beta", &beta, 4);
  Patch("kimi-k3.activation.situ_linear_beta", &lambda, 4);
  auto other = Run();
  ASSERT_TRUE(other.ok()) << other.error().message();
  EXPECT_TRUE(other->matches());  // store and source still agree bit for bit
  ASSERT_EQ(other->from_source.size(), base->from_source.size());
  EXPECT_NE(other->source_sha256, base->source_sha256) << "the GGUF's SiTU constants were not used";
  EXPECT_EQ(other->routed, base->routed);  // routing does not depend on SiTU

  const uint32_t softmax = 1;
  Patch("kimi-k3.expert_gating_func", &softmax, 4);
  auto refused = Run();
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message().find("expert_gating_func is 1"), std::string::npos)
      << refused.error().message();
}

}  // namespace
}  // namespace k3pack::store
