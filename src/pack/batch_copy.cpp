#include "pack/batch_copy.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <cstring>
#include <string>

namespace k3pack::pack {
namespace {

uint64_t AlignDown(uint64_t x) { return x & ~(kDirectAlign - 1); }
uint64_t AlignUp(uint64_t x) { return AlignDown(x + kDirectAlign - 1); }

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A pack range [a, z) to write, and the payload bytes in it (the budget's charge).
struct Run {
  uint64_t a = 0, z = 0, data = 0;
};

}  // namespace

Result<BatchBuffers> BatchBuffers::Allocate(uint64_t read_bytes, uint64_t stage_bytes, bool staged) {
  BatchBuffers out;
  for (uint32_t r = 0; r < (staged ? 1 : kRoleCount); ++r) {
    K3_ASSIGN_OR_RETURN(IoBuffer read, IoBuffer::Allocate(read_bytes + kDirectSlack));
    out.reads.push_back(std::make_unique<IoBuffer>(std::move(read)));
  }
  if (staged) {
    K3_ASSIGN_OR_RETURN(IoBuffer stage, IoBuffer::Allocate(stage_bytes));
    out.stage = std::make_unique<IoBuffer>(std::move(stage));
  }
  return out;
}

BatchSpan SpanOf(const PackLayout& layout, uint32_t li, uint32_t e0, uint32_t n) {
  const uint64_t lo = layout.ObjectOffset(li, e0);
  const uint64_t end = layout.ObjectOffset(li, e0 + n - 1) + layout.ObjectBytes(li);
  return {lo, std::min(AlignUp(end), layout.final_size())};
}

Status CopyBatch(const BatchIo& io, uint32_t li, uint32_t e0, uint32_t n, BatchBuffers& buf, TaskPool* pool,
                 std::array<uint8_t, 32>* digests, uint32_t* crcs, CopyStats* stats) {
  const PackLayout& layout = *io.layout;
  const BatchSpan span = SpanOf(layout, li, e0, n);
  const bool staged = buf.stage != nullptr;
  if (staged && span.hi - span.lo > buf.stage->size()) {
    return Error("CopyBatch: stage buffer too small", ErrorKind::kRuntime);
  }
  uint8_t* stage = staged ? buf.stage->data() : nullptr;
  std::vector<Run> runs;
  std::array<double, kRoleCount> hash_s{};
  std::vector<std::future<void>> pending;
  // Every way out waits for the hash jobs: they read the buffers and write
  // the caller's records.
  struct WaitAll {
    std::vector<std::future<void>>& jobs;
    ~WaitAll() {
      for (auto& j : jobs) {
        if (j.valid()) j.wait();
      }
    }
  } wait_all{pending};

  // The zero fill between payloads (and after the last, up to the block end).
  for (uint32_t i = 0; staged && i < n; ++i) {
    for (size_t k = 0; k < kRoleOrder.size(); ++k) {
      const EntrySlot s = layout.Slot(li, e0 + i, kRoleOrder[k]);
      const uint64_t next = k + 1 < kRoleOrder.size() ? layout.Slot(li, e0 + i, kRoleOrder[k + 1]).offset
                            : i + 1 < n              ? layout.ObjectOffset(li, e0 + i + 1)
                                                     : span.hi;
      if (next > s.offset + s.nbytes) std::memset(stage + (s.offset + s.nbytes - span.lo), 0, next - s.offset - s.nbytes);
    }
  }

  for (Role r : kRoleOrder) {
    const auto ri = static_cast<uint32_t>(r);
    const ExpertTensor& t = io.ex->by_layer[li][ri];
    const uint32_t shard = t.tensor.shard_index;
    const uint64_t slice = t.expert_bytes;
    const uint64_t src_off = t.tensor.data_offset + static_cast<uint64_t>(e0) * slice;
    auto in = ReadSource(io.src[shard], io.src_size[shard], src_off, slice * n, *buf.reads[staged ? 0 : ri], stats,
                         io.direct_src[shard]);
    if (!in.ok()) {
      return in.error().WithContext(t.shard_path + ": " + t.tensor.name + " experts " + std::to_string(e0) + ".." +
                                    std::to_string(e0 + n - 1));
    }
    // Staged: gather the slices into pack order and note where their data
    // goes. Unstaged: write each slice's data where it belongs.
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<uint8_t> has_data(n, 0);
    std::vector<const uint8_t*> bytes(n, nullptr);  // slice i's bytes, for the hash
    size_t seg = 0;
    for (uint32_t i = 0; in->bytes && i < n; ++i) {  // all hole: nothing to write, zeros to hash
      const uint64_t dst = layout.Slot(li, e0 + i, r).offset;
      const uint8_t* from = in->bytes + static_cast<uint64_t>(i) * slice;
      if (staged) std::memcpy(stage + (dst - span.lo), from, slice);
      bytes[i] = staged ? stage + (dst - span.lo) : from;
      const uint64_t lo = src_off + static_cast<uint64_t>(i) * slice, hi = lo + slice;
      while (seg < in->segs.size() && in->segs[seg].offset + in->segs[seg].length <= lo) ++seg;
      for (size_t k = seg; k < in->segs.size() && in->segs[k].offset < hi; ++k) {
        const Segment& sg = in->segs[k];
        if (sg.hole) continue;
        const uint64_t a = std::max(lo, sg.offset), z = std::min(hi, sg.offset + sg.length);
        if (staged) {
          runs.push_back({dst + (a - lo), dst + (z - lo), z - a});
        } else {
          K3_RETURN_IF_ERROR(io.out->Write(from + (a - lo), z - a, dst + (a - lo)));
        }
        has_data[i] = 1;
      }
    }
    if (stats) stats->write_s += SecondsSince(t0);
    pending.push_back(pool->Submit([=, &hash_s] {
      const auto h0 = std::chrono::steady_clock::now();
      for (uint32_t i = 0; i < n; ++i) {
        const size_t at = static_cast<size_t>(i) * kRoleCount + ri;
        if (has_data[i]) {
          HashSlice(bytes[i], slice, &digests[at], &crcs[at]);
        } else {
          digests[at] = ZeroSha256(slice);
          crcs[at] = ZeroCrc32c(slice);
        }
      }
      hash_s[ri] = SecondsSince(h0);
    }));
  }

  // Staged: whole blocks around the data, merged: one write for a batch
  // without holes.
  const auto w0 = std::chrono::steady_clock::now();
  for (Run& run : runs) {
    run.a = std::max(span.lo, AlignDown(run.a));
    run.z = std::min(span.hi, AlignUp(run.z));
  }
  std::sort(runs.begin(), runs.end(), [](const Run& x, const Run& y) { return x.a < y.a; });
  std::vector<Run> merged;
  for (const Run& run : runs) {
    if (!merged.empty() && run.a <= merged.back().z) {
      merged.back().z = std::max(merged.back().z, run.z);
      merged.back().data += run.data;
    } else {
      merged.push_back(run);
    }
  }
  for (const Run& run : merged) {
    K3_RETURN_IF_ERROR(io.out->Write(stage + (run.a - span.lo), run.z - run.a, run.a, run.data));
  }
  if (stats) stats->write_s += SecondsSince(w0);
  for (auto& j : pending) pool->Wait(j);
  if (stats) {
    for (double s : hash_s) stats->hash_s += s;
  }
  return Status::OK();
}

}  // namespace k3pack::pack
