#include "cli/implied_inputs.h"

#include <cstdio>
#include <filesystem>

#include "cli/preflight.h"
#include "k3pack/gguf.h"
#include "k3pack/pack.h"
#include "manifest/tokenizer_dir.h"

namespace k3pack::cli {

namespace fs = std::filesystem;

namespace {

void Announce(const std::string& command, const std::string& option, const manifest::ImpliedPath& found) {
  Narrate(command, "using " + option + " " + found.path + " (" + found.why + ")");
}

}  // namespace

Status FillImpliedInputs(Args& args, const std::string& command, ImpliedInputs which) {
  const std::string gguf = args.Get("--gguf-dir");
  // A --gguf-dir that is not there or holds no shards is the preflight's to
  // report, as it is when every input is given: nothing is derived from it.
  if (!CheckGgufDir("--gguf-dir", gguf).ok()) return Status::OK();
  const manifest::InputNames names;  // the CLI's option names
  if (which.tokenizer_dir && !args.Has("--tokenizer-dir")) {
    K3_ASSIGN_OR_RETURN(manifest::ImpliedPath tok, manifest::ImpliedTokenizerDir(gguf, names));
    args.Set("--tokenizer-dir", tok.path);
    Announce(command, "--tokenizer-dir", tok);
  }
  if (which.model_config && !args.Has("--model-config")) {
    K3_ASSIGN_OR_RETURN(manifest::ImpliedPath config,
                        manifest::ImpliedModelConfig(gguf, args.Get("--tokenizer-dir"), names));
    args.Set("--model-config", config.path);
    Announce(command, "--model-config", config);
  }
  if (which.pack && !args.Has("--pack")) {
    K3_ASSIGN_OR_RETURN(auto shards, gguf::ShardSet::Discover(gguf));
    if (shards.empty()) return Error("no GGUF shards in " + gguf).WithHint("pass --gguf-dir DIR holding the shards");
    K3_ASSIGN_OR_RETURN(std::string pack, pack::DefaultPackPath(shards.front()));
    args.Set("--pack", pack);
    Announce(command, "--pack", {pack, "the pack `k3pack pack` writes beside the shards"});
  }
  return Status::OK();
}

void ManifestInDirectory(Args& args, const std::string& command) {
  const std::string given = args.Get("--manifest");
  std::error_code ec;
  if (given.empty() || !fs::is_directory(given, ec)) return;
  const std::string path = (fs::path(given) / manifest::kDefaultManifestName).string();
  args.Set("--manifest", path);
  Announce(command, "--manifest", {path, "the manifest `k3pack build` writes in " + given});
}

}  // namespace k3pack::cli
