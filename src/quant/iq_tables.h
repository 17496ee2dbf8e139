// Lookup tables of ggml's IQ / FP4 formats (ggml-common.h), bit-identical to
// ggml's: grid words keep ggml's byte order (byte k = element k).
#pragma once

#include <array>
#include <cstdint>

namespace k3pack::quant::tables {

extern const uint8_t kKmaskIq2xs[8];      // 1 << j
extern const uint8_t kKsignsIq2xs[128];   // 7 sign bits + an even-parity 8th bit
extern const int8_t kValuesIq4nl[16];
extern const int8_t kValuesFp4[16];       // doubled E2M1 values (MXFP4, NVFP4)

extern const std::array<uint64_t, 256> kIq2xxsGrid;
extern const std::array<uint64_t, 512> kIq2xsGrid;
extern const std::array<uint64_t, 1024> kIq2sGrid;
extern const std::array<uint32_t, 256> kIq3xxsGrid;
extern const std::array<uint32_t, 512> kIq3sGrid;
extern const std::array<uint64_t, 2048> kIq1sGrid;    // bytes are int8 in {-1, 0, +1}

}  // namespace k3pack::quant::tables
