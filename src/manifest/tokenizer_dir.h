// Where the Kimi tokenizer directory of a GGUF shard set is, found the way
// SGLang's server finds it when it prepares a raw GGUF (spec 8.4 step 3), so
// that `k3pack build DIR` needs no other path when the layout is SGLang's.
#pragma once

#include <string>

#include "k3pack/error.h"
#include "manifest/manifest_output.h"

namespace k3pack::manifest {

// SGLang's test of a tokenizer directory: config.json and one of
// tokenizer.json, tiktoken.model, tokenizer_config.json, as regular files.
bool IsKimiTokenizerDir(const std::string& dir);

// The manifest writer lists the tokenizer directory and hashes every file in
// it after the pack is built: one this user may not list or read would fail
// a build only then (hours, for a real model), so `k3pack build` and
// k3pack.build try it first. The listing's or the open's error, with a hint
// naming `option` (the caller's name of the directory).
Status CheckTokenizerFilesReadable(const std::string& option, const std::string& dir);

// The one valid tokenizer directory among <shard dir>/tokenizer,
// <shard dir>/../kimi-k3-tokenizer and the sorted <shard dir>/../*tokenizer*
// directories (`gguf_path` is the shard directory or one shard), the shard
// directory resolved first and the result resolved, as SGLang's server does.
// None or several: SGLang's RuntimeError text, "could not uniquely derive
// Kimi tokenizer beside <shard dir>; candidates: <resolved paths or none>".
Result<std::string> DeriveTokenizerDir(const std::string& gguf_path);

// An input the shard set implies when it is not given, and why, for the
// caller to say ("using --tokenizer-dir m/tokenizer (<why>)").
struct ImpliedPath {
  std::string path, why;
};

// DeriveTokenizerDir, its failure a RuntimeError (as SGLang raises it) with
// a hint naming how to pass the directory (`names`: the caller's words).
Result<ImpliedPath> ImpliedTokenizerDir(const std::string& gguf_path, const InputNames& names);
// config.json beside the shards (what `doctor` reads), else the tokenizer
// directory's (`tokenizer_dir`, or the derived one when empty): the file
// SGLang's server builds its model metadata from.
Result<ImpliedPath> ImpliedModelConfig(const std::string& gguf_path, const std::string& tokenizer_dir,
                                       const InputNames& names);

}  // namespace k3pack::manifest
