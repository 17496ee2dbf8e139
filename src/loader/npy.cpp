#include "loader/npy.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>

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
  const std::string tmp = path + ".tmp";
  // Errors name `path`, the file asked for, not its temporary name.
  auto named = [&](const Status& st) -> Status { return st.error().WithContext("cannot write " + path); };
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Error::FromErrno("cannot write " + path, errno);
  UniqueFd owned(fd);
  const std::string header = NpyHeader(t);
  if (Status st = PwriteFull(fd, header.data(), header.size(), 0); !st.ok()) return named(st);
  // In 64 MiB pieces, releasing each piece of a mapped view after writing,
  // so dumping a large tensor does not pin it all in memory.
  constexpr size_t kChunk = size_t{64} << 20;
  for (size_t off = 0; off < t.data.size(); off += kChunk) {
    const auto piece = t.data.subspan(off, std::min(kChunk, t.data.size() - off));
    if (Status st = PwriteFull(fd, piece.data(), piece.size(), header.size() + off); !st.ok()) return named(st);
    if (t.zero_copy) ReleasePages(piece);
  }
  owned = UniqueFd();
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return Error::FromErrno("cannot rename " + tmp + " to " + path, errno);
  return Status::OK();
}

}  // namespace k3pack::loader
