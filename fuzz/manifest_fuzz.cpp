// Manifest parsing and typed validation over arbitrary JSON text.
#include <cstdint>
#include <nlohmann/json.hpp>

#include "k3pack/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  auto m = k3pack::manifest::ParseManifest(j);
  (void)m;
  return 0;
}
