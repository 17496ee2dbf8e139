"""A model of SGLang's KimiGGMLExpertPackStore slot bookkeeping, written
from the spec (sglang-expert-pack.md §7.6): the reference the k3pack store
is tested against, and the pure-Python baseline bench_sglang_store.py times.

Keys are (layer, expert); frequencies persist across evictions and cap at
255; a miss takes the first empty slot in index order, else the slot with
the strictly smallest frequency walking the LRU oldest->newest (decode) or
newest->oldest (prefill), skipping the call's own keys."""

import threading
from collections import OrderedDict


class SglangStoreModel:
    """SGLang's slot bookkeeping (spec §7.6), keyed by (layer, expert)."""

    def __init__(self, slots):
        self.slot_key = [None] * slots
        self.slot_freq = [0] * slots
        self.key_to_slot = {}
        self.freq = {}
        self.lru = OrderedDict()
        self.hits = self.misses = self.evictions = 0
        self.events = []  # ("hit"|"miss"|"evict", key) in order
        self.lock = threading.RLock()
        self.active = set()

    def victim(self, protected, preserve_oldest):
        for i, k in enumerate(self.slot_key):
            if k is None:
                return i
        order = reversed(self.lru) if preserve_oldest else iter(self.lru)
        best = None
        for k in order:
            if k in protected:
                continue
            s = self.key_to_slot[k]
            if best is None or self.slot_freq[s] < self.slot_freq[best]:
                best = s
        if best is None:
            raise RuntimeError("expert cache cannot evict the active top-k working set")
        return best

    def acquire(self, layer, ids, rows, is_prefill=None):
        prefill = rows > 1 if is_prefill is None else is_prefill
        keys = sorted({(layer, int(e)) for e in ids})
        for k in keys:
            self.freq[k] = min(self.freq.get(k, 0) + 1, 255)
        for k in keys:
            if k in self.key_to_slot:
                self.hits += 1
                self.events.append(("hit", k))
                self.lru.move_to_end(k)
                self.slot_freq[self.key_to_slot[k]] = self.freq[k]
                continue
            self.misses += 1
            self.events.append(("miss", k))
            v = self.victim(set(keys), prefill)
            old = self.slot_key[v]
            if old is not None:
                self.evictions += 1
                self.events.append(("evict", old))
                del self.key_to_slot[old]
                del self.lru[old]
            self.slot_key[v] = k
            self.slot_freq[v] = self.freq[k]
            self.key_to_slot[k] = v
            self.lru[k] = None
        return [self.key_to_slot[(layer, int(e))] for e in ids]

    def acquire_like_sglang(self, layer, topk_ids, torch, device="cpu"):
        """acquire() with the per-call work SGLang's store does around the
        bookkeeping: checks, ids to host, a lock, the int32 slot tensor."""
        if len(topk_ids.shape) != 2 or topk_ids.shape[-1] != 16:
            raise ValueError("runtime top-k must be exactly 16")
        route_ids = topk_ids.detach().to("cpu").reshape(-1).tolist()
        if any(e < 0 or e >= 896 for e in route_ids):
            raise ValueError("route contains an out-of-range expert id")
        with self.lock:
            slots = self.acquire(layer, route_ids, topk_ids.shape[0])
        return torch.tensor(slots, dtype=torch.int32, device=device), slots

    def mark_used(self, slots):
        with self.lock:
            for s in set(slots):
                self.active.discard(self.slot_key[s])
