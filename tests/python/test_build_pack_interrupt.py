"""Ctrl-C during build_pack's copy raises KeyboardInterrupt, as every other
long call of the Python API does (create_manifest, verify_pack(full=True),
synth).

The copy catches SIGINT itself: the workers finish their batch and the
finished prefix is checkpointed before the call returns. It used to return
that as OSError("interrupted; rerun the same command to resume from object
N of T"), so `except KeyboardInterrupt` missed it and a script went on as
after a disk error. The signal is now handed to Python once the checkpoint
is written: KeyboardInterrupt, whose argument still says where the rerun
resumes; the rerun resumes there.
"""

import json
import os
import subprocess
import sys
import textwrap
import unittest

import _util

import k3pack

# The child builds the pack with a throttled copy and sends itself SIGINT
# from the progress callback once 2 objects are done (inside the copy).
CHILD = """
    import json, os, signal, sys, k3pack

    # Python's Ctrl-C handler, as an interactive shell gives it (a background
    # job inherits SIGINT ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    model, out = sys.argv[1], sys.argv[2]
    sent = []

    def progress(p):
        if not sent and p["phase"] == "build" and 2 <= p["done_objects"] < p["total_objects"]:
            sent.append(p["done_objects"])
            os.kill(os.getpid(), signal.SIGINT)

    try:
        k3pack.build_pack(model, os.path.join(model, "config.json"), out=out, profile="scaled",
                          safety_margin_gib=0, threads=2, progress=progress)
        print(json.dumps({"ended": "returned"}))
    except BaseException as e:
        print(json.dumps({"ended": type(e).__name__, "args": [str(a) for a in e.args]}))
"""


class BuildPackInterrupt(_util.SynthModelTestCase):
    def test_ctrl_c_in_the_copy_raises_keyboard_interrupt_saying_where_to_resume(self):
        out = os.path.join(self.tmp.path, "ki.pack")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
                   K3PACK_THROTTLE_US="50000", K3PACK_BATCH_BYTES="1")
        proc = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD), self.model, out], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        ended = json.loads(proc.stdout.splitlines()[-1])
        self.assertEqual(ended["ended"], "KeyboardInterrupt", proc.stdout + proc.stderr)
        self.assertEqual(len(ended["args"]), 1, ended)
        self.assertRegex(ended["args"][0], r"^interrupted; rerun the same command to resume from object \d+ of \d+$")
        self.assertFalse(os.path.exists(out))

        # The text is true: the same call resumes there and finishes.
        resume_at = ended["args"][0].split("from object ")[1].split(" of ")[0]
        lines = []
        done = k3pack.build_pack(self.model, os.path.join(self.model, "config.json"), out=out, profile="scaled",
                                 safety_margin_gib=0, log=lines.append)
        self.assertEqual(done["resumed_objects"], int(resume_at), lines)
        self.assertTrue(os.path.exists(out))


if __name__ == "__main__":
    unittest.main()
