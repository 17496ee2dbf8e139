"""Soak tests of the Python module (session 32 resource-leak audit): the
stores, the non-routed weight stream and the one-shot calls run many times in
one interpreter, closed, dropped without close(), abandoned half way, ended
by an exception inside a `with`, or held in a reference cycle; the process's
descriptors, threads, mappings and resident memory must come back to where
they were. Views kept past close() stay readable (docs/python.md)."""

import gc
import os
import shutil
import unittest

import _util

import numpy as np

import k3pack


def resources():
    """(descriptors, threads, mappings, resident KiB) of this process."""
    fds = len(os.listdir("/proc/self/fd")) - 1  # the listing's own descriptor
    threads = len(os.listdir("/proc/self/task"))
    with open("/proc/self/maps") as f:
        maps = sum(1 for _ in f)
    with open("/proc/self/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return fds, threads, maps, rss


class Soak(_util.TinyPackTestCase):
    # Mappings and resident memory may grow by a fixed amount (malloc and
    # numpy keep freed arenas for reuse); descriptors and threads never.
    MAP_SLACK = 16
    RSS_SLACK_KIB = 32 << 10

    def soak(self, rounds, once, warm=4, rss=True):
        # The first rounds (one of each kind a test cycles through) load what
        # stays for the process: thread arenas, malloc's raised mmap threshold.
        for i in range(warm):
            once(i)
            gc.collect()
        before = resources()
        for i in range(rounds):
            once(i)
            gc.collect()  # a store dropped in a reference cycle is freed here
        # Threads just joined may linger in /proc/self/task a moment.
        _util.settled(lambda: resources()[1], before[1])
        after = resources()
        msg = "before %s, after %s (fds, threads, maps, rss KiB)" % (before, after)
        self.assertLessEqual(after[0], before[0], msg)
        self.assertLessEqual(after[1], before[1], msg)
        self.assertLessEqual(after[2], before[2] + self.MAP_SLACK, msg)
        if rss:
            self.assertLessEqual(after[3], before[3] + self.RSS_SLACK_KIB, msg)

    def ids(self, i):
        return np.array([[(i + j * 5) % self.experts for j in range(self.top_k)]], dtype=np.int64)

    def test_expert_store_closed_dropped_failed_in_with_and_in_cycles(self):
        for io in ("pread", "uring"):
            for direct in (False, True):
                def once(i, io=io, direct=direct):
                    store = k3pack.ExpertStore(self.pack, self.manifest, cache_bytes=4 * self.top_k * self.object_bytes,
                                               io_backend=io, direct_io=direct, queue_depth=4)
                    layer = self.layers[i % len(self.layers)]
                    store.prefetch(layer, [int(x) for x in self.ids(i + 1)[0]])
                    acq = store.acquire(layer, self.ids(i))
                    kind = i % 4
                    if kind == 0:
                        acq.mark_used()
                        store.close()
                    elif kind == 1:
                        pass  # store and acquisition dropped unreleased, unclosed
                    elif kind == 2:
                        with self.assertRaises(ZeroDivisionError):
                            with store:
                                with store.acquire(layer, self.ids(i + 2)):
                                    1 / 0
                    else:
                        holder = {"store": store, "acq": acq}
                        holder["self"] = holder  # a reference cycle: only gc frees it
                        del holder

                with self.subTest(io=io, direct=direct):
                    self.soak(16, once)

    def test_closed_stores_kept_alive_hold_no_descriptor_thread_or_mapping(self):
        # Before: a closed io_uring store kept its ring (descriptor, mappings)
        # and its checksum threads for as long as the object lived.
        from k3pack.sglang import KimiGGMLExpertPackStore

        kept, calls = [], []

        def once(i):
            calls.append(i)
            io = ("pread", "uring")[i % 2]
            store = k3pack.ExpertStore(self.pack, self.manifest, cache_bytes=4 * self.top_k * self.object_bytes,
                                       io_backend=io, direct_io=bool(i % 4 >= 2))
            store.acquire(self.layers[0], self.ids(i)).mark_used()
            store.close()
            dropin = KimiGGMLExpertPackStore(self.pack, manifest_path=self.manifest, expected_layers=self.num_layers,
                                             expected_experts=self.experts, expected_top_k=self.top_k,
                                             cache_vram_mib=6, cache_vram_reserve_mib=1, io_backend=io,
                                             host_cache_mib=4)
            dropin.initialize_device_cache("cpu")
            dropin.mark_used(dropin.acquire(self.layers[0], self.ids(i))[1])
            dropin.close()
            if len(calls) > 4:  # the warm-up rounds' stores go; the measured ones stay alive, closed
                kept.extend([store, dropin])

        # Resident memory is not compared: the drop-in's slot tensor is the
        # caller's and stays with the store object (docs/python.md).
        self.soak(6, once, rss=False)
        self.assertEqual(len(kept), 12)

    def test_expert_views_outlive_close_and_release(self):
        store = k3pack.ExpertStore(self.pack, self.manifest, cache_bytes=2 * self.top_k * self.object_bytes)
        layer = self.layers[0]
        acq = store.acquire(layer, self.ids(0))
        views = [r.bytes for r in acq]
        first = [bytes(v[:64]) for v in views]
        acq.mark_used()
        # Evict them, then close and drop store and acquisition.
        for i in range(1, 12):
            store.acquire(layer, self.ids(i)).mark_used()
        store.close()
        del store, acq
        gc.collect()
        self.assertEqual([bytes(v[:64]) for v in views], first)
        self.assertFalse(views[0].flags.writeable)

    def test_sglang_store_closed_dropped_and_failed_in_with(self):
        from k3pack.sglang import KimiGGMLExpertPackStore

        for kw in ({"io_backend": "pread"}, {"io_backend": "uring", "direct_io": True},
                   {"host_cache_mib": 4, "prefetch": True}):
            def once(i, kw=kw):
                store = KimiGGMLExpertPackStore(self.pack, manifest_path=self.manifest,
                                                expected_layers=self.num_layers, expected_experts=self.experts,
                                                expected_top_k=self.top_k, cache_vram_mib=6,
                                                cache_vram_reserve_mib=1, **kw)
                store.initialize_device_cache("cpu")
                layer = self.layers[i % len(self.layers)]
                if kw.get("prefetch"):
                    store.prefetch(layer, [int(x) for x in self.ids(i + 1)[0]])
                _, slots = store.acquire(layer, self.ids(i))
                kind = i % 3
                if kind == 0:
                    store.mark_used(slots)
                    store.close()
                elif kind == 1:
                    holder = [store]
                    holder.append(holder)  # dropped unclosed, in a cycle
                else:
                    cache = store.device_cache
                    store.close()
                    # The slot tensor kept past close() is the caller's: readable, its bytes the last ones read.
                    self.assertEqual(cache.shape[1], store.object_payload_bytes)
                    self.assertEqual(int(cache[slots[0]].sum()) >= 0, True)
                    with self.assertRaisesRegex(RuntimeError, "expert store is closed"):
                        store.acquire(layer, self.ids(i))

            with self.subTest(**kw):
                self.soak(6, once, warm=3)

    def test_nonexpert_stream_whole_abandoned_and_views_kept(self):
        kept = []

        def once(i):
            it = k3pack.nonexpert_weights(self.manifest, copy=bool(i % 3 == 2))
            for n, (name, array) in enumerate(it):
                if n == 0 and len(kept) < 4:
                    kept.append((name, array, bytes(array.tobytes()[:64])))
                if i % 2 and n == 3:
                    break  # abandoned half way: the generator is dropped unfinished

        self.soak(12, once)
        for name, array, first in kept:  # views outlive their stream
            self.assertEqual(bytes(array.tobytes()[:64]), first, name)

    def test_stream_closed_in_with_on_exception_and_shard_sets_reopened(self):
        model = os.path.join(self.tmp.path, "model")

        def stream_once(i):
            with self.assertRaises(KeyError):
                with k3pack.nonexpert_tensors(self.manifest) as stream:
                    next(stream)
                    raise KeyError("stop")
            self.assertTrue(stream.closed)
            self.assertEqual(list(stream), [])  # a closed stream stops at once

        self.soak(20, stream_once, warm=1)
        kept = []

        def shard_set_once(i):
            shards = k3pack.ShardSet(model)
            name = "token_embd.weight"
            data = shards.tensor_data(name, "raw")
            if len(kept) < 3:
                kept.append((data, bytes(data.tobytes()[:32])))

        self.soak(40, shard_set_once, warm=1)
        gc.collect()
        for data, first in kept:  # a tensor's view keeps its shard mapped after the set is gone
            self.assertEqual(bytes(data.tobytes()[:32]), first)

    def test_build_manifest_verify_and_failures_in_one_process(self):
        model = os.path.join(self.tmp.path, "model")
        out = os.path.join(self.tmp.path, "soak-build")

        def build_once(i):
            shutil.rmtree(out, ignore_errors=True)
            k3pack.build(model, os.path.join(model, "config.json"), os.path.join(model, "tokenizer"),
                         pack=os.path.join(out, "p.expert-major.pack"), manifest=os.path.join(out, "m.json"),
                         profile="scaled", safety_margin_gib=0)

        self.soak(4, build_once, warm=1)
        self.soak(6, lambda i: k3pack.verify_pack(self.manifest, full=bool(i % 2)), warm=2)

        missing = os.path.join(self.tmp.path, "no-such-model")

        def failed_build(i):
            with self.assertRaises(OSError):
                k3pack.build(missing, os.path.join(missing, "config.json"), os.path.join(missing, "tokenizer"),
                             pack=os.path.join(out, "q.expert-major.pack"), profile="scaled")

        self.soak(20, failed_build, warm=1)

        def failed_store(i):
            with self.assertRaises((OSError, ValueError)):
                k3pack.ExpertStore(os.path.join(missing, "p.pack"), self.manifest)

        self.soak(40, failed_store, warm=1)


if __name__ == "__main__":
    unittest.main()
