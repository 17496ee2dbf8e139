// NonExpertStream: SGLang's kimi_k3_nonexpert_weights_iterator as a pull
// stream over memory-mapped shards (spec §5.3).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <deque>
#include <new>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "k3pack/gguf.h"
#include "k3pack/loader.h"
#include "k3pack/names.h"
#include "loader/manifest_view.h"
#include "manifest/loader_rules.h"
#include "manifest/recorded_inputs.h"
#include "loader/values.h"
#include "util/buffer_pool.h"
#include "util/file.h"

namespace k3pack::loader {

namespace {

size_t PageSize() {
  static const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

// Page-aligned [begin, end) covering `span` (outward).
std::pair<uintptr_t, uintptr_t> PageRange(const uint8_t* p, size_t n) {
  const uintptr_t mask = PageSize() - 1;
  const auto b = reinterpret_cast<uintptr_t>(p) & ~mask;
  const auto e = (reinterpret_cast<uintptr_t>(p) + n + mask) & ~mask;
  return {b, e};
}

// A buffer for copy mode, not zeroed (pread fills every byte). Big ones are
// 2 MiB aligned and marked MADV_HUGEPAGE, so filling them takes one page
// fault per 2 MiB instead of one per 4 KiB where the kernel has transparent
// huge pages in madvise mode, and come from a process-wide BufferPool: a
// fresh buffer costs a page fault and the kernel's zeroing per page before
// pread can fill it (~25 % of a warm copy-mode stream), a recycled one is
// already mapped. The pool keeps at most 128 MiB of released buffers, so the
// memory a copying consumer pays stays small next to the largest tensor; it
// is never destroyed, so a buffer released at exit (a Python tensor
// outliving the stream) still has somewhere to go.
std::shared_ptr<uint8_t> CopyBuffer(size_t n) {
  constexpr size_t kHuge = size_t{2} << 20;
  if (n < 2 * kHuge) return std::shared_ptr<uint8_t>(new uint8_t[std::max<size_t>(n, 1)], std::default_delete<uint8_t[]>());
  static const auto* pool = new std::shared_ptr<BufferPool>(std::make_shared<BufferPool>(
      size_t{128} << 20, BufferAllocator{[](uint64_t bytes) -> void* {
                                           void* p = std::aligned_alloc(kHuge, bytes);
                                           if (p) ::madvise(p, bytes, MADV_HUGEPAGE);  // best effort
                                           return p;
                                         },
                                         [](void* p, uint64_t) { std::free(p); }}));
  std::shared_ptr<uint8_t> buf = (*pool)->Get((n + kHuge - 1) / kHuge * kHuge);
  if (!buf) throw std::bad_alloc();
  return buf;
}

void Advise(const uint8_t* p, size_t n, int advice) {
  if (n == 0) return;
  auto [b, e] = PageRange(p, n);
  ::madvise(reinterpret_cast<void*>(b), e - b, advice);  // best effort
}

}  // namespace

void ReleasePages(std::span<const uint8_t> view) { ReleaseMappedPages(view); }

void ReleasePages(const NamedTensor& tensor) {
  if (tensor.zero_copy) ReleasePages(tensor.data);  // a fresh buffer's pages would come back zeroed
}

struct NonExpertStream::Impl {
  LoadOptions opts;
  std::string manifest_path;
  StreamManifest manifest;
  nlohmann::json source_json;  // the manifest's `source`, kept for verify_metadata
  bool interrupted = false;     // VerifySource stopped by opts.interrupt_check
  bool source_verified = false;
  LoadStats stats;

  size_t next_shard = 0;
  std::shared_ptr<const gguf::GgufFile> shard;  // current shard
  const StreamShardRecord* shard_record = nullptr;
  std::unordered_map<std::string_view, const StreamTensorRecord*> records;  // current shard's
  size_t next_tensor = 0;
  size_t advised_upto = 0;  // tensors before this index already had read-ahead advice
  int fd_for_fadvise = -1;  // the shard opened for fadvise and, in copy mode, pread

  std::deque<NamedTensor> pending;
  std::optional<Error> pending_error;
  std::optional<Error> failed;
  std::unordered_set<std::string> seen;
  std::optional<int64_t> head_count;  // kimi-k3.attention.head_count of the first shard read

  // The last zero-copy range handed out, released on the next call.
  const uint8_t* last_ptr = nullptr;
  size_t last_len = 0;

  ~Impl() { CloseShard(); }

  void CloseShard() {
    if (fd_for_fadvise >= 0) ::close(fd_for_fadvise);
    fd_for_fadvise = -1;
    shard.reset();
    records.clear();
    shard_record = nullptr;
  }

  // SGLang names a shard as Path(shard["path"]).resolve().
  static std::string ShownPath(const StreamShardRecord& rec) {
    auto r = ResolvePath(rec.path);
    return r.ok() ? *r : rec.path;
  }
  static Error Missing(const StreamShardRecord& rec) {
    return Error("Kimi-K3 GGUF shard is missing or changed: " + ShownPath(rec), ErrorKind::kFileNotFound, ENOENT);
  }

  // A zero-copy stream reads (A_log) and hands out views of the mapping; a
  // mapped page past the end of a file truncated since it was opened is a
  // SIGBUS when read, which kills the process. So before each tensor the
  // open shard's size is checked against the manifest's: a shard cut short
  // is SGLang's "missing or changed" error instead. (Copy mode reads with
  // pread, whose short count says the same.) Views handed out earlier are
  // not protected: a consumer that keeps tensors while files may change
  // should use copy mode.
  Status CheckNotTruncated(const gguf::TensorInfo& t) {
    if (fd_for_fadvise < 0) return Status::OK();
    struct stat st {};
    if (::fstat(fd_for_fadvise, &st) != 0 || static_cast<uint64_t>(st.st_size) >= shard_record->size) {
      return Status::OK();
    }
    return Missing(*shard_record)
        .WithHint("the file is now " + std::to_string(st.st_size) + " bytes, " +
                  std::to_string(shard_record->size) + " in the manifest: it was cut short while " + t.name +
                  " was next; reading its bytes through the mapping would kill the process with SIGBUS");
  }

  void ReleaseLast() {
    if (!last_ptr || !shard) return;
    if (opts.release_pages) Advise(last_ptr, last_len, MADV_DONTNEED);
    if (opts.drop_page_cache && fd_for_fadvise >= 0) {
      const uint64_t off = static_cast<uint64_t>(last_ptr - shard->mapping()->data());
      ::posix_fadvise(fd_for_fadvise, static_cast<off_t>(off), static_cast<off_t>(last_len), POSIX_FADV_DONTNEED);
    }
    last_ptr = nullptr;
    last_len = 0;
  }

  Status OpenShard(const StreamShardRecord& rec) {
    CloseShard();
    // SGLang names the shard as Path(shard["path"]).resolve(); resolved only
    // when it is reported.
    auto shown = [&rec] { return ShownPath(rec); };
    auto missing = [&] { return Missing(rec); };
    // SGLang's text, and for a shard that is there, what differs (as the
    // metadata check says): without it an iterator that does not verify the
    // metadata first (the Python default) named the shard and nothing else.
    // A missing one is left bare: callers know more (`load`: the model
    // directory moved).
    struct stat st;
    if (::stat(rec.path.c_str(), &st) != 0) return missing();
    if (!S_ISREG(st.st_mode)) return missing().WithHint("it is not a regular file; rebuild the manifest");
    if (static_cast<uint64_t>(st.st_size) != rec.size) {
      return missing().WithHint("size " + std::to_string(st.st_size) + " != " + std::to_string(rec.size) +
                                " (file != manifest); rebuild the manifest");
    }
    gguf::ReadOptions ro;
    ro.require_packed_offsets = false;  // gguf-py reads any in-bounds offsets
    K3_ASSIGN_OR_RETURN(auto map, MappedFile::Open(rec.path, opts.copy_on_write));
    K3_ASSIGN_OR_RETURN(shard, gguf::GgufFile::Parse(std::move(map), ro));
    shard_record = &rec;

    static const std::vector<StreamTensorRecord> kNone;
    auto it = manifest.tensors_by_shard.find(rec.index);
    const auto& recs = it == manifest.tensors_by_shard.end() ? kNone : it->second;
    // A later record of one name replaces the earlier, as in SGLang's dict
    // of the records: its dtype is the one compared.
    for (const auto& r : recs) records.insert_or_assign(r.name, &r);
    bool same = records.size() == shard->tensors().size();
    for (const auto& t : shard->tensors()) {
      if (!same) break;
      same = records.count(t.name) != 0;
    }
    if (!same) return Error("Kimi-K3 GGUF shard inventory changed: " + shown());

    if (!head_count) {
      if (const gguf::Value* v = shard->Find("kimi-k3.attention.head_count")) {
        if (auto h = v->AsInt(); h && *h > 0) head_count = *h;
      }
    }
    {
      // Every mode keeps the shard open: copy mode reads it, drop_page_cache
      // advises it, and a zero-copy stream checks its size (CheckNotTruncated).
      int fd = ::open(rec.path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) return missing();
      fd_for_fadvise = fd;
      // Copy mode reads front to back: a doubled readahead window.
      if (fd >= 0 && opts.copy) ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    }
    next_tensor = 0;
    advised_upto = 0;
    stats.shards_opened++;
    if (opts.on_shard) opts.on_shard(rec.index, rec.path, static_cast<uint32_t>(manifest.shards.size()));
    return Status::OK();
  }

  // verify_metadata: before the first shard, every shard and tensor record
  // and the inventory digest against the files, by the manifest writer's
  // scan (manifest/recorded_inputs.h, shared with `k3pack verify`). First
  // lines are the iterator's texts for the same kind of change.
  Status VerifySource() {
    manifest::SourceCheckOptions o;
    o.whole_files = true;  // the shards are mapped and read anyway
    o.between_chunks = [this]() -> Status {
      if (!opts.interrupt_check) return Status::OK();
      Status s = opts.interrupt_check();
      interrupted = !s.ok();
      return s;
    };
    K3_ASSIGN_OR_RETURN(manifest::SourceDifference d, manifest::CompareSourceWithShards(source_json, o));
    using Kind = manifest::SourceDifference::Kind;
    const std::string hint = d.detail + "; rebuild the manifest";
    switch (d.kind) {
      case Kind::kNone:
        return Status::OK();
      case Kind::kShardMissing:
      case Kind::kShardUnreadable:
      case Kind::kShard:
        return Error("Kimi-K3 GGUF shard is missing or changed: " + d.shard_path, ErrorKind::kFileNotFound, ENOENT)
            .WithHint(hint);
      case Kind::kTensorSet:
        return Error("Kimi-K3 GGUF shard inventory changed: " + d.shard_path).WithHint(hint);
      case Kind::kTensor:
        if (d.field == "shard_index") return Error("Kimi-K3 GGUF shard inventory changed: " + d.shard_path).WithHint(hint);
        if (d.field == "dtype" || d.field == "dtype_id") {
          return Error("Kimi-K3 GGUF tensor type changed: " + d.tensor).WithHint(hint);
        }
        return Error("Kimi-K3 GGUF tensor layout changed: " + d.tensor)
            .WithHint(d.detail + " in " + d.shard_path + "; rebuild the manifest");
      case Kind::kSummary:
      case Kind::kInventory:
        return manifest::SourceDifferenceStatus(d);
    }
    return Status::OK();
  }

  Status Emit(NamedTensor t) {
    if (!seen.insert(t.name).second) return Error("duplicate Kimi-K3 target parameter: " + t.name);
    pending.push_back(std::move(t));
    return Status::OK();
  }

  Status CheckSsmAShape(const gguf::TensorInfo& t, const std::vector<int64_t>& shape) {
    if (opts.sglang_compat) return Status::OK();
    const int64_t h = kimi::SsmAHeadsOf(t.shape());
    if (h > 0 && (!head_count || h == *head_count)) return Status::OK();
    std::string expect = "(H,) or (1, 1, H, 1), i.e. GGUF ne {H} or {1, H, 1, 1}";
    if (head_count) expect += ", with H = kimi-k3.attention.head_count = " + std::to_string(*head_count);
    return Error("Kimi-K3 GGUF ssm_a must have shape " + expect + ", got " + PyTupleRepr(shape) + ": " + t.name)
        .WithHint("SGLang's A_log loader takes only these shapes; the converter writes ne {H}");
  }

  // pread of [off, off+n) into dst, except that holes of a sparse file are
  // zero-filled instead of read: their bytes are zeros by definition, and
  // reading them makes the kernel build and copy zero page-cache pages
  // (~0.3-0.5 GB/s on the development VM against memset's ~10 GB/s). The
  // count is short where the file ends early, as with one pread. `*read`:
  // the bytes of it actually read (holes are not).
  static Result<size_t> ReadSkippingHoles(int fd, uint8_t* dst, size_t n, uint64_t off, uint64_t* read) {
    const std::vector<Segment> segs = MapRange(fd, off, n);
    if (segs.size() == 1 && !segs[0].hole) {
      K3_ASSIGN_OR_RETURN(size_t k, PreadFull(fd, dst, n, off));
      *read += k;
      return k;
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0) return Error::FromErrno("fstat failed", errno);
    const uint64_t file_end = static_cast<uint64_t>(st.st_size);
    size_t got = 0;
    for (const Segment& s : segs) {
      uint8_t* at = dst + (s.offset - off);
      const uint64_t len = std::min<uint64_t>(s.length, file_end > s.offset ? file_end - s.offset : 0);
      if (s.hole) {
        std::memset(at, 0, len);
      } else {
        K3_ASSIGN_OR_RETURN(size_t k, PreadFull(fd, at, len, s.offset));
        *read += k;
        if (k != len) return got + k;
      }
      got += len;
      if (len != s.length) break;  // the file ends inside this segment
    }
    return got;
  }

  // Copy mode: the tensor's bytes read with pread into a fresh buffer (never
  // through the mapping, so nothing is mapped in), then dropped from the
  // page cache when asked to.
  Result<std::shared_ptr<uint8_t>> ReadCopy(const gguf::TensorInfo& t, std::span<const uint8_t> raw) {
    const uint64_t off = static_cast<uint64_t>(raw.data() - shard->mapping()->data());
    std::shared_ptr<uint8_t> buf = CopyBuffer(raw.size());
    uint64_t read = 0;
    K3_ASSIGN_OR_RETURN(size_t got, ReadSkippingHoles(fd_for_fadvise, buf.get(), raw.size(), off, &read));
    if (got != raw.size()) {
      return Missing(*shard_record)
          .WithHint("the file ended after " + std::to_string(off + got) + " bytes while reading " + t.name);
    }
    if (opts.drop_page_cache && !raw.empty()) {
      ::posix_fadvise(fd_for_fadvise, static_cast<off_t>(off), static_cast<off_t>(raw.size()), POSIX_FADV_DONTNEED);
    }
    stats.copied_bytes += read;  // the summary's "read with pread": holes were zero-filled, not read
    return buf;
  }

  // A target's own copy of the source bytes: the buffer just read for the
  // first target that takes it, a duplicate for any further one.
  std::shared_ptr<uint8_t> TakeCopy(std::shared_ptr<uint8_t>& read, bool& taken, size_t n) {
    if (!taken) {
      taken = true;
      return read;
    }
    std::shared_ptr<uint8_t> dup = CopyBuffer(n);
    std::memcpy(dup.get(), read.get(), n);
    return dup;
  }

  // Read-ahead sized to tensors: asks the kernel for the next non-routed
  // tensors' bytes, up to kReadAheadBytes past the one being handed out, so
  // the storage works while the caller consumes this one (routed stacks are
  // skipped: never read). Each range is advised once.
  static constexpr uint64_t kReadAheadBytes = uint64_t{64} << 20;
  void AdviseAhead() {
    uint64_t window = 0;
    const auto& all = shard->tensors();
    for (size_t i = next_tensor; i < all.size() && window < kReadAheadBytes; ++i) {
      const gguf::TensorInfo& t = all[i];
      if (kimi::IsRoutedExpertAggregate(t.name)) continue;
      window += t.nbytes;
      if (i < advised_upto) continue;
      advised_upto = i + 1;
      const std::span<const uint8_t> raw = shard->TensorData(t);
      if (opts.copy) {
        const auto off = static_cast<off_t>(raw.data() - shard->mapping()->data());
        ::posix_fadvise(fd_for_fadvise, off, static_cast<off_t>(raw.size()), POSIX_FADV_WILLNEED);
      } else {
        Advise(raw.data(), raw.size(), MADV_WILLNEED);
      }
    }
  }

  // One GGUF tensor -> its checks and 0..4 pending outputs (or an error
  // after the outputs SGLang would have yielded first).
  Status Process(const gguf::TensorInfo& t) {
    stats.source_tensors++;
    const StreamTensorRecord& rec = *records.at(t.name);
    if (GgmlTypeName(t.type) != rec.dtype) return Error("Kimi-K3 GGUF tensor type changed: " + t.name);
    if (kimi::IsRoutedExpertAggregate(t.name)) {
      stats.routed_skipped++;
      stats.routed_skipped_bytes += t.nbytes;
      return Status::OK();
    }
    K3_ASSIGN_OR_RETURN(kimi::Mapping mapping, kimi::MapTensorName(t.name));
    if (!opts.copy) K3_RETURN_IF_ERROR(CheckNotTruncated(t));
    const bool quantized = kimi::IsSglangQuantized(t.type);
    const ViewType view = GgufPyView(t, opts.sglang_compat);
    std::span<const uint8_t> raw = shard->TensorData(t);
    const std::shared_ptr<const void> map_owner = shard->mapping();
    std::shared_ptr<uint8_t> copied;  // copy mode: the bytes read once for every target
    bool copy_taken = false;
    if (opts.prefetch) AdviseAhead();  // the next tensors, while this one is read and consumed
    if (opts.copy) {
      K3_ASSIGN_OR_RETURN(copied, ReadCopy(t, raw));
      raw = {copied.get(), raw.size()};  // transforms read the copy, not the map
    } else if (opts.populate) {
#ifdef MADV_POPULATE_READ
      auto [b, e] = PageRange(raw.data(), raw.size());
      if (raw.empty() || ::madvise(reinterpret_cast<void*>(b), e - b, MADV_POPULATE_READ) != 0)
#endif
        Advise(raw.data(), raw.size(), MADV_WILLNEED);
    } else if (opts.prefetch) {
      Advise(raw.data(), raw.size(), MADV_WILLNEED);
    }
    // A target that hands the stored bytes out: a map view, or its own copy.
    auto hand_out = [&](NamedTensor& out) {
      if (opts.copy) {
        std::shared_ptr<uint8_t> own = TakeCopy(copied, copy_taken, raw.size());
        out.data = {own.get(), raw.size()};
        out.owner = std::move(own);
        out.writable = true;
      } else {
        out.data = raw;
        out.owner = map_owner;
        out.zero_copy = true;
      }
    };

    for (size_t ti = 0; ti < mapping.targets.size(); ++ti) {
      const kimi::Target& target = mapping.targets[ti];
      NamedTensor out;
      out.source_name = t.name;
      out.source_type = t.type;
      out.shard_index = shard_record->index;
      out.dtype = view.dtype;
      out.shape = view.shape;
      switch (target.transform) {
        case kimi::TargetTransform::kALog: {
          auto a_log = ALogFromSsmA(view.dtype, raw);
          if (!a_log.ok()) {
            // SGLang's text names neither the tensor nor the file; the hint does.
            return a_log.error().WithHint("tensor " + t.name + " in " + shard_record->path +
                                          "; `k3pack doctor` says what its values look like and whether "
                                          "`k3pack repair --fix ssm-a` can rewrite them");
          }
          std::vector<uint8_t> values = std::move(*a_log);
          K3_RETURN_IF_ERROR(CheckSsmAShape(t, view.shape));
          auto buf = std::make_shared<std::vector<uint8_t>>(std::move(values));
          out.data = {buf->data(), buf->size()};
          out.owner = buf;
          out.writable = opts.copy;
          out.kind = TensorKind::kALog;
          break;
        }
        case kimi::TargetTransform::kResidualProjection:
        case kimi::TargetTransform::kResidualNorm: {
          if (view.shape.size() != 1) {
            return Error("Kimi-K3 attention-residual score must be a vector, got " + PyTupleRepr(view.shape));
          }
          if (target.transform == kimi::TargetTransform::kResidualProjection) {
            out.shape.insert(out.shape.begin(), 1);  // raw.unsqueeze(0): a view
            hand_out(out);
            out.kind = TensorKind::kResidualProjection;
          } else {
            auto buf = std::make_shared<std::vector<uint8_t>>(OnesLike(view.dtype, static_cast<size_t>(view.shape[0])));
            out.data = {buf->data(), buf->size()};
            out.owner = buf;
            out.writable = opts.copy;
            out.kind = TensorKind::kResidualNorm;
          }
          break;
        }
        case kimi::TargetTransform::kNone:
          hand_out(out);
          out.kind = quantized ? TensorKind::kQweight : TensorKind::kPlain;
          break;
      }
      out.name = kimi::RuntimeName(target.name, quantized);
      // SGLang checks the runtime name before its qweight_type companion:
      // a repeated quantized target is named by its qweight.
      if (seen.count(out.name)) return Error("duplicate Kimi-K3 target parameter: " + out.name);
      if (quantized) {
        NamedTensor type_scalar;
        type_scalar.name = kimi::QweightTypeName(out.name);
        type_scalar.source_name = t.name;
        type_scalar.source_type = t.type;
        type_scalar.shard_index = shard_record->index;
        type_scalar.kind = TensorKind::kQweightType;
        type_scalar.dtype = DType::kUint8;
        // A byte of its own in every mode: torch ignores numpy's read-only
        // flag, and a zero-copy scalar used to point into a static const
        // table, where an in-place write (t.fill_(0)) was a SIGSEGV.
        auto one = std::make_shared<std::vector<uint8_t>>(1, static_cast<uint8_t>(static_cast<uint32_t>(t.type) & 0xff));
        type_scalar.data = {one->data(), 1};
        type_scalar.owner = std::move(one);
        type_scalar.writable = opts.copy;  // like every copied tensor
        K3_RETURN_IF_ERROR(Emit(std::move(type_scalar)));
      }
      K3_RETURN_IF_ERROR(Emit(std::move(out)));
    }
    return Status::OK();
  }

  Result<std::optional<NamedTensor>> Next() {
    if (failed) return *failed;
    ReleaseLast();
    for (;;) {
      if (!pending.empty()) {
        NamedTensor t = std::move(pending.front());
        pending.pop_front();
        stats.emitted++;
        if (t.zero_copy) {
          stats.zero_copy_tensors++;
          stats.zero_copy_bytes += t.data.size();
          if (t.data.data() != last_ptr) {
            last_ptr = t.data.data();
            last_len = t.data.size();
          }
        } else {
          stats.computed_bytes += t.data.size();
        }
        return std::optional<NamedTensor>(std::move(t));
      }
      if (pending_error) {
        failed = std::move(pending_error);
        pending_error.reset();
        CloseShard();  // a failed stream holds neither the shard's mapping nor its descriptor
        return *failed;
      }
      if (shard && next_tensor < shard->tensors().size()) {
        Status s = Process(shard->tensors()[next_tensor++]);
        if (!s.ok()) pending_error = s.error();
        continue;
      }
      if (next_shard == 0 && opts.verify_metadata && !source_verified) {
        source_verified = true;
        interrupted = false;
        Status s = VerifySource();
        if (!s.ok() && interrupted) {
          source_verified = false;  // not an answer about the files: the next call hashes again
          return s.error();
        }
        if (!s.ok()) {
          failed = s.error();
          return *failed;
        }
      }
      if (next_shard < manifest.shards.size()) {
        Status s = OpenShard(manifest.shards[next_shard++]);
        if (!s.ok()) {
          failed = s.error();
          CloseShard();
          return *failed;
        }
        continue;
      }
      CloseShard();
      return std::optional<NamedTensor>();
    }
  }
};

NonExpertStream::NonExpertStream(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
NonExpertStream::NonExpertStream(NonExpertStream&&) noexcept = default;
NonExpertStream& NonExpertStream::operator=(NonExpertStream&&) noexcept = default;
NonExpertStream::~NonExpertStream() = default;

Result<NonExpertStream> NonExpertStream::Open(const std::string& manifest_path, const LoadOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->opts = options;
  impl->manifest_path = manifest_path;
  K3_ASSIGN_OR_RETURN(nlohmann::json doc, ReadJsonFile(manifest_path));
  auto parsed = ParseStreamManifest(doc);
  if (!parsed.ok()) {
    const std::string why = manifest::WhyNotAFinishedManifest(doc, manifest_path);
    return why.empty() ? parsed.error() : parsed.error().WithHint(why);
  }
  impl->manifest = std::move(*parsed);
  if (options.verify_metadata) impl->source_json = doc["source"];
  impl->stats.shards_total = static_cast<uint32_t>(impl->manifest.shards.size());
  return NonExpertStream(std::move(impl));
}

// A moved-from stream has no Impl: it answers with an error and empty
// values instead of dereferencing null.
Result<std::optional<NamedTensor>> NonExpertStream::Next() {
  if (!impl_)
    return Error("this NonExpertStream was moved from; use the stream it was moved into", ErrorKind::kRuntime);
  return impl_->Next();
}

Status NonExpertStream::ForEach(const std::function<Status(NamedTensor&&)>& fn) {
  for (;;) {
    K3_ASSIGN_OR_RETURN(std::optional<NamedTensor> t, Next());
    if (!t) return Status::OK();
    K3_RETURN_IF_ERROR(fn(std::move(*t)));
  }
}

const LoadStats& NonExpertStream::stats() const {
  static const LoadStats kNone;
  return impl_ ? impl_->stats : kNone;
}
const std::string& NonExpertStream::manifest_path() const {
  static const std::string kNone;
  return impl_ ? impl_->manifest_path : kNone;
}

}  // namespace k3pack::loader
