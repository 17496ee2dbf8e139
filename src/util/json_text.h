// JSON text from files the user hands k3pack (manifests, config.json,
// sidecars, stats), parsed with a nesting limit.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "k3pack/error.h"

namespace k3pack {

// No k3pack file nests deeper than a few levels. nlohmann's parser keeps
// its own stack, but its dump() and every walk of the tree (Python's
// conversion among them) recurse per level: a 140 KB file of 70,000 `[`
// overflowed the thread's stack. Python's json.loads (SGLang's reader)
// raises RecursionError near 1,000 levels.
inline constexpr int kMaxJsonDepth = 512;

// nlohmann::json::parse of `text`; an error carries the parser's message
// (its position), or says the text nests deeper than kMaxJsonDepth.
Result<nlohmann::json> ParseJsonText(std::string_view text);

// An nlohmann exception's text without its "[json.exception.parse_error.101] "
// tag, which names the library, not the problem.
std::string JsonErrorText(const nlohmann::json::exception& e);

// The same, as json::parse(text, nullptr, false) does: a discarded value
// (is_discarded()) for text that does not parse or nests too deep.
nlohmann::json ParseJsonOrDiscarded(std::string_view text);

}  // namespace k3pack
