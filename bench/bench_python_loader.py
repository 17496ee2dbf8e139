#!/usr/bin/env python3
"""Throughput of k3pack's Python non-expert weight iterator.

Streams every non-routed weight of a manifest through
  1. k3pack.nonexpert_weights (numpy, zero-copy): what handing out costs;
  2. the same + one numpy copy per tensor (a consumer copying into its own
     buffers, as a model's weight_loader does);
  3. k3pack.sglang.kimi_k3_nonexpert_weights_iterator (torch, zero-copy) and
     with copy=True (SGLang's torch.tensor() copies);
and compares them with a baseline measured in the same run: numpy copies of
the same tensors' bytes straight out of freshly opened GGUF mappings
(k3pack.GGUFFile raw views: no name mapping, no checks). Ratios are printed, never asserted.

    python3 bench/bench_python_loader.py                  # synthesizes a model (needs the CLI)
    python3 bench/bench_python_loader.py --manifest M.json
Options: --repeat N, --hidden N (synth size), --keep DIR.
"""

import argparse
import hashlib
import json
import os
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


def best_of(repeat, fn):
    best = None
    result = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    return best, result


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--manifest")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=1024, help="hidden size of the synthesized model")
    ap.add_argument("--keep", help="directory for the synthesized model (kept)")
    args = ap.parse_args()

    tmp = None
    manifest = args.manifest
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
    files = {int(s["index"]): k3pack.GGUFFile(s["path"]) for s in doc["source"]["shards"]}
    for g in files.values():  # warm the page cache
        for t in g.tensors:
            g.tensor_data(t.name, layout="raw").sum()

    def stream_only():
        n = b = 0
        for name, arr in k3pack.nonexpert_weights(manifest, release_pages=False):
            n += 1
            b += arr.nbytes
        return n, b

    def stream_copy():
        b = 0
        for name, arr in k3pack.nonexpert_weights(manifest, release_pages=False):
            b += np.array(arr).nbytes
        return b

    # Baseline: the same tensors' bytes copied straight out of freshly opened
    # GGUF mappings (like the stream, each run maps the shards anew).
    emitted_sources = {r.source_name for r in k3pack.nonexpert_tensors(manifest)}
    shard_paths = [s["path"] for s in doc["source"]["shards"]]

    def baseline_copy():
        b = 0
        for path in shard_paths:
            g = k3pack.GGUFFile(path)
            for t in g.tensors:
                if t.name in emitted_sources:
                    b += np.array(g.tensor_data(t.name, layout="raw")).nbytes
        return b

    t_stream, (count, nbytes) = best_of(args.repeat, stream_only)
    t_copy, _ = best_of(args.repeat, stream_copy)
    t_base, base_bytes = best_of(args.repeat, baseline_copy)

    rows = [("k3pack.nonexpert_weights (zero-copy, numpy)", t_stream, nbytes),
            ("k3pack.nonexpert_weights + numpy copy", t_copy, nbytes),
            ("baseline: numpy copy of raw GGUF views", t_base, base_bytes)]
    try:
        import torch  # noqa: F401

        from k3pack.sglang import kimi_k3_nonexpert_weights_iterator as it

        def torch_stream(copy):
            b = 0
            for name, t in it(manifest, copy=copy, release_pages=False):
                b += t.numel() * t.element_size()
            return b

        t_torch, tb = best_of(args.repeat, lambda: torch_stream(False))
        t_torch_copy, _ = best_of(args.repeat, lambda: torch_stream(True))
        rows += [("k3pack.sglang iterator (zero-copy, torch)", t_torch, tb),
                 ("k3pack.sglang iterator copy=True (SGLang-like)", t_torch_copy, tb)]
    except ImportError:
        pass

    print("manifest: %s" % manifest)
    print("tensors emitted: %d, bytes: %d (%.1f MiB), best of %d" % (count, nbytes, nbytes / 2**20, args.repeat))
    print("%-48s %10s %10s %12s %9s" % ("path", "ms", "GB/s", "tensors/s", "vs base"))
    for label, t, b in rows:
        print("%-48s %10.2f %10.2f %12.0f %8.2fx" % (label, t * 1e3, b / t / 1e9, count / t, t_base / t))
    if tmp:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
