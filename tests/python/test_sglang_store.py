"""k3pack.sglang.KimiGGMLExpertPackStore driven the way SGLang's MoE layer
drives its store (acquire a layer's topk_ids, read device_cache[slots],
mark_used, next layer) on the synthetic model, on the CPU device; on CUDA
too when a GPU is present.

The reference for the hit / miss / eviction sequence and slot choice is a
model of SGLang's acquire/_victim_slot written here from the spec (§7.6);
object bytes are located by parsing the pack index here (spec §1.1)."""

import json
import os
import struct
import threading
import unittest

import _util  # noqa: F401  (import path)
import numpy as np
import torch

import k3pack
from k3pack.sglang import KimiGGMLExpertPackStore
from sglang_store_ref import SglangStoreModel


def pack_objects(pack_path):
    """(layer, expert) -> bytes of the object (up|gate|down), from the index."""
    with open(pack_path, "rb") as f:
        data = f.read()
    magic, version, header_size, count, data_start = struct.unpack_from("<16sIIQQ", data, 0)
    assert magic == b"GGMLMOEPACKv1\0\0\0" and header_size == 40
    objects = {}
    for i in range(0, count, 3):
        roles = []
        for r in range(3):
            name, expert, reserved, offset, nbytes = struct.unpack_from("<128siIQQ", data, 40 + (i + r) * 152)
            roles.append((name.split(b"\0")[0].decode(), expert, offset, nbytes))
        layer = int(roles[0][0].split(".")[1])
        start, end = roles[0][2], roles[2][2] + roles[2][3]
        objects[(layer, roles[0][1])] = data[start:end]
    return objects


class StoreCase(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = _util.TempDir()
        cls.pack, cls.manifest, doc = _util.build_tiny(cls.tmp.path)
        cls.layers = doc["model"]["active_moe_layer_ids"]
        cls.num_layers = doc["model"]["num_hidden_layers"]
        cls.experts = doc["model"]["num_experts"]
        cls.top_k = doc["model"]["num_experts_per_token"]
        cls.objects = pack_objects(cls.pack)
        cls.object_bytes = max(len(v) for v in cls.objects.values())

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def open(self, slots=None, **kw):
        kw.setdefault("cache_vram_mib", 3)  # tiny objects are 569,344 bytes: 5 slots
        kw.setdefault("cache_vram_reserve_mib", 1)
        store = KimiGGMLExpertPackStore(self.pack, manifest_path=self.manifest, expected_layers=self.num_layers,
                                        expected_experts=self.experts, expected_top_k=self.top_k, **kw)
        self.addCleanup(store.close)
        return store

    def routes(self, n, seed=0, rows=1):
        rng = np.random.default_rng(seed)
        weights = 1.0 / np.arange(1, self.experts + 1) ** 0.8
        weights /= weights.sum()
        for i in range(n):
            layer = self.layers[i % len(self.layers)]
            ids = np.stack([rng.choice(self.experts, self.top_k, replace=False, p=weights) for _ in range(rows)])
            yield layer, torch.from_numpy(ids)

    def assert_slot_bytes(self, store, layer, ids, slots):
        cache = store.device_cache
        for e, s in zip(ids.reshape(-1).tolist(), slots):
            want = self.objects[(layer, e)]
            got = cache[s, :len(want)].cpu().numpy().tobytes()
            self.assertEqual(got, want, f"slot {s} of layer {layer} expert {e}")

    def sglang_moe_loop(self, store, model, n, rows=1, seed=0, reads_are_misses=True):
        """What SGLang's ExpertPackMoEMethod.apply does per call."""
        for layer, ids in self.routes(n, seed, rows):
            snap_before = store.snapshot()
            slot_tensor, slots = store.acquire(layer, ids)
            self.assertEqual(slot_tensor.dtype, torch.int32)
            self.assertEqual(slot_tensor.tolist(), slots)
            self.assertEqual(slots, model.acquire(layer, ids.reshape(-1).tolist(), rows))
            self.assert_slot_bytes(store, layer, ids, slots)
            gathered = store.device_cache.index_select(0, slot_tensor.long())  # as the kernel path gathers
            self.assertEqual(gathered.shape, (len(slots), store.object_payload_bytes))
            store.mark_used(slots)
            snap = store.snapshot()
            self.assertEqual(snap["cache_hits"], model.hits)
            self.assertEqual(snap["cache_misses"], model.misses)
            self.assertEqual(snap["cache_evictions"], model.evictions)
            if reads_are_misses:  # without a host tier every slot miss is one pack read
                self.assertEqual(snap["pack_reads"] - snap_before["pack_reads"],
                                 snap["cache_misses"] - snap_before["cache_misses"])


class CpuDevice(StoreCase):
    def test_sequence_bytes_and_stats_match_sglang(self):
        for backend in ("pread", "uring"):
            for slots_mib in (3, 6, 16):
                store = self.open(cache_vram_mib=slots_mib, io_backend=backend)
                store.initialize_device_cache("cpu")
                store.initialize_device_cache("cpu")  # idempotent, as SGLang's
                slots = store.device_cache.shape[0]
                self.assertEqual(slots, slots_mib * 1024 * 1024 // store.object_payload_bytes)
                self.assertEqual(store.device_cache.data_ptr() % 4096, 0)
                model = SglangStoreModel(slots)
                self.sglang_moe_loop(store, model, 200, seed=slots_mib)
                if slots >= 2 * self.top_k:  # prefill-shaped calls (SGLang's preserve_oldest victims)
                    self.sglang_moe_loop(store, model, 40, rows=2, seed=9)
                snap = store.snapshot()
                self.assertEqual(snap["resident_experts"], len(model.key_to_slot))
                self.assertEqual(snap["cache_capacity_experts"], slots)
                self.assertEqual(snap["cache_policy"], "reuse-lfu-lru-v2")
                self.assertEqual(len(snap["route_calls_by_layer"]), self.num_layers)
                self.assertEqual(snap["h2d_bytes"], model.misses * store.object_payload_bytes)
                self.assertIn("k3pack", snap)
                store.close()

    def test_direct_io_and_host_tier(self):
        for kw in ({"direct_io": True}, {"host_cache_mib": 4, "prefetch": True}):
            store = self.open(**kw)
            store.initialize_device_cache("cpu")
            model = SglangStoreModel(store.device_cache.shape[0])
            if kw.get("prefetch"):
                store.prefetch(self.layers[0], list(range(self.top_k)))
            self.sglang_moe_loop(store, model, 60, seed=3, reads_are_misses="host_cache_mib" not in kw)
            if "host_cache_mib" in kw:  # the host tier turned repeated slot misses into memory copies
                snap = store.snapshot()
                self.assertLess(snap["pack_reads"], snap["cache_misses"])
                self.assertGreater(snap["k3pack"]["host_tier"]["cache_hits"], 0)
                # The prefetch went to the host tier: its accounting is in the drop-in's stats.
                pf = snap["k3pack"]["host_tier"]["prefetch"]
                self.assertEqual(pf["issued"], self.top_k)
                self.assertEqual(pf["issued"], pf["useful"] + pf["wasted"] + pf["cancelled"] + pf["staged"]
                                 + pf["failed"])

    def test_error_texts(self):
        store = self.open()
        ids = torch.zeros((1, self.top_k), dtype=torch.int64)
        with self.assertRaises(RuntimeError) as e:
            store.acquire(self.layers[0], ids)
        self.assertEqual(str(e.exception), "expert device cache is not initialized")
        with self.assertRaises(RuntimeError) as e:
            store.device_cache
        self.assertEqual(str(e.exception), "raw expert device cache is not initialized")
        with self.assertRaises(ValueError) as e:
            store.initialize_device_cache("meta")
        self.assertEqual(str(e.exception), "expert-pack runtime currently requires CUDA")
        store.initialize_device_cache("cpu")
        with self.assertRaises(ValueError) as e:
            store.acquire(0, ids)
        self.assertEqual(str(e.exception), "layer 0 is not an active routed MoE layer")
        narrow = torch.zeros((1, self.top_k - 1), dtype=torch.int64)
        with self.assertRaises(ValueError) as e:
            store.acquire(self.layers[0], narrow)
        self.assertEqual(str(e.exception),
                         f"runtime top-k must be exactly {self.top_k}; received shape {tuple(narrow.shape)}")
        bad = ids.clone()
        bad[0, 0] = self.experts
        with self.assertRaises(ValueError) as e:
            store.acquire(self.layers[0], bad)
        self.assertEqual(str(e.exception), "route contains an out-of-range expert id")

    def test_constructor_checks(self):
        cases = [
            ({"cache_vram_mib": 0}, ValueError, "expert cache and staging budgets, and read splits, must be positive"),
            ({"cache_vram_reserve_mib": 0}, ValueError,
             "expert cache and staging budgets, and read splits, must be positive"),
            ({"stage_slots": 0}, ValueError, "expert cache and staging budgets, and read splits, must be positive"),
            ({"read_splits": 0}, ValueError, "expert cache and staging budgets, and read splits, must be positive"),
            ({"stats_flush_interval": -1}, ValueError, "expert-pack stats flush interval cannot be negative"),
            ({"expected_source_sha256": "0" * 64}, ValueError,
             "expert-pack source_blob_sha256 does not match configured digest"),
            # k3pack's limit (SGLang has none): 10**7 took minutes and GBs.
            ({"read_splits": 1025}, ValueError, "read_splits must be at most 1024 (k3pack's limit), got 1025"),
        ]
        for kw, kind, text in cases:
            with self.assertRaises(kind) as e:
                self.open(**kw)
            self.assertEqual(str(e.exception), text, kw)
        with self.assertRaises(FileNotFoundError) as e:
            KimiGGMLExpertPackStore(self.pack + ".missing", manifest_path=self.manifest,
                                    expected_layers=self.num_layers, expected_experts=self.experts,
                                    expected_top_k=self.top_k)
        self.assertTrue(str(e.exception).startswith("Kimi expert-pack or manifest is missing: "))
        with self.assertRaises(MemoryError) as e:
            store = self.open(cache_vram_mib=2)  # 3 slots < top-4
            store.initialize_device_cache("cpu")
        self.assertTrue(str(e.exception).startswith("insufficient free VRAM for one top-k expert working set: "))

    def test_stats_path_never_replaces_the_pack_manifest_or_a_foreign_file(self):
        # A slip of stats_path replaced the pack being served with the
        # counters at close. Refused at construction now (FileExistsError),
        # and a file put at the path after construction is kept at close.
        with open(self.pack, "rb") as f:
            pack_before = f.read()
        for target in (self.pack, self.manifest, self.tmp.path):
            with self.assertRaises(FileExistsError) as e:
                self.open(stats_path=target)
            self.assertIn("stats_path", str(e.exception))
        with open(self.pack, "rb") as f:
            self.assertEqual(f.read(), pack_before)
        path = os.path.join(self.tmp.path, "guarded.stats.json")
        store = self.open(stats_path=path)
        with open(path, "w") as f:
            f.write("user notes\n")
        with self.assertRaises(FileExistsError):
            store.close()
        with open(path) as f:
            self.assertEqual(f.read(), "user notes\n")
        os.remove(path)

    def test_stats_file_as_sglang_writes_it(self):
        path = os.path.join(self.tmp.path, "stats", "kimi-k3-expert-pack.stats.json")
        store = self.open(stats_path=path, stats_flush_interval=5)
        store.initialize_device_cache("cpu")
        for i, (layer, ids) in enumerate(self.routes(7)):
            _, slots = store.acquire(layer, ids)
            store.mark_used(slots)
            if i == 3:
                self.assertFalse(os.path.exists(path))
        with open(path) as f:
            text = f.read()
        flushed = json.loads(text)
        self.assertEqual(sum(flushed["route_calls_by_layer"]), 5)
        self.assertEqual(text, json.dumps(flushed, indent=2, sort_keys=True) + "\n")
        store.close()
        with open(path) as f:
            final = json.load(f)
        self.assertEqual(sum(final["route_calls_by_layer"]), 7)
        self.assertEqual(sum(final["route_tokens_by_layer"]), 7)
        self.assertEqual([n for n in os.listdir(os.path.dirname(path)) if n.endswith(".tmp")], [])
        for key in ("cache_hits", "cache_misses", "cache_evictions", "h2d_bytes", "pack_reads", "pack_read_bytes",
                    "pack_read_ns", "mean_read_ms", "resident_experts", "route_calls_by_layer",
                    "route_tokens_by_layer", "cache_capacity_experts", "cache_capacity_bytes", "fallback_count",
                    "io_errors", "pack_format", "active_moe_layers", "kernel_backend"):
            self.assertIn(key, final)

    def test_two_threads_acquire_different_layers(self):
        store = self.open(cache_vram_mib=6)
        store.initialize_device_cache("cpu")
        errors = []

        def worker(layer, seed):
            rng = np.random.default_rng(seed)
            try:
                for _ in range(100):
                    ids = torch.from_numpy(rng.choice(self.experts, (1, self.top_k), replace=False))
                    _, slots = store.acquire(layer, ids)
                    self.assert_slot_bytes(store, layer, ids, slots)
                    store.mark_used(slots)
            except Exception as exc:  # reported on the main thread
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(layer, seed))
                   for layer, seed in ((self.layers[0], 1), (self.layers[-1], 2))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        calls = store.snapshot()["route_calls_by_layer"]
        self.assertEqual(calls[self.layers[0]], 100)
        self.assertEqual(calls[self.layers[-1]], 100)

    def test_damaged_object_is_refused_never_served(self):
        """A flipped payload byte fails the acquire that reads it (the digest
        sidecar's CRC32C), and the object never lands in a slot."""
        tmp = _util.TempDir()
        self.addCleanup(tmp.cleanup)
        model = os.path.join(tmp.path, "model")
        _util.synth(model)
        built = k3pack.build(model, os.path.join(model, "config.json"), os.path.join(model, "tokenizer"),
                             pack=os.path.join(tmp.path, "d.expert-major.pack"),
                             manifest=os.path.join(tmp.path, "d.manifest.json"), profile="scaled",
                             safety_margin_gib=0)
        pack = built["pack"]["pack"]
        layer, expert = self.layers[0], 5
        with open(pack, "rb") as f:
            f.seek(40 + ((layer - self.layers[0]) * self.experts + expert) * 3 * 152 + 136)
            offset = struct.unpack("<Q", f.read(8))[0]
        with open(pack, "r+b") as f:
            f.seek(offset + 100)
            b = f.read(1)
            f.seek(offset + 100)
            f.write(bytes([b[0] ^ 0xFF]))
        store = KimiGGMLExpertPackStore(pack, manifest_path=built["manifest"], expected_layers=self.num_layers,
                                        expected_experts=self.experts, expected_top_k=self.top_k,
                                        cache_vram_mib=3, cache_vram_reserve_mib=1)
        self.addCleanup(store.close)
        store.initialize_device_cache("cpu")
        ids = torch.tensor([[expert, 0, 1, 2][:self.top_k]])
        with self.assertRaises(OSError) as e:
            store.acquire(layer, ids)
        self.assertIn(f"(layer {layer}, expert {expert}) is damaged", str(e.exception))
        snap = store.snapshot()
        self.assertEqual(snap["k3pack"]["checksum_errors"], 1)
        self.assertEqual(snap["resident_experts"], 0)
        # Healthy objects are still served.
        healthy = torch.tensor([[6, 7, 8, 9][:self.top_k]])
        _, slots = store.acquire(layer, healthy)
        store.mark_used(slots)
        self.assertGreater(store.snapshot()["k3pack"]["checksum_verified_objects"], 0)

    def test_install_into_sglang_replaces_the_store_class(self):
        import sys

        import k3pack.sglang as adapter

        class Original:
            pass

        names = ["sglang", "sglang.srt", "sglang.srt.model_loader", adapter.SGLANG_MODULE, "sglang.srt.layers",
                 "sglang.srt.layers.moe", adapter.SGLANG_STORE_MODULE, "fake_moe_method"]
        with _util.StandInModules(*names):
            sys.modules[adapter.SGLANG_MODULE].kimi_k3_nonexpert_weights_iterator = lambda p: iter(())
            sys.modules[adapter.SGLANG_STORE_MODULE].KimiGGMLExpertPackStore = Original
            consumer = sys.modules["fake_moe_method"]
            consumer.KimiGGMLExpertPackStore = Original
            patched = adapter.install_into_sglang(store=True)
            self.assertIn(adapter.SGLANG_STORE_MODULE, patched)
            self.assertIn("fake_moe_method", patched)
            self.assertIs(consumer.KimiGGMLExpertPackStore, KimiGGMLExpertPackStore)
            self.assertIs(sys.modules[adapter.SGLANG_STORE_MODULE].KimiGGMLExpertPackStore, KimiGGMLExpertPackStore)


@unittest.skipUnless(torch.cuda.is_available(), "no CUDA device here: the CUDA tests run on a GPU machine")
class CudaDevice(StoreCase):
    """The same harness with the cache on the GPU; slots are read back."""

    def test_sequence_bytes_and_stats_match_sglang(self):
        store = self.open(cache_vram_mib=6, cache_vram_reserve_mib=1)
        store.initialize_device_cache("cuda")
        self.assertEqual(store.device_cache.device.type, "cuda")
        model = SglangStoreModel(store.device_cache.shape[0])
        self.sglang_moe_loop(store, model, 200)
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):  # a non-default current stream
            self.sglang_moe_loop(store, model, 50, seed=4)
        torch.cuda.synchronize()


if __name__ == "__main__":
    unittest.main()
