// Opening a store over a synthetic TinyPack in tests: OpenOk must succeed
// (the test fails with the error's text if not); OpenError gives the text a
// refused open says.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "k3pack/store.h"
#include "store/synthetic_pack.h"

namespace k3pack::store::testing {

inline std::shared_ptr<ExpertStore> OpenOk(const TinyPack& p, const StoreOptions& o) {
  auto s = ExpertStore::Open(p.pack, p.manifest, o);
  EXPECT_TRUE(s.ok()) << s.error().message();
  return s.ok() ? *s : nullptr;
}

// The bytes of one object of the default TinySpec: 3 roles of 4096 bytes.
inline constexpr uint64_t kObject = 3 * 4096;

// One token's routes at `layer` (shape 1 x ids.size()).
inline Result<Acquisition> Get(ExpertStore& s, uint32_t layer, std::vector<int64_t> ids) {
  const int64_t shape[2] = {1, static_cast<int64_t>(ids.size())};
  return s.Acquire(layer, ids, shape);
}

// A small cache and queue: what the open tests need.
inline StoreOptions SmallStore() {
  StoreOptions o;
  o.cache_bytes = 1 << 20;
  o.queue_depth = 4;
  return o;
}

// Gives a strict (kimi-k3 profile) manifest K3's dimensions and routed
// layers (1..`last_active_layer`), so an open reaches the checks after them.
inline void K3Model(TinyPack& p, int last_active_layer = 92) {
  p.json["model"]["num_hidden_layers"] = 93;
  p.json["model"]["num_experts"] = 896;
  p.json["model"]["num_experts_per_token"] = 16;
  std::vector<int> layers;
  for (int l = 1; l <= last_active_layer; ++l) layers.push_back(l);
  p.json["model"]["active_moe_layer_ids"] = layers;
}

// "OK", or the error the open refuses this pack with (its kind in `kind`).
inline std::string OpenError(const TinyPack& p, const StoreOptions& o = SmallStore(), ErrorKind* kind = nullptr) {
  auto s = ExpertStore::Open(p.pack, p.manifest, o);
  if (s.ok()) return "OK";
  if (kind) *kind = s.error().kind();
  return s.error().message();
}

}  // namespace k3pack::store::testing
