"""close() and initialize_device_cache() on the drop-in store at the same
time (docs/RELIABILITY.md, "Faults from an integrator's audit"). They were
not coordinated: an initialize_device_cache that started after close() had
returned attached slots to the closed engine and returned normally (on CUDA
the attach also created events, a stream and pinned staging nothing ever
released). Now close() and initialize_device_cache() take one lock: an
initialize in progress finishes before close() closes, and one after close()
raises RuntimeError("expert store is closed")."""

import random
import sys
import threading
import time
import unittest

import _util  # noqa: F401  (import path)
import torch


class CloseDuringInitialize(_util.TinyPackTestCase):
    def test_initialize_after_close_raises(self):
        store = self.dropin()
        store.close()
        with self.assertRaisesRegex(RuntimeError, r"^expert store is closed$"):
            store.initialize_device_cache("cpu")
        with self.assertRaisesRegex(RuntimeError, "raw expert device cache is not initialized"):
            store.device_cache  # noqa: B018  (nothing was attached)
        store.close()  # still idempotent

    def test_close_and_initialize_hammered_from_threads(self):
        """Each round: initialize_device_cache on one thread, close on another,
        started together or one a little after the other. Either initialize
        began before close returned and close waited for it (its cache was
        closed with the store), or it raised the closed error; nothing else. Before the fix every
        round whose initialize began after close had returned 'succeeded'."""
        old = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)  # switch threads often: the window is a few bytecodes wide
        self.addCleanup(sys.setswitchinterval, old)
        rng = random.Random(7)
        delays = [0.0, 0.0, 1e-5, 1e-4, 1e-3, 5e-3]
        outcomes = {"initialized": 0, "refused": 0}
        for round_ in range(60):
            store = self.dropin()
            self.addCleanup(store.close)
            barrier = threading.Barrier(2)
            init_delay, close_delay = rng.choice(delays), rng.choice(delays)
            seen = {}

            def initialize():
                barrier.wait()
                time.sleep(init_delay)
                seen["init_start"] = time.monotonic()
                try:
                    store.initialize_device_cache("cpu")
                    seen["init"] = "ok"
                except Exception as exc:  # noqa: BLE001  (every failure is looked at)
                    seen["init"] = exc

            def close():
                barrier.wait()
                time.sleep(close_delay)
                try:
                    store.close()
                    seen["close"] = "ok"
                except Exception as exc:  # noqa: BLE001
                    seen["close"] = exc
                seen["close_end"] = time.monotonic()

            threads = [threading.Thread(target=initialize), threading.Thread(target=close)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.assertEqual(seen["close"], "ok", f"round {round_}")
            if seen["init"] == "ok":
                outcomes["initialized"] += 1
                # Only a call that began before close() returned may succeed
                # (close waited for it); one that began later must be refused.
                self.assertLess(seen["init_start"], seen["close_end"],
                                f"round {round_}: initialize_device_cache began after close() returned and "
                                f"succeeded")
                self.assertEqual(tuple(store.device_cache.shape)[1], store.object_payload_bytes)
            else:
                outcomes["refused"] += 1
                self.assertIsInstance(seen["init"], RuntimeError, f"round {round_}: {seen['init']!r}")
                self.assertEqual(str(seen["init"]), "expert store is closed", f"round {round_}")
            # Closed either way: routing is refused, never served from freed state.
            ids = torch.arange(self.top_k).reshape(1, self.top_k)
            with self.assertRaises(RuntimeError):
                store.acquire(self.layers[0], ids)
        # Both orders happened, so both halves of the rule were exercised.
        self.assertGreater(outcomes["initialized"], 0, outcomes)
        self.assertGreater(outcomes["refused"], 0, outcomes)


if __name__ == "__main__":
    unittest.main()
