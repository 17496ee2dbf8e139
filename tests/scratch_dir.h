// Scratch space for tests: one directory per test process under the system
// temp dir, removed with everything in it when the process exits. ctest runs
// every test as its own process, so anything a test leaves behind would
// otherwise pile up run after run.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>

namespace k3pack::testing_scratch {

// `<tmp>/k3pack-tests-XXXXXX/<prefix>`: the process's scratch root (made on
// first use) with one subdirectory per prefix, so suites sharing a process
// keep apart.
inline std::string ProcessScratchDir(const std::string& prefix) {
  struct ScratchRoot {
    std::string path;
    ~ScratchRoot() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const ScratchRoot root{[] {
    std::string tmpl = (std::filesystem::temp_directory_path() / "k3pack-tests-XXXXXX").string();
    std::string made(::mkdtemp(tmpl.data()));
    // Traversable by others: some tests run the binary as an unprivileged user.
    std::filesystem::permissions(made, std::filesystem::perms::owner_all | std::filesystem::perms::group_read |
                                           std::filesystem::perms::group_exec | std::filesystem::perms::others_read |
                                           std::filesystem::perms::others_exec);
    return made;
  }()};
  const std::filesystem::path dir = std::filesystem::path(root.path) / prefix;
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace k3pack::testing_scratch
