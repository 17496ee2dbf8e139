#include "loader/npy.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "util/file.h"

namespace k3pack::loader {

std::string NpyHeader(const NamedTensor& t) {
  std::string dict = "{'descr': '" + std::string(DTypeNumpyStr(t.dtype)) + "', 'fortran_order': False, 'shape': " +
                     PyTupleRepr(t.shape) + ", }";
  // magic(6) + version(2) + header_len(2) + dict + padding + '\n' is a
  // multiple of 64, as numpy writes it.
  size_t total = 10 + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict.push_back('\n');
  std::string h("\x93NUMPY\x01\x00", 8);
  h.push_back(static_cast<char>(dict.size() & 0xff));
  h.push_back(static_cast<char>((dict.size() >> 8) & 0xff));
  return h + dict;
}

Status WriteNpy(const std::string& path, const NamedTensor& t) {
  K3_ASSIGN_OR_RETURN(AtomicFile out, AtomicFile::Create(path));
  const std::string header = NpyHeader(t);
  K3_RETURN_IF_ERROR(out.Write(header.data(), header.size(), 0));
  // In 64 MiB pieces, releasing each piece of a mapped view after writing,
  // so dumping a large tensor does not pin it all in memory.
  constexpr size_t kChunk = size_t{64} << 20;
  for (size_t off = 0; off < t.data.size(); off += kChunk) {
    const auto piece = t.data.subspan(off, std::min(kChunk, t.data.size() - off));
    K3_RETURN_IF_ERROR(out.Write(piece.data(), piece.size(), header.size() + off));
    if (t.zero_copy) ReleasePages(piece);
  }
  return out.Commit();
}

Result<bool> NpyFileHolds(const std::string& path, const NamedTensor& t) {
  const std::string header = NpyHeader(t);
  auto size = FileSize(path);
  if (!size.ok() || *size != header.size() + t.data.size()) return false;
  K3_ASSIGN_OR_RETURN(UniqueFd fd, OpenReadOnly(path));
  std::string buf(header.size(), '\0');
  K3_ASSIGN_OR_RETURN(size_t n, PreadFull(fd.get(), buf.data(), buf.size(), 0));
  if (n != buf.size() || buf != header) return false;
  // In pieces, releasing each piece of a mapped view after comparing it (as
  // WriteNpy does), so a large tensor is never held in memory whole.
  constexpr size_t kChunk = size_t{16} << 20;
  buf.resize(std::min(kChunk, t.data.size()));
  bool same = true;
  for (size_t off = 0; off < t.data.size() && same; off += kChunk) {
    const auto piece = t.data.subspan(off, std::min(kChunk, t.data.size() - off));
    K3_ASSIGN_OR_RETURN(n, PreadFull(fd.get(), buf.data(), piece.size(), header.size() + off));
    same = n == piece.size() && std::memcmp(buf.data(), piece.data(), piece.size()) == 0;
    if (t.zero_copy) ReleasePages(piece);
  }
  return same;
}

}  // namespace k3pack::loader
