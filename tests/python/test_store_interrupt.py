"""Ctrl-C reaches a store call that waits for room another thread holds.

Before, acquire() waited its whole 10 s bound without the GIL and raised
RuntimeError("expert cache cannot evict ..."); the KeyboardInterrupt surfaced
only while that error was handled (or, had the room come, after the
acquisition it then lost)."""

import os
import signal
import threading
import unittest

import _util  # noqa: F401  (import path)

import k3pack
import numpy as np


class StoreInterruptTest(_util.TinyPackTestCase):
    def setUp(self):
        super().setUp()
        # Python leaves SIGINT ignored when it starts with it ignored (a
        # command run in the background by a non-interactive shell, as a CI
        # job may run the suite): Ctrl-C is Python's default handler here.
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        self.addCleanup(signal.signal, signal.SIGINT, previous)

    def test_acquire_waiting_for_room_takes_ctrl_c(self):
        k, layer = self.top_k, self.layers[0]
        with k3pack.ExpertStore(self.pack, self.manifest, cache_bytes=64 << 20) as probe:
            one = probe.info["object_bytes"][0]
        with k3pack.ExpertStore(self.pack, self.manifest, cache_bytes=k * one, policy="lru") as store:
            held = []  # the cache's whole room, acquired by another thread and not released
            t = threading.Thread(target=lambda: held.append(store.acquire_token(layer, np.arange(k))))
            t.start()
            t.join()
            timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT))
            timer.start()
            try:
                with self.assertRaises(KeyboardInterrupt) as cm:
                    store.acquire_token(layer, np.arange(k, 2 * k))
            finally:
                timer.cancel()
            self.assertIsNone(cm.exception.__context__, "the interrupt came only after the wait's own error")
            held[0].mark_used()
            store.acquire_token(layer, np.arange(k, 2 * k)).mark_used()  # the store goes on

    def test_a_store_closed_while_the_wait_polls_ctrl_c_ends_the_wait(self):
        # A signal handler runs inside the poll, with the store's mutex let go:
        # before, a close() there went unseen and the call waited for a read
        # the closed engine never did, for ever.
        k, layer = self.top_k, self.layers[0]
        with k3pack.ExpertStore(self.pack, self.manifest, cache_bytes=64 << 20) as probe:
            one = probe.info["object_bytes"][0]
        store = k3pack.ExpertStore(self.pack, self.manifest, cache_bytes=k * one, policy="lru")
        held = []
        t = threading.Thread(target=lambda: held.append(store.acquire_token(layer, np.arange(k))))
        t.start()
        t.join()

        def close_it(signum, frame):
            held[0].mark_used()
            store.close()

        previous = signal.signal(signal.SIGUSR1, close_it)
        timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1))
        timer.start()
        try:
            with self.assertRaises(RuntimeError) as cm:
                store.acquire_token(layer, np.arange(k, 2 * k))
            self.assertIn("expert store is closed", str(cm.exception))
        finally:
            timer.cancel()
            signal.signal(signal.SIGUSR1, previous)


if __name__ == "__main__":
    unittest.main()
