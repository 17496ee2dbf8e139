// CRC32C (util/crc32c.h): known answers, and the SSE4.2 path equal to the
// portable one at every length and alignment.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "util/crc32c.h"

namespace k3pack {
namespace {

TEST(Crc32c, KnownAnswers) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32cPortable("123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32c("", 0), 0u);
  std::vector<uint8_t> zeros(32, 0), ones(32, 0xff);
  EXPECT_EQ(Crc32c(zeros.data(), 32), 0x8A9136AAu);  // RFC 3720 B.4
  EXPECT_EQ(Crc32c(ones.data(), 32), 0x62A8AB43u);
  std::vector<uint8_t> inc(32);
  for (int i = 0; i < 32; ++i) inc[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(Crc32c(inc.data(), 32), 0x46DD794Eu);
}

TEST(Crc32c, DispatchedEqualsPortableAtEveryLengthAndAlignment) {
  std::mt19937 rng(5);
  std::vector<uint8_t> buf(4096 + 64);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t align = 0; align < 9; ++align) {
    for (size_t n = 0; n < 300; ++n) {
      ASSERT_EQ(Crc32c(buf.data() + align, n), Crc32cPortable(buf.data() + align, n)) << align << " " << n;
    }
  }
  ASSERT_EQ(Crc32c(buf.data() + 3, 4096), Crc32cPortable(buf.data() + 3, 4096));
  // Continuation: crc(a + b) == crc(b, crc(a)).
  const uint32_t a = Crc32c(buf.data(), 1000);
  EXPECT_EQ(Crc32c(buf.data() + 1000, 3000, a), Crc32c(buf.data(), 4000));
  std::cout << "[   INFO   ] CRC32C implementation: " << Crc32cImplementation() << "\n";
}

// The dispatched version splits large buffers into three interleaved
// streams (blocks of 3 x 8 KiB and 3 x 256 bytes) and joins their CRCs:
// lengths around and across those block sizes, at odd alignments and with a
// running CRC, give the portable values.
TEST(Crc32c, InterleavedStreamsEqualPortableForLargeBuffers) {
  std::mt19937 rng(17);
  std::vector<uint8_t> buf(200000);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  std::vector<size_t> lengths = {767, 768, 769, 24575, 24576, 24577, 24576 + 768, 49152 + 767, 199990};
  for (int i = 0; i < 40; ++i) lengths.push_back(rng() % 199990);
  for (size_t n : lengths) {
    for (size_t align : {0, 1, 5, 8}) {
      ASSERT_EQ(Crc32c(buf.data() + align, n), Crc32cPortable(buf.data() + align, n)) << align << " " << n;
      ASSERT_EQ(Crc32c(buf.data() + align, n, 0x12345678u), Crc32cPortable(buf.data() + align, n, 0x12345678u))
          << align << " " << n;
    }
  }
}

}  // namespace
}  // namespace k3pack
