// Copy mode recycles the big buffers a consumer has released (the pool in
// stream.cpp): a recycled buffer holds exactly the next tensor's bytes,
// whatever the consumer wrote into it before, and tensors still held keep
// their own buffers.
#include <map>
#include <set>

#include "loader_fixture.h"

namespace k3pack::loader {
namespace {

using namespace testing;  // NOLINT

TEST(StreamCopyPool, RecycledBuffersHoldTheNextTensorsBytes) {
  TempDir dir("copy-pool");
  // 8 MiB each: big enough for the pooled (2 MiB-aligned) path.
  std::vector<gguf::TensorSpec> t;
  t.push_back(Typed("blk.0.ffn_up.weight", GgmlType::BF16, {2048, 2048}, 11));
  t.push_back(Typed("blk.0.ffn_gate.weight", GgmlType::BF16, {2048, 2048}, 12));
  t.push_back(Typed("blk.0.ffn_down.weight", GgmlType::BF16, {2048, 2048}, 13));
  t.push_back(Typed("output.weight", GgmlType::BF16, {2048, 2048}, 14));
  const std::string manifest = WriteModel(dir.path, t, {0, 0, 1, 1});

  // The expected bytes, from the zero-copy stream.
  std::map<std::string, std::vector<uint8_t>> want;
  {
    auto s = NonExpertStream::Open(manifest, LoadOptions{});
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE(s->ForEach([&](NamedTensor&& v) -> Status {
                   want[v.name].assign(v.data.begin(), v.data.end());
                   return Status::OK();
                 }).ok());
  }
  LoadOptions o;
  o.copy = true;
  for (int pass = 0; pass < 2; ++pass) {
    SCOPED_TRACE(pass == 0 ? "each tensor released before the next" : "every tensor held");
    auto s = NonExpertStream::Open(manifest, o);
    ASSERT_TRUE(s.ok());
    std::vector<NamedTensor> held;
    std::set<const uint8_t*> live;
    size_t seen = 0;
    Status st = s->ForEach([&](NamedTensor&& c) -> Status {
      ++seen;
      auto it = want.find(c.name);
      EXPECT_NE(it, want.end()) << c.name;
      if (it == want.end()) return Status::OK();
      EXPECT_EQ(c.data.size(), it->second.size()) << c.name;
      EXPECT_EQ(0, std::memcmp(c.data.data(), it->second.data(), it->second.size())) << c.name;
      if (pass == 1) {
        EXPECT_TRUE(live.insert(c.data.data()).second) << c.name << " shares a buffer with a tensor still held";
        held.push_back(std::move(c));
      } else {
        // Scribble on it before releasing: the next tensor must not see this.
        std::memset(const_cast<uint8_t*>(c.data.data()), 0xEE, c.data.size());
      }
      return Status::OK();
    });
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_GE(seen, t.size());
  }
}

}  // namespace
}  // namespace k3pack::loader
