"""Leftovers of the integrator's audit (docs/RELIABILITY.md, "Faults from an
integrator's audit"): concurrent initialize_device_cache on the drop-in
store, and EP errors that named the CLI's flags from Python. Each test
failed before its fix."""

import sys
import threading
import unittest

import _util  # noqa: F401  (import path)
import torch

import k3pack


class IntegratorLeftovers(_util.TinyPackTestCase):
    def dropin(self, **kw):
        store = super().dropin(**kw)
        self.addCleanup(store.close)
        return store

    def test_concurrent_initialize_device_cache_makes_one_cache(self):
        """Two threads' initialize_device_cache both passed the 'not yet
        initialized' check; the second one's attach failed with "the expert
        slot cache is already attached to its memory" (and had it not, two
        slot tensors would have existed)."""
        old = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)  # switch threads often: the race window is a few bytecodes wide
        self.addCleanup(sys.setswitchinterval, old)
        threads_per_round, rounds = 8, 6
        for round_ in range(rounds):
            store = self.dropin()
            barrier = threading.Barrier(threads_per_round)
            errors, caches = [], []

            def work():
                barrier.wait()
                try:
                    store.initialize_device_cache("cpu")
                    caches.append(store.device_cache)
                except Exception as exc:  # noqa: BLE001  (every failure is the finding)
                    errors.append(repr(exc))

            threads = [threading.Thread(target=work) for _ in range(threads_per_round)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.assertEqual(errors, [], f"round {round_}")
            self.assertEqual(len(caches), threads_per_round)
            self.assertTrue(all(c is caches[0] for c in caches), f"round {round_}: more than one cache")
            # The one cache serves: every thread saw it fully set up.
            ids = torch.arange(self.top_k).reshape(1, self.top_k)
            _, slots = store.acquire(self.layers[0], ids)
            store.mark_used(slots)
            store.close()

    def test_ep_errors_name_the_python_keywords(self):
        """An ep_size that does not divide the experts came back as the CLI's
        "--ep-size 3 does not divide ..." from both Python stores."""
        size = next(s for s in range(2, self.experts + 1) if self.experts % s)
        want = (f"ep_size {size} does not divide the {self.experts} routed experts per layer; SGLang's expert "
                f"parallelism gives every rank the same number of experts, so the size must be a divisor of "
                f"{self.experts}")
        opens = {
            "drop-in": lambda: self.dropin(ep_size=size, ep_rank=0),
            "ExpertStore": lambda: k3pack.ExpertStore(self.pack, self.manifest, ep_size=size, ep_rank=0),
        }
        for surface, open_ in opens.items():
            with self.assertRaises(ValueError, msg=surface) as cm:
                open_()
            self.assertEqual(str(cm.exception).splitlines()[0], want, surface)
            self.assertNotIn("--ep-", str(cm.exception), surface)


if __name__ == "__main__":
    unittest.main()
