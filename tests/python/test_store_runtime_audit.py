"""Faults a run-time audit of the expert stores found, from Python
(docs/RELIABILITY.md, "Faults from a store run-time audit (session 13)"):
k3pack.ExpertStore and the drop-in k3pack.sglang.KimiGGMLExpertPackStore in a
forked child. Each test failed before its fix."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import unittest

import _util

# A parent opens a store, uses it (its read threads run), forks; the child
# tries the store, then ends the way a worker process does: a normal
# interpreter exit (finalizers, atexit hooks, module teardown) with the store
# still alive. The parent reports what the child did and how it ended.
_FORK_SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    sys.path.insert(0, sys.argv[1])
    import numpy as np
    import k3pack, k3pack.sglang
    pack, manifest, kind, layers, experts, top_k, layer = sys.argv[2:9]
    layers, experts, top_k, layer = int(layers), int(experts), int(top_k), int(layer)
    first = np.arange(top_k).reshape(1, top_k)
    second = np.arange(top_k, 2 * top_k).reshape(1, top_k)
    if kind == "expert":
        store = k3pack.ExpertStore(pack, manifest, cache_bytes=64 << 20)
        store.acquire(layer, first).mark_used()
        acquire = lambda: store.acquire(layer, second)
    else:
        store = k3pack.sglang.KimiGGMLExpertPackStore(
            pack, manifest_path=manifest, expected_layers=layers, expected_experts=experts,
            expected_top_k=top_k, cache_vram_mib=64, cache_vram_reserve_mib=1)
        store.initialize_device_cache("cpu")
        _, slots = store.acquire(layer, first)
        store.mark_used(slots)
        acquire = lambda: store.acquire(layer, second)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            acquire()
            said = "acquired"
        except Exception as e:
            said = type(e).__name__ + ": " + str(e)
        os.write(write, said.encode())
        os.close(write)
        sys.exit(0)  # a normal exit, store alive
    os.close(write)
    deadline = time.time() + 60  # a guard against the hang, not a timing check
    status = None
    while time.time() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.02)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        status = "hung"
    said = os.read(read, 4096).decode()
    if status != "hung":
        status = os.waitstatus_to_exitcode(status)
    # The parent's store still works.
    if kind == "expert":
        store.acquire(layer, second).mark_used()
    else:
        _, slots = store.acquire(layer, second)
        store.mark_used(slots)
    store.close()
    print(json.dumps({"child_said": said, "child_exit": status}))
""")


class ForkedChild(_util.TinyPackTestCase):
    def run_fork(self, kind):
        proc = subprocess.run(
            [sys.executable, "-c", _FORK_SCRIPT, os.path.join(_util.REPO, "python"), self.pack, self.manifest, kind,
             str(self.num_layers), str(self.experts), str(self.top_k), str(self.layers[0])],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300,
            env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def test_forked_child_exits_and_is_told_to_open_its_own_store(self):
        """fork() copies a store but not its read threads: the child's
        acquire of an object not resident hung for good, and a child that
        just exited normally hung (ExpertStore: its destructor joined the
        parent's threads) or died of SIGSEGV (the drop-in's exit hook)."""
        for kind in ("expert", "dropin"):
            with self.subTest(kind):
                got = self.run_fork(kind)
                self.assertEqual(got["child_exit"], 0, got)
                self.assertTrue(got["child_said"].startswith("RuntimeError: expert store was opened by process"),
                                got)
                self.assertIn("forked from it", got["child_said"])


if __name__ == "__main__":
    unittest.main()
