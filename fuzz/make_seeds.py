#!/usr/bin/python3
"""Regenerates the committed fuzz seed corpora, fuzz/corpus/<target>/.

Seeds come from `k3pack synth --preset tiny` outputs (GGUF shards cut down to
a few small tensors, the pack's header + index, the manifest, a routing
trace, the JSON files) plus crafted bad files, one per rule the decoders
enforce. Every seed stays under 64 KiB (fuzz.sh's -max_len) and the whole
corpus under 1 MiB, so it can be committed.

Usage: fuzz/make_seeds.py [path/to/k3pack]   (default: build/k3pack)
Files named regression-* are crash reproducers and are never touched.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "fuzz", "corpus")
MAX_SEED = 64 * 1024

# GGUF value types (gguf spec) and the sizes of the fixed-size ones.
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
FIXED = {U8: 1, I8: 1, U16: 2, I16: 2, U32: 4, I32: 4, F32: 4, BOOL: 1, U64: 8, I64: 8, F64: 8}


def run(*args):
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


class Reader:
    def __init__(self, data):
        self.d, self.p = data, 0

    def take(self, fmt):
        v = struct.unpack_from("<" + fmt, self.d, self.p)
        self.p += struct.calcsize("<" + fmt)
        return v[0] if len(v) == 1 else v

    def string(self):
        n = self.take("Q")
        s = self.d[self.p:self.p + n]
        self.p += n
        return s

    def value(self, t):
        """Skips one value of type t; returns its raw bytes."""
        start = self.p
        if t in FIXED:
            self.p += FIXED[t]
        elif t == STR:
            self.string()
        elif t == ARR:
            at, n = self.take("I"), self.take("Q")
            for _ in range(n):
                self.value(at)
        else:
            raise ValueError("bad GGUF value type %d" % t)
        return self.d[start:self.p]


def parse_gguf(data):
    r = Reader(data)
    magic, version, n_tensors, n_kv = r.take("4sIQQ")
    assert magic == b"GGUF", magic
    kvs = []
    for _ in range(n_kv):
        key = r.string()
        t = r.take("I")
        kvs.append((key, t, r.value(t)))
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        nd = r.take("I")
        dims = [r.take("Q") for _ in range(nd)]
        ggml_type, offset = r.take("I"), r.take("Q")
        tensors.append((name, dims, ggml_type, offset))
    align = 32
    for key, t, raw in kvs:
        if key == b"general.alignment" and t == U32:
            align = struct.unpack("<I", raw)[0]
    data_start = (r.p + align - 1) // align * align
    return version, kvs, tensors, align, data_start


def gstr(b):
    return struct.pack("<Q", len(b)) + b


def write_gguf(kvs, tensors, align=32, version=3, magic=b"GGUF", n_tensors=None, n_kv=None):
    """tensors: (name, dims, ggml_type, payload bytes); offsets are laid out here."""
    out = magic + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                              len(kvs) if n_kv is None else n_kv)
    for key, t, raw in kvs:
        out += gstr(key) + struct.pack("<I", t) + raw
    off, offsets = 0, []
    for _, _, _, payload in tensors:
        offsets.append(off)
        off = (off + len(payload) + align - 1) // align * align
    for (name, dims, ggml_type, _), o in zip(tensors, offsets):
        out += gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", ggml_type, o)
    out += b"\0" * (-len(out) % align)
    data_start = len(out)
    for (_, _, _, payload), o in zip(tensors, offsets):
        out += b"\0" * (data_start + o - len(out)) + payload
    out += b"\0" * (-len(out) % align)
    return out


def small_shard(path, max_tensors=4):
    """The shard's metadata (large arrays dropped) with its few smallest F32/F16 tensors."""
    data = open(path, "rb").read()
    _, kvs, tensors, align, data_start = parse_gguf(data)
    kept_kvs = [kv for kv in kvs if len(kv[2]) <= 1024]
    small = []
    for name, dims, ggml_type, offset in tensors:
        if ggml_type not in (0, 1):  # F32, F16
            continue
        n = 1
        for d in dims:
            n *= d
        nbytes = n * (4 if ggml_type == 0 else 2)
        if nbytes <= 2048:
            small.append((name, dims, ggml_type, data[data_start + offset:data_start + offset + nbytes]))
    return kept_kvs, small[:max_tensors], align


def put(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    assert len(data) <= MAX_SEED, (target, name, len(data))
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def clear_generated():
    for target in os.listdir(CORPUS) if os.path.isdir(CORPUS) else []:
        d = os.path.join(CORPUS, target)
        for n in os.listdir(d):
            if not n.startswith("regression-"):
                os.remove(os.path.join(d, n))


def gguf_seeds(model_dir):
    shards = sorted(os.path.join(model_dir, n) for n in os.listdir(model_dir) if n.endswith(".gguf"))
    parts = [small_shard(path) for path in shards]
    # The cut-down set must still agree on split.tensors.count.
    count = sum(len(tensors) for _, tensors, _ in parts)
    small = []
    for i, (kvs, tensors, align) in enumerate(parts):
        kvs = [(k, t, struct.pack("<i", count) if k == b"split.tensors.count" and t == I32 else raw)
               for k, t, raw in kvs]
        img = write_gguf(kvs, tensors, align)
        small.append(img)
        put("gguf_reader", "synth-tiny-shard%d" % (i + 1), img)
    kvs, tensors, align = parts[0]
    good = small[0]
    t0 = tensors[0]
    # Crafted bad files: one per rule of the reader.
    put("gguf_reader", "bad-magic", write_gguf(kvs, tensors, align, magic=b"GGUX"))
    put("gguf_reader", "bad-version-4", write_gguf(kvs, tensors, align, version=4))
    put("gguf_reader", "bad-version-1", write_gguf(kvs, tensors, align, version=1))
    put("gguf_reader", "truncated-in-header", good[:20])
    put("gguf_reader", "truncated-in-metadata", good[:len(good) // 3])
    put("gguf_reader", "truncated-in-data", good[:-8])
    put("gguf_reader", "huge-tensor-count", write_gguf(kvs, tensors, align, n_tensors=1 << 60))
    put("gguf_reader", "huge-kv-count", write_gguf(kvs, tensors, align, n_kv=(1 << 64) - 1))
    put("gguf_reader", "huge-string-length",
        b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1 << 62) + b"key")
    put("gguf_reader", "bad-value-type", b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gstr(b"k") + struct.pack("<I", 99))
    put("gguf_reader", "nested-array",
        b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gstr(b"a") + struct.pack("<IIQ", ARR, ARR, 1) +
        struct.pack("<IQ", U8, 2) + b"\1\2")
    put("gguf_reader", "huge-array-count",
        b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gstr(b"a") + struct.pack("<IIQ", ARR, U64, 1 << 61))
    put("gguf_reader", "duplicate-key", write_gguf(kvs + kvs[:1], tensors, align))
    put("gguf_reader", "duplicate-tensor", write_gguf(kvs, tensors + tensors[:1], align))
    put("gguf_reader", "zero-dim", write_gguf(kvs, [(t0[0], [0] + t0[1][1:], t0[2], b"")], align))
    put("gguf_reader", "five-dims", write_gguf(kvs, [(t0[0], [1, 1, 1, 1, 1], 0, b"\0" * 4)], align))
    put("gguf_reader", "huge-extents", write_gguf(kvs, [(t0[0], [1 << 40, 1 << 40], 0, b"\0" * 4)], align))
    put("gguf_reader", "bad-ggml-type", write_gguf(kvs, [(t0[0], t0[1], 200, t0[3])], align))
    put("gguf_reader", "bad-alignment",
        write_gguf([(b"general.alignment", U32, struct.pack("<I", 3))] + kvs, tensors, 32))
    # A tensor whose offset points past the end of the data.
    img = bytearray(good)
    _, _, ts, _, _ = parse_gguf(bytes(img))
    pos = bytes(img).rfind(gstr(ts[-1][0]))
    pos += len(gstr(ts[-1][0])) + 4 + 8 * len(ts[-1][1]) + 4
    struct.pack_into("<Q", img, pos, 1 << 40)
    put("gguf_reader", "tensor-offset-past-eof", bytes(img))
    struct.pack_into("<Q", img, pos, 1)
    put("gguf_reader", "tensor-offset-unaligned", bytes(img))
    return small


def cli_json_seeds():
    """The GGUF reader's seeds, plus files whose strings are not UTF-8 (the CLI
    printed them through nlohmann::json, which throws on such bytes)."""
    src = os.path.join(CORPUS, "gguf_reader")
    for n in sorted(os.listdir(src)):
        put("cli_json", n, open(os.path.join(src, n), "rb").read())
    version, kvs, tensors, align, data_start = parse_gguf(open(os.path.join(src, "synth-tiny-shard1"), "rb").read())
    good = open(os.path.join(src, "synth-tiny-shard1"), "rb").read()
    payloads = []
    for name, dims, ggml_type, offset in tensors:
        n = 1
        for d in dims:
            n *= d
        nbytes = n * (4 if ggml_type == 0 else 2)
        payloads.append((name, dims, ggml_type, good[data_start + offset:data_start + offset + nbytes]))
    named = [(k, t, gstr(b"bad\xffname") if k == b"general.name" else raw) for k, t, raw in kvs]
    if not any(k == b"general.name" for k, _, _ in kvs):
        named.append((b"general.name", STR, gstr(b"bad\xffname")))
    put("cli_json", "not-utf8-value", write_gguf(named, payloads, align))
    put("cli_json", "not-utf8-key", write_gguf(kvs + [(b"general.bad\xfekey", STR, gstr(b"x"))], payloads, align))
    t0 = payloads[0]
    put("cli_json", "not-utf8-tensor-name",
        write_gguf(kvs, [(t0[0] + b"\xc3(", t0[1], t0[2], t0[3])] + payloads[1:], align))
    tokens = [b"tok%d" % i for i in range(11)] + [b"\xed\xa0\x80"]  # a surrogate: not UTF-8 for Python
    arr = struct.pack("<IQ", STR, len(tokens)) + b"".join(gstr(t) for t in tokens)
    put("cli_json", "not-utf8-token", write_gguf(kvs + [(b"tokenizer.ggml.tokens", ARR, arr)], payloads, align))


def shard_set_seeds(small):
    sep = b"|||\n"
    put("shard_set", "synth-tiny-3-shards", b"\x02" + sep.join(small))
    put("shard_set", "synth-tiny-3-shards-and-mmproj", b"\x02" + sep.join(small + [small[0][:64]]))
    put("shard_set", "synth-tiny-shard1-alone", b"\x00" + small[0])
    put("shard_set", "synth-tiny-2-of-3", b"\x01" + sep.join(small[:2]))
    put("shard_set", "shards-swapped", b"\x02" + sep.join([small[1], small[0], small[2]]))
    put("shard_set", "one-shard-truncated", b"\x02" + sep.join([small[0], small[1][:100], small[2]]))
    put("shard_set", "same-shard-thrice", b"\x02" + sep.join([small[0]] * 3))


def pack_seeds(pack_path):
    with open(pack_path, "rb") as f:
        head = f.read(40)
        n = struct.unpack_from("<Q", head, 24)[0]
        prefix = head + f.read(n * 152)
    put("pack_index", "synth-tiny-header-index", prefix[:MAX_SEED])
    put("pack_index", "synth-tiny-header-first-entries", prefix[:40 + 8 * 152])
    e = bytearray(prefix[:40 + 4 * 152])
    put("pack_index", "bad-magic", b"GGMLMOEPACKv2" + bytes(e[13:]))
    bad = bytearray(e)
    struct.pack_into("<I", bad, 40 + 132, 1)
    put("pack_index", "reserved-nonzero", bytes(bad))
    bad = bytearray(e)
    bad[40:42] = b"\xff\xfe"
    put("pack_index", "name-not-utf8", bytes(bad))
    bad = bytearray(e)
    name = b"blk.01.ffn_up_exps.weight"
    bad[40:40 + 128] = name + b"\0" * (128 - len(name))
    put("pack_index", "name-leading-zero", bytes(bad))
    bad = bytearray(e)
    bad[40:40 + 128] = b"x" * 128
    put("pack_index", "name-unterminated", bytes(bad))
    bad = bytearray(e)
    bad[40 + 20:40 + 21] = b"\x01"  # a byte after the name's NUL
    put("pack_index", "name-padding-nonzero", bytes(bad))
    bad = bytearray(e)
    struct.pack_into("<QQ", bad, 40 + 136, (1 << 64) - 4096, (1 << 64) - 1)
    put("pack_index", "offset-nbytes-overflow", bytes(bad))
    put("pack_index", "truncated-header", prefix[:39])


def json_seeds(model_dir, manifest_path):
    manifest = open(manifest_path, "rb").read()
    put("manifest", "synth-tiny-manifest.json", manifest)
    m = json.loads(manifest)
    m2 = dict(m, complete=False)
    put("manifest", "incomplete.json", json.dumps(m2).encode())
    m3 = json.loads(manifest)
    del m3["expert_pack"]
    put("manifest", "missing-expert-pack.json", json.dumps(m3).encode())
    m4 = json.loads(manifest)
    m4["expert_pack"]["size"] = "12"
    put("manifest", "wrong-type.json", json.dumps(m4).encode())
    m5 = json.loads(manifest)
    m5["expert_pack"]["size"] = -1
    m5["source"]["shards"] = m5["source"]["shards"][:1]
    put("manifest", "negative-size-one-shard.json", json.dumps(m5).encode())
    m6 = json.loads(manifest)
    m6["expert_pack"]["index_count"] = 18446744073709551615
    put("manifest", "huge-count.json", json.dumps(m6).encode())
    put("manifest", "empty-object.json", b"{}")
    put("manifest", "not-an-object.json", b"[1, 2, 3]")

    put("pyjson", "synth-tiny-manifest.json", manifest)
    put("pyjson", "synth-tiny-config.json", open(os.path.join(model_dir, "config.json"), "rb").read())
    put("pyjson", "synth-tiny-tokenizer-config.json",
        open(os.path.join(model_dir, "tokenizer", "tokenizer_config.json"), "rb").read())
    put("pyjson", "floats.json", b"[0.1, 1e308, 5e-324, -0.0, 1.7976931348623157e308, 2.5e-8, 1e16, 123456789012.5]")
    put("pyjson", "ints.json", b"[0, -1, 9223372036854775807, -9223372036854775808, 18446744073709551615]")
    put("pyjson", "unicode.json", '{"k\\u00e9y": "\\ud83d\\ude00 \\u0000 \\t \\" \\\\ \\/ é 中", "": null}'.encode())
    put("pyjson", "nested.json", b"[" * 64 + b"{}" + b"]" * 64)
    put("pyjson", "scalars.json", b'{"t": true, "f": false, "n": null, "s": "", "a": [], "o": {}}')


def trace_seeds(trace_path):
    t = open(trace_path, "rb").read()
    put("trace", "synth-tiny-trace.k3t", t)
    put("trace", "truncated-header.k3t", t[:12])
    put("trace", "truncated-records.k3t", t[:len(t) // 2])
    put("trace", "bad-magic.k3t", b"K3TRACX\0" + t[8:])
    bad = bytearray(t)
    struct.pack_into("<I", bad, 8, 2)
    put("trace", "bad-version.k3t", bytes(bad))
    bad = bytearray(t)
    struct.pack_into("<I", bad, 24, 0xFFFFFFFF)
    put("trace", "huge-record-count.k3t", bytes(bad))
    # An expert id past num_experts: regression-expert-id-out-of-range (found by trace_fuzz).


def main():
    k3pack = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "k3pack"))
    with tempfile.TemporaryDirectory(prefix="k3pack-seeds-") as tmp:
        model = os.path.join(tmp, "model")
        pack = os.path.join(tmp, "tiny.pack")
        manifest = os.path.join(tmp, "tiny.json")
        trace = os.path.join(tmp, "tiny.k3t")
        run(k3pack, "synth", "--preset", "tiny", "--out", model)
        run(k3pack, "pack", "--gguf-dir", model, "--model-config", os.path.join(model, "config.json"), "--profile",
            "scaled", "--out", pack, "--safety-margin-gib", "0")
        run(k3pack, "manifest", "--gguf-dir", model, "--expert-pack", pack, "--model-config",
            os.path.join(model, "config.json"), "--tokenizer-dir", os.path.join(model, "tokenizer"), "--output",
            manifest, "--profile", "scaled")
        run(k3pack, "trace", "gen", "--manifest", manifest, "--requests", "1", "--prompt-tokens", "4",
            "--decode-tokens", "8", "--out", trace)
        clear_generated()
        small = gguf_seeds(model)
        cli_json_seeds()
        shard_set_seeds(small)
        pack_seeds(pack)
        json_seeds(model, manifest)
        trace_seeds(trace)
    total = 0
    for target in sorted(os.listdir(CORPUS)):
        files = os.listdir(os.path.join(CORPUS, target))
        size = sum(os.path.getsize(os.path.join(CORPUS, target, f)) for f in files)
        total += size
        print("%-12s %3d seeds %8d bytes" % (target, len(files), size))
    print("total %d bytes" % total)
    assert total < 1 << 20, "corpus over 1 MiB"


if __name__ == "__main__":
    main()
