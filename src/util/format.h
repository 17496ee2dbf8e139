// Human-readable quantities for CLI output and progress lines.
#pragma once

#include <cstdint>
#include <string>

namespace k3pack {

std::string HumanBytes(uint64_t bytes);        // "1.50 GiB"
std::string HumanRate(double bytes_per_second);  // "812.3 MB/s" (decimal, as disks are rated)
std::string HumanDuration(double seconds);       // "1m05s", "3.2s"

// `s` as one POSIX shell word: as is when it holds only characters no shell
// treats specially, else in single quotes (a quote inside as '\''). For
// commands the user is told to run.
std::string ShellQuoted(const std::string& s);

}  // namespace k3pack
