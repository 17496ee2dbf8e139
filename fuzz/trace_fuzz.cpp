// Routing-trace parser over arbitrary bytes (in memory: ReadTrace is
// ReadFileToString + ParseTrace): reject or accept, and every accepted
// record's id span must lie inside the trace.
#include <cstdint>

#include "k3pack/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto t = k3pack::trace::ParseTrace({reinterpret_cast<const char*>(data), size}, "fuzz.k3t");
  if (!t.ok()) return 0;
  for (const auto& r : t->records) {
    auto ids = t->RecordIds(r);
    if (ids.data() < t->ids.data() || ids.data() + ids.size() > t->ids.data() + t->ids.size()) __builtin_trap();
    for (uint16_t id : ids) {
      if (id >= t->num_experts) __builtin_trap();
    }
  }
  return 0;
}
