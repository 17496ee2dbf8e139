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
    // v2 tails: per-row requests and predictions lie inside their arrays.
    for (uint32_t row = 0; row < r.rows; ++row) (void)t->RowRequest(r, row);
    if (r.has_row_requests && r.row_request_offset + r.rows > t->row_requests.size()) __builtin_trap();
    auto pred = t->RecordPredictions(r);
    if (!pred.empty() && pred.data() + pred.size() > t->predictions.data() + t->predictions.size()) __builtin_trap();
    for (uint16_t id : pred) {
      if (id >= t->num_experts) __builtin_trap();
    }
  }
  return 0;
}
