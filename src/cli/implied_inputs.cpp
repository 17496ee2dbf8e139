#include "cli/implied_inputs.h"

#include <cstdio>
#include <filesystem>

#include "k3pack/gguf.h"
#include "k3pack/pack.h"
#include "manifest/tokenizer_dir.h"

namespace k3pack::cli {

namespace fs = std::filesystem;

namespace {

void Announce(const std::string& command, const std::string& option, const std::string& path, const std::string& why) {
  std::fprintf(stderr, "k3pack %s: using %s %s (%s)\n", command.c_str(), option.c_str(), path.c_str(), why.c_str());
}

fs::path ShardDir(const std::string& gguf_path) {
  std::error_code ec;
  fs::path p(gguf_path);
  if (!fs::is_directory(p, ec)) p = p.parent_path();
  return p.empty() ? fs::path(".") : p;
}

}  // namespace

Status FillImpliedInputs(Args& args, const std::string& command, ImpliedInputs which) {
  const std::string gguf = args.Get("--gguf-dir");
  std::error_code ec;
  // A --gguf-dir that is not there is the preflight's to report, as it is
  // when every input is given.
  if (!fs::exists(gguf, ec)) return Status::OK();
  if (which.tokenizer_dir && !args.Has("--tokenizer-dir")) {
    auto tok = manifest::DeriveTokenizerDir(gguf);
    if (!tok.ok()) {
      return Error(tok.error().message())
          .WithHint("pass --tokenizer-dir TOK: the Kimi tokenizer directory (config.json + tokenizer.json, "
                    "tiktoken.model or tokenizer_config.json). Without it k3pack looks where SGLang's server does: "
                    "<shard dir>/tokenizer, <shard dir>/../kimi-k3-tokenizer and <shard dir>/../*tokenizer*");
    }
    args.Fill("--tokenizer-dir", *tok);
    Announce(command, "--tokenizer-dir", *tok, "the Kimi tokenizer directory beside the shards, found as SGLang's server "
                                              "finds it");
  }
  if (which.model_config && !args.Has("--model-config")) {
    const fs::path beside = ShardDir(gguf) / "config.json";
    if (fs::is_regular_file(beside, ec)) {
      args.Fill("--model-config", beside.string());
      Announce(command, "--model-config", beside.string(), "config.json beside the shards");
    } else {
      std::string tok = args.Get("--tokenizer-dir");
      std::string why_not;
      if (tok.empty()) {
        auto derived = manifest::DeriveTokenizerDir(gguf);
        if (derived.ok()) tok = *derived;
        else why_not = derived.error().message();
      }
      const fs::path in_tok = fs::path(tok) / "config.json";
      if (tok.empty() || !fs::is_regular_file(in_tok, ec)) {
        if (why_not.empty()) why_not = "no " + in_tok.string();
        return Error("--model-config not given, and no config.json found for it: no " + beside.string() + ", and " +
                     why_not)
            .WithHint("pass --model-config CONFIG: the Kimi-K3 model's HF config.json");
      }
      args.Fill("--model-config", in_tok.string());
      Announce(command, "--model-config", in_tok.string(), "the tokenizer directory's config.json, as SGLang's server "
                                                            "uses it");
    }
  }
  if (which.pack && !args.Has("--pack")) {
    K3_ASSIGN_OR_RETURN(auto shards, gguf::ShardSet::Discover(gguf));
    if (shards.empty()) return Error("no GGUF shards in " + gguf).WithHint("pass --gguf-dir DIR holding the shards");
    K3_ASSIGN_OR_RETURN(std::string pack, pack::DefaultPackPath(shards.front()));
    args.Fill("--pack", pack);
    Announce(command, "--pack", pack, "the pack `k3pack pack` writes beside the shards");
  }
  return Status::OK();
}

}  // namespace k3pack::cli
