"""Ctrl-C during the long calls of the Python API.

create_manifest (whole-shard digests by default), verify_pack(full=True) and
validate_pack(full_pack_hash=True) hash whole shards or whole packs: hours on
a full checkpoint, in C++ without the GIL. They used to answer Ctrl-C only
when they returned. Each now polls Python's signal handlers between 8 MiB
chunks and raises KeyboardInterrupt within a few chunks.

Files with terabytes of trailing holes stand in for a full checkpoint: a
shard recorded with 4 TiB of holes after its data, and a full-scale pack
(`synth --preset k3-structure`, ~918 GiB of holes). Hashing either takes far
longer than the child's time limit, so an unanswered Ctrl-C fails the test.
"""

import json
import os
import subprocess
import sys
import textwrap
import unittest

import _util

import k3pack

SHARD0 = "KIMI-K3-SYNTH-00001-of-00003.gguf"

# The child starts the call on its main thread; a second thread sends SIGINT
# once 256 MiB were read (the call is inside its hashing by then). It prints
# how it ended and how much it read.
CHILD = """
    import json, os, signal, sys, threading, time, k3pack

    call = sys.argv[1]
    args = json.loads(sys.argv[2])
    base = rchar()

    def interrupt_once_hashing():
        while rchar() - base < (256 << 20):
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_once_hashing, daemon=True).start()
    try:
        getattr(k3pack, call)(*args["args"], **args["kwargs"])
        print("returned")
    except KeyboardInterrupt:
        print("interrupted")
    print("read", rchar() - base)
"""


def run_interrupted(call, *args, **kwargs):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return subprocess.run([sys.executable, "-c", _util.CHILD_RCHAR + textwrap.dedent(CHILD), call,
                           json.dumps({"args": list(args), "kwargs": kwargs})],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)


class _Interrupted(unittest.TestCase):
    def assert_interrupted(self, call, *args, **kwargs):
        proc = run_interrupted(call, *args, **kwargs)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        lines = dict(line.split(" ", 1) if " " in line else (line, "") for line in proc.stdout.splitlines())
        self.assertIn("interrupted", lines, proc.stdout + proc.stderr)
        self.assertLess(int(lines["read"]), 4 << 30, proc.stdout)  # stopped within a few chunks


class ShardDigests(_Interrupted):
    """A tiny model whose shard 0 carries 4 TiB of trailing holes."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = _util.TempDir()
        cls.pack, cls.manifest, cls.doc = _util.build_tiny(cls.tmp.path)
        cls.model = os.path.join(cls.tmp.path, "model")
        shard = os.path.join(cls.model, SHARD0)
        os.truncate(shard, os.path.getsize(shard) + (4 << 40))
        # The manifest records the shard as it is now, so verify's size
        # check passes and it goes on to hash the whole shard.
        doc = json.loads(json.dumps(cls.doc))
        doc["source"]["shards"][0]["size"] = os.path.getsize(shard)
        cls.huge_manifest = os.path.join(cls.tmp.path, "huge.manifest.json")
        with open(cls.huge_manifest, "w") as f:
            json.dump(doc, f)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_create_manifest_hashing_shards(self):
        self.assert_interrupted("create_manifest", self.model, self.pack, os.path.join(self.model, "config.json"),
                                os.path.join(self.model, "tokenizer"), profile="scaled")

    def test_verify_pack_full_hashing_shards(self):
        self.assertIn("sha256", self.doc["source"]["shards"][0])  # a default build records whole-shard digests
        self.assert_interrupted("verify_pack", self.huge_manifest, full=True)


@unittest.skipUnless(_util.cli_has_command("synth"), "needs the k3pack CLI")
class PackDigest(_Interrupted):
    """A full-scale pack of holes (k3-structure): its whole-pack digest reads ~918 GiB."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = _util.TempDir()
        cls.model = os.path.join(cls.tmp.path, "k3")
        _util.run_cli("synth", "--preset", "k3-structure", "--out", cls.model)
        cls.pack = os.path.join(cls.tmp.path, "k3.pack")
        _util.run_cli("pack", cls.model, "--out", cls.pack, "--progress", "none")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_validate_pack_full_pack_hash(self):
        self.assert_interrupted("validate_pack", self.pack, self.model, os.path.join(self.model, "config.json"),
                                payload_samples=0, full_pack_hash=True)


if __name__ == "__main__":
    unittest.main()
