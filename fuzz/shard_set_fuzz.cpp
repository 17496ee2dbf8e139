// Shard-set discovery and cross-shard checks over a directory of fuzzed
// files: the input is cut into up to three shard images plus a stray file.
#include <cstdint>
#include <filesystem>
#include <string>

#include "fuzz_util.h"
#include "k3pack/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fs = std::filesystem;
  const fs::path dir = k3fuzz::ScratchDir() / "set";
  fs::remove_all(dir);
  fs::create_directories(dir);
  // Pieces are separated by the 4-byte marker "|||\n"; the first byte picks the shard count.
  const std::string in(reinterpret_cast<const char*>(data), size);
  const int count = size ? 1 + data[0] % 3 : 1;
  size_t start = size ? 1 : 0;
  for (int i = 0; i <= count; ++i) {
    size_t end = in.find("|||\n", start);
    std::string piece = in.substr(start, end == std::string::npos ? std::string::npos : end - start);
    std::string name = i < count ? "F-0000" + std::to_string(i + 1) + "-of-0000" + std::to_string(count) + ".gguf"
                                 : "mmproj-F16.gguf";
    k3fuzz::WriteFile(dir / name, reinterpret_cast<const uint8_t*>(piece.data()), piece.size());
    if (end == std::string::npos) break;
    start = end + 4;
  }
  k3pack::gguf::ShardSetOptions opts;
  opts.expected_architecture = "";
  auto set = k3pack::gguf::ShardSet::Open(dir.string(), opts);
  if (set.ok()) {
    for (const auto& t : set->AllTensors()) {
      if (!set->FindTensor(t.info->name)) __builtin_trap();
    }
  }
  return 0;
}
