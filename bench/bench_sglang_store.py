#!/usr/bin/env python3
"""k3pack.sglang.KimiGGMLExpertPackStore on the CPU device, against baselines
measured in the same run:

  1. hot decode step: acquire + mark_used of one top-16 route whose experts
     are all resident, k3pack vs a pure-Python reimplementation of SGLang's
     bookkeeping (tests/python/sglang_store_ref.py, with the torch work
     SGLang's acquire does around it) on the same routes;
  2. miss path: every route misses, bytes/s of objects landing in slots vs a
     raw parallel pread of the same objects (same depth) into one buffer;
  3. with a GPU: cold fill of the device cache vs raw pinned DMA, and a hot
     decode step with the routes on the GPU.

Usage: PYTHONPATH=python /usr/bin/python3 bench/bench_sglang_store.py [--calls N] [--keep DIR]
Prints ratios; asserts nothing about speed.
"""

import argparse
import concurrent.futures
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import k3pack  # noqa: E402
from k3pack.sglang import KimiGGMLExpertPackStore  # noqa: E402
from sglang_store_ref import SglangStoreModel  # noqa: E402

LAYERS, EXPERTS, TOP_K = 8, 128, 16


def build_model(root):
    model = os.path.join(root, "model")
    cli = os.environ.get("K3PACK_BIN") or os.path.join(HERE, "..", "build", "k3pack")
    subprocess.run([cli, "synth", "--out", model, "--layers", str(LAYERS + 1), "--experts", str(EXPERTS),
                    "--top-k", str(TOP_K), "--all-data"], check=True, stdout=subprocess.DEVNULL)
    built = k3pack.build(model, os.path.join(model, "config.json"), os.path.join(model, "tokenizer"),
                         pack=os.path.join(root, "bench.expert-major.pack"),
                         manifest=os.path.join(root, "bench.manifest.json"), profile="scaled", safety_margin_gib=0)
    return built["pack"]["pack"], built["manifest"]


def open_store(pack, manifest, mib, **kw):
    return KimiGGMLExpertPackStore(pack, manifest_path=manifest, expected_layers=LAYERS + 1, expected_experts=EXPERTS,
                                   expected_top_k=TOP_K, cache_vram_mib=mib, cache_vram_reserve_mib=1, **kw)


def hot_step(pack, manifest, calls):
    store = open_store(pack, manifest, 4096)
    store.initialize_device_cache("cpu")
    rng = np.random.default_rng(0)
    routes = [(1 + i % LAYERS, torch.from_numpy(rng.choice(16 * 2, (1, TOP_K), replace=False))) for i in range(64)]
    for layer, ids in routes:  # make every expert of every route resident
        _, slots = store.acquire(layer, ids)
        store.mark_used(slots)
    ref = SglangStoreModel(store.device_cache.shape[0])
    for layer, ids in routes:
        _, slots = ref.acquire_like_sglang(layer, ids, torch)
        ref.mark_used(slots)

    def timed(fn):
        best = []
        for _ in range(3):
            t0 = time.perf_counter_ns()
            for i in range(calls):
                layer, ids = routes[i % len(routes)]
                fn(layer, ids)
            best.append((time.perf_counter_ns() - t0) / calls / 1e3)
        return min(best)

    def k3(layer, ids):
        _, slots = store.acquire(layer, ids)
        store.mark_used(slots)

    def sg(layer, ids):
        _, slots = ref.acquire_like_sglang(layer, ids, torch)
        ref.mark_used(slots)

    k3_us, sg_us = timed(k3), timed(sg)
    hits = store.snapshot()["cache_hits"]
    store.close()
    print(f"hot decode step (top-{TOP_K}, all hits, {calls} calls, best of 3):")
    print(f"  k3pack acquire+mark_used       {k3_us:8.1f} us/call")
    print(f"  SGLang bookkeeping (Python)    {sg_us:8.1f} us/call")
    print(f"  ratio (SGLang / k3pack)        {sg_us / k3_us:8.2f}x   (hits counted: {hits})")


def object_offset(pack, layer, expert):
    """File offset of (layer, expert)'s object: its `up` entry in the index."""
    entry = ((layer - 1) * EXPERTS + expert) * 3
    with open(pack, "rb") as f:
        f.seek(40 + entry * 152 + 136)
        return struct.unpack("<Q", f.read(8))[0]


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def miss_path(pack, manifest, rounds):
    results = {}
    for backend in ("pread", "uring"):
        store = open_store(pack, manifest, 64, io_backend=backend, stage_slots=16, read_splits=1)
        store.initialize_device_cache("cpu")
        obj = store.object_payload_bytes
        # Cycle through all experts so that every route misses.
        order = [(1 + (i // (EXPERTS // TOP_K)) % LAYERS, (i % (EXPERTS // TOP_K)) * TOP_K) for i in range(rounds)]
        drop_cache(pack)
        t0 = time.perf_counter()
        for layer, first in order:
            ids = torch.arange(first, first + TOP_K).reshape(1, TOP_K)
            _, slots = store.acquire(layer, ids)
            store.mark_used(slots)
        secs = time.perf_counter() - t0
        snap = store.snapshot()
        store.close()
        results[backend] = snap["pack_read_bytes"] / secs
        objects = snap["pack_reads"]

    # The same objects, raw: 16 threads of os.preadv into reused buffers.
    offsets = [object_offset(pack, layer, e) for layer, first in order for e in range(first, first + TOP_K)]
    bufs = [bytearray(obj) for _ in range(16)]
    fd = os.open(pack, os.O_RDONLY)
    drop_cache(pack)
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        for start in range(0, len(offsets), 16):
            list(pool.map(lambda j: os.preadv(fd, [bufs[j % 16]], offsets[start + j]),
                          range(min(16, len(offsets) - start))))
    raw = len(offsets) * obj / (time.perf_counter() - t0)
    os.close(fd)
    print(f"miss path (cold page cache, {objects} objects of {obj} bytes, 16 in flight):")
    for backend, rate in results.items():
        print(f"  k3pack {backend:6s} into slots       {rate / 1e9:6.2f} GB/s   ratio to raw {rate / raw:5.2f}x")
    print(f"  raw parallel preadv (Python)   {raw / 1e9:6.2f} GB/s")


def gpu_fill(pack, manifest, rounds):
    """CUDA only: cold fill of the device cache (every route misses) against
    raw pinned host-to-device DMA of the same bytes; then a hot step."""
    store = open_store(pack, manifest, 512, stage_slots=16, read_splits=1, io_backend="uring")
    store.initialize_device_cache("cuda")
    obj = store.object_payload_bytes
    order = [(1 + (i // (EXPERTS // TOP_K)) % LAYERS, (i % (EXPERTS // TOP_K)) * TOP_K) for i in range(rounds)]
    # Every object the timed loop reads, read once first: the page cache is
    # warm, so this measures staging + DMA, not the disk (it warmed 8 of the
    # calls and relied on the miss-path section having read the rest).
    for layer, first in order:
        _, slots = store.acquire(layer, torch.arange(first, first + TOP_K).reshape(1, TOP_K))
        store.mark_used(slots)
    store.close()
    store = open_store(pack, manifest, 512, stage_slots=16, read_splits=1, io_backend="uring")
    store.initialize_device_cache("cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for layer, first in order:
        _, slots = store.acquire(layer, torch.arange(first, first + TOP_K).reshape(1, TOP_K))
        store.mark_used(slots)
    torch.cuda.synchronize()
    fill = store.snapshot()["h2d_bytes"] / (time.perf_counter() - t0)
    pinned = torch.empty(16 * obj, dtype=torch.uint8).pin_memory()
    dev = torch.empty(16 * obj, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(rounds):
        dev.copy_(pinned, non_blocking=True)
    torch.cuda.synchronize()
    dma = rounds * 16 * obj / (time.perf_counter() - t0)
    layer, first = order[-1]
    ids = torch.arange(first, first + TOP_K).reshape(1, TOP_K).cuda()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(1000):
        _, slots = store.acquire(layer, ids)
        store.mark_used(slots)
    torch.cuda.synchronize()
    hot_us = (time.perf_counter() - t0) / 1000 * 1e6
    store.close()
    print(f"GPU ({torch.cuda.get_device_name()}):")
    print(f"  cold fill (page cache warm)    {fill / 1e9:6.2f} GB/s   ratio to raw pinned DMA {fill / dma:5.2f}x")
    print(f"  raw pinned DMA                 {dma / 1e9:6.2f} GB/s")
    print(f"  hot decode step (ids on GPU)   {hot_us:6.1f} us/call")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=64)
    ap.add_argument("--keep", help="build the model here and keep it")
    args = ap.parse_args()
    root = args.keep or tempfile.mkdtemp(prefix="k3-bench-sglang-store-")
    try:
        pack = os.path.join(root, "bench.expert-major.pack")
        manifest = os.path.join(root, "bench.manifest.json")
        if not (os.path.exists(pack) and os.path.exists(manifest)):
            pack, manifest = build_model(root)
        print(f"load average {os.getloadavg()[0]:.1f}; model: {LAYERS} MoE layers x {EXPERTS} experts, top-{TOP_K}")
        hot_step(pack, manifest, args.calls)
        miss_path(pack, manifest, args.rounds)
        if torch.cuda.is_available():
            gpu_fill(pack, manifest, args.rounds)
        else:
            print("GPU: no CUDA device here (the cold-fill and hot-step figures on a GPU run where one is present)")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
