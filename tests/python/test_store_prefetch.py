"""k3pack.ExpertStore's prefetch policy keywords (docs/store.md, "Prefetch policy")."""

import unittest

import _util  # noqa: F401  (import path)

import k3pack
import numpy as np


class StorePrefetchTest(_util.TinyPackTestCase):
    def test_staged_prefetch_is_taken_or_dropped(self):
        k = self.top_k
        with k3pack.ExpertStore(self.pack, self.manifest, cache_bytes=64 << 20, prefetch_mode="staged",
                                prefetch_queue_depth=1) as store:
            layer = self.layers[0]
            store.prefetch(layer, np.arange(k + 1))  # k of them used below, one not
            store.acquire_token(layer, np.arange(k)).mark_used()
            pf = store.snapshot()["k3pack"]["prefetch"]
            self.assertEqual(pf["mode"], "staged")
            self.assertEqual(pf["queue_depth"], 1)
            self.assertEqual(pf["issued"], k + 1)
            self.assertEqual(pf["useful"], k)
            self.assertEqual(pf["wasted"] + pf["cancelled"], 1)
            snap = store.snapshot()
            self.assertEqual(snap["cache_misses"], k)  # served from staging, still policy misses

    def test_keep_predicted_keeps_prefetched_residents_until_their_acquire(self):
        k = self.top_k
        with k3pack.ExpertStore(self.pack, self.manifest, cache_bytes=64 << 20) as store:
            one = store.info["object_bytes"][0]
        first, second = self.layers[0], self.layers[1]
        hits = {}
        for keep in (True, False):
            with k3pack.ExpertStore(self.pack, self.manifest, cache_bytes=2 * k * one, policy="lru",
                                    keep_predicted=keep) as store:
                store.acquire_token(first, np.arange(k)).mark_used()
                store.acquire_token(first, np.arange(k, 2 * k)).mark_used()  # the cache is full
                store.prefetch(first, np.arange(k))  # resident: nothing read, kept if asked
                store.acquire_token(second, np.arange(k)).mark_used()  # k victims
                before = store.snapshot()["cache_hits"]
                store.acquire_token(first, np.arange(k)).mark_used()
                snap = store.snapshot()
                hits[keep] = snap["cache_hits"] - before
                self.assertEqual(snap["k3pack"]["prefetch"]["keep_predicted"], keep)
                self.assertEqual(snap["k3pack"]["prefetch"]["kept"], k if keep else 0)
                self.assertEqual(snap["k3pack"]["prefetch"]["issued"], 0)
        self.assertEqual(hits, {True: k, False: 0})

    def test_keep_hints_residents_and_reads_nothing(self):
        # keep(): the resident ones of the predicted experts survive another
        # layer's misses until their layer's next acquire; the one that is not
        # resident is not read (prefetch() would stage it).
        k = self.top_k
        with k3pack.ExpertStore(self.pack, self.manifest, cache_bytes=64 << 20) as store:
            one = store.info["object_bytes"][0]
        first, second = self.layers[0], self.layers[1]
        predicted = np.arange(k + 1)  # expert k is not resident below
        hits = {}
        for hint in (True, False):
            with k3pack.ExpertStore(self.pack, self.manifest, cache_bytes=2 * k * one, policy="lru") as store:
                store.acquire_token(first, np.arange(k)).mark_used()
                store.acquire_token(first, np.arange(k + 1, 2 * k + 1)).mark_used()  # the cache is full
                if hint:
                    store.keep(first, predicted, request_id=5)
                store.acquire_token(second, np.arange(k)).mark_used()  # k victims
                before = store.snapshot()["cache_hits"]
                store.acquire_token(first, np.arange(k)).mark_used()
                snap = store.snapshot()
                hits[hint] = snap["cache_hits"] - before
                pf = snap["k3pack"]["prefetch"]
                self.assertEqual((pf["issued"], pf["kept"]), (0, k if hint else 0))
        self.assertEqual(hits, {True: k, False: 0})
        with k3pack.ExpertStore(self.pack, self.manifest, cache_bytes=64 << 20, keep_predicted=False) as store:
            with self.assertRaises(Exception) as cm:
                store.keep(first, predicted)
            self.assertIn("keep hints are off in this store", str(cm.exception))

    def test_a_requests_keep_hint_outlives_other_requests_acquires(self):
        # A's prediction, given with A's id, survives B's acquire of the layer;
        # without an id it ends there and LRU evicts A's experts.
        k = self.top_k
        with k3pack.ExpertStore(self.pack, self.manifest, cache_bytes=64 << 20) as store:
            one = store.info["object_bytes"][0]
        first, second = self.layers[0], self.layers[1]
        a, b = np.arange(k).reshape(1, k), np.arange(k, 2 * k).reshape(1, k)
        hits = {}
        for request_id in (7, None):
            with k3pack.ExpertStore(self.pack, self.manifest, cache_bytes=2 * k * one, policy="lru") as store:
                store.acquire(first, a, request_ids=7).mark_used()
                store.acquire(first, b, request_ids=8).mark_used()
                store.prefetch(first, a[0], request_id=request_id)
                store.acquire(first, b, request_ids=8).mark_used()
                store.acquire(second, a, request_ids=8).mark_used()  # k victims
                before = store.snapshot()["cache_hits"]
                store.acquire(first, a, request_ids=7).mark_used()
                hits[request_id] = store.snapshot()["cache_hits"] - before
        self.assertEqual(hits, {7: k, None: 0})
        with k3pack.ExpertStore(self.pack, self.manifest, cache_bytes=64 << 20) as store:
            with self.assertRaises(ValueError) as cm:
                store.prefetch(first, a[0], request_id=[1, 2])
            self.assertIn("prefetch takes one request_id", str(cm.exception))
            with self.assertRaises(ValueError):
                store.prefetch(first, a[0], request_id=-1)

    def test_a_requests_staged_reads_wait_through_other_requests_acquires(self):
        # A's guesses (not resident) are staged for A: B's acquire of the layer
        # leaves them, and A's next acquire takes them without a second read.
        # Without an id B's acquire drops them and A reads them again.
        k = self.top_k
        first = self.layers[0]
        a, b = np.arange(k).reshape(1, k), np.arange(k, 2 * k).reshape(1, k)
        seen = {}
        for request_id in (7, None):
            # every guess's read is issued at once: none can be cancelled
            with k3pack.ExpertStore(self.pack, self.manifest, cache_bytes=64 << 20, prefetch_queue_depth=k,
                                    queue_depth=2 * k) as store:
                store.prefetch(first, a[0], request_id=request_id)
                store.acquire(first, b, request_ids=8).mark_used()
                store.acquire(first, a, request_ids=7).mark_used()
                store.close()
                snap = store.snapshot()
                pf = snap["k3pack"]["prefetch"]
                seen[request_id] = (pf["useful"], pf["wasted"], pf["cancelled"], snap["pack_reads"])
        self.assertEqual(seen, {7: (k, 0, 0, 2 * k), None: (0, k, 0, 3 * k)})

    def test_budget_refuses_and_mode_is_checked(self):
        one = None
        with k3pack.ExpertStore(self.pack, self.manifest, cache_bytes=64 << 20) as store:
            one = store.info["object_bytes"][0]
        with k3pack.ExpertStore(self.pack, self.manifest, cache_bytes=64 << 20, prefetch_budget_bytes=one) as store:
            store.prefetch(self.layers[0], np.arange(3))
            pf = store.snapshot()["k3pack"]["prefetch"]
            self.assertEqual((pf["issued"], pf["refused"]), (1, 2))
        with k3pack.ExpertStore(self.pack, self.manifest, cache_bytes=64 << 20, prefetch_mode="cache") as store:
            store.prefetch(self.layers[0], np.arange(2))
            self.assertEqual(store.snapshot()["k3pack"]["prefetch"]["mode"], "cache")
        with self.assertRaises(Exception) as cm:
            k3pack.ExpertStore(self.pack, self.manifest, prefetch_mode="eager")
        self.assertIn("unknown prefetch mode 'eager' (known: staged, cache)", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
