#include "k3pack/ggml_types.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <limits>
#include <mutex>
#include <set>
#include <string>

namespace k3pack {
namespace {

constexpr GgmlTypeInfo kRemoved{"", 0, 0, false};

constexpr std::array<GgmlTypeInfo, kGgmlTypeCount> kTypes = {{
    {"F32", 1, 4, false},       // 0
    {"F16", 1, 2, false},       // 1
    {"Q4_0", 32, 18, true},     // 2
    {"Q4_1", 32, 20, true},     // 3
    kRemoved,                   // 4  Q4_2
    kRemoved,                   // 5  Q4_3
    {"Q5_0", 32, 22, true},     // 6
    {"Q5_1", 32, 24, true},     // 7
    {"Q8_0", 32, 34, true},     // 8
    {"Q8_1", 32, 36, true},     // 9  (ggml's struct size; gguf-py's 40 is stale)
    {"Q2_K", 256, 84, true},    // 10
    {"Q3_K", 256, 110, true},   // 11
    {"Q4_K", 256, 144, true},   // 12
    {"Q5_K", 256, 176, true},   // 13
    {"Q6_K", 256, 210, true},   // 14
    {"Q8_K", 256, 292, true},   // 15
    {"IQ2_XXS", 256, 66, true}, // 16
    {"IQ2_XS", 256, 74, true},  // 17
    {"IQ3_XXS", 256, 98, true}, // 18
    {"IQ1_S", 256, 50, true},   // 19
    {"IQ4_NL", 32, 18, true},   // 20
    {"IQ3_S", 256, 110, true},  // 21
    {"IQ2_S", 256, 82, true},   // 22
    {"IQ4_XS", 256, 136, true}, // 23
    {"I8", 1, 1, false},        // 24
    {"I16", 1, 2, false},       // 25
    {"I32", 1, 4, false},       // 26
    {"I64", 1, 8, false},       // 27
    {"F64", 1, 8, false},       // 28
    {"IQ1_M", 256, 56, true},   // 29
    {"BF16", 1, 2, false},      // 30
    kRemoved,                   // 31 Q4_0_4_4
    kRemoved,                   // 32 Q4_0_4_8
    kRemoved,                   // 33 Q4_0_8_8
    {"TQ1_0", 256, 54, true},   // 34
    {"TQ2_0", 256, 66, true},   // 35
    kRemoved,                   // 36 IQ4_NL_4_4
    kRemoved,                   // 37 IQ4_NL_4_8
    kRemoved,                   // 38 IQ4_NL_8_8
    {"MXFP4", 32, 17, true},    // 39
    {"NVFP4", 64, 36, true},    // 40
    {"Q1_0", 128, 18, true},    // 41
    {"Q2_0", 64, 18, true},     // 42
}};

}  // namespace

const GgmlTypeInfo* GgmlTypeInfoFor(uint32_t id) {
  return id < kTypes.size() ? &kTypes[id] : nullptr;
}

bool IsValidGgmlType(uint32_t id) {
  const GgmlTypeInfo* info = GgmlTypeInfoFor(id);
  return info != nullptr && info->block_size != 0;
}

std::optional<GgmlType> GgmlTypeFromName(std::string_view name) {
  for (uint32_t id = 0; id < kTypes.size(); ++id) {
    if (kTypes[id].block_size != 0 && name == kTypes[id].name) return static_cast<GgmlType>(id);
  }
  return std::nullopt;
}

std::optional<GgmlType> GgmlTypeFromTypedName(std::string_view name) {
  std::string upper(name);
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (uint32_t id = 0; id < kTypes.size(); ++id) {
    if (kTypes[id].block_size == 0) continue;
    std::string known(kTypes[id].name);
    for (char& c : known) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    if (upper == known) return static_cast<GgmlType>(id);
  }
  return std::nullopt;
}

std::string_view GgmlTypeName(GgmlType t) {
  const GgmlTypeInfo* info = GgmlTypeInfoFor(t);
  if (info != nullptr && info->block_size != 0) return info->name;
  // One string per unknown id for the life of the process, so each view
  // stays valid: a message naming two unknown types used to show the second
  // twice (one reused buffer). Only ids read from files get here: few.
  static std::mutex mu;
  static std::set<std::string>* names = new std::set<std::string>;  // never destroyed: views outlive exit hooks
  std::lock_guard<std::mutex> lock(mu);
  return *names->insert("type#" + std::to_string(static_cast<uint32_t>(t))).first;
}

uint64_t GgmlRowBytes(GgmlType t, uint64_t n_elements) {
  const GgmlTypeInfo* info = GgmlTypeInfoFor(t);
  if (info == nullptr || info->block_size == 0) return 0;
  return n_elements / info->block_size * info->type_size;
}

bool ElementCountOverflows(std::span<const int64_t> ne) {
  if (std::find(ne.begin(), ne.end(), 0) != ne.end()) return false;
  int64_t n = 1;
  for (size_t j = 0; j < ne.size(); ++j) {
    if (j > 0 && std::numeric_limits<int64_t>::max() / ne[j] <= n) return true;
    n *= ne[j];
  }
  return false;
}

}  // namespace k3pack
