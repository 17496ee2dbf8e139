#include "util/json_text.h"

#include <string>

namespace k3pack {

namespace {

struct TooDeep {};

}  // namespace

std::string JsonErrorText(const nlohmann::json::exception& e) {
  std::string text = e.what();
  if (text.starts_with("[json.exception.")) {
    if (const size_t end = text.find("] "); end != std::string::npos) text.erase(0, end + 2);
  }
  return text;
}

Result<nlohmann::json> ParseJsonText(std::string_view text) {
  // The callback sees each value's depth as the parser reaches it; leaving
  // by an exception stops the parse before the tree grows deeper.
  auto limit = [](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    if (depth > kMaxJsonDepth) throw TooDeep{};
    return true;
  };
  try {
    return nlohmann::json::parse(text, limit);
  } catch (const TooDeep&) {
    return Error("JSON nested more than " + std::to_string(kMaxJsonDepth) + " levels deep");
  } catch (const nlohmann::json::exception& e) {
    return Error(JsonErrorText(e));
  }
}

nlohmann::json ParseJsonOrDiscarded(std::string_view text) {
  auto j = ParseJsonText(text);
  return j.ok() ? std::move(*j) : nlohmann::json(nlohmann::json::value_t::discarded);
}

}  // namespace k3pack
