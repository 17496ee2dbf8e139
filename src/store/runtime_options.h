// The runtime options both stores (ExpertStore, SlotCache) check when they
// open, after the pack's checks (SGLang's _initialize_runtime_state), and
// the words of those checks: the Python binding refuses an int no C++
// option can hold with the same error, so one condition reads the same
// from C++ and from Python.
#pragma once

#include <cstdint>
#include <string_view>

#include "k3pack/error.h"
#include "k3pack/store.h"

namespace k3pack::store {

// read_splits and queue_depth are int64 (SGLang's are Python ints) but the
// range planner and the I/O engine count in 32 bits: a larger value is
// refused rather than cut (2^32 read as 0, 2^32 + 1 as 1).
inline constexpr uint64_t kMaxReadCount = UINT32_MAX;
// Ranges per object read: each is a read job on every miss and a row of the
// range plan of every layer made at open, so 10^7 took minutes and GBs
// before the first read. 1024 ranges of a K3 object are 11.7 KB each; past
// P / 4096 ranges they are no longer 4096-aligned anyway (SGLang's rule).
inline constexpr uint64_t kMaxReadSplits = 1024;
// SlotCache's pinned staging buffers; SGLang has no limit.
inline constexpr uint64_t kMaxStageSlots = 1024;

// SGLang's one ValueError for a budget, read_splits or queue_depth that is
// not positive; the hint names which and its value (`value` as written, so
// the binding can pass an int past 64 bits): "read_splits must be at least
// 1, got 0".
Error NotPositiveError(std::string_view name, std::string_view value);
// k3pack's limit: "NAME must be at most LIMIT (k3pack's limit), got VALUE".
Error PastLimitError(std::string_view name, uint64_t limit, std::string_view value);

// The budget (`budget_name`: ExpertStore's cache_bytes, SlotCache's
// stage_slots), queue_depth and read_splits positive, in that order
// (NotPositiveError), then queue_depth at most kMaxReadCount and
// read_splits at most kMaxReadSplits (PastLimitError), then the stats flush
// interval not negative (SGLang's text).
Status CheckRuntimeCounts(const StoreOptions& opt, std::string_view budget_name, uint64_t budget);

}  // namespace k3pack::store
