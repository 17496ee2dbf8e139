// Shard-set discovery and cross-shard checks over a directory of fuzzed
// files: the input is cut into up to three shard images plus a stray file.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_util.h"
#include "k3pack/gguf.h"

namespace {

std::string ShardName(int index, int count) {
  return "F-0000" + std::to_string(index + 1) + "-of-0000" + std::to_string(count) + ".gguf";
}

// Every name an input can create, so the next input starts from an empty
// directory without recreating it.
const std::vector<std::filesystem::path>& AllNames(const std::filesystem::path& dir) {
  static const std::vector<std::filesystem::path> names = [&] {
    std::vector<std::filesystem::path> v{dir / "mmproj-F16.gguf"};
    for (int count = 1; count <= 3; ++count)
      for (int i = 0; i < count; ++i) v.push_back(dir / ShardName(i, count));
    return v;
  }();
  return names;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::filesystem::path dir = [] {
    auto d = k3fuzz::ScratchDir() / "set";
    std::filesystem::create_directories(d);
    return d;
  }();
  for (const auto& p : AllNames(dir)) ::unlink(p.c_str());
  // Pieces are separated by the 4-byte marker "|||\n"; the first byte picks the shard count.
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const int count = size ? 1 + data[0] % 3 : 1;
  size_t start = size ? 1 : 0;
  for (int i = 0; i <= count; ++i) {
    const size_t end = in.find("|||\n", start);
    const std::string_view piece = in.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start);
    const auto path = i < count ? dir / ShardName(i, count) : dir / "mmproj-F16.gguf";
    k3fuzz::WriteFile(path, piece.data(), piece.size());
    if (end == std::string_view::npos) break;
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
