"""k3pack.ExpertStore.acquire's request_ids keyword (docs/python.md, docs/store.md "request-aware")."""

import unittest

import _util  # noqa: F401  (import path)

import k3pack
import numpy as np


class StoreRequestIdsTest(_util.TinyPackTestCase):
    def test_forms_and_errors(self):
        k, layer = self.top_k, self.layers[0]
        ids = np.arange(2 * k).reshape(2, k)
        for policy in ("request-aware", "adaptive", "lru"):
            with k3pack.ExpertStore(self.pack, self.manifest, cache_bytes=64 << 20, policy=policy) as store:
                for rid in (None, 7, np.int64(7), [7, 8], np.array([7, 8])):
                    acq = store.acquire(layer, ids, request_ids=rid)
                    self.assertEqual(len(acq.routes), 2 * k)
                    acq.mark_used()
                with self.assertRaises(ValueError) as cm:
                    store.acquire(layer, ids, request_ids=[1, 2, 3])
                self.assertEqual(str(cm.exception),
                                 "request_ids must hold one id for the call or one per row; received 3 for 2 rows")
                with self.assertRaises(ValueError):
                    store.acquire(layer, ids, request_ids=-1)
                for bad in ("a", 1.5):  # another type: TypeError (session 44)
                    with self.assertRaises(TypeError):
                        store.acquire(layer, ids, request_ids=bad)
                # 2**64-1 stands for "no request id" inside the store.
                for call in (lambda: store.acquire(layer, ids, request_ids=[7, 2**64 - 1]),
                             lambda: store.prefetch(layer, [0], request_id=2**64 - 1),
                             lambda: store.keep(layer, [0], request_id=2**64 - 1)):
                    with self.assertRaises(ValueError) as cm:
                        call()
                    self.assertIn("request id 18446744073709551615 (2^64-1) is reserved", str(cm.exception))
                # A failed argument check counts no call.
                self.assertEqual(store.snapshot()["route_calls_by_layer"][layer], 5)


if __name__ == "__main__":
    unittest.main()
