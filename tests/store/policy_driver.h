// A policy under test driven call by call (policy_test.cpp, keep_hints_test.cpp):
// objects of kObj bytes, a cache of `slots` of them.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "store/policy.h"

namespace k3pack::store {

inline constexpr uint64_t kObj = 4096;

struct Driver {
  std::unique_ptr<Policy> p;
  AccessResult r;
  Driver(const std::string& name, const ObjectSpace& s, uint64_t slots) {
    auto made = MakePolicy(name, s, slots * kObj);
    EXPECT_TRUE(made.ok());
    p = std::move(made).value();
  }
  // Returns the evicted keys of one call with the given keys (sorted here).
  std::vector<ObjectId> Call(std::vector<ObjectId> keys, bool prefill = false, const PinCounts* pins = nullptr,
                             uint64_t gen = 1) {
    std::sort(keys.begin(), keys.end());
    std::vector<uint64_t> gens(keys.size(), gen);
    Status st = p->Access(keys, gens, prefill, pins, &r);
    EXPECT_TRUE(st.ok()) << st.message();
    return r.evicted;
  }
};

}  // namespace k3pack::store
