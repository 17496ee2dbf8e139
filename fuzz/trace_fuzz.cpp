// Routing-trace reader over arbitrary files: reject or accept, and every
// accepted record's id span must lie inside the trace.
#include <cstdint>

#include "fuzz_util.h"
#include "k3pack/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = k3fuzz::ScratchDir() / "t.k3t";
  k3fuzz::WriteFile(path, data, size);
  auto t = k3pack::trace::ReadTrace(path.string());
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
