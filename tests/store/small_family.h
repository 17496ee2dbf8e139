// Trace families scaled down for tests, and a generated trace with what a
// bound needs beside it (the generator's truth, the object space, the calls).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "k3pack/trace.h"
#include "store/simulate.h"

namespace k3pack::store::testing_traces {

// A family's preset at `layers` routed layers (numbered from 1) of top_k of
// `experts`.
inline trace::GenOptions ScaledFamily(const std::string& family, uint32_t layers, uint32_t experts, uint32_t top_k) {
  trace::GenOptions o;
  EXPECT_TRUE(trace::ApplyFamily(family, &o)) << family;
  o.layer_ids.clear();
  for (uint32_t l = 1; l <= layers; ++l) o.layer_ids.push_back(l);
  o.num_experts = experts;
  o.top_k = top_k;
  return o;
}

// 6 layers, 64 experts, top-4, at most 60 decode and 64 prompt tokens per
// request.
inline trace::GenOptions SmallFamily(const std::string& family) {
  trace::GenOptions o = ScaledFamily(family, 6, 64, 4);
  o.decode_tokens = std::min<uint32_t>(o.decode_tokens, 60);
  o.prompt_tokens = std::min<uint32_t>(o.prompt_tokens, 64);
  return o;
}

// The same scale as `trace gen` options (shorter requests: 30 decode and 32
// prompt tokens), for the CLI tests.
inline const std::string kSmallFamilyArgs =
    " --layers 6 --experts 64 --top-k 4 --decode-tokens 30 --prompt-tokens 32";

// A generated trace with its truth, 4 KiB objects and its calls.
struct GeneratedTrace {
  trace::TrueDistribution truth;
  trace::Trace trace;
  ObjectSpace space;
  CallSeq seq;
};
inline Result<GeneratedTrace> GenerateWithTruth(trace::GenOptions o) {
  GeneratedTrace g;
  o.truth = &g.truth;
  auto t = trace::Generate(o);
  if (!t.ok()) return t.error();
  g.trace = std::move(*t);
  g.space = SpaceForTrace(g.trace, 4096);
  auto seq = BuildCallSeq(g.trace, g.space);
  if (!seq.ok()) return seq.error();
  g.seq = std::move(*seq);
  return g;
}

}  // namespace k3pack::store::testing_traces
