// Inputs a Kimi GGUF shard directory implies, filled in where the user did
// not give them, so that `k3pack build DIR` works on SGLang's layout (the
// tokenizer directory beside the shards, its config.json the model config)
// and every filled path is said on stderr, never guessed silently.
#pragma once

#include <string>

#include "cli/command.h"
#include "k3pack/error.h"

namespace k3pack::cli {

struct ImpliedInputs {
  bool tokenizer_dir = false;  // --tokenizer-dir: manifest::DeriveTokenizerDir(--gguf-dir)
  bool model_config = false;   // --model-config: config.json beside the shards, else the tokenizer dir's
  bool pack = false;           // --pack: the pack `k3pack pack` writes beside the shards
};

// Fills the options `which` names that are not given, in the order above,
// each announced as "k3pack <command>: using <option> <path> (<why>)". An
// input that cannot be found is an error naming the option to pass.
Status FillImpliedInputs(Args& args, const std::string& command, ImpliedInputs which);

// A --manifest that names a directory stands for the manifest `build` and
// `manifest` write there under SGLang's name; the path used is announced.
// (A directory without one is then reported as a missing manifest file.)
void ManifestInDirectory(Args& args, const std::string& command);

}  // namespace k3pack::cli
