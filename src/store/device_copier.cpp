#include "store/device_copier.h"

#include <cstring>
#include <string>
#include <system_error>

#include "util/all_or_none.h"
#include "util/process_limits.h"
#include "util/threads.h"

namespace k3pack::store {

Result<std::unique_ptr<DeviceCopier>> DeviceCopier::Open(const cuda::Runtime* rt, int device, uint32_t workers,
                                                         uint64_t staging_bytes, bool stage_pageable) {
  if (workers == 0) return Error("device copies need at least one worker");
  std::unique_ptr<DeviceCopier> c(new DeviceCopier(rt, device, stage_pageable));
  c->lanes_.resize(workers);
  for (Lane& lane : c->lanes_) {  // ~DeviceCopier releases whatever was created before a failure
    K3_RETURN_IF_ERROR(cuda::Check(*rt, rt->StreamCreate(&lane.stream), "cudaStreamCreate"));
    if (!stage_pageable) continue;
    for (int i = 0; i < 2; ++i) {
      K3_RETURN_IF_ERROR(
          cuda::Check(*rt, rt->HostAlloc(&lane.staging[i], staging_bytes, 0), "cudaHostAlloc (pinned staging)"));
      K3_RETURN_IF_ERROR(cuda::Check(*rt, rt->EventCreate(&lane.copied[i]), "cudaEventCreate"));
    }
  }
  // Workers pull jobs from one queue, so when the process cannot start them
  // all (a pids or address-space limit) the copies run on those it started,
  // and the lanes no thread drives are released.
  for (size_t i = 0; i < c->lanes_.size(); ++i) {
    if (const std::error_code failed =
            TryStartThread([&] { c->threads_.emplace_back(&DeviceCopier::Work, c.get(), &c->lanes_[i]); })) {
      if (c->threads_.empty())
        return Error("cannot start the device tier's copy threads (0 of " + std::to_string(workers) +
                         " started): " + failed.message(),
                     ErrorKind::kOS, failed.value())
            .WithHint("lower copy_workers, or " + ThreadStartHint());
      break;
    }
  }
  while (c->lanes_.size() > c->threads_.size()) {
    c->Release(c->lanes_.back());
    c->lanes_.pop_back();
  }
  return c;
}

void DeviceCopier::Release(Lane& lane) {
  if (lane.stream) rt_->StreamSynchronize(lane.stream);
  for (int i = 0; i < 2; ++i) {
    if (lane.copied[i]) rt_->EventDestroy(lane.copied[i]);
    if (lane.staging[i]) rt_->FreeHost(lane.staging[i]);
  }
  if (lane.stream) rt_->StreamDestroy(lane.stream);
}

DeviceCopier::~DeviceCopier() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : threads_) t.join();
  for (Lane& lane : lanes_) Release(lane);
}

Status DeviceCopier::Copy(Lane& lane, const CopyJob& job) {
  if (job.src_pinned || !stage_)
    return cuda::Check(*rt_, rt_->MemcpyAsync(job.dst, job.src, job.size, cuda::kHostToDevice, lane.stream),
                       "cudaMemcpyAsync (expert to device)");
  const int b = lane.next;
  lane.next ^= 1;
  if (lane.pending[b]) {
    lane.pending[b] = false;
    K3_RETURN_IF_ERROR(cuda::Check(*rt_, rt_->EventSynchronize(lane.copied[b]), "cudaEventSynchronize"));
  }
  std::memcpy(lane.staging[b], job.src, job.size);
  K3_RETURN_IF_ERROR(cuda::Check(
      *rt_, rt_->MemcpyAsync(job.dst, lane.staging[b], job.size, cuda::kHostToDevice, lane.stream),
      "cudaMemcpyAsync (expert to device)"));
  K3_RETURN_IF_ERROR(cuda::Check(*rt_, rt_->EventRecord(lane.copied[b], lane.stream), "cudaEventRecord"));
  lane.pending[b] = true;
  return Status::OK();
}

// Given its lane, not an index: lanes_ may shrink while the first workers start.
void DeviceCopier::Work(Lane* own) {
  Lane& lane = *own;
  Status device = cuda::Check(*rt_, rt_->SetDevice(device_), "cudaSetDevice");  // the current device is per thread
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping
    const CopyJob* job = queue_.front();
    queue_.pop_front();
    lock.unlock();
    // On a copy thread, which must not throw: an error whose text cannot be
    // made is BareOutOfMemory.
    Status st = Status::OK();
    if (RanOutOfMemory([&] { st = device.ok() ? Copy(lane, *job) : device; })) st = BareOutOfMemory();
    lock.lock();
    if (!st.ok() && first_error_.ok()) first_error_ = std::move(st);
    if (--remaining_ == 0) done_cv_.notify_all();
  }
}

Status DeviceCopier::CopyAll(std::span<const CopyJob> jobs) {
  if (jobs.empty()) return Status::OK();
  {
    std::unique_lock<std::mutex> lock(mu_);
    first_error_ = Status::OK();
    AppendAllOrNone(queue_, jobs.size(), [&](size_t i) { return &jobs[i]; });
    remaining_ = jobs.size();
    work_cv_.notify_all();
    done_cv_.wait(lock, [&] { return remaining_ == 0; });
  }
  // Every DMA is queued; wait for all of them, even after an error, so no
  // copy still reads a source the caller is about to release.
  Status synced;
  for (Lane& lane : lanes_) {
    Status st = cuda::Check(*rt_, rt_->StreamSynchronize(lane.stream), "cudaStreamSynchronize");
    if (!st.ok() && synced.ok()) synced = st;
  }
  if (!first_error_.ok()) return first_error_;
  return synced;
}

}  // namespace k3pack::store
