#include "util/utf8.h"

namespace k3pack {

bool IsValidUtf8(std::string_view s) {
  // Strict UTF-8 as Python's decoder: no overlongs, no surrogates, <= U+10FFFF.
  size_t i = 0;
  const auto* b = reinterpret_cast<const unsigned char*>(s.data());
  while (i < s.size()) {
    unsigned c = b[i];
    if (c < 0x80) { ++i; continue; }
    int n;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) n = 1;
    else if (c == 0xE0) { n = 2; lo = 0xA0; }
    else if (c >= 0xE1 && c <= 0xEC) n = 2;
    else if (c == 0xED) { n = 2; hi = 0x9F; }
    else if (c >= 0xEE && c <= 0xEF) n = 2;
    else if (c == 0xF0) { n = 3; lo = 0x90; }
    else if (c >= 0xF1 && c <= 0xF3) n = 3;
    else if (c == 0xF4) { n = 3; hi = 0x8F; }
    else return false;
    for (int k = 1; k <= n; ++k) {
      if (i + k >= s.size()) return false;
      unsigned cc = b[i + k];
      unsigned l = (k == 1) ? lo : 0x80, h = (k == 1) ? hi : 0xBF;
      if (cc < l || cc > h) return false;
    }
    i += n + 1;
  }
  return true;
}

}  // namespace k3pack
