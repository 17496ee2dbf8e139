// The `k3pack trace` subcommands that live in files of their own, dispatched
// by `k3pack trace` (src/cli/cmd_trace.cpp).
#pragma once

#include <string>
#include <vector>

namespace k3pack::cli {

int RunTraceReplay(const std::vector<std::string>& argv);  // cmd_trace_replay.cpp
int RunTraceSweep(const std::vector<std::string>& argv);   // cmd_trace_sweep.cpp

}  // namespace k3pack::cli
