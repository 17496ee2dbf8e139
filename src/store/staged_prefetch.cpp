// Staged prefetch (StoreOptions::prefetch_mode "staged"): speculative reads
// land outside the cache, so a wrong or unused guess can never displace an
// object that demand caching would have kept.
//
// Life of a staged object: Prefetch() accepts it if the staging budget has
// room (else it is refused and counted) and queues its read; at most
// prefetch_depth speculative reads are with the engine at once, the rest wait
// here. It is staged for the prefetch's request: an Acquire() of its layer
// that routes to it takes it, whichever request asks (the policy sees a
// demand miss and inserts it as one, but no second read is made; a read
// still queued is submitted at once), and that request's next Acquire() of
// the layer (any acquire of the layer without request ids on either side)
// drops it if nothing took it: a queued read is cancelled (never issued), a
// finished one freed, one in flight discarded when it lands. So with
// requests decoded side by side, A's guesses wait through B's acquire of the
// layer. An object already resident is not read; with keep_predicted it
// becomes a keep hint for the policy until that acquire. Every function here
// runs with `mu` held.
#include <algorithm>

#include "store/store_state.h"
#include "util/process_limits.h"
#include "util/threads.h"

namespace k3pack::store {

Status ExpertStore::Impl::StagePrefetch(uint32_t li, std::span<const ObjectId> keys, uint64_t request) {
  // Room first: under `ulimit -v` an allocation that failed after an object
  // was staged and charged, but before its hold was given, left it staged
  // for good, its bytes charged against the prefetch budget.
  std::vector<ObjectId> resident, held, fresh;  // held: staged for this request's next acquire
  resident.reserve(keys.size());
  held.reserve(keys.size());
  fresh.reserve(keys.size());
  bool short_of_memory = false;
  for (ObjectId k : keys) {
    if (policy->Resident(k)) {  // nothing to read; kept for that acquire
      if (kept) resident.push_back(k);
      continue;
    }
    if (staged[k]) {  // staged for another request (or this one) already: this one waits for it too
      held.push_back(k);
      continue;
    }
    const uint64_t cost = geo.space.Cost(k);
    if (staged_bytes + cost > prefetch_budget) {
      ++prefetch_refused;
      prefetch_refused_bytes += cost;
      continue;
    }
    std::shared_ptr<Entry> e;
    const bool queued = !RanOutOfMemory([&] {
      e = std::make_shared<Entry>();
      spec_queue.push_back(e);  // before anything is charged: the one step that may fail
    });
    if (!queued) {
      short_of_memory = true;  // the rest is not staged; what is staged gets its hold below
      break;
    }
    e->id = k;
    e->prefetched = true;
    staged[k] = e;
    ++staged_objects;
    staged_bytes += cost;
    staged_bytes_max = std::max(staged_bytes_max, staged_bytes);
    ++prefetch_issued;
    prefetch_issued_bytes += cost;
    held.push_back(k);
    fresh.push_back(k);
  }
  if (RanOutOfMemory([&] { stage_holds->Give(li, request, held); })) {
    for (ObjectId k : fresh) DropStaged(k);  // no hold would ever release them
    PumpSpeculative();
    return BareOutOfMemory();
  }
  // Keep hints are advice: without memory for them, none is given.
  if (kept) (void)RanOutOfMemory([&] { KeepResidents(li, request, resident); });
  PumpSpeculative();
  if (short_of_memory) return BareOutOfMemory();
  return Status::OK();
}

void ExpertStore::Impl::PumpSpeculative() {
  while (!closed && spec_inflight < prefetch_depth && !spec_queue.empty()) {
    std::shared_ptr<Entry> e = std::move(spec_queue.front());
    spec_queue.pop_front();
    if (e->submitted || e->dropped) continue;  // taken (read on demand) or cancelled
    e->speculative_io = true;
    ++spec_inflight;
    SubmitRead(e);
  }
}

std::shared_ptr<ExpertStore::Impl::Entry> ExpertStore::Impl::TakeStaged(ObjectId id) {
  std::shared_ptr<Entry> e = std::move(staged[id]);
  if (!e) return nullptr;
  --staged_objects;
  staged_bytes -= geo.space.Cost(id);
  ++prefetch_useful;
  prefetch_useful_bytes += geo.space.Cost(id);
  entries[id] = e;
  if (!e->submitted) SubmitRead(e);  // still queued: the acquire needs it now
  return e;
}

void ExpertStore::Impl::EndStaged(uint32_t li, std::span<const uint64_t> requests) {
  stage_holds->CallStarts(li, requests, [&](ObjectId id) { DropStaged(id); });
}

void ExpertStore::Impl::KeepResidents(uint32_t li, uint64_t request, std::span<const ObjectId> residents) {
  if (residents.empty()) return;
  if (!keep_hints_given) {
    policy->SetKeepHints(kept->counts());
    keep_hints_given = true;
  }
  kept->Give(li, request, residents);
  prefetch_kept += residents.size();
}

void ExpertStore::Impl::DropStaged(ObjectId id) {
  std::shared_ptr<Entry> e = std::move(staged[id]);
  if (!e) return;  // taken, or not staged
  --staged_objects;
  const uint64_t cost = geo.space.Cost(id);
  e->dropped = true;
  if (!e->submitted) {
    ++prefetch_cancelled;
    prefetch_cancelled_bytes += cost;
    staged_bytes -= cost;
    return;
  }
  ++prefetch_wasted;
  prefetch_wasted_bytes += cost;
  // A read in flight keeps its buffer (and its charge) until it lands.
  if (e->state != Entry::kLoading) staged_bytes -= cost;
}

void ExpertStore::Impl::FinishStagedRead(const std::shared_ptr<Entry>& e, bool ok) {
  if (e->speculative_io) {
    e->speculative_io = false;
    --spec_inflight;
  }
  const uint64_t cost = geo.space.Cost(e->id);
  if (e->dropped) {
    staged_bytes -= cost;  // the discarded read's charge
  } else if (!ok && staged[e->id] == e) {
    // Failed before anyone took it: forget it; the acquire reads on demand.
    staged[e->id].reset();
    --staged_objects;
    ++prefetch_failed;
    staged_bytes -= cost;
  }
  PumpSpeculative();
}

}  // namespace k3pack::store
