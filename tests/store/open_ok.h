// Opening a store over a synthetic TinyPack in tests: the open must succeed
// (the test fails with the error's text if not).
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "k3pack/store.h"
#include "store/synthetic_pack.h"

namespace k3pack::store::testing {

inline std::shared_ptr<ExpertStore> OpenOk(const TinyPack& p, const StoreOptions& o) {
  auto s = ExpertStore::Open(p.pack, p.manifest, o);
  EXPECT_TRUE(s.ok()) << s.error().message();
  return s.ok() ? *s : nullptr;
}

}  // namespace k3pack::store::testing
