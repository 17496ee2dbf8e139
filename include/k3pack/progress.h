// Progress of a long operation, as every k3pack engine reports it (pack
// build, verify, synth, trace replay/sweep, load, inspect --stats, doctor,
// run-experts).
// Engines only fill this struct; how it is shown (bar, periodic lines, JSON
// lines) is the command line's business (src/util/progress.h).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>

namespace k3pack {

struct Progress {
  Progress() = default;
  Progress(std::string phase_, uint64_t done_bytes_, uint64_t total_bytes_, uint64_t done_objects_,
           uint64_t total_objects_, double elapsed_s_, std::optional<uint64_t> copied_bytes_ = std::nullopt)
      : phase(std::move(phase_)),
        done_bytes(done_bytes_),
        total_bytes(total_bytes_),
        done_objects(done_objects_),
        total_objects(total_objects_),
        elapsed_s(elapsed_s_),
        copied_bytes(copied_bytes_) {}

  std::string phase;  // "build", "verify", "synth", "replay", ...
  // Work measured in bytes (0 total: not known or not byte-shaped) and in
  // whole items (objects, tensors, records, simulations).
  uint64_t done_bytes = 0, total_bytes = 0;
  uint64_t done_objects = 0, total_objects = 0;
  double elapsed_s = 0;  // as the engine measures it (informational)
  // Bytes actually read or written by this run so far, when some of
  // done_bytes were skipped (sparse holes): throughput is computed from
  // these, so holes never show up as copy speed.
  std::optional<uint64_t> copied_bytes;
  std::string unit = "objects";  // what done_objects counts
  bool final = false;  // last report of a run that stopped early (error, signal): ends a bar's line
};
// Called from one thread at a time; may be called often (the reporter
// throttles what it prints).
using ProgressFn = std::function<void(const Progress&)>;

}  // namespace k3pack
