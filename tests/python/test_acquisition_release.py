"""An Acquisition dropped without mark_used() is released by its destructor,
which now lets go of the GIL around the release (a stats flush may be due
then). No test shows the GIL held during that flush without timing it; these
guard the destructor where letting go of the GIL is not safe: another
thread, interpreter exit, a daemon thread dropping while the interpreter
exits."""

import json
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np

import _util
import k3pack


class DroppedAcquisitionTest(_util.TinyPackTestCase):
    def open_store(self, stats_path):
        # Room for one token's objects: a pin the drop did not release makes
        # the next acquire of other experts wait for room, then fail.
        return k3pack.ExpertStore(self.pack, self.manifest, cache_bytes=self.top_k * self.object_bytes,
                                  stats_path=stats_path, stats_flush_interval=1)

    def acquire_and_drop(self, store, first):
        ids = np.arange(first, first + self.top_k) % self.experts
        acq = store.acquire_token(self.layers[0], ids)
        self.assertFalse(acq.released)
        del acq

    def check_released_and_flushed(self, store, stats_path):
        self.acquire_and_drop(store, self.top_k)  # other experts: needs the first token's room
        with open(stats_path) as f:
            self.assertEqual(sum(json.load(f)["route_calls_by_layer"]), 2)

    def test_dropped_on_the_main_thread(self):
        stats_path = os.path.join(self.tmp.path, "main.stats.json")
        with self.open_store(stats_path) as store:
            self.acquire_and_drop(store, 0)
            self.check_released_and_flushed(store, stats_path)

    def test_dropped_on_another_thread(self):
        stats_path = os.path.join(self.tmp.path, "thread.stats.json")
        with self.open_store(stats_path) as store:
            errors = []

            def drop():
                try:
                    self.acquire_and_drop(store, 0)
                except BaseException as e:  # noqa: B902 - reported below
                    errors.append(e)
            thread = threading.Thread(target=drop)
            thread.start()
            thread.join()
            self.assertEqual(errors, [])
            self.check_released_and_flushed(store, stats_path)

    def run_script(self, body):
        script = textwrap.dedent("""
            import sys, threading
            import numpy as np
            sys.path[:0] = {path!r}
            import k3pack
            store = k3pack.ExpertStore({pack!r}, {manifest!r}, cache_bytes=64 << 20, stats_path={stats!r},
                                       stats_flush_interval=1)
            ids = np.arange({top_k})
        """).format(path=sys.path[:3], pack=self.pack, manifest=self.manifest, top_k=self.top_k,
                    stats=os.path.join(self.tmp.path, "exit.stats.json")) + textwrap.dedent(body)
        return subprocess.run([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, timeout=120)

    def test_dropped_at_interpreter_exit(self):
        # A module global: dropped while the interpreter tears the module down.
        proc = self.run_script(f"""
            kept = store.acquire_token({self.layers[0]}, ids)
        """)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertNotIn("Traceback", proc.stderr)

    def test_dropped_by_a_daemon_thread_while_exiting(self):
        # The daemon thread may drop before, during or after the exit hook:
        # in none of them may the destructor abort or raise.
        proc = self.run_script(f"""
            started = threading.Event()
            def churn():
                started.set()
                try:
                    while True:
                        store.acquire_token({self.layers[0]}, ids)  # dropped at once
                except RuntimeError:
                    pass  # "the interpreter is exiting": k3pack refuses new calls from this thread
            threading.Thread(target=churn, daemon=True).start()
            started.wait()
        """)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertNotIn("terminate called", proc.stderr)
        self.assertNotIn("Fatal Python error", proc.stderr)


if __name__ == "__main__":
    import unittest

    unittest.main()
