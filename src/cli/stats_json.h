// The JSON form of quant::TensorStats, shared by `inspect --stats --json`
// and `dump-tensor --stats --json` so that the two commands (and the Python
// API's `k3pack.tensor_stats`, which uses the same keys) always agree.
#pragma once

#include <nlohmann/json.hpp>

#include "k3pack/quant.h"

namespace k3pack::cli {

// Keys as in include/k3pack/quant.h: min, max, mean (finite values only),
// nan_count, inf_count, count.
inline nlohmann::json TensorStatsJson(const quant::TensorStats& s) {
  return {{"min", s.min},       {"max", s.max},           {"mean", s.mean},
          {"nan_count", s.nan_count}, {"inf_count", s.inf_count}, {"count", s.count}};
}

}  // namespace k3pack::cli
