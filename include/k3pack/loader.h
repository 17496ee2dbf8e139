// Streaming loader for Kimi-K3's non-routed weights: reads an adapter
// manifest, checks every GGUF shard against it, and yields (name, tensor)
// pairs in exactly the order and form SGLang's
// kimi_k3_nonexpert_weights_iterator yields them -- without reading the
// routed-expert payloads, and without copying tensors it does not change.
//
// Unchanged tensors are views into the shard's memory map (`owner` keeps the
// map alive, so a view may outlive the stream). Transformed tensors (A_log,
// the residual projection/norm pair's norm, type scalars) live in small
// fresh buffers owned the same way.
//
// Where SGLang is wrong, k3pack differs on purpose (see docs/loader.md):
// BF16 tensors come out as bfloat16 values instead of raw bytes, and an ssm_a
// whose shape the model cannot take is rejected. LoadOptions::sglang_compat
// restores SGLang's behaviour for both.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "k3pack/error.h"
#include "k3pack/ggml_types.h"
#include "k3pack/names.h"

namespace k3pack::loader {

// Element types of emitted tensors (numpy/torch names via DTypeName).
enum class DType : uint8_t { kUint8, kInt8, kInt16, kInt32, kInt64, kFloat16, kBFloat16, kFloat32, kFloat64 };
const char* DTypeName(DType d);  // "uint8", "int8", ..., "float16", "bfloat16", "float32", "float64"
size_t DTypeSize(DType d);       // bytes per element
// numpy's array-protocol typestr ("|u1", "<f2", "<f4", ...); bfloat16 has
// none in numpy, so it is "<u2" (the raw bits).
const char* DTypeNumpyStr(DType d);

// Why an emitted tensor exists (what produced its bytes).
enum class TensorKind : uint8_t {
  kPlain,               // the GGUF tensor as stored (F32/F16/BF16 values)
  kQweightType,         // 0-D uint8 holding the ggml type id
  kQweight,             // quantized block bytes, uint8
  kALog,                // log(-ssm_a), computed
  kResidualProjection,  // residual score viewed as [1, d]
  kResidualNorm,        // ones(d), computed
};
const char* TensorKindName(TensorKind k);

struct NamedTensor {
  std::string name;         // SGLang runtime parameter name
  std::string source_name;  // GGUF tensor it came from
  TensorKind kind = TensorKind::kPlain;
  DType dtype = DType::kUint8;
  // numpy (row-major) order: last axis fastest. gguf-py's view shape:
  // reversed ne for element types; for block types (and compat BF16)
  // reversed ne with ne[0] replaced by the row's byte count.
  std::vector<int64_t> shape;
  std::span<const uint8_t> data;  // little-endian element bytes, C-contiguous
  // Keeps `data` alive: the shard mapping (zero-copy) or a fresh buffer
  // (computed tensors, the type-id scalars, copy mode). Never null.
  std::shared_ptr<const void> owner;
  bool zero_copy = false;  // data points into the shard's memory map
  // data is a fresh buffer that only this tensor owns (LoadOptions::copy):
  // the caller may write into it.
  bool writable = false;
  GgmlType source_type = GgmlType::F32;
  uint32_t shard_index = 0;  // manifest shard index

  int64_t numel() const;
};

struct LoadOptions {
  // Before the first tensor, also compare the manifest's whole `source`
  // section with the shards, as `k3pack verify` does: each shard's size,
  // metadata_sha256 (a same-size shard whose header changed, which SGLang
  // misses; spec §11.18) and whole-file sha256 where recorded, every tensor
  // record (shape, dtype, data_offset, nbytes), and inventory_sha256
  // recomputed as the manifest writer computes it.
  bool verify_metadata = false;
  // Reproduce SGLang exactly where k3pack deliberately differs: BF16 as raw
  // uint8 bytes (last axis doubled), no ssm_a shape check.
  bool sglang_compat = false;
  // madvise(MADV_DONTNEED) a tensor's pages once the caller asks for the
  // next one, so resident memory stays at about one tensor. Views stay valid
  // (file-backed pages fault back in on access).
  bool release_pages = true;
  // Map shards copy-on-write (private, writable) instead of read-only, so a
  // write into a zero-copy view changes a private page instead of killing
  // the process with SIGSEGV; the file never changes. For views handed to
  // torch, which has no read-only tensors. A written page is private to the
  // view and, with release_pages, dropped (back to the file's bytes) once
  // the stream moves past its tensor: copy what you mean to keep.
  bool copy_on_write = false;
  // Also drop the source range from the page cache (POSIX_FADV_DONTNEED)
  // after use: keeps a one-shot load from evicting other data.
  bool drop_page_cache = false;
  // madvise(MADV_WILLNEED) each tensor's range as it is reached, and the
  // next non-routed tensors' ranges up to 64 MiB ahead (posix_fadvise
  // WILLNEED in copy mode), so the kernel reads them while the caller
  // consumes this one. Routed stacks are never advised.
  bool prefetch = true;
  // Instead of MADV_WILLNEED, map each tensor's pages in with one
  // MADV_POPULATE_READ call as it is reached (Linux >= 5.14; WILLNEED where
  // the kernel lacks it): one system call instead of one page fault per 4 KiB
  // when the consumer reads every byte. The pages are released as above.
  bool populate = false;
  // Hand out every tensor in a fresh buffer of its own, as SGLang's
  // torch.tensor() copies do, read with pread() (POSIX_FADV_SEQUENTIAL)
  // instead of through the mapping: no page of tensor data is mapped into
  // the process, so a consumer that copies every tensor peaks at about the
  // tensors it holds itself (the one it has plus the one being produced).
  // The stream keeps no reference to a buffer once it is handed out.
  bool copy = false;
  // Called when a shard has been checked and streaming into it begins.
  std::function<void(uint32_t shard_index, const std::string& path, uint32_t shard_count)> on_shard;
  // Polled between 8 MiB chunks of verify_metadata's whole-shard hashing
  // (minutes for a full checkpoint), so a caller can answer Ctrl-C or a
  // close() from another thread. An error stops the hashing and is Next()'s
  // answer; the stream stays usable, and the next Next() hashes again.
  std::function<Status()> interrupt_check;
};

struct LoadStats {
  uint32_t shards_total = 0;
  uint32_t shards_opened = 0;
  uint64_t source_tensors = 0;       // GGUF tensors visited (all checked)
  uint64_t routed_skipped = 0;       // routed aggregates skipped
  uint64_t routed_skipped_bytes = 0;
  uint64_t emitted = 0;              // NamedTensors returned
  uint64_t zero_copy_tensors = 0;
  uint64_t zero_copy_bytes = 0;      // bytes handed out as map views
  uint64_t computed_bytes = 0;       // bytes in fresh buffers
  uint64_t copied_bytes = 0;         // read from the shards with pread (copy mode; holes are zero-filled, not read)
};

class NonExpertStream {
 public:
  // Reads and checks the manifest (format, complete, records). Shards are
  // opened lazily, one at a time, by Next().
  static Result<NonExpertStream> Open(const std::string& manifest_path, const LoadOptions& options = {});

  // A moved-from stream stays safe to call: Next() and ForEach() return an
  // error (kRuntime), stats() zeros and manifest_path() "".
  NonExpertStream(NonExpertStream&&) noexcept;
  NonExpertStream& operator=(NonExpertStream&&) noexcept;
  ~NonExpertStream();

  // The next tensor, nullopt at the end. Errors carry SGLang's text and
  // exception kind; after an error every further call returns it again.
  // Not thread-safe: one thread at a time per stream (tensors handed out
  // may be used from any thread).
  Result<std::optional<NamedTensor>> Next();

  // Streams everything into `fn`; stops at the first error (the stream's or
  // the callback's).
  Status ForEach(const std::function<Status(NamedTensor&&)>& fn);

  const LoadStats& stats() const;
  const std::string& manifest_path() const;

 private:
  struct Impl;
  explicit NonExpertStream(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The ssm_a -> A_log transform on its own (tests, doctor): log(-x) of every
// element of `values` (dtype F32/F16/BF16 bits), rounded back to the same
// dtype. SGLang's errors for non-finite or non-negative input.
Result<std::vector<uint8_t>> ALogFromSsmA(DType dtype, std::span<const uint8_t> values);

// Drops the resident pages that lie wholly inside `view` (madvise
// MADV_DONTNEED, rounded inward). For callers that consume a big zero-copy
// view piece by piece: a view into a shard's mapping stays valid (its pages
// fault back in with the file's bytes). Any other memory (a copy-mode or
// computed tensor's buffer, the caller's own) loses its contents: its whole
// pages read back as zeros. ReleasePages(tensor) makes that check.
void ReleasePages(std::span<const uint8_t> view);
// ReleasePages(tensor.data) for a zero-copy tensor; nothing for any other
// (its bytes live only in its buffer).
void ReleasePages(const NamedTensor& tensor);

// Python's repr of a shape tuple: "()", "(512,)", "(1, 512)".
std::string PyTupleRepr(const std::vector<int64_t>& shape);

}  // namespace k3pack::loader
