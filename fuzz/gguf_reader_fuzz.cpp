// GGUF header parser over arbitrary bytes: must reject or accept, never
// crash, over-read or leak; accepted files must be fully walkable.
#include <cstdint>
#include <string>

#include "k3pack/gguf.h"
#include "util/file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace k3pack;
  auto map = MappedFile::FromBytes("fuzz.gguf", std::string(reinterpret_cast<const char*>(data), size));
  auto r = gguf::GgufFile::Parse(map);
  if (!r.ok()) return 0;
  const gguf::GgufFile& f = **r;
  uint64_t sum = 0;
  for (const auto& kv : f.metadata()) {
    const gguf::Value& v = kv.value;
    if (v.type == gguf::ValueType::kArray && v.array_type != gguf::ValueType::kString) {
      for (uint64_t i = 0; i < v.array_count && i < 64; ++i) sum += static_cast<uint64_t>(v.ArrayInt(i));
    }
    if (f.Find(kv.key) != &v) __builtin_trap();
  }
  for (const auto& t : f.tensors()) {
    auto bytes = f.TensorData(t);
    if (!bytes.empty()) sum += bytes.front() + bytes.back();  // must be inside the image
    if (f.FindTensor(t.name) != &t) __builtin_trap();
  }
  return static_cast<int>(sum & 0);
}
