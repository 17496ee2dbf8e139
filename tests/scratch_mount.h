// A filesystem mounted on a scratch directory for one test and detached on
// destruction: a small tmpfs that really fills up, a ramfs (no O_DIRECT, no
// size). Mounting needs root; `ok` says whether it worked (skip otherwise).
#pragma once

#include <sys/mount.h>

#include <filesystem>
#include <string>

namespace k3pack::testing_scratch {

struct ScratchMount {
  std::string dir;
  bool ok = false;
  ScratchMount(const std::string& d, const char* type, const std::string& options = "") : dir(d) {
    std::filesystem::create_directories(dir);
    ok = ::mount(type, dir.c_str(), type, 0, options.empty() ? nullptr : options.c_str()) == 0;
  }
  ~ScratchMount() {
    if (ok) ::umount2(dir.c_str(), MNT_DETACH);
  }
  ScratchMount(const ScratchMount&) = delete;
  ScratchMount& operator=(const ScratchMount&) = delete;
};

}  // namespace k3pack::testing_scratch
