// NonExpertStream: SGLang's kimi_k3_nonexpert_weights_iterator as a pull
// stream over memory-mapped shards (spec §5.3).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <sys/stat.h>

#include <array>
#include <deque>
#include <unordered_map>
#include <unordered_set>

#include "k3pack/gguf.h"
#include "k3pack/loader.h"
#include "k3pack/names.h"
#include "loader/manifest_view.h"
#include "loader/values.h"
#include "util/file.h"
#include "util/sha256.h"

namespace k3pack::loader {

namespace {

// Static storage for the 0-D type-id scalars (no allocation per tensor).
const std::array<uint8_t, 256>& TypeIdBytes() {
  static const std::array<uint8_t, 256> bytes = [] {
    std::array<uint8_t, 256> b{};
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(i);
    return b;
  }();
  return bytes;
}

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

void Advise(const uint8_t* p, size_t n, int advice) {
  if (n == 0) return;
  auto [b, e] = PageRange(p, n);
  ::madvise(reinterpret_cast<void*>(b), e - b, advice);  // best effort
}

}  // namespace

void ReleasePages(std::span<const uint8_t> view) {
  // Inward rounding: never drops a page that also holds bytes outside `view`.
  const uintptr_t mask = PageSize() - 1;
  const auto b = (reinterpret_cast<uintptr_t>(view.data()) + mask) & ~mask;
  const auto e = (reinterpret_cast<uintptr_t>(view.data()) + view.size()) & ~mask;
  if (e > b) ::madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);
}

struct NonExpertStream::Impl {
  LoadOptions opts;
  std::string manifest_path;
  StreamManifest manifest;
  LoadStats stats;

  size_t next_shard = 0;
  std::shared_ptr<const gguf::GgufFile> shard;  // current shard
  const StreamShardRecord* shard_record = nullptr;
  std::unordered_map<std::string_view, const StreamTensorRecord*> records;  // current shard's
  size_t next_tensor = 0;
  int fd_for_fadvise = -1;

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
    const Error missing("Kimi-K3 GGUF shard is missing or changed: " + rec.path, ErrorKind::kFileNotFound, ENOENT);
    struct stat st;
    if (::stat(rec.path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != rec.size) {
      return missing;
    }
    gguf::ReadOptions ro;
    ro.require_packed_offsets = false;  // gguf-py reads any in-bounds offsets
    K3_ASSIGN_OR_RETURN(auto map, MappedFile::Open(rec.path, opts.copy_on_write));
    K3_ASSIGN_OR_RETURN(shard, gguf::GgufFile::Parse(std::move(map), ro));
    shard_record = &rec;
    if (opts.verify_metadata) K3_RETURN_IF_ERROR(VerifyMetadata(rec));

    static const std::vector<StreamTensorRecord> kNone;
    auto it = manifest.tensors_by_shard.find(rec.index);
    const auto& recs = it == manifest.tensors_by_shard.end() ? kNone : it->second;
    for (const auto& r : recs) records.emplace(r.name, &r);  // later duplicates collapse, like a dict
    bool same = records.size() == shard->tensors().size();
    for (const auto& t : shard->tensors()) {
      if (!same) break;
      same = records.count(t.name) != 0;
    }
    if (!same) return Error("Kimi-K3 GGUF shard inventory changed: " + rec.path);

    if (!head_count) {
      if (const gguf::Value* v = shard->Find("kimi-k3.attention.head_count")) {
        if (auto h = v->AsInt(); h && *h > 0) head_count = *h;
      }
    }
    if (opts.drop_page_cache) {
      int fd = ::open(rec.path.c_str(), O_RDONLY | O_CLOEXEC);
      fd_for_fadvise = fd;
    }
    next_tensor = 0;
    stats.shards_opened++;
    if (opts.on_shard) opts.on_shard(rec.index, rec.path, static_cast<uint32_t>(manifest.shards.size()));
    return Status::OK();
  }

  Status VerifyMetadata(const StreamShardRecord& rec) {
    const Error changed("Kimi-K3 GGUF shard is missing or changed: " + rec.path, ErrorKind::kFileNotFound, ENOENT);
    if (rec.metadata_nbytes && *rec.metadata_nbytes != shard->data_offset()) {
      return changed.WithHint("metadata_nbytes is " + std::to_string(shard->data_offset()) + ", the manifest recorded " +
                              std::to_string(*rec.metadata_nbytes) + " (the header changed; rebuild the manifest)");
    }
    if (!rec.metadata_sha256) {
      return Error("manifest shard " + std::to_string(rec.index) + " has no metadata_sha256 to verify: " + rec.path);
    }
    const auto header = shard->mapping()->bytes().first(static_cast<size_t>(shard->data_offset()));
    const std::string digest = Sha256Hex(header.data(), header.size());
    if (digest != *rec.metadata_sha256) {
      return changed.WithHint("metadata_sha256 of bytes [0, " + std::to_string(shard->data_offset()) + ") is " + digest +
                              ", the manifest recorded " + *rec.metadata_sha256 +
                              " (same size, different header; rebuild the manifest)");
    }
    // Same size and header but changed tensor bytes: only a whole-file digest
    // sees that, and the manifest has one only with --full-source-hashes.
    if (rec.sha256) {
      const auto all = shard->mapping()->bytes();
      const std::string whole = Sha256Hex(all.data(), all.size());
      if (whole != *rec.sha256) {
        return changed.WithHint("sha256 of the whole file is " + whole + ", the manifest recorded " + *rec.sha256 +
                                " (same size and header, different tensor bytes; rebuild the manifest)");
      }
    }
    return Status::OK();
  }

  Status VerifyLayout(const gguf::TensorInfo& t, const StreamTensorRecord& r) {
    const bool shape_ok = !r.shape || *r.shape == t.shape();
    const bool off_ok = !r.data_offset || *r.data_offset == t.data_offset;
    const bool len_ok = !r.nbytes || *r.nbytes == t.nbytes;
    if (shape_ok && off_ok && len_ok) return Status::OK();
    return Error("Kimi-K3 GGUF tensor layout changed: " + t.name)
        .WithHint("the manifest records a different " +
                  std::string(!shape_ok ? "shape" : !off_ok ? "data_offset" : "nbytes") + " for this tensor in " +
                  shard_record->path + "; rebuild the manifest");
  }

  Status Emit(NamedTensor t) {
    if (!seen.insert(t.name).second) return Error("duplicate Kimi-K3 target parameter: " + t.name);
    pending.push_back(std::move(t));
    return Status::OK();
  }

  Status CheckSsmAShape(const gguf::TensorInfo& t, const std::vector<int64_t>& shape) {
    if (opts.sglang_compat) return Status::OK();
    int64_t h = -1;
    if (shape.size() == 1) h = shape[0];
    if (shape.size() == 4 && shape[0] == 1 && shape[1] == 1 && shape[3] == 1) h = shape[2];
    if (h > 0 && (!head_count || h == *head_count)) return Status::OK();
    std::string expect = "(H,) or (1, 1, H, 1), i.e. GGUF ne {H} or {1, H, 1, 1}";
    if (head_count) expect += ", with H = kimi-k3.attention.head_count = " + std::to_string(*head_count);
    return Error("Kimi-K3 GGUF ssm_a must have shape " + expect + ", got " + PyTupleRepr(shape) + ": " + t.name)
        .WithHint("SGLang's A_log loader takes only these shapes; the converter writes ne {H}");
  }

  // One GGUF tensor -> its checks and 0..4 pending outputs (or an error
  // after the outputs SGLang would have yielded first).
  Status Process(const gguf::TensorInfo& t) {
    stats.source_tensors++;
    const StreamTensorRecord& rec = *records.at(t.name);
    if (GgmlTypeName(t.type) != rec.dtype) return Error("Kimi-K3 GGUF tensor type changed: " + t.name);
    if (opts.verify_metadata) K3_RETURN_IF_ERROR(VerifyLayout(t, rec));
    if (kimi::IsRoutedExpertAggregate(t.name)) {
      stats.routed_skipped++;
      stats.routed_skipped_bytes += t.nbytes;
      return Status::OK();
    }
    K3_ASSIGN_OR_RETURN(kimi::Mapping mapping, kimi::MapTensorName(t.name));
    const bool quantized = kimi::IsSglangQuantized(t.type);
    const ViewType view = GgufPyView(t, opts.sglang_compat);
    const std::span<const uint8_t> raw = shard->TensorData(t);
    const std::shared_ptr<const void> map_owner = shard->mapping();
    if (opts.prefetch) Advise(raw.data(), raw.size(), MADV_WILLNEED);

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
          K3_ASSIGN_OR_RETURN(auto values, ALogFromSsmA(view.dtype, raw));
          K3_RETURN_IF_ERROR(CheckSsmAShape(t, view.shape));
          auto buf = std::make_shared<std::vector<uint8_t>>(std::move(values));
          out.data = {buf->data(), buf->size()};
          out.owner = buf;
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
            out.data = raw;
            out.owner = map_owner;
            out.zero_copy = true;
            out.kind = TensorKind::kResidualProjection;
          } else {
            auto buf = std::make_shared<std::vector<uint8_t>>(OnesLike(view.dtype, static_cast<size_t>(view.shape[0])));
            out.data = {buf->data(), buf->size()};
            out.owner = buf;
            out.kind = TensorKind::kResidualNorm;
          }
          break;
        }
        case kimi::TargetTransform::kNone:
          out.data = raw;
          out.owner = map_owner;
          out.zero_copy = true;
          out.kind = quantized ? TensorKind::kQweight : TensorKind::kPlain;
          break;
      }
      out.name = kimi::RuntimeName(target.name, quantized);
      if (quantized) {
        NamedTensor type_scalar;
        type_scalar.name = kimi::QweightTypeName(out.name);
        type_scalar.source_name = t.name;
        type_scalar.source_type = t.type;
        type_scalar.shard_index = shard_record->index;
        type_scalar.kind = TensorKind::kQweightType;
        type_scalar.dtype = DType::kUint8;
        type_scalar.data = {&TypeIdBytes()[static_cast<uint32_t>(t.type) & 0xff], 1};
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
        return *failed;
      }
      if (shard && next_tensor < shard->tensors().size()) {
        Status s = Process(shard->tensors()[next_tensor++]);
        if (!s.ok()) pending_error = s.error();
        continue;
      }
      if (next_shard < manifest.shards.size()) {
        Status s = OpenShard(manifest.shards[next_shard++]);
        if (!s.ok()) {
          failed = s.error();
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
  K3_ASSIGN_OR_RETURN(impl->manifest, ParseStreamManifest(doc));
  impl->stats.shards_total = static_cast<uint32_t>(impl->manifest.shards.size());
  return NonExpertStream(std::move(impl));
}

Result<std::optional<NamedTensor>> NonExpertStream::Next() { return impl_->Next(); }

Status NonExpertStream::ForEach(const std::function<Status(NamedTensor&&)>& fn) {
  for (;;) {
    K3_ASSIGN_OR_RETURN(std::optional<NamedTensor> t, Next());
    if (!t) return Status::OK();
    K3_RETURN_IF_ERROR(fn(std::move(*t)));
  }
}

const LoadStats& NonExpertStream::stats() const { return impl_->stats; }
const std::string& NonExpertStream::manifest_path() const { return impl_->manifest_path; }

}  // namespace k3pack::loader
