// The copy's I/O buffers (pack::IoBuffer): always block-aligned for O_DIRECT,
// and a buffer of 2 MiB or more is aligned to 2 MiB so that it can be backed
// by transparent huge pages (one fault per 2 MiB; O_DIRECT pins a few large
// folios instead of thousands of 4 KiB pages).
#include <gtest/gtest.h>

#include <cstdint>
#include <cerrno>
#include <cstring>
#include <string>

#include "pack/copy.h"
#include "../forked_child.h"  // K3_TEST_UNDER_SANITIZER

namespace k3pack::pack {
namespace {

uintptr_t Addr(IoBuffer& b) { return reinterpret_cast<uintptr_t>(b.data()); }

TEST(IoBuffer, SmallBuffersAreBlockAligned) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{4096}, size_t{(2u << 20) - 1}}) {
    auto allocated = IoBuffer::Allocate(n);
    ASSERT_TRUE(allocated.ok()) << n;
    IoBuffer& b = *allocated;
    ASSERT_NE(b.data(), nullptr) << n;
    EXPECT_EQ(Addr(b) % kDirectAlign, 0u) << n;
    EXPECT_EQ(b.size(), n);
  }
}

TEST(IoBuffer, LargeBuffersAreHugePageAligned) {
  for (size_t n : {size_t{2u << 20}, size_t{(8u << 20) + kDirectSlack}, size_t{(40u << 20) + 12345}}) {
    auto allocated = IoBuffer::Allocate(n);
    ASSERT_TRUE(allocated.ok()) << n;
    IoBuffer& b = *allocated;
    ASSERT_NE(b.data(), nullptr) << n;
    EXPECT_EQ(Addr(b) % (2u << 20), 0u) << n;
    std::memset(b.data(), 0xab, n);  // the whole range is usable, not only the huge-page part
    EXPECT_EQ(b.data()[n - 1], 0xab);
  }
}

TEST(IoBuffer, AllocationFailureIsAnOutOfMemoryErrorNamingTheSize) {
#ifdef K3_TEST_UNDER_SANITIZER
  GTEST_SKIP() << "the sanitizers' allocators abort on a size they cannot serve instead of failing the call";
#endif
  // posix_memalign refuses 4 EiB. Before, the buffer was left null and the
  // first read into it failed as EFAULT ("Bad address"), far from here.
  constexpr size_t kAbsurd = size_t{1} << 62;
  auto b = IoBuffer::Allocate(kAbsurd);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.error().kind(), ErrorKind::kMemory);
  EXPECT_EQ(b.error().sys_errno(), ENOMEM);
  EXPECT_EQ(b.error().headline(), "cannot allocate an I/O buffer of " + std::to_string(kAbsurd) +
                                      " bytes: " + std::strerror(ENOMEM));
  // The hint says what to do (the address-space case is in ResourceLimits).
  EXPECT_FALSE(b.error().hint().empty());
}

TEST(IoBuffer, MovedBufferKeepsItsBytes) {
  auto a = IoBuffer::Allocate(4096);
  ASSERT_TRUE(a.ok());
  uint8_t* p = a->data();
  IoBuffer moved = std::move(*a);
  EXPECT_EQ(moved.data(), p);
  EXPECT_EQ(moved.size(), 4096u);
  EXPECT_EQ(a->data(), nullptr);  // freed once, by `moved`
}

}  // namespace
}  // namespace k3pack::pack
