// The copy's I/O buffers (pack::IoBuffer): always block-aligned for O_DIRECT,
// and a buffer of 2 MiB or more is aligned to 2 MiB so that it can be backed
// by transparent huge pages (one fault per 2 MiB; O_DIRECT pins a few large
// folios instead of thousands of 4 KiB pages).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "pack/copy.h"

namespace k3pack::pack {
namespace {

uintptr_t Addr(IoBuffer& b) { return reinterpret_cast<uintptr_t>(b.data()); }

TEST(IoBuffer, SmallBuffersAreBlockAligned) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{4096}, size_t{(2u << 20) - 1}}) {
    IoBuffer b(n);
    ASSERT_NE(b.data(), nullptr) << n;
    EXPECT_EQ(Addr(b) % kDirectAlign, 0u) << n;
    EXPECT_EQ(b.size(), n);
  }
}

TEST(IoBuffer, LargeBuffersAreHugePageAligned) {
  for (size_t n : {size_t{2u << 20}, size_t{(8u << 20) + kDirectSlack}, size_t{(40u << 20) + 12345}}) {
    IoBuffer b(n);
    ASSERT_NE(b.data(), nullptr) << n;
    EXPECT_EQ(Addr(b) % (2u << 20), 0u) << n;
    std::memset(b.data(), 0xab, n);  // the whole range is usable, not only the huge-page part
    EXPECT_EQ(b.data()[n - 1], 0xab);
  }
}

}  // namespace
}  // namespace k3pack::pack
