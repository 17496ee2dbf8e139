// Sizes given in MiB (--cache-mib, --device-mib, ...): the count is bounded
// by what a byte count in 64 bits holds, since a larger one wrapped when
// shifted (--cache-mib 17592186044416 became a 0-byte cache, --device-mib
// the same silently dropped the device tier).
#pragma once

#include <cstdint>
#include <string>

#include "cli/command.h"

namespace k3pack::cli {

constexpr int64_t kMaxMib = static_cast<int64_t>(UINT64_MAX >> 20);

// The option's value in bytes; from `min_mib` to kMaxMib, else an error naming the option.
inline Result<uint64_t> MibOptionBytes(const Args& a, const std::string& name, int64_t min_mib) {
  auto v = a.GetInt(name);
  if (!v.ok() || *v < min_mib || *v > kMaxMib)
    return Error(name + " must be an integer from " + std::to_string(min_mib) + " to " + std::to_string(kMaxMib) +
                 " (MiB), got '" + a.Get(name) + "'");
  return static_cast<uint64_t>(*v) << 20;
}

}  // namespace k3pack::cli
