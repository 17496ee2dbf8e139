#!/usr/bin/env python3
"""k3pack's pack builder in-process against a model of SGLang's writer.

Synthesizes a model whose routed experts total about --mib MiB (real bytes),
then in --repeat paired rounds (the order within a pair alternating) builds
its expert pack with k3pack.build_pack (Python binding, in this process:
SHA-256 and CRC32C digests, checkpoints, fsync) and with
bench/sglang_writer_ref.py (SGLang's write_ggml_moe_pack as the spec states
it: one Python loop, 16 MiB chunks, no hashing), each from a cold page cache
(sources fdatasync-ed and dropped) into a fresh file, and prints the paired
ratio: median and range over the rounds. The two packs are compared byte for
byte once. Each round also writes the pack's size from memory with O_DIRECT
(64 MiB of random bytes cycled in 8 MiB writes, then fsync) and reads the
source shards cold with O_DIRECT: the device's write and read ceilings in
the same run. A writer reads every byte and writes it, so it can take no
less than the slower of the two; the summary says what ratio to the model
writer that floor allows (the ">= 2x SGLang's writer" target) and how close
k3pack is to it. Ratios are printed, never asserted.

    python3 bench/bench_python_pack.py [--mib N] [--repeat N] [--keep DIR]
"""

import argparse
import filecmp
import glob
import mmap
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import k3pack  # noqa: E402
import sglang_writer_ref  # noqa: E402
from bench_python_loader import drop_cache  # noqa: E402

# Routed expert tensors of the synthesized model: 3 MoE layers, up/gate Q2_K
# and down Q3_K at 2048 x 2048 (as bench_pack's model).
OBJECT_BYTES = 2 * 2048 * 2048 // 256 * 84 + 2048 * 2048 // 256 * 110
MOE_LAYERS = 3


def direct_write_ceiling(path, nbytes, chunk=8 << 20, pool_chunks=8):
    """Seconds to write nbytes (rounded up to chunks) from memory with
    O_DIRECT plus fsync into a fresh file: what the device accepts."""
    pool = []
    for _ in range(pool_chunks):
        buf = mmap.mmap(-1, chunk)  # page-aligned, as O_DIRECT wants
        buf.write(os.urandom(chunk))
        pool.append(buf)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_DIRECT, 0o644)
    try:
        t0 = time.perf_counter()
        done, i = 0, 0
        while done < nbytes:
            done += os.write(fd, pool[i % pool_chunks])
            i += 1
        os.fsync(fd)
        return time.perf_counter() - t0
    finally:
        os.close(fd)
        os.remove(path)
        for buf in pool:
            buf.close()


def direct_read_ceiling(paths, chunk=8 << 20):
    """(bytes, seconds) to read whole files with O_DIRECT from a cold cache:
    what the device gives a reader of the sources."""
    drop_cache(paths)
    buf = mmap.mmap(-1, chunk)
    total, t0 = 0, time.perf_counter()
    try:
        for path in paths:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
            try:
                while True:
                    n = os.readv(fd, [buf])
                    total += n
                    if n < chunk:
                        break
            finally:
                os.close(fd)
        return total, time.perf_counter() - t0
    finally:
        buf.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=1024, help="routed expert bytes of the model, MiB")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", help="directory for the synthesized model (kept)")
    args = ap.parse_args()
    if args.mib < 1 or args.repeat < 1:
        ap.error("--mib and --repeat must be positive")

    work = tempfile.mkdtemp(prefix="k3bench-pack-")
    model = args.keep or os.path.join(work, "model")
    experts = max(8, (args.mib << 20) // (OBJECT_BYTES * MOE_LAYERS))
    cli = os.environ.get("K3PACK_BIN") or os.path.join(REPO, "build", "k3pack")
    if not glob.glob(os.path.join(model, "*.gguf")):
        subprocess.run([cli, "synth", "--preset", "tiny", "--out", model, "--layers", str(MOE_LAYERS + 1),
                        "--experts", str(experts), "--latent", "2048", "--moe-intermediate", "2048"],
                       check=True, stdout=subprocess.DEVNULL)
    shards = sorted(glob.glob(os.path.join(model, "*.gguf")))
    config = os.path.join(model, "config.json")
    ours, ref = os.path.join(work, "k3pack.pack"), os.path.join(work, "sglang-model.pack")

    def clean():
        for p in glob.glob(ours + "*") + glob.glob(ref + "*"):
            os.remove(p)

    def timed(fn):
        clean()
        os.sync()
        drop_cache(shards)
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    run_ours = lambda: k3pack.build_pack(model, config, out=ours, profile="scaled", safety_margin_gib=0)  # noqa: E731
    run_ref = lambda: sglang_writer_ref.write_pack(shards, ref)  # noqa: E731
    run_ours()
    run_ref()
    same = filecmp.cmp(ours, ref, shallow=False)
    size = os.path.getsize(ours)
    print("model: %d experts x %d MoE layers, pack %.1f MiB; the two packs are %s" %
          (experts, MOE_LAYERS, size / 2**20, "byte-identical" if same else "DIFFERENT"))
    t_ours, t_ref, t_ceiling, t_read, ratios = [], [], [], [], []
    for r in range(args.repeat):
        if r % 2 == 0:
            a, b = timed(run_ours), timed(run_ref)
        else:
            b, a = timed(run_ref), timed(run_ours)
        c = direct_write_ceiling(os.path.join(work, "ceiling.bin"), size)
        read_bytes, read_s = direct_read_ceiling(shards)
        t_ours.append(a)
        t_ref.append(b)
        t_ceiling.append(c)
        t_read.append(size * read_s / read_bytes)
        ratios.append(b / a)
        print("round %d: k3pack.build_pack %.2f s (%.0f MB/s), SGLang-model writer %.2f s (%.0f MB/s): %.2fx; "
              "O_DIRECT write from memory %.0f MB/s, cold O_DIRECT read %.0f MB/s  load %s"
              % (r + 1, a, size / a / 1e6, b, size / b / 1e6, b / a, size / c / 1e6, size / t_read[-1] / 1e6,
                 " ".join(open("/proc/loadavg").read().split()[:3])))
    ratios.sort()
    print("in-process pack build vs SGLang-model writer: %.2fx (range %.2f-%.2fx, median of %d paired rounds; "
          "target >= 2x; k3pack %.2f s, model %.2f s medians; k3pack also hashes every payload)"
          % (statistics.median(ratios), ratios[0], ratios[-1], len(ratios), statistics.median(t_ours),
             statistics.median(t_ref)))
    # A writer must read the sources cold and write the pack: with the two
    # fully overlapped it still takes the slower of the two alone.
    floor = max(statistics.median(t_ceiling), statistics.median(t_read))
    print("device ceilings (medians): O_DIRECT write from memory %.0f MB/s, cold O_DIRECT read of the sources "
          "%.0f MB/s; no writer can take less than %.2f s (the slower of the two), so the most any writer can reach "
          "is %.2fx the model writer (target 2x); k3pack takes %.2fx that floor"
          % (size / statistics.median(t_ceiling) / 1e6, size / statistics.median(t_read) / 1e6, floor,
             statistics.median(t_ref) / floor, statistics.median(t_ours) / floor))
    clean()
    if not args.keep:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
