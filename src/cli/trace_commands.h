// `k3pack trace sweep` (src/cli/cmd_trace_sweep.cpp), dispatched by `k3pack trace`.
#pragma once

#include <string>
#include <vector>

namespace k3pack::cli {

int RunTraceSweep(const std::vector<std::string>& argv);

}  // namespace k3pack::cli
