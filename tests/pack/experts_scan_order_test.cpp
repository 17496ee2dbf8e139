// SGLang's validate_expert_tensors checks the routed tensors in its dict's
// insertion order, i.e. the scan order (shards in order, each file's tensor
// order), not in layer/role order: of several bad tensors the first one in
// the files is named. k3pack checked layer by layer, up before gate, so a
// checkpoint whose files list gate before up, with every up/gate tensor of
// another type, was reported as (1, 'up') where SGLang says (1, 'gate').
#include <gtest/gtest.h>

#include "k3_model_spec.h"
#include "k3pack/pack.h"

namespace k3pack::pack {
namespace {

// llama.cpp's order within a layer: down, gate, up; layers from last to
// first in the file to make layer order and file order disagree too.
std::vector<SourceTensor> Files(uint32_t up_gate_type) {
  std::vector<SourceTensor> v;
  for (uint32_t l = 92; l >= 1; --l) {
    const std::string b = "blk." + std::to_string(l) + ".ffn_";
    v.push_back({b + "down_exps.weight", {3072, 3584, 896}, 11, 0, 0, 4730880ull * 896});
    v.push_back({b + "gate_exps.weight", {3584, 3072, 896}, up_gate_type, 0, 0, 3612672ull * 896});
    v.push_back({b + "up_exps.weight", {3584, 3072, 896}, up_gate_type, 0, 0, 3612672ull * 896});
  }
  return v;
}

std::string Err(const std::vector<SourceTensor>& t) {
  return k3test_spec::CollectError(t, k3test_spec::K3Spec(), "/x/K-00001-of-00001.gguf");
}

}  // namespace

TEST(ExpertsScanOrder, FirstBadTensorInTheFilesIsNamed) {
  EXPECT_EQ(Err(Files(10)), "OK");
  EXPECT_EQ(Err(Files(12)), "unexpected expert dtype for (92, 'gate'): Q4_K");
}

TEST(ExpertsScanOrder, ShapeBeforeDtypeOfTheSameTensorButNotOfALaterOne) {
  auto t = Files(10);
  t[2].dtype_id = 12;                    // blk.92.ffn_up: dtype (3rd in the files)
  t[4].shape = {3584, 3072, 895};        // blk.91.ffn_gate: shape (5th)
  EXPECT_EQ(Err(t), "unexpected expert dtype for (92, 'up'): Q4_K");
}

}  // namespace k3pack::pack
