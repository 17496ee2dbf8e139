// Python-compatible JSON writer round trip: any JSON value serialized in each
// style must parse back to the same value.
#include <cstdint>
#include <nlohmann/json.hpp>

#include "manifest/pyjson.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace k3pack::manifest;
  auto j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;
  for (auto style : {PyJsonStyle::kIndent2, PyJsonStyle::kCanonical, PyJsonStyle::kIndent2Ascii}) {
    std::string text = PyJsonDumps(j, style);
    auto back = nlohmann::json::parse(text, nullptr, false);
    if (back.is_discarded()) __builtin_trap();
    // Floats go through Python's repr, which round-trips exactly.
    if (back != j) __builtin_trap();
  }
  return 0;
}
