#include "store/runtime_options.h"

#include <string>
#include <utility>

namespace k3pack::store {

Error NotPositiveError(std::string_view name, std::string_view value) {
  // SGLang lumps them in one text, which its users match; which one it was
  // goes in the hint.
  return Error("expert cache and staging budgets, and read splits, must be positive")
      .WithHint(std::string(name) + " must be at least 1, got " + std::string(value));
}

Error PastLimitError(std::string_view name, uint64_t limit, std::string_view value) {
  return Error(std::string(name) + " must be at most " + std::to_string(limit) + " (k3pack's limit), got " +
               std::string(value));
}

Status CheckRuntimeCounts(const StoreOptions& opt, std::string_view budget_name, uint64_t budget) {
  if (budget == 0) return NotPositiveError(budget_name, "0");
  const std::pair<std::string_view, int64_t> counts[] = {{"queue_depth", opt.queue_depth},
                                                         {"read_splits", opt.read_splits}};
  for (const auto& [name, value] : counts) {
    if (value <= 0) return NotPositiveError(name, std::to_string(value));
  }
  if (static_cast<uint64_t>(opt.queue_depth) > kMaxReadCount)
    return PastLimitError("queue_depth", kMaxReadCount, std::to_string(opt.queue_depth));
  if (static_cast<uint64_t>(opt.read_splits) > kMaxReadSplits)
    return PastLimitError("read_splits", kMaxReadSplits, std::to_string(opt.read_splits));
  if (opt.stats_flush_interval < 0) return Error("expert-pack stats flush interval cannot be negative");
  return Status::OK();
}

}  // namespace k3pack::store
