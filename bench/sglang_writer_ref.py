"""A stand-in for SGLang's expert-pack writer, for benchmarks only.

SGLang cannot be installed on the development machine (no PyPI), so
bench_python_pack.py times this model of `write_ggml_moe_pack` instead,
written from the compatibility spec (§1.1 format, §6.3 errors, §8.1 writer
details), sharing no code with k3pack:

  * expert tensors are found in the GGUF headers by SGLang's regex; the
    layers are the ones that have them, the experts the slowest dimension;
  * refuses an existing pack or `.partial`, opens `.partial` with mode "xb";
  * writes the 40-byte header, the 152-byte entries (expert-major, physical
    role order up, gate, down) and zeros up to data_start;
  * then per entry: zeros up to its 4096-aligned offset and a copy of the
    expert's slice from the shard (opened unbuffered) in 16 MiB chunks;
  * flushes, fsyncs, checks the size and renames `.partial` onto the pack.

It hashes nothing and keeps no checkpoint (SGLang's writer has neither), so
k3pack's builder, which does both, is measured against less work than its
own. Its output is byte-identical to k3pack's pack (bench_python_pack.py and
tests/python/test_sglang_writer_model.py check that).
"""
import os
import re
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "manifest"))
import sglang_manifest_ref as gguf_ref  # noqa: E402  (struct-only GGUF header reader)

PACK_MAGIC = b"GGMLMOEPACKv1\0\0\0"
PACK_HEADER = struct.Struct("<16sIIQQ")
PACK_ENTRY = struct.Struct("<128siIQQ")
PACK_ALIGNMENT = 4096
ROLE_ORDER = ("up", "gate", "down")
EXPERT = re.compile(r"^blk\.(?P<layer>\d+)\.ffn_(?P<role>up|gate|down)_exps\.weight$")
COPY_CHUNK_BYTES = 16 * 1024 * 1024


def _align(n):
    return (n + PACK_ALIGNMENT - 1) // PACK_ALIGNMENT * PACK_ALIGNMENT


def expert_tensors(shard_paths):
    """{(layer, role): (path, data_offset, expert_bytes)} and the expert count."""
    found, experts = {}, None
    for path in shard_paths:
        _, tensors, _, data = gguf_ref.read_gguf(path)
        data.close()
        for t in tensors:
            m = EXPERT.fullmatch(t["name"])
            if not m:
                continue
            n = t["shape"][-1]
            experts = n if experts is None else experts
            found[(int(m["layer"]), m["role"])] = (path, t["data_offset"], t["nbytes"] // n)
    return found, experts


def layout(shard_paths):
    """(entry count, data_start, entries, final size); an entry is
    (name, expert, pack offset, bytes, shard path, source offset)."""
    found, experts = expert_tensors(shard_paths)
    layers = sorted({layer for layer, _ in found})
    count = len(layers) * experts * len(ROLE_ORDER)
    data_start = _align(PACK_HEADER.size + count * PACK_ENTRY.size)
    entries, cursor = [], data_start
    for layer in layers:
        for e in range(experts):
            for role in ROLE_ORDER:
                path, offset, nbytes = found[(layer, role)]
                cursor = _align(cursor)
                entries.append((f"blk.{layer}.ffn_{role}_exps.weight", e, cursor, nbytes, path, offset + e * nbytes))
                cursor += nbytes
    return count, data_start, entries, cursor


def header_and_index(count, data_start, entries):
    """The pack's first 40 + 152 * count bytes."""
    out = [PACK_HEADER.pack(PACK_MAGIC, 1, PACK_HEADER.size, count, data_start)]
    for name, e, offset, nbytes, _, _ in entries:
        encoded = name.encode("utf-8")
        if len(encoded) >= 128:
            raise ValueError(f"expert tensor name is too long for the Pack index: {name}")
        out.append(PACK_ENTRY.pack(encoded, e, 0, offset, nbytes))
    return b"".join(out)


def write_pack(shard_paths, out):
    if os.path.exists(out):
        raise FileExistsError(f"refusing to overwrite existing Expert Pack: {out}")
    partial = out + ".partial"
    if os.path.exists(partial):
        raise FileExistsError(f"partial Expert Pack already exists: {partial}")
    count, data_start, entries, final_size = layout(shard_paths)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    sources = {p: open(p, "rb", buffering=0) for p in shard_paths}
    try:
        with open(partial, "xb") as f:
            f.write(header_and_index(count, data_start, entries))
            f.write(b"\0" * (data_start - f.tell()))
            for _, _, offset, nbytes, path, src in entries:
                if offset < f.tell():
                    raise RuntimeError("Expert Pack layout moved backwards")
                f.write(b"\0" * (offset - f.tell()))
                s = sources[path]
                s.seek(src)
                remaining = nbytes
                while remaining:
                    chunk = s.read(min(COPY_CHUNK_BYTES, remaining))
                    if not chunk:
                        raise EOFError(f"short GGUF read at offset {src + nbytes - remaining}; {remaining} bytes remain")
                    f.write(chunk)
                    remaining -= len(chunk)
            f.flush()
            os.fsync(f.fileno())
            actual = f.tell()
        if actual != final_size:
            raise RuntimeError(f"generated Expert Pack size {actual} != {final_size}")
        os.replace(partial, out)
    finally:
        for s in sources.values():
            s.close()
    return final_size
