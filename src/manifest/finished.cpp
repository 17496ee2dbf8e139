// Step 2 of the loaders' checks, kept apart from the other rules so that the
// manifest reader (and its fuzz target) can name what a JSON file that is no
// finished manifest lacks without linking the whole rule set.
#include <string>

#include "manifest/json_fields.h"
#include "manifest/loader_rules.h"
#include "manifest/manifest_output.h"

namespace k3pack::manifest {

using nlohmann::json;

bool FormatSupported(const json& m) {
  return m.is_object() && m.contains("format") && m["format"] == kManifestFormat;
}

bool MarkedComplete(const json& m) {
  return fields::Truthy(m, "complete");
}

namespace {

// What makes `m` no adapter manifest at all, complete or not; "" when its
// format is the adapter's.
std::string WhyNotAdapterFormat(const json& m) {
  if (!m.is_object()) return "it is a JSON " + std::string(m.type_name()) + ", not an object";
  if (!m.contains("format")) return "it has no \"format\" key";
  if (!FormatSupported(m)) {
    return "its \"format\" is " + m["format"].dump() + ", not \"" + std::string(kManifestFormat) + "\"";
  }
  return "";
}

}  // namespace

std::string WhyNotAFinishedManifest(const json& m, const std::string& path) {
  std::string why = WhyNotAdapterFormat(m);
  if (!why.empty()) {
  } else if (!MarkedComplete(m)) {
    why = "its \"complete\" is " + (m.contains("complete") ? m["complete"].dump() : std::string("missing")) +
          " (a manifest is marked complete only once it is written whole)";
  }
  if (why.empty()) return why;
  return path + ": " + why + "; pass the adapter manifest `k3pack build` or `k3pack manifest` wrote (" +
         std::string(kDefaultManifestName) + " beside the pack)";
}

Error WithMissingKeyHint(const Error& error, const std::string& path, const std::string& reader) {
  if (error.kind() != ErrorKind::kKey || error.message().find('\n') != std::string::npos) return error;
  return error.WithHint("manifest " + path + " has no key " + error.message() + " that " + reader +
                        " reads; regenerate it with `k3pack manifest`");
}

}  // namespace k3pack::manifest
