#include "util/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace k3pack {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

// Slicing-by-8 tables.
struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  Tables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (kPoly & (0u - (c & 1)));
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
    }
  }
};

const Tables& T() {
  static const Tables tables;
  return tables;
}

uint32_t PortableRaw(const uint8_t* p, size_t n, uint32_t c) {
  const auto& t = T().t;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);  // little-endian host (x86-64, aarch64 LE)
    v ^= c;
    c = t[7][v & 0xff] ^ t[6][(v >> 8) & 0xff] ^ t[5][(v >> 16) & 0xff] ^ t[4][(v >> 24) & 0xff] ^
        t[3][(v >> 32) & 0xff] ^ t[2][(v >> 40) & 0xff] ^ t[1][(v >> 48) & 0xff] ^ t[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xff];
  return c;
}

#if defined(__x86_64__)
// One crc32 instruction per 8 bytes: ~8 bytes per 3 cycles (the
// instruction's latency), several GB/s per core, far above an SSD's read rate.
__attribute__((target("sse4.2"))) uint32_t Sse42Raw(const uint8_t* p, size_t n, uint32_t c) {
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = _mm_crc32_u8(c, *p++);
    --n;
  }
  uint64_t c64 = c;
  while (n >= 64) {
    uint64_t v[8];
    std::memcpy(v, p, 64);
    c64 = _mm_crc32_u64(c64, v[0]);
    c64 = _mm_crc32_u64(c64, v[1]);
    c64 = _mm_crc32_u64(c64, v[2]);
    c64 = _mm_crc32_u64(c64, v[3]);
    c64 = _mm_crc32_u64(c64, v[4]);
    c64 = _mm_crc32_u64(c64, v[5]);
    c64 = _mm_crc32_u64(c64, v[6]);
    c64 = _mm_crc32_u64(c64, v[7]);
    p += 64;
    n -= 64;
  }
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c64 = _mm_crc32_u64(c64, v);
    p += 8;
    n -= 8;
  }
  c = static_cast<uint32_t>(c64);
  while (n--) c = _mm_crc32_u8(c, *p++);
  return c;
}

bool HaveSse42() {
  static const bool have = __builtin_cpu_supports("sse4.2");
  return have;
}
#endif

}  // namespace

uint32_t Crc32cPortable(const void* data, size_t n, uint32_t crc) {
  return ~PortableRaw(static_cast<const uint8_t*>(data), n, ~crc);
}

uint32_t Crc32c(const void* data, size_t n, uint32_t crc) {
#if defined(__x86_64__)
  if (HaveSse42()) return ~Sse42Raw(static_cast<const uint8_t*>(data), n, ~crc);
#endif
  return Crc32cPortable(data, n, crc);
}

const char* Crc32cImplementation() {
#if defined(__x86_64__)
  if (HaveSse42()) return "sse4.2";
#endif
  return "portable";
}

}  // namespace k3pack
