"""Faults an SGLang integrator's audit of the run-time Python side found
(docs/RELIABILITY.md, "Faults from an integrator's audit"): the drop-in
store k3pack.sglang.KimiGGMLExpertPackStore and k3pack.ExpertStore /
Acquisition / ExpertView, driven with wrong ids, dropped objects and bad
arguments. Each test failed before its fix."""

import gc
import os
import unittest
import weakref

import _util  # noqa: F401  (import path)
import numpy as np
import torch

import k3pack
import k3pack.sglang
from k3pack.sglang import KimiGGMLExpertPackStore


def task_count():
    return len(os.listdir("/proc/self/task"))


def fd_count():
    return len(os.listdir("/proc/self/fd"))


class IntegratorAudit(_util.TinyPackTestCase):
    def expert_store(self, objects=None, **kw):
        if objects is not None:
            kw["cache_bytes"] = objects * self.object_bytes
        store = k3pack.ExpertStore(self.pack, self.manifest, **kw)
        self.addCleanup(store.close)
        return store

    # ------------------------------------------------------------ wrong ids

    def test_float_and_bool_ids_are_refused_never_truncated(self):
        """Float ids were cast to int64: expert 0.7 was served as expert 0,
        3.5 as 3, without a word (and a bool tensor as experts 0 / 1)."""
        layer, k = self.layers[0], self.top_k
        floats = torch.arange(k, dtype=torch.float32).reshape(1, k) + 0.5
        bools = torch.tensor([[True, False] * (k // 2)])
        store = self.dropin()
        self.addCleanup(store.close)
        store.initialize_device_cache("cpu")
        for bad in (floats, bools):
            with self.assertRaises(TypeError) as cm:
                store.acquire(layer, bad)
            self.assertIn("topk_ids must hold integers", str(cm.exception))
        self.assertEqual(store._route_calls, 0)  # a refused call is not counted (SGLang's rule)
        self.assertEqual(sum(store.snapshot()["route_calls_by_layer"]), 0)
        _, slots = store.acquire(layer, torch.arange(k, dtype=torch.int32).reshape(1, k))  # integers still work
        with self.assertRaises(TypeError) as cm:
            store.mark_used([float(s) + 0.5 for s in slots])
        self.assertIn("slot_indices must hold integers", str(cm.exception))
        store.mark_used(slots)
        prefetching = self.dropin(host_cache_mib=4, prefetch=True)
        self.addCleanup(prefetching.close)
        with self.assertRaises(TypeError) as cm:
            prefetching.prefetch(layer, torch.tensor([0.5, 1.5]))
        self.assertIn("expert_ids must hold integers", str(cm.exception))
        # request_id: one id (the request whose next token was predicted).
        prefetching.prefetch(layer, torch.arange(k), request_id=3)
        with self.assertRaises(ValueError) as cm:
            prefetching.prefetch(layer, torch.arange(k), request_id=[3, 4])
        self.assertIn("prefetch takes one request_id", str(cm.exception))
        # keep(): hints without reads, the same arguments.
        prefetching.keep(layer, torch.arange(k), request_id=3)
        with self.assertRaises(TypeError):
            prefetching.keep(layer, torch.tensor([0.5, 1.5]))
        with self.assertRaises(ValueError) as cm:
            prefetching.keep(layer, torch.arange(k), request_id=[3, 4])
        self.assertIn("keep takes one request_id", str(cm.exception))

    def test_expert_store_refuses_float_ids(self):
        layer, k = self.layers[0], self.top_k
        store = self.expert_store()
        floats = np.arange(k).reshape(1, k) + 0.5
        for call in (lambda: store.acquire(layer, floats), lambda: store.acquire_token(layer, floats[0]),
                     lambda: store.prefetch(layer, floats[0])):
            with self.assertRaises(TypeError) as cm:
                call()
            self.assertIn("must hold integers", str(cm.exception))
        self.assertEqual(store.acquire(layer, np.arange(k).reshape(1, k)).experts, list(range(k)))

    # ------------------------------------------------------------ lifetimes

    def test_a_dropped_acquisition_releases_its_objects(self):
        """An Acquisition garbage-collected without mark_used kept its objects
        pinned for good: every later call that needed their room failed."""
        layer, k = self.layers[0], self.top_k
        store = self.expert_store(objects=k + 1)
        for start in range(0, self.experts - k + 1, k):
            store.acquire(layer, np.arange(start, start + k).reshape(1, k))  # result dropped at once

        def fails_midway():
            acq = store.acquire(layer, np.arange(k).reshape(1, k))  # noqa: F841
            raise KeyError("a kernel error between acquire and mark_used")

        for _ in range(2):
            with self.assertRaises(KeyError):
                fails_midway()
            acq = store.acquire(layer, np.arange(k, 2 * k).reshape(1, k))
            acq.mark_used()
        snap = store.snapshot()
        self.assertGreater(snap["cache_evictions"], 0)

    def test_mark_used_refuses_another_stores_acquisition(self):
        """store_b.mark_used(acquisition of store_a) released nothing of a's
        and marked the acquisition released, so a's objects stayed pinned."""
        layer, k = self.layers[0], self.top_k
        store_a = self.expert_store(objects=k + 1)
        store_b = self.expert_store(objects=k + 1)
        acq = store_a.acquire(layer, np.arange(k).reshape(1, k))
        with self.assertRaises(ValueError) as cm:
            store_b.mark_used(acq)
        self.assertIn("belongs to another ExpertStore", str(cm.exception))
        self.assertFalse(acq.released)
        store_a.mark_used(acq)
        self.assertTrue(acq.released)
        # a's objects are free again: a disjoint working set fits.
        store_a.acquire(layer, np.arange(k, 2 * k).reshape(1, k)).mark_used()

    def test_an_unclosed_dropin_store_is_freed_with_its_threads_and_fd(self):
        """atexit.register(self.close) kept every store alive until exit: a
        store dropped without close() kept its slot memory, its pack fd and
        its read threads (64 with the defaults)."""
        gc.collect()
        tasks, fds = task_count(), fd_count()
        stats = os.path.join(self.tmp.path, "dropped", "stats.json")
        store = self.dropin(stats_path=stats)
        store.initialize_device_cache("cpu")
        store.acquire(self.layers[0], torch.arange(self.top_k).reshape(1, self.top_k))
        self.assertGreater(task_count(), tasks)
        ref = weakref.ref(store)
        del store
        gc.collect()
        self.assertIsNone(ref())
        self.assertEqual(_util.settled(task_count, tasks), tasks)
        self.assertEqual(fd_count(), fds)
        self.assertTrue(os.path.exists(stats))  # what close() (or SGLang's atexit) would have written
        # close() still works, and only once.
        store = self.dropin()
        store.close()
        store.close()
        with self.assertRaises(RuntimeError):
            store.initialize_device_cache("cpu")
            store.acquire(self.layers[0], torch.arange(self.top_k).reshape(1, self.top_k))

    # ------------------------------------------------------------ threads

    def test_concurrent_stats_flushes_never_fail(self):
        """With stats_flush_interval=1, threads' mark_used flushes shared one
        temporary file: about a quarter of the calls raised FileNotFoundError
        (drop-in and ExpertStore alike)."""
        import json
        import threading

        layer_count = len(self.layers)
        dropin = self.dropin(cache_vram_mib=12, stats_path=os.path.join(self.tmp.path, "flush", "a.json"),
                             stats_flush_interval=1)
        self.addCleanup(dropin.close)
        dropin.initialize_device_cache("cpu")
        store = self.expert_store(objects=12, stats_path=os.path.join(self.tmp.path, "flush", "b.json"),
                                  stats_flush_interval=1)

        def dropin_call(layer, ids):
            _, slots = dropin.acquire(layer, torch.from_numpy(ids))
            dropin.mark_used(slots)

        def store_call(layer, ids):
            store.acquire(layer, ids).mark_used()

        for call, path in ((dropin_call, dropin.stats_path), (store_call, os.path.join(self.tmp.path, "flush",
                                                                                         "b.json"))):
            errors = []

            def work(seed):
                rng = np.random.default_rng(seed)
                for _ in range(150):
                    try:
                        call(self.layers[seed % layer_count],
                             rng.choice(self.experts, self.top_k, replace=False).reshape(1, self.top_k))
                    except Exception as exc:  # noqa: BLE001  (every failure is the finding)
                        errors.append(repr(exc))

            threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.assertEqual(errors[:3], [], f"{len(errors)} of 600 calls failed")
            with open(path) as f:
                self.assertEqual(sum(json.load(f)["route_calls_by_layer"]) > 0, True)

    # ------------------------------------------------------------ arguments

    def test_bad_arguments_are_value_errors_naming_the_argument(self):
        """These were pybind11's 'incompatible function arguments' TypeErrors
        (which list the internal SlotCache signature), an opaque 'Unable to
        cast Python instance' RuntimeError, a misleading 'must be positive',
        or accepted until initialize_device_cache."""
        layer, k = self.layers[0], self.top_k
        cases = [
            ({"host_cache_mib": -1}, "host_cache_mib must be 0 (no host tier) or positive, got -1"),
            ({"ep_size": -1, "ep_rank": 0}, "ep_size must be at least 1, got -1"),
            ({"ep_size": 2, "ep_rank": 5}, "ep_rank 5 is out of range for ep_size 2 (ranks are 0..1)"),
            ({"ep_size": 2, "ep_rank": -1}, "ep_rank -1 is out of range for ep_size 2 (ranks are 0..1)"),
            ({"stage_slots": 5000}, "stage_slots must be at most 1024 (k3pack's limit), got 5000"),
            ({"policy": "bogus"}, "unknown cache policy 'bogus' (known: reuse-lfu-lru-v2, lru, decay-lfu, "
                                  "quota-decay, request-aware, adaptive)"),
        ]
        for kw, text in cases:
            with self.assertRaises(ValueError) as cm:
                self.dropin(**kw)
            self.assertEqual(str(cm.exception), text, kw)
        with self.assertRaises(ValueError) as cm:
            k3pack.ExpertStore(self.pack, self.manifest, cache_bytes=-1)
        self.assertEqual(str(cm.exception), "expert cache and staging budgets, and read splits, must be positive")
        with self.assertRaises(ValueError) as cm:
            k3pack.ExpertStore(self.pack, self.manifest, ep_size=2, ep_rank=-1)
        self.assertEqual(str(cm.exception), "ep_rank -1 is out of range for ep_size 2 (ranks are 0..1)")

        store = self.expert_store()
        ids = np.arange(k).reshape(1, k)
        for bad_layer in (-1, 2 ** 40):
            with self.assertRaises(ValueError) as cm:
                store.acquire(bad_layer, ids)
            self.assertEqual(str(cm.exception), f"layer {bad_layer} is not an active routed MoE layer")
            with self.assertRaises(ValueError):
                store.prefetch(bad_layer, ids[0])
        # A CPU torch tensor and nested lists are arrays too.
        self.assertEqual(store.acquire(layer, torch.from_numpy(ids)).experts, list(range(k)))
        self.assertEqual(store.acquire(layer, ids.tolist()).experts, list(range(k)))
        self.assertEqual(store.acquire_token(layer, list(range(k))).experts, list(range(k)))
        # Python's negative indexing.
        acq = store.acquire(layer, ids)
        self.assertEqual(acq[-1].expert, k - 1)
        self.assertEqual(acq[-k].expert, 0)
        with self.assertRaises(IndexError):
            acq[-k - 1]
        with self.assertRaises(IndexError):
            acq[k]
        # request_ids: any id below 2**64 - 1, the store's "no request id".
        store.acquire(layer, ids, request_ids=2 ** 64 - 2).mark_used()
        with self.assertRaises(ValueError):
            store.acquire(layer, ids, request_ids=2 ** 64 - 1)
        with self.assertRaises(ValueError) as cm:
            store.acquire(layer, ids, request_ids=2 ** 64)
        self.assertEqual(str(cm.exception), "request_ids must be below 2**64")

        dropin = self.dropin()
        self.addCleanup(dropin.close)
        dropin.initialize_device_cache("cpu")
        # is_prefill: SGLang uses its truth value.
        _, slots = dropin.acquire(layer, torch.from_numpy(ids), is_prefill=torch.tensor(True))
        dropin.mark_used(slots)
        with self.assertRaises(ValueError) as cm:
            dropin.acquire(layer, torch.from_numpy(ids), request_ids=2 ** 64)
        self.assertEqual(str(cm.exception), "request_ids must be below 2**64")

    # ------------------------------------------------------------ dtypes

    def test_to_torch_and_a_log_refuse_a_dtype_that_is_not_the_arrays(self):
        """to_torch(float32 array, "bfloat16") gave a bfloat16 tensor of twice
        the length from the float's bytes; ssm_a_to_a_log(float32, dtype=
        "bfloat16") computed on those reinterpreted values, and dtype="float16"
        on a float32 array was ignored."""
        values = np.array([-1.0, -2.0], dtype=np.float32)
        with self.assertRaises(TypeError) as cm:
            k3pack.sglang.to_torch(values, "bfloat16")
        self.assertIn("bfloat16 values must be uint16 bit patterns", str(cm.exception))
        with self.assertRaises(TypeError):
            k3pack.sglang.to_torch(values, "float16")
        with self.assertRaises(TypeError) as cm:
            k3pack.ssm_a_to_a_log(values, dtype="bfloat16")
        self.assertIn("takes uint16 bit patterns", str(cm.exception))
        with self.assertRaises(TypeError):
            k3pack.ssm_a_to_a_log(values, dtype="float16")
        # What k3pack hands out still converts, and a matching name is fine.
        bf16 = np.array([0x3F80, 0xC000], dtype=np.uint16)  # 1.0, -2.0
        self.assertEqual(k3pack.sglang.to_torch(bf16, "bfloat16").float().tolist(), [1.0, -2.0])
        self.assertEqual(k3pack.sglang.to_torch(values, "float32").tolist(), [-1.0, -2.0])
        np.testing.assert_array_equal(k3pack.ssm_a_to_a_log(values, dtype="float32"),
                                      k3pack.ssm_a_to_a_log(values))
        self.assertEqual(k3pack.ssm_a_to_a_log(np.array([0xBF80], dtype=np.uint16), dtype="bfloat16").tolist(),
                         [0])  # log(-(-1.0)) = 0, as bfloat16 bits

    # ------------------------------------------------------------ docs

    def test_every_public_callable_has_a_docstring(self):
        """pybind11 gives a bare signature line when no doc is bound; several
        methods, every Acquisition / ExpertView attribute and NonExpertStream's
        stats / manifest_path had only that (and, found later, most GGUFFile /
        GGUFTensor / ShardSet members, read_manifest and synth_faults)."""

        import re

        def text(doc):
            lines = (doc or "").strip().splitlines()
            # pybind11's signature line: "(self: ..." for members, "name(args) -> type" for functions
            # (read_manifest and synth_faults had only that).
            if lines and ("(self:" in lines[0] or re.fullmatch(r"[A-Za-z_]\w*\(.*\)( -> .+)?", lines[0])):
                lines = lines[1:]
            return "\n".join(lines).strip()

        missing = []
        classes = [k3pack.ExpertStore, k3pack.Acquisition, k3pack.ExpertView, KimiGGMLExpertPackStore,
                   k3pack.NonExpertStream, k3pack.NonExpertTensor, k3pack.GGUFFile, k3pack.GGUFTensor,
                   k3pack.ShardSet]
        # Every class k3pack exports, not only those named above.
        classes += [v for v in (getattr(k3pack, n) for n in k3pack.__all__) if isinstance(v, type)
                    and v not in classes]
        for cls in classes:
            if not text(cls.__doc__):
                missing.append(cls.__name__)
            for name, member in vars(cls).items():
                if name.startswith("_") and name not in ("__init__", "__enter__", "__exit__", "__getitem__",
                                                         "__len__"):
                    continue
                if not callable(member) and not isinstance(member, (property, staticmethod, classmethod)):
                    continue
                if not text(getattr(member, "__doc__", None)):
                    missing.append(f"{cls.__name__}.{name}")
        for module in (k3pack, k3pack.sglang):
            for name in module.__all__:
                value = getattr(module, name)
                if callable(value) and not text(value.__doc__):
                    missing.append(f"{module.__name__}.{name}")
        self.assertEqual(missing, [])


if __name__ == "__main__":
    unittest.main()
