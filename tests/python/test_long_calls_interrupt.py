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

The same files keep a daemon thread inside k3pack while the interpreter
exits (InterpreterExit).
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

    # Python's Ctrl-C handler, as an interactive shell gives it: a job started
    # in the background (nohup, `&`) inherits SIGINT ignored, and the kill
    # below would then do nothing.
    signal.signal(signal.SIGINT, signal.default_int_handler)
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


class _HugeShard(unittest.TestCase):
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


class ShardDigests(_HugeShard, _Interrupted):
    def test_create_manifest_hashing_shards(self):
        self.assert_interrupted("create_manifest", self.model, self.pack, os.path.join(self.model, "config.json"),
                                os.path.join(self.model, "tokenizer"), profile="scaled")

    def test_verify_pack_full_hashing_shards(self):
        self.assertIn("sha256", self.doc["source"]["shards"][0])  # a default build records whole-shard digests
        self.assert_interrupted("verify_pack", self.huge_manifest, full=True)


# The interpreter exits while a daemon thread hashes a shard in
# create_manifest. CPython ends a thread that takes the GIL once finalization
# has begun with pthread_exit, which aborted inside k3pack's C++ frames
# ("terminate called without an active exception", status 134). A finalizer
# that sleeps (it lets go of the GIL) holds finalization open long enough for
# the daemon to come back. A hook registered before k3pack's import runs after
# k3pack's exit wait: a new call from another thread is refused there, and the
# finalizing thread may still call k3pack.
EXIT_CHILD = """
    import atexit, os, sys, threading, time

    model, pack = sys.argv[1], sys.argv[2]
    shard = os.path.join(model, "KIMI-K3-SYNTH-00001-of-00003.gguf")

    def say(text, write=os.write):
        write(1, (text + "\\n").encode())

    daemon_said = threading.Event()

    def late_hook(threading=threading, say=say, daemon_said=daemon_said, os=os):
        # The daemon's own except clause runs once it has the GIL back; wait
        # for it (without the GIL) rather than for the scheduler, which on a
        # loaded machine left it no turn before finalization. (A daemon the
        # exit gave up on is parked and never says anything.)
        daemon_said.wait(0 if os.environ.get("K3PACK_TEST_EXIT_WAIT_MS") == "0" else 10)
        seen = []
        def call():
            try:
                k3pack.GGUFFile(shard)
                seen.append("returned")
            except RuntimeError as e:
                seen.append("refused: " + str(e))
        t = threading.Thread(target=call)
        t.start()
        t.join()
        say("late thread " + seen[0])
        k3pack.GGUFFile(shard)
        say("late main returned")

    atexit.register(late_hook)
    import k3pack

    def work():
        try:
            k3pack.create_manifest(model, pack, os.path.join(model, "config.json"), os.path.join(model, "tokenizer"),
                                   profile="scaled")
            say("daemon returned")
        except BaseException as e:
            say("daemon %s: %s" % (type(e).__name__, e))
        daemon_said.set()

    base = rchar()
    threading.Thread(target=work, daemon=True).start()
    while rchar() - base < (256 << 20):  # inside the hashing
        time.sleep(0.01)

    class SlowFinalizer:
        def __del__(self, sleep=time.sleep):
            sleep(1)

    slow = SlowFinalizer()
    say("main exits")
"""


class InterpreterExit(_HugeShard):
    def run_child(self, **env):
        child_env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), **env)
        return subprocess.run([sys.executable, "-c", _util.CHILD_RCHAR + textwrap.dedent(EXIT_CHILD), self.model,
                               self.pack], env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=300)

    def test_exit_stops_a_daemon_threads_long_call_and_refuses_new_ones(self):
        proc = self.run_child()
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertNotIn("terminate", proc.stderr)
        lines = proc.stdout.splitlines()
        self.assertIn("daemon RuntimeError: interrupted while creating the manifest: the interpreter is exiting", lines,
                      proc.stdout + proc.stderr)
        self.assertIn("late thread refused: the interpreter is exiting: k3pack refuses new calls from threads other "
                      "than the one finalizing it (they could not take the GIL back)", lines, proc.stdout)
        self.assertIn("late main returned", lines, proc.stdout)

    def test_a_call_the_exit_stopped_waiting_for_is_parked_not_aborted(self):
        # The exit waits 0 ms here: the daemon is still inside k3pack when it
        # gives up, and comes back during finalization.
        proc = self.run_child(K3PACK_TEST_EXIT_WAIT_MS="0")
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertNotIn("terminate", proc.stderr)
        self.assertIn("k3pack: 1 call(s) on other threads were still running at interpreter exit", proc.stderr)


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
