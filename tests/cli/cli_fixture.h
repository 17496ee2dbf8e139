// Shared by the CLI safety tests: one synthetic tiny model per test binary,
// fresh copies of it per test, and snapshots (SHA-256 of every file) to prove
// a refused command changed no input and published nothing.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

#include "../cli_run.h"
#include "../scratch_dir.h"
#include "util/sha256.h"

namespace k3cli {

namespace fs = std::filesystem;
using k3pack::testing_cli::Cli;
using k3pack::testing_cli::CliVia;
using k3pack::testing_cli::CliRun;
using k3pack::testing_cli::FileBytes;

// The names `build` gives the pack and the manifest of the synthetic model.
inline const char* kPackName = "KIMI-K3-SYNTH.expert-major.pack";
inline const char* kManifestName = "kimi-k3-expert-pack.manifest.json";

// A hang is a failure (exit 124), not a stalled test run.
inline CliRun Timed(const std::string& args) { return CliVia("timeout -k 5 60", args); }

inline std::string Q(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

inline std::string Root() { return k3pack::testing_scratch::ProcessScratchDir("k3cli"); }

// The synthetic tiny model (3 shards, config.json, tokenizer/), written once.
inline const std::string& BaseModel() {
  static const std::string dir = [] {
    const std::string d = Root() + "/base-model";
    CliRun r = Cli("synth --preset tiny --seed 1 --out " + Q(d));
    EXPECT_EQ(r.code, 0) << r.out;
    return d;
  }();
  return dir;
}

// A private copy of the model in `Root()/name` (tests write beside the shards).
inline std::string FreshModel(const std::string& name) {
  const std::string d = Root() + "/" + name;
  fs::remove_all(d);
  fs::copy(BaseModel(), d, fs::copy_options::recursive);
  return d;
}

// A copy of the model built once per process (pack + manifest beside the
// shards); callers only read it.
inline const std::string& BuiltTinyModel() {
  static const std::string m = [] {
    const std::string d = FreshModel("built-once");
    CliRun r = Cli("build --progress none --safety-margin-gib 0 " + Q(d));
    EXPECT_EQ(r.code, 0) << r.out;
    return d;
  }();
  return m;
}

// Relative path -> SHA-256 of every regular file under `dir` ("<dir>" for directories).
inline std::map<std::string, std::string> Snapshot(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string rel = fs::relative(e.path(), dir).string();
    if (e.is_regular_file()) {
      auto h = k3pack::Sha256File(e.path().string());
      out[rel] = h.ok() ? *h : "unreadable";
    } else {
      out[rel] = "<dir>";
    }
  }
  return out;
}

inline bool Contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

inline std::string Shard(const std::string& model, int i) {
  return model + "/KIMI-K3-SYNTH-0000" + std::to_string(i) + "-of-00003.gguf";
}

// build with the model's own config and tokenizer, plus `extra`.
inline CliRun Build(const std::string& model, const std::string& extra = "") {
  return Cli("build --progress none --safety-margin-gib 0 --gguf-dir " + Q(model) + " --model-config " +
             Q(model + "/config.json") + " --tokenizer-dir " + Q(model + "/tokenizer") + " " + extra);
}

inline CliRun Pack(const std::string& model, const std::string& extra = "") {
  return Cli("pack --progress none --safety-margin-gib 0 --gguf-dir " + Q(model) + " --model-config " +
             Q(model + "/config.json") + " " + extra);
}

// A cheap command that writes one file: a small generated trace, `extra`
// appended (the trace's path among it).
inline std::string TraceGenArgs(const std::string& extra) {
  return "trace gen --layers 2 --experts 8 --top-k 2 --requests 1 --decode-tokens 4 " + extra;
}

inline std::string TraceGen(const std::string& trace, const std::string& extra = "") {
  return TraceGenArgs("--trace " + Q(trace) + " " + extra);
}

}  // namespace k3cli
