"""k3pack.sglang.KimiGGMLExpertPackStore: SGLang's expert store
(sglang.srt.layers.moe.expert_pack.KimiGGMLExpertPackStore), served by
k3pack's C++ slot cache.

Same constructor, checks, texts, device-cache sizing, acquire/mark_used
contract, stats keys and stats file as SGLang's class (spec §7). What k3pack
adds, all keyword-only and off by default except where SGLang has no choice:
  * policy: the slot replacement policy ("reuse-lfu-lru-v2" = SGLang's, the
    default, with its exact hit/miss/eviction sequence and slot choice);
  * io_backend: "pread" (a thread pool) or "uring" (io_uring); every miss of
    a call is in flight at once, not in batches of stage_slots;
  * host_cache_mib: a host-RAM tier between the SSD and the slots (0: none);
  * prefetch: enables prefetch(layer, expert_ids), which starts host-tier
    reads without waiting (needs host_cache_mib > 0);
  * the device may be "cpu" (SGLang accepts only CUDA), so CPU inference and
    machines without a GPU run the same code path.
  * ep_size / ep_rank: serve one expert-parallel rank (SGLang's EP blocks:
    rank r owns experts [r*E/N, (r+1)*E/N)). Defaults: a rank pack's own rank
    (its manifest's k3pack.ep), else the whole model. Ids stay global; a row
    of topk_ids holds the token's routes to this rank (1..top_k of them), and
    a route to an expert another rank owns raises ValueError naming layer,
    expert, this rank and the owner, before any read (SGLang's EP never
    sends one: a routing bug).
torch is imported when the class is constructed.
"""

import json
import operator
import os
import pathlib
import threading
import weakref

import numpy as np

from . import _k3pack
from ._paths import fspath_str
from ._sglang_records import PackEntries, PackHeader, StoreStats

__all__ = ["KimiGGMLExpertPackStore", "READ_SPLITS"]

READ_SPLITS = 4
_MIB = 1024 * 1024
_MAX_HOST_CACHE_MIB = (2 ** 64 - 1) // _MIB  # host_cache_bytes is a uint64
# The engine's reads in flight (a uint32): stage_slots x read_splits past it
# is refused for the keyword at fault, not for this product.
_MAX_QUEUE_DEPTH = 2 ** 32 - 1
_ALIGN = 4096
_PACK_FORMAT = "SGLANG-KIMI-GGMLMOEPACK-ADAPTER-v1"
_HARD_CONSTRAINTS = {
    "top_k": 16,
    "top_k_is_immutable": True,
    "all_selected_experts_must_execute": True,
    "expert_pruning_allowed": False,
    "requantization_allowed": False,
}


def _int_option(value, keyword):
    """value as an int, for k3pack's own integer keywords: any int or numpy
    integer (what SlotCache takes), else a TypeError naming the keyword."""
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{keyword} must be an int, got {type(value).__name__}") from None


def _torch():
    import torch

    return torch


def _write_stats_file(snapshot, path):
    """SGLang's _write_stats: json.dumps(indent=2, sort_keys=True) to
    <path>.<pid>.tmp, then replace."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    _k3pack._check_stats_path(path)  # the path may name another file by now
    # Serialized before the temp file exists: a value JSON cannot hold (set
    # through store.stats) raised with an empty temp file left behind.
    text = json.dumps(snapshot, indent=2, sort_keys=True) + "\n"
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="ascii") as f:
        f.write(text)
    os.replace(tmp, path)


def _snapshot(engine, extra):
    """The engine's stats plus the keys callers set through store.stats."""
    snap = engine.snapshot()
    snap.update(extra)
    return snap


def _finish(engine, stats_path, stats_lock, extra):
    """close()'s work; also run at interpreter exit (SGLang's atexit(close))
    and when a store that was never closed is garbage-collected. It holds no
    reference to the store, so an unclosed store's slot memory, pack fd and
    read threads are freed with it."""
    try:
        if stats_path:
            with stats_lock:
                _write_stats_file(_snapshot(engine, extra), stats_path)
    finally:
        engine.close()


class KimiGGMLExpertPackStore:
    """Drop-in for SGLang's KimiGGMLExpertPackStore (see the module docstring).

    KimiGGMLExpertPackStore(pack_path, *, manifest_path, expected_layers,
    expected_experts, expected_top_k, ...) runs SGLang's start-up checks on
    the pack and manifest, with its texts; initialize_device_cache(device)
    allocates the slots; acquire(layer, topk_ids) / mark_used(slots) serve a
    MoE layer's call; snapshot() / close() as SGLang's. k3pack's keywords
    (policy, io_backend, host_cache_mib, prefetch, ep_size, ep_rank) are
    described in docs/python.md."""

    def __init__(self, pack_path, *, manifest_path, expected_layers, expected_experts, expected_top_k,
                 expected_source_sha256=None, expected_model_identity_sha256=None, expected_config_sha256=None,
                 cache_vram_mib=18 * 1024, cache_vram_reserve_mib=3 * 1024, stage_slots=16, read_splits=READ_SPLITS,
                 direct_io=False, stats_flush_interval=0, verify_pack_sha256=False, stats_path=None,
                 policy="reuse-lfu-lru-v2", io_backend="pread", host_cache_mib=0, prefetch=False, ep_size=None,
                 ep_rank=None):
        """Runs SGLang's start-up checks (manifest, header, every index entry,
        index digest, configured digests, budgets), with its texts."""
        self._cache = None
        self._closed = False
        self.pack_path = fspath_str(pack_path, "pack_path")
        self.manifest_path = fspath_str(manifest_path, "manifest_path")
        # k3pack's keyword: checked before the C++ side sees a size it cannot
        # hold (negative, or past 64 bits once in bytes). int() took 1.5 as 1
        # and "8" as 8; it is taken as every integer option is (any int or
        # numpy integer, else a TypeError naming it).
        host_cache_mib = _int_option(host_cache_mib, "host_cache_mib")
        if int(host_cache_mib) < 0:
            raise ValueError(f"host_cache_mib must be 0 (no host tier) or positive, got {host_cache_mib}")
        if int(host_cache_mib) > _MAX_HOST_CACHE_MIB:
            raise ValueError(f"host_cache_mib must be 0 (no host tier) or positive, at most {_MAX_HOST_CACHE_MIB}, "
                             f"got {host_cache_mib}")
        # The pack checks (manifest, header, every index entry, index digest)
        # run in C++, in SGLang's order and with its texts.
        self._engine = _k3pack.SlotCache(
            self.pack_path, self.manifest_path, policy=policy, io_backend=io_backend, direct_io=bool(direct_io),
            read_splits=int(read_splits) if int(read_splits) > 0 else 1,
            queue_depth=min(max(1, int(stage_slots)) * max(1, int(read_splits)), _MAX_QUEUE_DEPTH),
            stage_slots=max(1, int(stage_slots)), host_cache_bytes=int(host_cache_mib) * _MIB,
            verify_pack_sha256=bool(verify_pack_sha256), cache_vram_reserve_mib=int(cache_vram_reserve_mib),
            expected_layers=int(expected_layers), expected_experts=int(expected_experts),
            expected_top_k=int(expected_top_k), ep_size=ep_size, ep_rank=ep_rank)
        # SGLang checks the digests, budgets and stats_path after the pack. One
        # that failed left the engine open: its read threads and the pack's
        # descriptor lived as long as the exception did (a kept, logged or
        # chained one), for every store that failed.
        try:
            with open(self.manifest_path, "rb") as f:
                manifest = json.load(f)
            # SGLang's synthesized header digests, compared like the shared store
            # compares configured digests.
            digests = {
                "model_identity_sha256": ("0" * 64, expected_model_identity_sha256),
                "source_blob_sha256": (manifest["source"]["inventory_sha256"], expected_source_sha256),
                "config_sha256": (manifest["model"]["config_sha256"], expected_config_sha256),
            }
            for field, (actual, expected) in digests.items():
                if expected is not None and str(expected).lower() != actual:
                    raise ValueError(f"expert-pack {field} does not match configured digest")
            # SGLang's _initialize_runtime_state checks.
            if cache_vram_mib <= 0 or cache_vram_reserve_mib <= 0 or stage_slots <= 0 or read_splits <= 0:
                raise ValueError("expert cache and staging budgets, and read splits, must be positive")
            if stats_flush_interval < 0:
                raise ValueError("expert-pack stats flush interval cannot be negative")
            if direct_io and not hasattr(os, "O_DIRECT"):
                raise ValueError("expert-pack direct I/O is unavailable on this platform")
            if prefetch and host_cache_mib <= 0:
                raise ValueError("prefetch needs a host tier: pass host_cache_mib > 0")
            self.expected_layers = int(expected_layers)
            self.expected_experts = int(expected_experts)
            self.top_k = self._engine.top_k
            self.ep_size = self._engine.ep_size
            self.ep_rank = self._engine.ep_rank
            self.owned_experts = range(*self._engine.owned_experts)
            self.cache_vram_mib = int(cache_vram_mib)
            self.cache_vram_reserve_mib = int(cache_vram_reserve_mib)
            self.stage_slots = int(stage_slots)
            self.read_splits = int(read_splits)
            self.direct_io = bool(direct_io)
            self.stats_flush_interval = int(stats_flush_interval)
            self.policy = policy
            self.io_backend = io_backend
            self.host_cache_mib = int(host_cache_mib)
            self.prefetch_enabled = bool(prefetch)
            self.active_moe_layer_ids = frozenset(self._engine.active_layer_ids)
            self.object_payload_bytes = self.object_stride = self._engine.slot_bytes
            self.role_offsets = self._role_map(self._engine.role_offsets[0])
            self.role_nbytes = self._role_map(self._engine.role_bytes[0])
            self.role_bytes = self.role_nbytes["gate"]
            self.index_sha256 = self._engine.index_sha256
            # SGLang: str(expert_pack.get("sha256") or the index digest).
            self.pack_sha256 = str(manifest["expert_pack"].get("sha256") or self.index_sha256)
            # What SGLang's store gives the code around it (spec §7.2-§7.3): the
            # synthesized header, the entry records (its MoE method reads their
            # shapes), the mutable stats dict (its loader adds dense_bytes).
            layers = list(self.active_moe_layer_ids)  # ascending: the store checked it
            self.header = PackHeader(
                flags=3, index_count=len(layers) * self._engine.num_experts * 3,
                data_start=int(manifest["expert_pack"]["data_start"]),
                alignment=int(manifest["expert_pack"]["alignment"]),
                num_layers=self.expected_layers, num_experts=self._engine.num_experts, top_k=self.top_k, role_count=3,
                model_identity_sha256="0" * 64, source_blob_sha256=str(manifest["source"]["inventory_sha256"]),
                config_sha256=str(manifest["model"]["config_sha256"]))
            self.entries = PackEntries(self.pack_path, manifest, layers, self._engine.num_experts, self.index_sha256)
            self.stats = StoreStats(self._engine)
            # SGLang: Path(stats_path).resolve() (symlinks resolved, no "~" expansion).
            self.stats_path = str(pathlib.Path(os.fspath(stats_path)).resolve()) if stats_path else None
            if self.stats_path:
                # Checked now, not at close: a slip of the path (the pack, the
                # manifest) was overwritten with the counters, and a directory
                # lost them.
                _k3pack._check_stats_path(self.stats_path)
            self._last_flush = 0
            self._route_calls = 0  # sum(route_calls_by_layer), kept here so mark_used stays cheap
            self._device = None
            self._slot_count = 0
            # Stats writes share <stats>.<pid>.tmp: one at a time (threads'
            # mark_used flushes used to race: a rename failed, FileNotFoundError).
            self._stats_lock = threading.Lock()
            self._init_lock = threading.Lock()  # initialize_device_cache: one attach
            # SGLang registers atexit(self.close), which keeps every store alive
            # until exit; a finalizer holds only the engine, so a store that is
            # dropped unclosed frees its slots, fd and read threads.
            self._finalizer = weakref.finalize(self, _finish, self._engine, self.stats_path, self._stats_lock,
                                               self.stats.extra)
        except BaseException:
            self._engine.close()
            raise

    def __reduce_ex__(self, protocol):
        # copy.copy made a second store over the same engine: the first one's
        # finalizer closed it when that one was collected ("expert store is
        # closed" from the copy), and each kept its own idea of the device
        # cache. Refused as k3pack.ExpertStore (a C++ object) refuses it.
        raise TypeError(f"cannot pickle {type(self).__name__!r} object: it owns the pack's descriptor, read threads "
                        "and slots; share the store instead of copying it")

    @staticmethod
    def _role_map(values):
        up, gate, down = values  # the pack's physical order
        return {"up": up, "gate": gate, "down": down}

    # ------------------------------------------------------------ device cache

    def initialize_device_cache(self, device):
        """SGLang's sizing on CUDA: min(cache_vram_mib, free - reserve) //
        object bytes slots, at least top-k. On "cpu" the budget is
        cache_vram_mib (no free-memory probe). Safe from several threads:
        one attaches the cache, the others wait for it and return, as a
        second call does. After close() it raises RuntimeError("expert
        store is closed"); a close() on another thread waits for a call
        in progress."""
        # Two threads both passing the check used to attach twice: the
        # second attach failed ("already attached"). close() takes the same
        # lock, so a store is never attached after (or while) it is closed.
        with self._init_lock:
            if self._closed:
                raise RuntimeError("expert store is closed")
            if self._cache is None:
                self._attach_device_cache(device)

    def _attach_device_cache(self, device):
        torch = _torch()
        device = torch.device(device)
        if device.type not in ("cuda", "cpu"):
            raise ValueError("expert-pack runtime currently requires CUDA")
        if device.type == "cuda" and device.index is None:
            # "cuda" is the current device. torch.cuda.mem_get_info refuses a
            # device without an index ("Expected a torch.device with a
            # specified index or an integer"), so initialize_device_cache("cuda")
            # failed before any slot was made.
            device = torch.device("cuda", torch.cuda.current_device())
        budget = self.cache_vram_mib * _MIB
        if device.type == "cuda":
            free_bytes, _ = torch.cuda.mem_get_info(device)
            budget = min(budget, max(0, free_bytes - self.cache_vram_reserve_mib * _MIB))
        else:
            free_bytes = budget
        slots = budget // self.object_payload_bytes
        # A rank's token never needs more than its owned experts resident.
        if slots < min(self.top_k, len(self.owned_experts)):
            raise MemoryError(
                f"insufficient free VRAM for one top-k expert working set: free={free_bytes}, "
                f"object={self.object_payload_bytes}")
        if device.type == "cuda":
            cache = torch.empty((slots, self.object_payload_bytes), dtype=torch.uint8, device=device)
            self._engine.attach_cuda(cache.data_ptr(), slots, device.index)
        else:
            # Over-allocate and start at a 4096-aligned address, so reads
            # (O_DIRECT included) land straight in the slots.
            flat = torch.empty(slots * self.object_payload_bytes + _ALIGN, dtype=torch.uint8)
            skip = (-flat.data_ptr()) % _ALIGN
            cache = flat[skip:skip + slots * self.object_payload_bytes].view(slots, self.object_payload_bytes)
            self._engine.attach_host(cache.data_ptr(), slots)
        # _cache last: the other methods test it without the lock.
        self._device = device
        self._slot_count = slots
        self._cache = cache

    @property
    def device_cache(self):
        """The slot tensor, uint8 [slots, object_payload_bytes] on the cache's
        device; a slot from acquire() indexes its rows."""
        if self._cache is None:
            raise RuntimeError("raw expert device cache is not initialized")
        return self._cache

    # ------------------------------------------------------------ routing

    def _stream(self):
        if self._device is None or self._device.type != "cuda":
            return 0
        return _torch().cuda.current_stream(self._device).cuda_stream

    def acquire(self, layer, topk_ids, *, is_prefill=None, request_ids=None):
        """Slots of topk_ids' routes in route order (duplicates kept), as an
        int32 tensor on the cache's device and as a list. request_ids
        (k3pack's, optional): the call's request id or one per row, for the
        request-aware and adaptive policies; None = unknown."""
        if self._cache is None:
            raise RuntimeError("expert device cache is not initialized")
        layer = int(layer)
        if layer not in self.active_moe_layer_ids:
            raise ValueError(f"layer {layer} is not an active routed MoE layer")
        # SGLang prints tuple(topk_ids.shape): (1, 3), not torch.Size([1, 3]).
        shape = tuple(topk_ids.shape)
        if self.ep_size > 1:
            if len(shape) != 2 or not 1 <= shape[-1] <= self.top_k:
                raise ValueError(f"an EP rank's routes must be 1..{self.top_k} per token; received shape {shape}")
        elif len(shape) != 2 or shape[-1] != self.top_k:
            raise ValueError(f"runtime top-k must be exactly {self.top_k}; received shape {shape}")
        torch = _torch()
        if isinstance(topk_ids, torch.Tensor):
            # SGLang moves the routes to the host too; the C++ side takes any
            # integer dtype and refuses float and bool ones (TypeError).
            ids = topk_ids.numpy() if topk_ids.device.type == "cpu" else topk_ids.to("cpu").numpy()
        else:
            ids = np.asarray(topk_ids)
        if is_prefill is not None:
            is_prefill = bool(is_prefill)  # SGLang uses its truth value (a 0-d tensor, numpy bool, ...)
        try:
            slots = self._engine.acquire(layer, ids, is_prefill, self._stream(), request_ids)
        except (ValueError, TypeError):  # a route or argument check: SGLang counts no call
            raise
        except BaseException:
            self._route_calls += 1
            raise
        self._route_calls += 1
        slot_list = slots.tolist()
        tensor = torch.from_numpy(slots)
        if self._device.type == "cuda":
            tensor = tensor.to(self._device, non_blocking=False)
        return tensor, slot_list

    def mark_used(self, slot_indices):
        """Ends a call: its slots may be replaced once the work queued on the
        current stream now has finished."""
        if isinstance(slot_indices, (list, tuple)):
            slots = np.asarray(slot_indices)
        else:
            torch = _torch()
            if isinstance(slot_indices, torch.Tensor):
                slot_indices = slot_indices.to("cpu").numpy()
            slots = np.asarray(slot_indices)
        # The C++ side checks the slots (integers, in range).
        self._engine.mark_used(slots.reshape(-1), self._stream())
        if self.stats_path and self.stats_flush_interval > 0:
            if self._route_calls - self._last_flush >= self.stats_flush_interval:
                with self._stats_lock:
                    if self._route_calls - self._last_flush >= self.stats_flush_interval:  # not done meanwhile
                        self._write_stats()
                        self._last_flush = self._route_calls

    def prefetch(self, layer, expert_ids, *, request_id=None):
        """k3pack extra: start host-tier reads of a layer's experts (e.g. the
        next layer's predicted top-k) without waiting. request_id: the request
        whose next token was predicted; an already resident expert is then
        kept, and a staged read held, until that request's next acquire of
        the layer."""
        self._host_tier_call(self._engine.prefetch, layer, expert_ids, request_id)

    def keep(self, layer, expert_ids, *, request_id=None):
        """k3pack extra: keep hints without reads. The host-resident ones of a
        layer's predicted experts (e.g. the request's next token, predicted a
        token ahead) are passed over by host evictions until request_id's
        next acquire of the layer; nothing is read."""
        self._host_tier_call(self._engine.keep, layer, expert_ids, request_id)

    def _host_tier_call(self, call, layer, expert_ids, request_id):
        if not self.prefetch_enabled:
            raise ValueError("prefetch is off: construct the store with prefetch=True and host_cache_mib > 0")
        torch = _torch()
        if isinstance(expert_ids, torch.Tensor):
            expert_ids = expert_ids.detach().to("cpu").numpy()
        # Not cast here: the C++ side refuses float and bool ids (TypeError).
        call(int(layer), np.asarray(expert_ids).reshape(-1), request_id=request_id)

    # ------------------------------------------------------------ stats

    def snapshot(self):
        """SGLang's stats dict (same keys, spec 7.7) plus k3pack's under "k3pack"
        and any key set through store.stats (e.g. SGLang's dense_bytes)."""
        return _snapshot(self._engine, self.stats.extra)

    def _write_stats(self):
        _write_stats_file(self.snapshot(), self.stats_path)

    def close(self):
        """Writes the stats file (when stats_path is set) and closes the pack;
        idempotent. Also runs at interpreter exit, as SGLang's atexit(close).
        acquire() and initialize_device_cache() then raise
        RuntimeError("expert store is closed"). An initialize_device_cache()
        running on another thread finishes first (its cache is then closed
        with the store)."""
        with self._init_lock:
            if self._closed:
                return
            self._closed = True
        self._finalizer()
