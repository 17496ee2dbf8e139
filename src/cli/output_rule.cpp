#include "cli/output_rule.h"

#include <iostream>

#include <nlohmann/json.hpp>

namespace k3pack::cli {

void AddForceFlag(Args& args, const std::string& what) {
  args.Flag("--force", "replace an existing " + what + " (otherwise refused; a finished valid one is reported)");
}

void ReportAlreadyBuilt(const std::string& command, const std::string& path, bool json) {
  const std::string line = "already built: " + path + " (use --force to rebuild)";
  if (json) {
    std::cerr << "k3pack " << command << ": " << line << "\n";
    PrintJson(nlohmann::json{{"already_built", true}, {"path", path}});
  } else {
    std::cout << line << "\n";
  }
}

}  // namespace k3pack::cli
