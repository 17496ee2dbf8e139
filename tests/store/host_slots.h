// A slot cache (SGLang's drop-in) with 4 host slots in memory the test owns,
// for the tests that check which bytes each slot holds.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "k3pack/slot_cache.h"
#include "store/synthetic_pack.h"

namespace k3pack::store::testing {

struct FourHostSlots {
  std::unique_ptr<SlotCache> cache;
  std::vector<uint8_t> memory;
  uint8_t* base = nullptr;

  // `policy` empty: the slot cache's default.
  FourHostSlots(const TinyPack& p, const char* io, const std::string& policy = "") {
    SlotCacheOptions o;
    o.store.io_backend = io;
    if (!policy.empty()) o.store.policy = policy;
    auto opened = SlotCache::Open(p.pack, p.manifest, o);
    EXPECT_TRUE(opened.ok()) << opened.error().message();
    if (!opened.ok()) return;
    cache = std::move(opened).value();
    memory.resize(4 * cache->slot_bytes() + 4096);
    base = memory.data() + (4096 - reinterpret_cast<uintptr_t>(memory.data()) % 4096) % 4096;
    const Status attached = cache->AttachHost(base, 4);
    EXPECT_TRUE(attached.ok()) << attached.error().message();
  }
  // `ids` as rows of two (top-2), one request per row (ids 100, 101, ...).
  Result<std::vector<int32_t>> Acquire(uint32_t layer, const std::vector<int64_t>& ids) {
    const int64_t shape[2] = {static_cast<int64_t>(ids.size() / 2), 2};
    std::vector<uint64_t> requests;
    for (size_t r = 0; r < ids.size() / 2; ++r) requests.push_back(100 + r);
    return cache->Acquire(layer, ids, shape, std::nullopt, nullptr, requests);
  }
  // Whether slot `slot` holds (layer, expert)'s bytes.
  bool Holds(int32_t slot, uint32_t layer, int64_t expert) const {
    return slot >= 0 && slot < 4 &&
           base[uint64_t(slot) * cache->slot_bytes() + 4096 + 777] ==
               PatternByte(layer, static_cast<uint32_t>(expert), 1, 777);
  }
  void AcquireAndRelease(uint32_t layer, const std::vector<int64_t>& ids) {
    auto got = Acquire(layer, ids);
    if (got.ok()) (void)cache->MarkUsed(*got);
  }
  // Acquires `ids`, checks each slot holds its object's bytes, releases.
  void ExpectServed(uint32_t layer, const std::vector<int64_t>& ids) {
    auto got = Acquire(layer, ids);
    ASSERT_TRUE(got.ok()) << got.error().message();
    for (size_t i = 0; i < ids.size(); ++i) ASSERT_TRUE(Holds((*got)[i], layer, ids[i])) << "expert " << ids[i];
    ASSERT_TRUE(cache->MarkUsed(*got).ok());
  }
};

}  // namespace k3pack::store::testing
