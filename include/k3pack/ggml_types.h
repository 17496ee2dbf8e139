// The ggml tensor storage types (ids 0..42) as GGUF files name them.
//
// Names are spelled as gguf-py's GGMLQuantizationType enum spells them
// ("Q2_K", "IQ2_XS", "BF16"), because SGLang's manifest records those names.
// Block sizes and type sizes are ggml's (`type_traits[]`): ids removed from
// the format (4, 5, 31-33, 36-38) have block size 0 and are rejected.
#pragma once

#include <cstdint>
#include <span>
#include <optional>
#include <string_view>

namespace k3pack {

enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21,
  IQ2_S = 22, IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28,
  IQ1_M = 29, BF16 = 30, TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39, NVFP4 = 40,
  Q1_0 = 41, Q2_0 = 42,
};

inline constexpr uint32_t kGgmlTypeCount = 43;

struct GgmlTypeInfo {
  const char* name;     // gguf-py enum name; "" for removed ids
  uint32_t block_size;  // elements per block; 0 = removed from the format
  uint32_t type_size;   // bytes per block
  bool quantized;       // block-quantized (not a plain float/int element type)
};

// nullptr when `id` is outside 0..42. Removed ids return an entry with
// block_size 0 so callers can report "removed" rather than "unknown".
const GgmlTypeInfo* GgmlTypeInfoFor(uint32_t id);
inline const GgmlTypeInfo* GgmlTypeInfoFor(GgmlType t) { return GgmlTypeInfoFor(static_cast<uint32_t>(t)); }

// ggml's guard on a tensor's extents (each >= 0): true when a partial
// product of them reaches INT64_MAX. An empty tensor (an extent of 0) never
// overflows. The reader refuses such a tensor and the writer never writes one.
bool ElementCountOverflows(std::span<const int64_t> ne);

// True for ids a GGUF file may carry (in range and not removed).
bool IsValidGgmlType(uint32_t id);

// "Q2_K" -> Q2_K. Case-sensitive, gguf-py spelling. nullopt if unknown.
std::optional<GgmlType> GgmlTypeFromName(std::string_view name);
// The same for names a person types: any case ("q2_k", ggml's own "q2_K",
// "Q2_K"), as llama.cpp's tools take them. Never for names read from files,
// which SGLang compares exactly.
std::optional<GgmlType> GgmlTypeFromTypedName(std::string_view name);

// The name, or "type#<id>" for ids without one; the view stays valid for the
// life of the process.
std::string_view GgmlTypeName(GgmlType t);

// Bytes for `n_elements` elements of type t (n_elements % block == 0 assumed).
uint64_t GgmlRowBytes(GgmlType t, uint64_t n_elements);

}  // namespace k3pack
