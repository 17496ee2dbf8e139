"""k3pack.dequantize, pack/manifest/verify operations and ExpertStore,
checked against the oracle (own decoders, own pack index reader, GGUF bytes)."""

import hashlib
import os
import struct
import unittest

import numpy as np

import _util
import gguf_oracle as oracle
import k3pack


def oracle_q8_0(raw):
    """ggml Q8_0: per 32 elements an f16 scale then 32 int8; y = q * d (float32)."""
    blocks = raw.reshape(-1, 34)
    d = blocks[:, :2].copy().view("<f2").astype(np.float32)
    q = blocks[:, 2:].view(np.int8).astype(np.float32)
    return (q * d).astype(np.float32).reshape(-1)


def oracle_q4_0(raw):
    """ggml Q4_0: f16 scale, 16 bytes of nibbles; low nibbles are elements
    0..15, high nibbles 16..31, value (n - 8) * d."""
    blocks = raw.reshape(-1, 18)
    d = blocks[:, :2].copy().view("<f2").astype(np.float32)
    qs = blocks[:, 2:]
    lo = (qs & 0x0F).astype(np.int32) - 8
    hi = (qs >> 4).astype(np.int32) - 8
    return (np.concatenate([lo, hi], axis=1).astype(np.float32) * d).astype(np.float32).reshape(-1)


def _f16(cols):
    return cols.copy().view("<f2").astype(np.float32).reshape(-1)


def oracle_q2_k(raw):
    """ggml Q2_K (gguf doc 3.3): scales[16], qs[64], d, dmin; halves of 128,
    shifts 0,2,4,6, two groups of 16 per shift; y = (d*sc)*q - dmin*m."""
    b = raw.reshape(-1, 84)
    scales, qs = b[:, :16], b[:, 16:80]
    d, dmin = _f16(b[:, 80:82]), _f16(b[:, 82:84])
    out, col = np.empty((b.shape[0], 256), np.float32), 0
    for h in range(2):
        for j in range(4):
            for g in range(2):
                sc = scales[:, 8 * h + 2 * j + g]
                q = ((qs[:, 32 * h + 16 * g: 32 * h + 16 * g + 16] >> (2 * j)) & 3).astype(np.float32)
                dl = d * (sc & 0xF).astype(np.float32)
                ml = dmin * (sc >> 4).astype(np.float32)
                out[:, col:col + 16] = dl[:, None] * q - ml[:, None]
                col += 16
    return out.reshape(-1)


def oracle_q3_k(raw):
    """ggml Q3_K (gguf doc 3.3): hmask[32], qs[64], 12 bytes of 6-bit scales, d."""
    b = raw.reshape(-1, 110)
    hmask, qs, sb = b[:, :32], b[:, 32:96], b[:, 96:108].astype(np.int32)
    d = _f16(b[:, 108:110])
    sc = []
    for i in range(16):
        low = sb[:, i] & 0xF if i < 8 else sb[:, i - 8] >> 4
        high = (sb[:, 8 + i % 4] >> (2 * (i // 4))) & 3
        sc.append((low | (high << 4)) - 32)
    out, col = np.empty((b.shape[0], 256), np.float32), 0
    for h in range(2):
        for j in range(4):
            m = 1 << (4 * h + j)
            for g in range(2):
                q = ((qs[:, 32 * h + 16 * g: 32 * h + 16 * g + 16] >> (2 * j)) & 3).astype(np.int32)
                q = q - np.where(hmask[:, 16 * g: 16 * g + 16] & m, 0, 4)
                dl = d * sc[8 * h + 2 * j + g].astype(np.float32)
                out[:, col:col + 16] = dl[:, None] * q.astype(np.float32)
                col += 16
    return out.reshape(-1)


class Dequantize(unittest.TestCase):
    def setUp(self):
        self.rng = np.random.default_rng(11)

    def blocks(self, n, size, scale_ok=True):
        raw = self.rng.integers(0, 256, size=(n, size), dtype=np.uint8)
        # Finite scales: f16 in [-2, 2].
        raw[:, :2] = np.frombuffer(self.rng.uniform(-2, 2, n).astype("<f2").tobytes(), np.uint8).reshape(n, 2)
        return raw

    def test_q8_0(self):
        raw = self.blocks(12, 34).reshape(3, 4 * 34)  # 3 rows of 128 elements
        out = k3pack.dequantize(raw, "Q8_0")
        self.assertEqual((out.dtype, out.shape), (np.float32, (3, 128)))
        np.testing.assert_array_equal(out.reshape(-1), oracle_q8_0(raw.reshape(-1)))

    def test_q4_0_by_id(self):
        raw = self.blocks(8, 18).reshape(2, 4 * 18)
        out = k3pack.dequantize(raw, 2)
        np.testing.assert_array_equal(out.reshape(-1), oracle_q4_0(raw.reshape(-1)))

    def test_q2_k_q3_k(self):
        raw = self.rng.integers(0, 256, size=(6, 84), dtype=np.uint8)
        raw[:, 80:84] = np.frombuffer(self.rng.uniform(-1, 1, 12).astype("<f2").tobytes(), np.uint8).reshape(6, 4)
        np.testing.assert_array_equal(k3pack.dequantize(raw.reshape(2, 3 * 84), "Q2_K").reshape(-1),
                                      oracle_q2_k(raw))
        raw = self.rng.integers(0, 256, size=(6, 110), dtype=np.uint8)
        raw[:, 108:110] = np.frombuffer(self.rng.uniform(-1, 1, 6).astype("<f2").tobytes(), np.uint8).reshape(6, 2)
        np.testing.assert_array_equal(k3pack.dequantize(raw.reshape(3, 2 * 110), "Q3_K").reshape(-1),
                                      oracle_q3_k(raw))

    def test_f16_bf16_f32(self):
        x = self.rng.standard_normal((4, 8)).astype("<f2")
        np.testing.assert_array_equal(k3pack.dequantize(x, "F16"), x.astype(np.float32))
        bits = self.rng.integers(0, 0x7F00, size=(4, 8), dtype=np.uint16)  # finite positive bf16
        as_bytes = bits.astype("<u2").view(np.uint8).reshape(4, 16)
        want = (bits.astype(np.uint32) << 16).view(np.float32)
        np.testing.assert_array_equal(k3pack.dequantize(as_bytes, "BF16"), want)
        y = self.rng.standard_normal(5).astype(np.float32)
        np.testing.assert_array_equal(k3pack.dequantize(y, "F32"), y)

    def test_bad_input(self):
        with self.assertRaises(ValueError):
            k3pack.dequantize(np.zeros((2, 33), np.uint8), "Q8_0")  # not whole blocks
        with self.assertRaises(ValueError):
            k3pack.dequantize(np.zeros(4, np.uint8), "NOPE")

    def test_stats(self):
        x = np.array([1.0, -3.0, np.nan, np.inf, 2.0], dtype=np.float32)
        s = k3pack.tensor_stats(x, "F32")
        self.assertEqual((s["min"], s["max"], s["nan_count"], s["inf_count"], s["count"]), (-3.0, 2.0, 1, 1, 5))
        self.assertIn(k3pack.quant_isa(), ("scalar", "avx2", "avx512"))


class PackManifestStore(unittest.TestCase):
    """Tiny model -> build_pack -> create_manifest -> verify / stream / store."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = _util.TempDir()
        cls.model = os.path.join(cls.tmp.path, "model")
        _util.synth(cls.model, all_data=True)
        cls.config = os.path.join(cls.model, "config.json")
        cls.pack = os.path.join(cls.tmp.path, "tiny.expert-major.pack")
        cls.manifest = os.path.join(cls.tmp.path, "kimi-k3-expert-pack.manifest.json")
        cls.progress = []
        cls.built = k3pack.build(cls.model, cls.config, os.path.join(cls.model, "tokenizer"), pack=cls.pack,
                                 manifest=cls.manifest, profile="scaled", safety_margin_gib=0,
                                 progress=cls.progress.append)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def pack_index(self):
        """The pack's index read by hand (spec 1.1): {(name, expert): (offset, nbytes)}."""
        with open(self.pack, "rb") as f:
            head = f.read(40)
            magic, version, header_size, count, data_start = struct.unpack("<16sIIQQ", head)
            self.assertEqual((magic, version, header_size), (b"GGMLMOEPACKv1\0\0\0", 1, 40))
            entries = {}
            for _ in range(count):
                name, expert, reserved, offset, nbytes = struct.unpack("<128siIQQ", f.read(152))
                entries[(name.split(b"\0")[0].decode(), expert)] = (offset, nbytes)
        return entries, count

    def test_build_result_and_manifest(self):
        b = self.built["pack"]
        self.assertEqual(b["pack"], os.path.realpath(self.pack))
        self.assertEqual(b["size"], os.path.getsize(self.pack))
        entries, count = self.pack_index()
        self.assertEqual(b["index_count"], count)
        with open(self.pack, "rb") as f:
            self.assertEqual(hashlib.sha256(f.read(40 + 152 * count)).hexdigest(), b["index_sha256"])
        doc = k3pack.read_manifest(self.manifest)
        self.assertEqual(doc, self.built["document"])
        self.assertEqual(doc["format"], "SGLANG-KIMI-GGMLMOEPACK-ADAPTER-v1")
        self.assertEqual(doc["expert_pack"]["index_sha256"], b["index_sha256"])
        self.assertEqual(doc["k3pack"]["profile"], "scaled")
        with open(self.manifest, "rb") as f:
            self.assertEqual(f.read(), k3pack.serialize_manifest(doc))
        self.assertTrue(self.progress)

    def test_an_empty_shard_directory_is_reported_before_the_config(self):
        # SGLang's prepare_kimi_pack discovers the shards before it reads the
        # config: a directory without shards whose config.json is not K3's
        # says "no GGUF files found", not the invariants mismatch.
        empty = os.path.join(self.tmp.path, "no-shards")
        os.makedirs(empty, exist_ok=True)
        for call in (lambda: k3pack.build(empty, self.config, profile="kimi-k3"),
                     lambda: k3pack.build_pack(empty, self.config, profile="kimi-k3")):
            with self.assertRaises(ValueError) as e:
                call()
            self.assertEqual(str(e.exception).splitlines()[0], "no GGUF files found in " + os.path.realpath(empty))

    def test_build_hashes_the_shards_once_beside_the_copy(self):
        # k3pack.build hashes every whole shard during the pack copy and hands the
        # digests to the manifest, as `k3pack build` does: one read of the shards.
        shards = [os.path.realpath(p) for p in k3pack.ShardSet.discover(self.model)]
        want = {}
        for p in shards:
            with open(p, "rb") as f:
                want[p] = hashlib.sha256(f.read()).hexdigest()
        self.assertEqual(self.built["pack"]["source_sha256"], want)
        recorded = {os.path.realpath(s["path"]): s["sha256"] for s in self.built["document"]["source"]["shards"]}
        self.assertEqual(recorded, want)

    def test_create_manifest_takes_known_shard_hashes_without_reading(self):
        # A digest given in known_shard_sha256 is recorded as given (the shard is
        # not read again): a made-up value shows it was used.
        shards = [os.path.realpath(p) for p in k3pack.ShardSet.discover(self.model)]
        made_up = {shards[0]: "ab" * 32}
        doc = k3pack.create_manifest(self.model, self.pack, self.config, os.path.join(self.model, "tokenizer"),
                                     profile="scaled", known_shard_sha256=made_up)
        recorded = {os.path.realpath(s["path"]): s["sha256"] for s in doc["source"]["shards"]}
        self.assertEqual(recorded[shards[0]], "ab" * 32)
        for p in shards[1:]:
            self.assertEqual(recorded[p], self.built["pack"]["source_sha256"][p])

    def test_pack_payloads_equal_gguf_slices(self):
        entries, _ = self.pack_index()
        shards = [oracle.OracleGGUF(p) for p in k3pack.ShardSet.discover(self.model)]
        tensors = {t.name: t for s in shards for t in s.tensors}
        with open(self.pack, "rb") as f:
            for (name, expert), (offset, nbytes) in list(entries.items())[::7]:
                src = tensors[name].data.reshape(-1)[expert * nbytes:(expert + 1) * nbytes]
                f.seek(offset)
                self.assertEqual(f.read(nbytes), src.tobytes(), (name, expert))

    def test_validate_and_verify(self):
        section = k3pack.validate_pack(self.pack, self.model, self.config, profile="scaled")
        self.assertEqual(section["index_sha256"], self.built["pack"]["index_sha256"])
        # profile=None (the default): the profile synth recorded, as build_pack.
        self.assertEqual(k3pack.validate_pack(self.pack, self.model, self.config), section)
        r = k3pack.verify_pack(self.manifest)
        self.assertEqual((r["structure"], r["payload_mode"]), ("ok", "samples"))
        self.assertGreater(r["entries_checked"], 0)
        full = k3pack.verify_pack(self.manifest, full=True)
        self.assertEqual(full["entries_checked"], self.built["pack"]["index_count"])

    def test_dequantize_synth_tensors(self):
        s = k3pack.ShardSet(self.model)
        decoders = {"Q2_K": oracle_q2_k, "Q3_K": oracle_q3_k, "Q8_0": oracle_q8_0}
        checked = set()
        for t in s.tensors:
            if t.type in decoders and t.type not in checked:
                got = k3pack.dequantize_tensor(s, t.name)
                self.assertEqual(got.shape, tuple(reversed(t.shape)))
                raw = s.tensor_data(t.name, layout="raw")
                np.testing.assert_array_equal(got.reshape(-1), decoders[t.type](raw), t.name)
                checked.add(t.type)
        self.assertEqual(checked, set(decoders))

    def test_rebuild_is_already_built(self):
        # As `k3pack pack`: the valid pack of these shards is reported and kept (test_output_rules.py).
        r = k3pack.build_pack(self.model, self.config, out=self.pack, profile="scaled", safety_margin_gib=0)
        self.assertTrue(r["already_built"])
        self.assertEqual(r["index_sha256"], self.built["pack"]["index_sha256"])

    def test_stream_from_real_manifest_matches_oracle(self):
        want = [(n, v) for n, v, _ in oracle.sglang_nonexpert_weights(self.manifest)]
        got = list(k3pack.nonexpert_weights(self.manifest, sglang_compat=True))
        self.assertEqual([n for n, _ in got], [n for n, _ in want])

    def test_expert_store(self):
        entries, _ = self.pack_index()
        doc = k3pack.read_manifest(self.manifest)
        layers = doc["model"]["active_moe_layer_ids"]
        top_k = doc["model"]["num_experts_per_token"]
        n_exp = doc["model"]["num_experts"]
        stats_path = os.path.join(self.tmp.path, "stats.json")
        with k3pack.ExpertStore(self.pack, self.manifest, cache_bytes=64 << 20, stats_path=stats_path) as store:
            self.assertEqual(store.info["top_k"], top_k)
            ids = np.array([[(3 * k + 1) % n_exp for k in range(top_k)], list(range(top_k))], dtype=np.int64)
            layer = layers[-1]
            with open(self.pack, "rb") as f:
                acq = store.acquire(layer, ids)
                self.assertEqual(len(acq), ids.size)
                self.assertEqual(acq.experts, [int(e) for e in ids.reshape(-1)])
                for view in acq.routes:
                    for role in ("up", "gate", "down"):
                        off, nb = entries[("blk.%d.ffn_%s_exps.weight" % (layer, role), view.expert)]
                        f.seek(off)
                        arr = getattr(view, role)
                        self.assertFalse(arr.flags.writeable)
                        self.assertEqual(arr.tobytes(), f.read(nb))
                acq.mark_used()
                self.assertTrue(acq.released)
                # Views stay valid after release.
                off, nb = entries[("blk.%d.ffn_up_exps.weight" % layer, acq.routes[0].expert)]
                f.seek(off)
                self.assertEqual(acq.routes[0].up.tobytes(), f.read(nb))
            tok = store.acquire_token(layers[0], np.arange(top_k))
            self.assertEqual(tok.experts, list(range(top_k)))
            tok.mark_used()
            store.prefetch(layers[0], np.arange(4))
            snap = store.snapshot()
            self.assertEqual(snap["cache_policy"], "reuse-lfu-lru-v2")
            self.assertGreater(snap["cache_misses"], 0)
            with self.assertRaises(ValueError) as cm:
                store.acquire(layer, np.zeros((1, top_k + 1), np.int64))
            self.assertIn("runtime top-k must be exactly", str(cm.exception))
            with self.assertRaises(ValueError):
                store.acquire(layer, np.full((1, top_k), n_exp, np.int64))
        self.assertTrue(os.path.exists(stats_path))


if __name__ == "__main__":
    unittest.main()
