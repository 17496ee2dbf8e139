// Pack header and index-entry decoding over arbitrary bytes, plus the
// expert tensor-name parser every entry name goes through.
#include <algorithm>
#include <cstdint>
#include <span>
#include <string_view>

#include "pack/format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace k3pack::pack;
  std::span<const uint8_t> bytes(data, size);
  auto header = DecodeHeader(bytes);
  size_t pos = kHeaderBytes;
  for (int i = 0; i < 64 && pos + kEntryBytes <= size; ++i, pos += kEntryBytes) {
    auto e = DecodeEntry(bytes.subspan(pos, kEntryBytes));
    if (!e.ok()) continue;
    auto parsed = ParseExpertTensorName(e->name);
    if (parsed && parsed->layer <= UINT32_MAX &&
        ExpertTensorName(static_cast<uint32_t>(parsed->layer), parsed->role) != e->name) {
      // Names with leading zeros ("blk.01") or other Unicode decimal digits
      // ("blk.\u0663") parse but are not canonical; anything else is a bug.
      const bool ascii = std::none_of(e->name.begin(), e->name.end(), [](char c) { return c & 0x80; });
      if (ascii && e->name.find(".0") == std::string::npos) __builtin_trap();
    }
    auto re = EncodeEntry(*e);
    if (re.ok() && e->name_utf8_ok) {
      auto back = DecodeEntry(std::span<const uint8_t>(re->data(), re->size()));
      if (!back.ok() || back->name != e->name || back->offset != e->offset || back->nbytes != e->nbytes) __builtin_trap();
    }
  }
  (void)header;
  return 0;
}
