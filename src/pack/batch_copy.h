// One work unit of the pack builder's copy phase: n consecutive experts of
// one layer, all three roles, staged in the pack's byte order and written
// with one large write, while a pool of hash threads takes the payloads'
// SHA-256 and CRC32C.
//
// Why staged: the objects interleave the roles (up, gate, down of expert e,
// then of e + 1), so writing each role's slices where they belong is 3n
// scattered writes per batch. Gathered into one buffer in pack order (a
// memcpy, which the page-cache write it replaces also was), the batch is one
// contiguous, block-aligned range: one write, which can bypass the page
// cache (O_DIRECT) and so needs neither the copy into cache pages nor their
// writeback and eviction, CPU the hashing needs on a small machine.
// Through the page cache (no O_DIRECT on the pack's filesystem, or
// K3PACK_DIRECT_WRITE=0) the batch is not staged: the kernel copies the
// bytes anyway, so each slice is written from the read buffer.
// Why a hash pool: the hashing of role r runs while role r + 1 is read and
// while the batch is written, instead of after them.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <vector>

#include "k3pack/pack.h"
#include "pack/copy.h"
#include "pack/format.h"
#include "util/task_pool.h"

namespace k3pack::pack {

// What every batch reads from and writes to (shared, read-only).
struct BatchIo {
  const ExpertSet* ex = nullptr;
  const PackLayout* layout = nullptr;
  std::vector<int> src;          // shard fds
  std::vector<int> direct_src;   // the same shards opened with O_DIRECT, or -1
  std::vector<uint64_t> src_size;
  const OutputFile* out = nullptr;  // the partial pack
};

// A worker's buffers. Staged (the pack written with O_DIRECT): reads[0]
// holds one role's slices of a batch (plus kDirectSlack), `stage` the
// batch's objects in pack order. Unstaged (the pack written through the page
// cache, which is a copy already; a gather would be a second one): one read
// buffer per role, the slices written from there, no stage.
struct BatchBuffers {
  static Result<BatchBuffers> Allocate(uint64_t read_bytes, uint64_t stage_bytes, bool staged);
  std::vector<std::unique_ptr<IoBuffer>> reads;
  std::unique_ptr<IoBuffer> stage;  // null when unstaged
};

// The pack bytes [lo, hi) objects (li, e0 .. e0+n-1) span, hi rounded up to
// a block (never past the file's end).
struct BatchSpan {
  uint64_t lo = 0, hi = 0;
};
BatchSpan SpanOf(const PackLayout& layout, uint32_t li, uint32_t e0, uint32_t n);

// Copies objects (active layer li, experts e0 .. e0+n-1): stores the SHA-256
// and CRC32C of entry (obj0 * 3 + k) in digests[k] and crcs[k], for
// k < 3n. Source holes stay holes: staged, only the blocks that hold source
// data are written (the zero fill between payloads and any hole bytes
// sharing a block with data are written as zeros, as a partial-block write
// would leave them), and the budget of io.out is charged the payload bytes
// only; unstaged, only the data bytes are written.
Status CopyBatch(const BatchIo& io, uint32_t li, uint32_t e0, uint32_t n, BatchBuffers& buf, TaskPool* pool,
                 std::array<uint8_t, 32>* digests, uint32_t* crcs, CopyStats* stats);

}  // namespace k3pack::pack
