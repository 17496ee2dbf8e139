// The audited Kimi-K3 model facts and the expert-collection error text, as
// the routed-expert validation tests use them.
#pragma once

#include <string>
#include <vector>

#include "k3pack/pack.h"

namespace k3pack::pack::k3test_spec {

inline kimi::ModelSpec K3Spec() {
  kimi::ModelSpec s;
  s.num_hidden_layers = 93;
  s.first_k_dense_replace = 1;
  s.num_experts = 896;
  s.top_k = 16;
  s.num_shared_experts = 2;
  s.hidden_size = 7168;
  s.routed_expert_hidden_size = 3584;
  s.moe_intermediate_size = 3072;
  s.hidden_act = "situ";
  for (uint32_t i = 1; i < 93; ++i) s.active_moe_layer_ids.push_back(i);
  s.profile = kimi::Profile::kKimiK3;
  return s;
}

// "OK", or the message CollectExperts refuses these tensors with.
inline std::string CollectError(const std::vector<SourceTensor>& t, const kimi::ModelSpec& s,
                                const std::string& shard, CollectOptions o = {}) {
  auto r = CollectExperts(t, {shard}, s, o);
  return r.ok() ? "OK" : r.error().message();
}

}  // namespace k3pack::pack::k3test_spec
