// Shared helpers of the synth tests: temp dirs and readback.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "k3pack/gguf.h"
#include "k3pack/synth.h"

namespace k3pack::synth::testing {

class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/k3synth-XXXXXX";
    char* p = ::mkdtemp(tmpl.data());
    EXPECT_NE(p, nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline SynthOptions Tiny(const std::string& out, uint64_t seed = 7) {
  auto o = PresetOptions("tiny");
  EXPECT_TRUE(o.ok());
  SynthOptions opts = *o;
  opts.out_dir = out;
  opts.seed = seed;
  return opts;
}

inline std::vector<float> F32Values(const gguf::GgufFile& f, const gguf::TensorInfo& t) {
  auto bytes = f.TensorData(t);
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

}  // namespace k3pack::synth::testing
