// A trace family's preset scaled down for tests: 6 layers, 64 experts,
// top-4, at most 60 decode and 64 prompt tokens per request.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "k3pack/trace.h"

namespace k3pack::store::testing_traces {

inline trace::GenOptions SmallFamily(const std::string& family) {
  trace::GenOptions o;
  o.layer_ids = {1, 2, 3, 4, 5, 6};
  o.num_experts = 64;
  o.top_k = 4;
  EXPECT_TRUE(trace::ApplyFamily(family, &o)) << family;
  o.decode_tokens = std::min<uint32_t>(o.decode_tokens, 60);
  o.prompt_tokens = std::min<uint32_t>(o.prompt_tokens, 64);
  return o;
}

}  // namespace k3pack::store::testing_traces
