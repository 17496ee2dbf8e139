// Expands the packed grids of iq_grid_hex.h into ggml's integer tables at
// compile time, and defines the small sign/value tables.
#include "quant/iq_tables.h"

#include <array>
#include <cstddef>

#include "quant/iq_grid_hex.h"

namespace k3pack::quant::tables {
namespace {

constexpr unsigned HexNibble(char c) {
  return c >= '0' && c <= '9' ? static_cast<unsigned>(c - '0') : static_cast<unsigned>(c - 'a' + 10);
}

// bits = 2: four codes per byte (low bits first); bits = 3: one per nibble.
template <typename Word, size_t N, size_t kElems, size_t kHexLen>
constexpr std::array<Word, N> Expand(const char (&hex)[kHexLen], const int (&value_map)[8], unsigned bits) {
  std::array<Word, N> out{};
  const unsigned per_byte = bits == 2 ? 4 : 2;
  const unsigned step = bits == 2 ? 2 : 4;
  size_t elem = 0;
  for (size_t i = 0; i + 1 < kHexLen; i += 2) {
    const unsigned byte = (HexNibble(hex[i]) << 4) | HexNibble(hex[i + 1]);
    for (unsigned k = 0; k < per_byte; ++k, ++elem) {
      const unsigned code = (byte >> (k * step)) & ((1u << bits) - 1);
      const Word v = static_cast<Word>(static_cast<uint8_t>(value_map[code]));
      out[elem / kElems] |= v << (8 * (elem % kElems));
    }
  }
  return out;
}

constexpr int kMapIq2[8] = {0x08, 0x19, 0x2b, 0, 0, 0, 0, 0};
constexpr int kMapIq3xxs[8] = {0x04, 0x0c, 0x14, 0x1c, 0x24, 0x2c, 0x34, 0x3e};
constexpr int kMapIq3s[8] = {0x01, 0x03, 0x05, 0x07, 0x09, 0x0b, 0x0d, 0x0f};
constexpr int kMapIq1s[8] = {-1, 0, 1, 0, 0, 0, 0, 0};

}  // namespace

const uint8_t kKmaskIq2xs[8] = {1, 2, 4, 8, 16, 32, 64, 128};

const uint8_t kKsignsIq2xs[128] = {
    0x00, 0x81, 0x82, 0x03, 0x84, 0x05, 0x06, 0x87, 0x88, 0x09, 0x0a, 0x8b, 0x0c, 0x8d, 0x8e, 0x0f,
    0x90, 0x11, 0x12, 0x93, 0x14, 0x95, 0x96, 0x17, 0x18, 0x99, 0x9a, 0x1b, 0x9c, 0x1d, 0x1e, 0x9f,
    0xa0, 0x21, 0x22, 0xa3, 0x24, 0xa5, 0xa6, 0x27, 0x28, 0xa9, 0xaa, 0x2b, 0xac, 0x2d, 0x2e, 0xaf,
    0x30, 0xb1, 0xb2, 0x33, 0xb4, 0x35, 0x36, 0xb7, 0xb8, 0x39, 0x3a, 0xbb, 0x3c, 0xbd, 0xbe, 0x3f,
    0xc0, 0x41, 0x42, 0xc3, 0x44, 0xc5, 0xc6, 0x47, 0x48, 0xc9, 0xca, 0x4b, 0xcc, 0x4d, 0x4e, 0xcf,
    0x50, 0xd1, 0xd2, 0x53, 0xd4, 0x55, 0x56, 0xd7, 0xd8, 0x59, 0x5a, 0xdb, 0x5c, 0xdd, 0xde, 0x5f,
    0x60, 0xe1, 0xe2, 0x63, 0xe4, 0x65, 0x66, 0xe7, 0xe8, 0x69, 0x6a, 0xeb, 0x6c, 0xed, 0xee, 0x6f,
    0xf0, 0x71, 0x72, 0xf3, 0x74, 0xf5, 0xf6, 0x77, 0x78, 0xf9, 0xfa, 0x7b, 0xfc, 0x7d, 0x7e, 0xff,
};

const int8_t kValuesIq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
const int8_t kValuesFp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// Constant-initialized from the compile-time expansion of the packed strings.
constexpr std::array<uint64_t, 256> kIq2xxsGrid = Expand<uint64_t, 256, 8>(kIq2xxsHex, kMapIq2, 2);
constexpr std::array<uint64_t, 512> kIq2xsGrid = Expand<uint64_t, 512, 8>(kIq2xsHex, kMapIq2, 2);
constexpr std::array<uint64_t, 1024> kIq2sGrid = Expand<uint64_t, 1024, 8>(kIq2sHex, kMapIq2, 2);
constexpr std::array<uint32_t, 256> kIq3xxsGrid = Expand<uint32_t, 256, 4>(kIq3xxsHex, kMapIq3xxs, 3);
constexpr std::array<uint32_t, 512> kIq3sGrid = Expand<uint32_t, 512, 4>(kIq3sHex, kMapIq3s, 3);
constexpr std::array<uint64_t, 2048> kIq1sGrid = Expand<uint64_t, 2048, 8>(kIq1sHex, kMapIq1s, 2);

static_assert(sizeof(kIq2xxsHex) - 1 == 256 * 4 && sizeof(kIq2xsHex) - 1 == 512 * 4 &&
              sizeof(kIq2sHex) - 1 == 1024 * 4 && sizeof(kIq3xxsHex) - 1 == 256 * 4 &&
              sizeof(kIq3sHex) - 1 == 512 * 4 && sizeof(kIq1sHex) - 1 == 2048 * 4,
              "packed grid strings have the wrong length");
static_assert(kIq2xxsGrid[1] == 0x080808080808082bULL && kIq3xxsGrid[1] == 0x04040414u &&
              kIq1sGrid[0] == 0xffffffffffffffffULL, "grid expansion order");

}  // namespace k3pack::quant::tables
