// CRC32C (Castagnoli, the iSCSI/ext4 checksum): a cheap per-object check on
// the store's read path. Uses the SSE4.2 crc32 instruction where the CPU has
// it (chosen at run time; several GB/s per core), else a portable table
// version (slicing-by-8, ~1-2 GB/s). Both give the same values (Crc32cPortable is exposed so
// tests can compare them).
#pragma once

#include <cstddef>
#include <cstdint>

namespace k3pack {

// CRC32C of `n` bytes, continuing from `crc` (0 to start): standard
// pre/post inversion, so Crc32c("123456789") == 0xE3069283.
uint32_t Crc32c(const void* data, size_t n, uint32_t crc = 0);
uint32_t Crc32cPortable(const void* data, size_t n, uint32_t crc = 0);
// Which implementation Crc32c uses: "sse4.2" or "portable".
const char* Crc32cImplementation();

}  // namespace k3pack
