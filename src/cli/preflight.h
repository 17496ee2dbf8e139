// Checks every writing command runs before it reads or writes a byte of
// payload: the inputs are what the option says they are, the outputs can be
// written, and no output is one of the inputs. Each error names the option and
// says what to pass instead.
#pragma once

#include <string>
#include <vector>

#include "k3pack/error.h"
#include "util/output_guard.h"

namespace k3pack::cli {

// Shared with the Python binding (util/output_guard.h): the output-is-not-an-
// input and writable-directory checks.
using k3pack::CheckOutputDirWritable;
using k3pack::CheckOutputNotIn;
using k3pack::CheckOutputsAreNotInputs;
using k3pack::CheckOutputWritable;
using k3pack::CheckOutputWritableUnlessThere;
using k3pack::NamedPath;

// --model-config: a readable file (not a directory) holding a JSON object that
// is a Kimi HF config (model_type / architectures name Kimi, top level or in
// text_config).
Status CheckModelConfig(const std::string& option, const std::string& path);

// --tokenizer-dir: a directory SGLang accepts as the Kimi tokenizer: it has
// config.json (with text_config) and one of tokenizer.json, tiktoken.model,
// tokenizer_config.json.
Status CheckTokenizerDir(const std::string& option, const std::string& dir);
// Only the first part: the directory exists and is one SGLang takes as a
// tokenizer directory (`doctor`, which reports the rest as findings).
Status CheckIsTokenizerDir(const std::string& option, const std::string& dir);

// --gguf-dir: exists; when it holds no .gguf file but exactly one
// subdirectory does (unsloth's quant folders, e.g. UD-Q2_K_XL/), the error
// names that folder and the --gguf-dir to pass.
Status CheckGgufDir(const std::string& option, const std::string& path);

// An input file/dir named by `option` exists; when it does not, the error
// lists the candidates found beside it (names ending in `suffix`), or where
// there are none says how such a file is made (`make_it`).
Status CheckInputExists(const std::string& option, const std::string& path, const std::string& suffix,
                        const std::string& make_it = "run `k3pack build` first");

// `e` from a command that reads what a manifest records: when files the
// manifest names (pack, shards) are gone, as after moving the model directory,
// adds a hint saying so and to rerun `k3pack build` (unless `e` has a hint).
Error WithMovedModelHint(const Error& e, const std::string& manifest_path);

}  // namespace k3pack::cli
