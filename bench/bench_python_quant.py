#!/usr/bin/env python3
"""k3pack.dequantize (Python) against the C++ decoder on the same sizes.

Runs build/bench_quant --json for the C++ figures (one thread and T
threads, output buffer reused) and times k3pack.dequantize on arrays of the
same type and element count in this process: with out= (buffer reused, like
the C++ bench) and with a fresh output array per call. Prints GB/s of float
output and the ratio Python / C++ (target >= 0.9 for large arrays). Ratios
are printed, never asserted.

    python3 bench/bench_python_quant.py [--elements N] [--reps R] [--threads T] [--types Q2_K,BF16]
"""

import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))

import numpy as np  # noqa: E402

import k3pack  # noqa: E402

# Offsets of the fp16 scale fields made finite (as bench_quant.cpp does), so
# both sides decode ordinary values.
HALF_OFFSETS = {"Q2_K": [80, 82], "Q3_K": [108], "Q6_K": [208], "Q4_K": [0, 2], "Q5_K": [0, 2],
                "Q4_1": [0, 2], "Q5_1": [0, 2]}


def random_tensor(type_name, n, rng):
    info = k3pack.ggml_type_info(type_name)
    block, size = info["block_size"], info["type_size"]
    data = rng.integers(0, 256, n // block * size, dtype=np.uint8)
    if block == 1:
        if type_name in ("F16", "BF16"):
            data[1::2] &= 0x3F
        return data.view(np.uint16) if type_name == "F16" else data
    blocks = data.reshape(-1, size)
    for off in HALF_OFFSETS.get(type_name, [0]):
        blocks[:, off + 1] &= 0xBF
    return data


def best_of(reps, fn):
    best = None
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--elements", type=int, default=16 << 20)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--types", default="Q2_K,Q8_0,BF16,F16,IQ2_XS,IQ3_XXS,Q4_K,Q6_K")
    ap.add_argument("--bench-quant", default=os.path.join(REPO, "build", "bench_quant"))
    args = ap.parse_args()
    n = args.elements // 256 * 256

    cpp = {}
    proc = subprocess.run([args.bench_quant, "--elements", str(n), "--reps", str(args.reps), "--threads",
                           str(args.threads), "--types", args.types, "--json", "--no-matvec"],
                          check=True, stdout=subprocess.PIPE, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith("JSON "):
            rec = json.loads(line[5:])
            cpp[rec["type"]] = rec

    rng = np.random.default_rng(42)
    print("k3pack.dequantize vs C++ DequantizeRow/DequantizeParallel, %d elements, best of %d, %d threads, ISA %s"
          % (n, args.reps, args.threads, k3pack.quant_isa()))
    print("%-8s %10s %10s %7s %10s %10s %7s %12s" % ("type", "py 1t", "C++ 1t", "ratio", "py MT", "C++ MT", "ratio",
                                                   "py MT fresh"))
    for t in args.types.split(","):
        if t not in cpp:
            continue
        data = random_tensor(t, n, rng)
        out = k3pack.dequantize(data, t)  # the output shape, and pages faulted in once
        gb = out.size * 4 / 1e9
        py1 = gb / best_of(args.reps, lambda: k3pack.dequantize(data, t, threads=1, out=out))
        pymt = gb / best_of(args.reps, lambda: k3pack.dequantize(data, t, threads=args.threads, out=out))
        fresh = gb / best_of(args.reps, lambda: k3pack.dequantize(data, t, threads=args.threads))
        c1, cm = cpp[t]["gbs_1t"], cpp[t]["gbs_mt"]
        print("%-8s %10.2f %10.2f %6.2fx %10.2f %10.2f %6.2fx %12.2f" % (t, py1, c1, py1 / c1, pymt, cm, pymt / cm,
                                                                       fresh))
    print("(GB/s of float32 output; 'fresh' allocates a new output array per call, so it includes page faults)")


if __name__ == "__main__":
    main()
