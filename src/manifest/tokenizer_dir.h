// Where the Kimi tokenizer directory of a GGUF shard set is, found the way
// SGLang's server finds it when it prepares a raw GGUF (spec 8.4 step 3), so
// that `k3pack build DIR` needs no other path when the layout is SGLang's.
#pragma once

#include <string>

#include "k3pack/error.h"

namespace k3pack::manifest {

// SGLang's test of a tokenizer directory: config.json and one of
// tokenizer.json, tiktoken.model, tokenizer_config.json, as regular files.
bool IsKimiTokenizerDir(const std::string& dir);

// The one valid tokenizer directory among <shard dir>/tokenizer,
// <shard dir>/../kimi-k3-tokenizer and the sorted <shard dir>/../*tokenizer*
// directories (`gguf_path` is the shard directory or one shard). None or
// several: SGLang's RuntimeError text, "could not uniquely derive Kimi
// tokenizer beside <shard dir>; candidates: <names or none>".
Result<std::string> DeriveTokenizerDir(const std::string& gguf_path);

}  // namespace k3pack::manifest
