#include "pack/progress.h"

#include <cstdio>
#include <memory>

#include <nlohmann/json.hpp>

#include "util/format.h"

namespace k3pack::pack {

Result<ProgressMode> ParseProgressMode(const std::string& name, bool tty) {
  if (name == "auto") return tty ? ProgressMode::kBar : ProgressMode::kNone;
  if (name == "bar") return ProgressMode::kBar;
  if (name == "json") return ProgressMode::kJson;
  if (name == "none") return ProgressMode::kNone;
  return Error("--progress must be one of auto, bar, json, none; got '" + name + "'");
}

ProgressFn MakeProgressPrinter(ProgressMode mode) {
  if (mode == ProgressMode::kNone) return {};
  if (mode == ProgressMode::kJson) {
    return [](const Progress& p) {
      const double rate = p.elapsed_s > 0 ? p.done_bytes / p.elapsed_s : 0;
      nlohmann::json j = {{"phase", p.phase},         {"done_bytes", p.done_bytes},
                          {"total_bytes", p.total_bytes}, {"done_objects", p.done_objects},
                          {"total_objects", p.total_objects}, {"elapsed_s", p.elapsed_s},
                          {"bytes_per_s", rate}};
      std::fprintf(stderr, "%s\n", j.dump().c_str());
      std::fflush(stderr);
    };
  }
  return [](const Progress& p) {
    const double frac = p.total_bytes ? static_cast<double>(p.done_bytes) / p.total_bytes : 1.0;
    const double rate = p.elapsed_s > 0 ? p.done_bytes / p.elapsed_s : 0;
    const double eta = rate > 0 ? (p.total_bytes - p.done_bytes) / rate : 0;
    constexpr int kWidth = 30;
    const int fill = static_cast<int>(frac * kWidth);
    std::string bar(fill, '#');
    bar.resize(kWidth, '.');
    std::fprintf(stderr, "\r%s [%s] %5.1f%% %s/%s %s ETA %s   ", p.phase.c_str(), bar.c_str(), frac * 100,
                 HumanBytes(p.done_bytes).c_str(), HumanBytes(p.total_bytes).c_str(), HumanRate(rate).c_str(),
                 HumanDuration(eta).c_str());
    if (p.done_objects >= p.total_objects || p.final) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  };
}

}  // namespace k3pack::pack
