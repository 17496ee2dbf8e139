#!/usr/bin/env python3
"""Throughput of k3pack's Python non-expert weight iterator.

Streams every non-routed weight of a manifest, cold (each shard fdatasync-ed
and dropped from the page cache with POSIX_FADV_DONTNEED before each run) and
warm, in --repeat rounds (each runs every mode once; medians and paired ranges), through
  1. the baseline: exactly the tensors' stored byte ranges read with os.preadv
     into one reused buffer, POSIX_FADV_SEQUENTIAL (no names, no checks);
  2. k3pack.nonexpert_weights (numpy, zero-copy), touching one byte per page;
  3. the same + np.copyto into one preallocated buffer per size (a consumer
     copying into its parameters);
  4. k3pack.nonexpert_weights(copy=True): fresh writable arrays read by the
     stream with pread (what SGLang's torch.tensor() copies give), the
     consumer holding each until the next, as SGLang's loop does;
  5. k3pack.sglang.kimi_k3_nonexpert_weights_iterator(copy=True) when torch
     is installed;
  6. SGLang's load loop: the same iterator with every tensor copied into a
     parameter (param.copy_), and the same loop over a model of SGLang's own
     iterator (bench/sglang_iterator_ref.py: numpy.memmap views copied by
     torch.tensor(), as gguf-py + SGLang do), with the ratio between them.
Each line prints GB/s, the ratio to the baseline of the same run and cache
state (target >= 0.8) and the growth of peak RSS over the mode (VmHWM reset
through /proc/self/clear_refs). Ratios are printed, never asserted.

    python3 bench/bench_python_loader.py                  # synthesizes a model (needs the CLI)
    python3 bench/bench_python_loader.py --manifest M.json
    python3 bench/bench_python_loader.py --gguf DIR       # e.g. `k3pack synth --preset k3-structure`
Options: --repeat N, --hidden N (synth size), --keep DIR, --modes a,b, --cache both|cold|warm.
"""

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))

import numpy as np  # noqa: E402

import k3pack  # noqa: E402


def source_manifest(directory, out):
    """A manifest with the keys the iterator reads, from k3pack.ShardSet."""
    s = k3pack.ShardSet(directory)
    shards, tensors = [], []
    for i, g in enumerate(s.shards):
        with open(g.path, "rb") as f:
            meta = hashlib.sha256(f.read(g.data_offset)).hexdigest()
        shards.append({"index": i, "path": os.path.realpath(g.path), "size": g.file_size,
                       "metadata_nbytes": g.data_offset, "metadata_sha256": meta, "tensor_count": len(g)})
    for t in s.tensors:
        tensors.append({"name": t.name, "shape": list(t.shape), "dtype": t.type, "dtype_id": t.type_id,
                        "shard_index": t.shard_index, "data_offset": t.data_offset, "nbytes": t.nbytes})
    tensors.sort(key=lambda r: r["name"])
    doc = {"format": "SGLANG-KIMI-GGMLMOEPACK-ADAPTER-v1", "complete": True,
           "source": {"shards": shards, "tensors": tensors}}
    with open(out, "w") as f:
        json.dump(doc, f, indent=2, sort_keys=True)
    return doc


def status_bytes(key):
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def reset_peak_rss():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def drop_cache(paths):
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--manifest")
    ap.add_argument("--gguf", help="a GGUF shard directory: a minimal manifest is written for it")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=1024, help="hidden size of the synthesized model")
    ap.add_argument("--keep", help="directory for the synthesized model (kept)")
    ap.add_argument("--cache", choices=("both", "cold", "warm"), default="both",
                    help="page-cache states to measure (a model larger than memory is cold either way)")
    ap.add_argument("--modes", default="pread,views,copyto,copy,torch,sglang-loop,sglang-ref")
    args = ap.parse_args()

    tmp = None
    manifest = args.manifest
    if args.gguf:
        manifest = os.path.join(tempfile.mkdtemp(prefix="k3bench-"), "bench.manifest.json")
        source_manifest(args.gguf, manifest)
    if not manifest:
        cli = os.environ.get("K3PACK_BIN") or os.path.join(REPO, "build", "k3pack")
        out = args.keep or tempfile.mkdtemp(prefix="k3bench-")
        tmp = None if args.keep else out
        h = str(args.hidden)
        if os.access(cli, os.X_OK):
            subprocess.run([cli, "synth", "--preset", "tiny", "--out", out, "--all-data", "--hidden", h,
                            "--vocab", str(8 * args.hidden)], check=True, stdout=subprocess.DEVNULL)
        else:
            k3pack.synth(out, all_data=True, hidden=args.hidden, vocab=8 * args.hidden)
        manifest = os.path.join(out, "bench.manifest.json")
        source_manifest(out, manifest)

    doc = json.load(open(manifest))
    shard_paths = [s["path"] for s in doc["source"]["shards"]]
    # The stored ranges the stream hands out, per shard (a record's source
    # tensor; computed tensors have none), and the emitted volume.
    by_path = {int(s["index"]): s["path"] for s in doc["source"]["shards"]}
    recs = {(t["shard_index"], t["name"]): t for t in doc["source"]["tensors"]}
    ranges, seen, emitted, count, largest = {}, set(), 0, 0, 0
    for r in k3pack.nonexpert_tensors(manifest, release_pages=True):
        emitted += r.array.nbytes
        count += 1
        largest = max(largest, r.array.nbytes)
        key = (r.shard_index, r.source_name)
        if r.zero_copy and key not in seen:
            seen.add(key)
            g = files_cache(by_path[r.shard_index])
            t = g.tensor(r.source_name) if hasattr(g, "tensor") else None
            off = (t.data_offset if t is not None else recs[key]["data_offset"]) + g.data_offset
            ranges.setdefault(by_path[r.shard_index], []).append((off, r.array.nbytes))
    buf = bytearray(min(max(largest, 1), 64 << 20))
    view = memoryview(buf)

    def raw_pread():
        b = 0
        for path, spans in ranges.items():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
                for off, n in spans:
                    done = 0
                    while done < n:
                        k = os.preadv(fd, [view[:min(len(buf), n - done)]], off + done)
                        if k <= 0:
                            break
                        done += k
                    b += done
            finally:
                os.close(fd)
        return b

    def views():
        b = 0
        for name, arr in k3pack.nonexpert_weights(manifest):
            flat = arr.reshape(-1).view(np.uint8)
            int(flat[::4096].sum())
            b += arr.nbytes
        return b

    params = {}

    def copyto():
        b = 0
        for name, arr in k3pack.nonexpert_weights(manifest):
            flat = arr.reshape(-1).view(np.uint8)
            dst = params.get(flat.size)
            if dst is None:
                dst = params[flat.size] = np.empty(flat.size, np.uint8)
            np.copyto(dst, flat)
            b += arr.nbytes
        return b

    def copied():
        b = 0
        for name, arr in k3pack.nonexpert_weights(manifest, copy=True):
            b += arr.nbytes
        return b

    modes = [("pread", "baseline: os.preadv into one buffer", raw_pread),
             ("views", "nonexpert_weights (zero-copy, touch)", views),
             ("copyto", "nonexpert_weights + np.copyto", copyto),
             ("copy", "nonexpert_weights(copy=True)", copied)]
    try:
        import torch  # noqa: F401

        from k3pack.sglang import kimi_k3_nonexpert_weights_iterator as it

        def torch_copy():
            b = 0
            for name, t in it(manifest, copy=True):
                b += t.numel() * t.element_size()
            return b

        modes.append(("torch", "k3pack.sglang iterator copy=True", torch_copy))

        # SGLang's load loop: every yielded tensor copied into its parameter.
        # The model's parameters would not fit in this machine's memory (and
        # live on the GPU in SGLang), so one preallocated, already-touched
        # byte buffer of the largest tensor's size stands in for them: both
        # iterators pay the same copy and neither pays first-touch faults.
        param_bytes = torch.zeros(max(largest, 8) + 64, dtype=torch.uint8)

        def into_params(pairs):
            b = 0
            for name, t in pairs:
                n = t.numel() * t.element_size()
                param_bytes[:n].view(t.dtype).copy_(t.reshape(-1))
                b += n
            return b

        modes.append(("sglang-loop", "k3pack.sglang copy=True + param copy", lambda: into_params(it(manifest, copy=True))))
        import sglang_iterator_ref

        modes.append(("sglang-ref", "SGLang-model iterator + param copy",
                      lambda: into_params(sglang_iterator_ref.iterate(shard_paths))))
    except ImportError:
        pass
    wanted = set(args.modes.split(","))
    modes = [m for m in modes if m[0] in wanted or m[0] == "pread"]

    print("manifest: %s" % manifest)
    print("tensors emitted: %d, %.1f MiB (largest %.1f MiB), stored ranges %.1f MiB, rounds %d"
          % (count, emitted / 2**20, largest / 2**20, sum(n for s in ranges.values() for _, n in s) / 2**20,
             args.repeat))
    print("%-40s %5s %9s %9s %8s %13s %13s" % ("path", "cache", "GB/s", "median s", "x pread", "x range",
                                               "peak RSS +MiB"))
    loop_ratios = {}
    for cold in {"both": (True, False), "cold": (True,), "warm": (False,)}[args.cache]:
        # Rounds: each runs every mode once, so a mode's ratio is paired with
        # the baseline of its own round (robust to load that changes between
        # rounds); medians and ranges over the rounds are printed.
        times = {key: [] for key, _, _ in modes}
        peaks = {key: 0 for key, _, _ in modes}
        volume = {}
        for _ in range(args.repeat):
            for key, label, fn in modes:
                reset_peak_rss()
                rss0 = status_bytes("VmRSS:")
                if cold:
                    drop_cache(shard_paths)
                t0 = time.perf_counter()
                volume[key] = fn()
                times[key].append(time.perf_counter() - t0)
                peaks[key] = max(peaks[key], status_bytes("VmHWM:") - rss0)
        base = times[modes[0][0]]
        for key, label, fn in modes:
            ratios = sorted(b / t for b, t in zip(base, times[key]))
            med = statistics.median(times[key])
            print("%-40s %5s %9.2f %9.3f %7.2fx %13s %13.1f" % (
                label, "cold" if cold else "warm", volume[key] / med / 1e9, med, statistics.median(ratios),
                "%.2f-%.2fx" % (ratios[0], ratios[-1]), max(0, peaks[key]) / 2**20))
        if "sglang-loop" in times and "sglang-ref" in times:
            loop_ratios[cold] = (statistics.median(times["sglang-loop"]), statistics.median(times["sglang-ref"]),
                                 sorted(r / o for o, r in zip(times["sglang-loop"], times["sglang-ref"])),
                                 statistics.median(base))
    print("(x pread = baseline time / mode time, paired per round: median and range over %d rounds; peak RSS ="
          " growth of VmHWM during the mode; the copyto buffers are allocated in the first round)" % args.repeat)
    for cold, (ours, ref, r, raw) in loop_ratios.items():
        print("SGLang's loop (%s): k3pack %.3f s, SGLang-model iterator %.3f s (medians): %.2fx, range %.2f-%.2fx"
              " (target >= 10x against SGLang itself; the model is faster than SGLang, see"
              " bench/sglang_iterator_ref.py)" % ("cold" if cold else "warm", ours, ref, statistics.median(r), r[0],
                                                   r[-1]))
        # Any loop gets every stored byte out of the files at least once: the
        # raw read of the same ranges is the scale of what is left to win. It
        # is one thread with sequential advice, not the fastest read there
        # is (k3pack's copy mode asks for more read-ahead and can beat it),
        # so it is a reference, not a bound.
        print("  the loop reads every stored byte: the raw pread baseline (one thread) takes %.3f s; the model's"
              " loop takes %.2fx that, k3pack's %.2fx" % (raw, ref / raw, ours / raw))
    if tmp:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


_FILES = {}


def files_cache(path):
    g = _FILES.get(path)
    if g is None:
        g = _FILES[path] = k3pack.GGUFFile(path)
    return g


if __name__ == "__main__":
    main()
